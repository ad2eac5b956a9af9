"""Llama 4 (GGUF `llama4`; HF `llama4_text`, and the text part of `llama4`).

Follows llama.cpp's src/models/llama4.cpp (hparams in its load_arch_hparams) and
transformers' Llama4ForCausalLM / Llama4ForConditionalGeneration; the converter is
conversion/llama.py's Llama4Model. The llama block (adjacent-pair rope, Q/K rows not
permuted) with:

- iRoPE: every `no_rope_layer_step`-th layer (1-based) rotates nothing and attends to the
  whole context; the others rotate and attend within their chunk (chunked local attention:
  the query at p sees [p // chunk * chunk, p]; the cache keeps the current chunk);
- attention temperature on the NoPE layers: q at p times
  log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1;
- L2-normed Q and K (a weightless RMSNorm per head) on the rope layers;
- a sparse MoE on every `interleave_moe_layer_step`-th layer: top k over the router
  logits, sigmoid weights (not renormalized) applied to each chosen expert's input
  (llama.cpp's weight_before_ffn), plus an ungated shared expert as wide as an expert; a
  dense SwiGLU FFN (feed_forward_length = HF intermediate_size_mlp) on the others.

llama.cpp 0.3.36 reads none of the chunk, temperature and NoPE settings from the file: it
hard-codes chunk 8192, floor_scale 8192, attn_scale 0.1, NoPE every 4th layer, and Q/K
norms unless the model has 128 experts. Those are the defaults here for a GGUF that does
not say otherwise; frink's own keys (written from an HF config, which may set any of them)
carry the config's values, for which transformers is the reference.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..formats.safetensors import StoredTensor, read_stored, read_stored_half
from ..graph.blocks.attention import AttentionSpec
from ..model.config import LayerPlan, LayerShape, ModelConfig
from .decoder import DecoderConfig, decoder_ext, with_ext
from .hf import HF_ATTENTION_TENSORS, Composite, MetadataWriter, hf_type, multimodal
from .hf_plan import HfModelType, Kept, Plan, Transform, check_dtype, pop_matching
from .llama import Llama

# llama.cpp's hard-coded values (load_arch_hparams), the defaults of a GGUF without keys.
CHUNK = 8192
FLOOR_SCALE = 8192.0
ATTN_SCALE = 0.1
NO_ROPE_STEP = 4
# The largest step or chunk a file may state (anything larger is a broken file).
MAX_STEP = 1 << 16
MAX_CHUNK = 1 << 26


@dataclasses.dataclass(frozen=True)
class Llama4Config(DecoderConfig):
    """Llama 4's decorations: chunked attention on the rope layers (`chunk` positions),
    NoPE layers every `no_rope_step`-th layer with the attention temperature
    (`temperature` = (floor_scale, attn_scale), None: off), and L2-normed Q/K on the rope
    layers (`qk_l2_norm`)."""

    chunk: int | None = None
    no_rope_step: int = 0
    temperature: tuple[float, float] | None = None
    qk_l2_norm: bool = False

    def rotates(self, layer: int) -> bool:
        """Layer `layer` is a rope layer (not NoPE)."""
        return self.no_rope_step == 0 or (layer + 1) % self.no_rope_step != 0

    def layer_shape(self, cfg: ModelConfig, layer: int) -> LayerShape:
        shape = super().layer_shape(cfg, layer)
        if self.chunk is not None and self.rotates(layer):
            shape = dataclasses.replace(shape, chunk=self.chunk)
        return shape

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        plan = super().layer_plan(cfg, shape)
        if self.qk_l2_norm and self.rotates(shape.index):
            plan = dataclasses.replace(plan, qk_norm="weightless")
        return plan

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        spec = dataclasses.replace(super().make_attention_spec(cfg, shape), chunk=shape.chunk)
        if self.rotates(shape.index):
            return spec
        return dataclasses.replace(spec, rotates=False, temperature=self.temperature)


def _transposed(st: StoredTensor, half: int | None) -> np.ndarray:
    """A stored [E, a, b] tensor (or half `half` of its last axis) as [E, b, a]."""
    w = read_stored(st) if half is None else read_stored_half(st, half, 2)
    return np.ascontiguousarray(np.swapaxes(w, -1, -2))


def split_experts(kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """The experts as the converter writes them (Llama4Model.modify_tensors): gate_up_proj
    [E, d, 2*ff] transposed, its first ff rows -> ffn_gate_exps, the rest -> ffn_up_exps;
    down_proj [E, ff, d] transposed -> ffn_down_exps."""
    plans: dict[str, Plan] = {}
    rx = re.compile(r"model\.layers\.(\d+)\.feed_forward\.experts\.(gate_up|down)_proj$")
    for m, hf_name, st in pop_matching(kept, rx):
        check_dtype(hf_name, st)
        if len(st.shape) != 3 or (m.group(2) == "gate_up" and st.shape[2] % 2):
            raise FrinkError(f"{st.file}: tensor {hf_name!r} has shape {list(st.shape)}")
        e, a, b = st.shape
        bid = m.group(1)
        if m.group(2) == "down":
            read = functools.partial(_transposed, st, None)
            plans[f"blk.{bid}.ffn_down_exps.weight"] = Plan(None, (e, b, a), st.dtype, (), read)
            continue
        for i, part in enumerate(("gate", "up")):
            read = functools.partial(_transposed, st, i)
            plans[f"blk.{bid}.ffn_{part}_exps.weight"] = Plan(
                None, (e, b // 2, a), st.dtype, (), read
            )
    return plans


_FF = "model.layers.{bid}.feed_forward"
_TEXT = hf_type("llama4_text")


class Llama4(Llama):
    name = "llama4"
    ext_class = Llama4Config
    hf_model_types: ClassVar[dict[str, HfModelType]] = {
        "llama4_text": _TEXT,
        "llama4": multimodal(
            _TEXT, ("vision_model.", "multi_modal_projector."), "vision model and projector"
        ),
    }
    hf_tensors = (
        ("model.embed_tokens", "token_embd"),
        ("model.norm", "output_norm"),
        ("lm_head", "output"),
        *HF_ATTENTION_TENSORS,
        ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.ffn_norm"),
        (_FF + ".gate_proj", "blk.{bid}.ffn_gate"),
        (_FF + ".up_proj", "blk.{bid}.ffn_up"),
        (_FF + ".down_proj", "blk.{bid}.ffn_down"),
        (_FF + ".router", "blk.{bid}.ffn_gate_inp"),
        (_FF + ".shared_expert.gate_proj", "blk.{bid}.ffn_gate_shexp"),
        (_FF + ".shared_expert.up_proj", "blk.{bid}.ffn_up_shexp"),
        (_FF + ".shared_expert.down_proj", "blk.{bid}.ffn_down_shexp"),
    )
    hf_composites: ClassVar[tuple[Composite, ...]] = (split_experts,)

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return {}  # Llama 4 rotates adjacent pairs in HF too: Q/K rows are not permuted

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        md, key = ckpt.metadata, self.key
        moe = decoder_ext(cfg).moe
        if moe is None:
            raise FrinkError(f"{ckpt.path}: model metadata is missing {key('expert_count')}")
        step = _step(ckpt, key("interleave_moe_layer_step"), None)
        want = tuple((i + 1) % step == 0 for i in range(cfg.n_layer))
        if moe.layers != want:
            raise FrinkError(
                f"{ckpt.path}: the routed layers (with ffn_gate_inp) do not follow "
                f"{key('interleave_moe_layer_step')} = {step}"
            )
        # The shared expert is as wide as an expert; sigmoid weights, not renormalized,
        # applied to the experts' inputs.
        moe = dataclasses.replace(
            moe,
            n_ff_shexp=moe.n_ff_exp,
            shared_gate=False,
            gating="sigmoid",
            norm_topk=False,
            weights_before=True,
        )
        sw = md.get(key("attention.sliding_window"))
        if sw is not None and int(sw) == 0:
            raise FrinkError(
                f"{ckpt.path}: {key('attention.sliding_window')} = 0 (llama4 without chunked "
                "attention) is not supported"
            )
        chunk = _positive_int(ckpt, key("attention.chunk_size"), CHUNK, MAX_CHUNK)
        temperature = None
        if bool(md.get(key("attention.temperature_tuning"), True)):
            floor_scale = _positive(ckpt, key("attention.temperature_floor_scale"), FLOOR_SCALE)
            scale = _finite(ckpt, key("attention.temperature_scale"), ATTN_SCALE)
            temperature = (floor_scale, scale)
        cfg = dataclasses.replace(cfg, sliding_window=None, swa_layers=(False,) * cfg.n_layer)
        return with_ext(
            cfg,
            moe=moe,
            chunk=chunk,
            no_rope_step=_step(ckpt, key("no_rope_layer_step"), NO_ROPE_STEP),
            temperature=temperature,
            qk_l2_norm=bool(md.get(key("attention.qk_l2_norm"), moe.n_expert != 128)),
        )

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        hp = w.hp
        n = int(hp["num_hidden_layers"])
        w.u32("feed_forward_length", "intermediate_size_mlp")
        w.u32("expert_feed_forward_length", "intermediate_size")
        w.u32("expert_count", "num_local_experts")
        w.u32("expert_used_count", "num_experts_per_tok")
        w.u32("interleave_moe_layer_step", "interleave_moe_layer_step")
        _hf_layer_patterns(hp, n)
        w.u32("no_rope_layer_step", "no_rope_layer_interval")
        if hp.get("attention_chunk_size") is None:
            raise FrinkError("config.json: llama4 without attention_chunk_size is not supported")
        w.u32("attention.chunk_size", "attention_chunk_size")
        w.flag("attention.temperature_tuning", "attn_temperature_tuning")
        w.f32("attention.temperature_floor_scale", "floor_scale")
        w.f32("attention.temperature_scale", "attn_scale")
        w.flag("attention.qk_l2_norm", "use_qk_norm")


def _hf_layer_patterns(hp: dict[str, Any], n: int) -> None:
    """Refuse a config whose NoPE, chunked and MoE layers are not the interval patterns
    llama.cpp's graph has (a NoPE layer every no_rope_layer_interval-th, the others
    chunked, experts every interleave_moe_layer_step-th)."""
    interval = int(hp["no_rope_layer_interval"])
    step = int(hp["interleave_moe_layer_step"])
    if interval <= 0 or step <= 0:
        raise FrinkError(
            "config.json: no_rope_layer_interval and interleave_moe_layer_step must be > 0"
        )
    rope = [int((i + 1) % interval != 0) for i in range(n)]
    if hp.get("no_rope_layers") and list(hp["no_rope_layers"]) != rope:
        raise FrinkError(
            f"config.json: no_rope_layers does not follow no_rope_layer_interval {interval} "
            "(not supported)"
        )
    types = ["chunked_attention" if r else "full_attention" for r in rope]
    if hp.get("layer_types") and list(hp["layer_types"]) != types:
        raise FrinkError("config.json: layer_types must be chunked on the rope layers only")
    moe_layers = list(range(step - 1, n, step))
    if hp.get("moe_layers") is not None and list(hp["moe_layers"]) != moe_layers:
        raise FrinkError(
            f"config.json: moe_layers does not follow interleave_moe_layer_step {step} "
            "(not supported)"
        )


def _step(ckpt: Checkpoint, name: str, default: int | None) -> int:
    """A layer step key: 1..MAX_STEP (required when default is None)."""
    raw = ckpt.metadata.get(name, default)
    if raw is None:
        raise FrinkError(f"{ckpt.path}: model metadata is missing {name}")
    return _positive_int(ckpt, name, raw, MAX_STEP)


def _positive_int(ckpt: Checkpoint, name: str, default: Any, most: int) -> int:
    raw = ckpt.metadata.get(name, default)
    if isinstance(raw, bool) or not isinstance(raw, (int, np.integer)) or not 0 < raw <= most:
        raise FrinkError(
            f"{ckpt.path}: bad model metadata ({name} = {raw!r:.40}; expected 1..{most})"
        )
    return int(raw)


def _finite(ckpt: Checkpoint, name: str, default: float) -> float:
    raw = ckpt.metadata.get(name, default)
    if isinstance(raw, bool) or not isinstance(raw, (int, float, np.number)):
        raise FrinkError(f"{ckpt.path}: bad model metadata ({name} = {raw!r:.40})")
    if not math.isfinite(float(raw)):
        raise FrinkError(f"{ckpt.path}: bad model metadata ({name} = {raw!r:.40}; expected finite)")
    return float(raw)


def _positive(ckpt: Checkpoint, name: str, default: float) -> float:
    value = _finite(ckpt, name, default)
    if value <= 0:
        raise FrinkError(f"{ckpt.path}: bad model metadata ({name} = {value!r}; expected > 0)")
    return value
