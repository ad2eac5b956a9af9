"""What every architecture shares of the HF safetensors -> GGUF conversion: the
llama-style tensor names, the GGUF metadata written from config.json, and the helpers an
architecture module builds its model_types from.

`HfConversion` is the HF half of `base.Arch`: an architecture overrides its `hf_*`
attributes and methods. The metadata written is what convert_hf_to_gguf.py's
TextModel.set_gguf_parameters writes; hf_plan.py applies the names and transforms.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats.safetensors import is_uint
from ..resources import config_file
from .hf_plan import HfModelType, Kept, Plan, Transform, is_finite_number

# A composite turns several stored tensors into one GGUF tensor, or one into several: it
# pops what it takes from `kept` and returns the plans it makes.
Composite = Callable[[Kept, dict[str, Any]], dict[str, Plan]]

# HF module name -> GGUF name, without .weight/.bias ({bid} = layer index). The llama-style
# attention: its input norm and projections.
HF_ATTENTION_TENSORS: tuple[tuple[str, str], ...] = (
    ("model.layers.{bid}.input_layernorm", "blk.{bid}.attn_norm"),
    ("model.layers.{bid}.self_attn.q_proj", "blk.{bid}.attn_q"),
    ("model.layers.{bid}.self_attn.k_proj", "blk.{bid}.attn_k"),
    ("model.layers.{bid}.self_attn.v_proj", "blk.{bid}.attn_v"),
    ("model.layers.{bid}.self_attn.o_proj", "blk.{bid}.attn_output"),
)
# The llama-style names of the whole stack; every architecture here names these the same way.
HF_CORE_TENSORS: tuple[tuple[str, str], ...] = (
    ("model.embed_tokens", "token_embd"),
    ("model.norm", "output_norm"),
    ("lm_head", "output"),
    *HF_ATTENTION_TENSORS,
    ("model.layers.{bid}.mlp.gate_proj", "blk.{bid}.ffn_gate"),
    ("model.layers.{bid}.mlp.up_proj", "blk.{bid}.ffn_up"),
    ("model.layers.{bid}.mlp.down_proj", "blk.{bid}.ffn_down"),
)
HF_QK_NORM_TENSORS: tuple[tuple[str, str], ...] = (
    ("model.layers.{bid}.self_attn.q_norm", "blk.{bid}.attn_q_norm"),
    ("model.layers.{bid}.self_attn.k_norm", "blk.{bid}.attn_k_norm"),
)


def f32(x: Any) -> float:
    """GGUF stores these as float32; round here so both formats give the same numbers."""
    return float(np.float32(x))


class MetadataWriter:
    """GGUF metadata from normalized HF hyperparameters: `{arch}.` is prefixed to keys."""

    def __init__(self, arch: str, hp: dict[str, Any]):
        self.arch, self.hp = arch, hp
        self.meta: dict[str, Any] = {}

    def _value(self, src: str, optional: bool, ok: Callable[[Any], bool], expected: str) -> Any:
        """The config value, checked by type, not coerced: "3" or true where a count
        belongs is a broken config."""
        value = self.hp.get(src)
        if value is None:
            if not optional:
                raise FrinkError(f"config.json: missing {src!r}")
            return None
        if not ok(value):
            raise FrinkError(f"config.json: {src!r} must be {expected}, got {value!r}"[:300])
        return value

    def u32(self, key: str, src: str, optional: bool = False) -> None:
        value = self._value(src, optional, is_uint, "a non-negative integer")
        if value is not None:
            self.set(key, value)

    def f32(self, key: str, src: str, optional: bool = False) -> None:
        value = self._value(src, optional, is_finite_number, "a finite number")
        if value is not None:
            self.set(key, f32(value))

    def sizes(self, ffn_optional: bool = False) -> None:
        """The shape keys every converter writes first: layers, context, widths, heads."""
        self.u32("block_count", "num_hidden_layers")
        self.u32("context_length", "max_position_embeddings")
        self.u32("embedding_length", "hidden_size")
        self.u32("feed_forward_length", "intermediate_size", optional=ffn_optional)
        self.u32("attention.head_count", "num_attention_heads")

    def flag(self, key: str, src: str) -> None:
        self.set(key, self._value(src, False, lambda v: isinstance(v, bool), "true or false"))

    def set(self, key: str, value: Any) -> None:
        self.meta[self.key(key)] = value

    def key(self, key: str) -> str:
        return f"{self.arch}.{key}"


class HfConversion:
    """The HF -> GGUF side of an architecture (mixed into `base.Arch`)."""

    name: ClassVar[str]  # GGUF general.architecture
    # HF config.json model_type -> how to read that config (several may share one arch).
    hf_model_types: ClassVar[dict[str, HfModelType]] = {}

    @classmethod
    def hf_claims(cls, config: dict[str, Any]) -> bool:
        """Whether this architecture serves a config.json of one of its model_types (where
        two share a model_type, the config's flags choose: gemma3_text's bidirectional
        attention is gemma-embedding's)."""
        return True

    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = HF_CORE_TENSORS + (
        ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.ffn_norm"),
    )
    # Parameters with no .weight/.bias suffix (A_log), mapped by their whole name.
    hf_tensors_whole: ClassVar[tuple[tuple[str, str], ...]] = ()
    hf_composites: ClassVar[tuple[Composite, ...]] = ()

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        """GGUF name pattern -> the transforms that tensor gets, in order."""
        return {}

    def hf_generated(self, hp: dict[str, Any]) -> dict[str, np.ndarray]:
        """Tensors the converter synthesizes from the config (none by default)."""
        return {}

    def hf_gguf_metadata(self, hp: dict[str, Any], notes: list[str]) -> dict[str, Any]:
        """GGUF metadata from the normalized config (what the safetensors reader calls)."""
        w = MetadataWriter(self.name, hp)
        self.hf_metadata(w, notes)
        return w.meta

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        """Write the GGUF metadata keys (w.hp: the normalized config). Extend with super();
        append to `notes` what the user should know (a config setting not applied)."""
        w.sizes(ffn_optional=not self.hf_needs_ffn_width)
        w.u32("attention.head_count_kv", "num_key_value_heads")
        w.u32("attention.key_length", "head_dim")
        w.u32("attention.value_length", "head_dim")
        w.f32("attention.layer_norm_rms_epsilon", "rms_norm_eps")
        w.f32("rope.freq_base", "rope_theta")
        w.u32("vocab_size", "n_vocab")
        self.hf_rope_scaling(w)

    # A dense FFN width is required in config.json (False where every FFN may be routed).
    hf_needs_ffn_width: ClassVar[bool] = True
    # rope_type "llama3" is expressed as a generated rope_freqs tensor (llama only).
    hf_llama3_rope_freqs: ClassVar[bool] = False

    def hf_rope_scaling(self, w: MetadataWriter) -> None:
        """The rope scaling keys the converter writes from rope_scaling / rope_parameters."""
        rp = w.hp["_rope_full"]
        rope_type = rp.get("rope_type")
        if rope_type in (None, "default"):
            return
        factor = rp.get("factor")
        if rope_type == "linear":
            if factor is not None:
                w.set("rope.scaling.type", "linear")
                w.set("rope.scaling.factor", f32(factor))
        elif rope_type == "yarn":
            if factor is not None:
                w.set("rope.scaling.type", "yarn")
                w.set("rope.scaling.factor", f32(factor))
                orig = rp.get("original_max_position_embeddings")
                if orig is None:
                    raise FrinkError(
                        "config.json: yarn rope scaling without original_max_position_embeddings"
                    )
                w.set("rope.scaling.original_context_length", int(orig))
                for src, key in (
                    ("extrapolation_factor", "yarn_ext_factor"),
                    ("attention_factor", "yarn_attn_factor"),
                    ("attn_factor", "yarn_attn_factor"),
                    ("beta_fast", "yarn_beta_fast"),
                    ("beta_slow", "yarn_beta_slow"),
                ):
                    if rp.get(src) is not None and w.key(f"rope.scaling.{key}") not in w.meta:
                        w.set(f"rope.scaling.{key}", f32(rp[src]))
        elif rope_type == "llama3" and self.hf_llama3_rope_freqs:
            pass  # expressed as the generated rope_freqs.weight tensor
        else:
            raise FrinkError(
                f"config.json: unsupported rope scaling type {rope_type!r} for {self.name}"
            )


def hf_sliding_window_note(arch: str, hp: dict[str, Any], notes: list[str]) -> None:
    """llama.cpp's llama/qwen2/qwen3 graphs have no sliding window; neither does frink's
    canonical form for them. Say so when the HF config asks for one."""
    sw = hp.get("sliding_window")
    types = hp.get("layer_types") or []
    uses = "sliding_attention" in types if types else sw is not None
    if hp.get("use_sliding_window") is False:
        uses = False
    if uses and sw is not None and sw < int(hp.get("max_position_embeddings") or 0):
        notes.append(
            f"config sliding_window={sw} is not applied ({arch} attends to the full context, "
            f"as llama.cpp does)"
        )


@functools.cache
def _transformers_defaults() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = json.loads(
        config_file("hf_defaults.json").read_text(encoding="utf-8")
    )["model_types"]
    return table


def hf_type(model_type: str, **fields: Any) -> HfModelType:
    """The HfModelType of `model_type`, its defaults being transformers' config-class
    defaults from configs/hf_defaults.json (checked against transformers by
    tests/test_hf_defaults.py); `fields` sets the other HfModelType fields (aliases,
    ignore, ...). Every entry of the table has a caller here, so a missing one is a bug."""
    return HfModelType(defaults=dict(_transformers_defaults()[model_type]), **fields)


def hf_types(*model_types: str, **fields: Any) -> dict[str, HfModelType]:
    """An architecture's `hf_model_types` where each model_type is read alike:
    {model_type: hf_type(model_type, **fields)}."""
    return {mt: hf_type(mt, **fields) for mt in model_types}


def multimodal(text: HfModelType, ignore: tuple[str, ...], what: str) -> HfModelType:
    """A multimodal checkpoint's model_type: the language model's config under text_config
    and its weights under `language_model.`; the towers in `ignore` are not read."""
    return HfModelType(
        defaults=dict(text.defaults),
        text_config="text_config",
        strip=("language_model.",),
        ignore=ignore,
        ignored_note=f"{what} ignored (text only)",
        aliases=text.aliases,
        rename=text.rename,
    )
