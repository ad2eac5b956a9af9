"""What the gated-delta-net hybrids (qwen35, qwen35moe, qwen3next) share: a gated
full-attention layer every few layers, linear-attention (GDN) layers between, the pre-FFN
norm stored as post_attention_norm, and the HF side the converter's Qwen3NextModel writes
(A_log -> -exp(A_log), squeezed conv kernel, +1 on the (1 + w) RMSNorms, the ssm.* keys).

Not an architecture itself: qwen35.py and qwen3next.py subclass it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import FrinkError
from ..graph.blocks.gdn import GdnConfig, gdn
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import LayerShape, ModelConfig
from .base import Arch
from .decoder import DecoderConfig
from .hf import HF_CORE_TENSORS, HF_QK_NORM_TENSORS, MetadataWriter, hf_type
from .hf_plan import HfModelType, Transform
from .transforms import NEG_EXP, ONE_CENTERED_NORMS, SQUEEZE, add_one

# The MTP module's own tensors, as the converter names them (layer-indexed NextN names).
_MTP_NAMES = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
}


def mtp_as_layers(name: str, n_layer: int) -> str:
    """Qwen3.5 / Qwen3-Next's multi-token-prediction weights (`mtp.*`, or `model.mtp.*`) as
    the converter's _QwenMtpMixin.filter_tensors renames them: mtp.layers.k.* as the layer
    n_layer + k, mtp.fc and its norms as layer n_layer's NextN tensors. The trunk runs
    without them; `--spec mtp` drafts with them (mtp.py), as from the converted GGUF."""
    if name.startswith("model.mtp."):
        name = name[len("model.") :]
    if not name.startswith("mtp."):
        return name
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[1] == "layers" and parts[2].isdecimal():
        return f"model.layers.{n_layer + int(parts[2])}.{parts[3]}"
    if len(parts) == 3 and parts[1] in _MTP_NAMES:
        return f"model.layers.{n_layer}.{_MTP_NAMES[parts[1]]}.{parts[2]}"
    return name


def hf_text_type(model_type: str) -> HfModelType:
    """A text-only checkpoint's model_type, its MTP blocks read after the trunk."""
    return hf_type(model_type, rename=mtp_as_layers)


@dataclass(frozen=True)
class GdnHybridConfig(DecoderConfig):
    """A decoder whose layers gdn.layers names are gated delta nets, not attention."""

    gdn: GdnConfig | None = None

    recurrent_mixer = "gdn"

    recurrent_info_fields: ClassVar[dict[str, str]] = {
        "key_heads": "n_k_heads",
        "value_heads": "n_v_heads",
        "head_dim_k": "head_dim_k",
        "head_dim_v": "head_dim_v",
        "conv_kernel": "conv_kernel",
        "value_head_order": "v_head_order",
    }

    def recurrent_shapes(
        self, cfg: ModelConfig, layer: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        assert self.gdn is not None and self.gdn.layers[layer]  # asked of a GDN layer only
        return self.gdn.state_shapes()

    def recurrent_state_bytes(self, cfg: ModelConfig) -> int:
        return 0 if self.gdn is None else self.gdn.state_bytes()

    def mixer(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, at: At
    ) -> Array:
        if shape.mixer == "gdn":
            assert self.gdn is not None
            return gdn(ops, self.gdn, cfg.norm_eps, w.gdn, h, at.kv)
        return super().mixer(ops, cfg, shape, w, h, at)


# The converter adds 1 to every weight named *norm.weight but the delta net's gated norm.
_NEXTN_NORMS = tuple(f"blk.{{bid}}.nextn.{n}" for n in ("enorm", "hnorm", "shared_head_norm"))


class GdnHybrid(Arch):
    ext_class = GdnHybridConfig
    rope_type = "neox"
    qk_norm = True
    attn_output_gate = True
    ffn_norm_tensor = "post_attention_norm"
    gdn_v_head_order: ClassVar[str | None] = "grouped"
    hf_tensors = (
        HF_CORE_TENSORS
        + HF_QK_NORM_TENSORS
        + (
            ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.post_attention_norm"),
            ("model.layers.{bid}.linear_attn.conv1d", "blk.{bid}.ssm_conv1d"),
            ("model.layers.{bid}.linear_attn.norm", "blk.{bid}.ssm_norm"),
            ("model.layers.{bid}.linear_attn.out_proj", "blk.{bid}.ssm_out"),
            # An MTP block's own (mtp_as_layers has renamed them).
            ("model.layers.{bid}.eh_proj", "blk.{bid}.nextn.eh_proj"),
            ("model.layers.{bid}.enorm", "blk.{bid}.nextn.enorm"),
            ("model.layers.{bid}.hnorm", "blk.{bid}.nextn.hnorm"),
            ("model.layers.{bid}.shared_head.norm", "blk.{bid}.nextn.shared_head_norm"),
        )
    )
    hf_tensors_whole = (
        ("model.layers.{bid}.linear_attn.A_log", "blk.{bid}.ssm_a"),
        ("model.layers.{bid}.linear_attn.dt_bias", "blk.{bid}.ssm_dt.bias"),
    )

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        # Norms +1 except the delta net's gated norm (ssm_norm), which scales by w.
        return add_one(ONE_CENTERED_NORMS + _NEXTN_NORMS) | {
            "blk.{bid}.ssm_a": (NEG_EXP,),
            "blk.{bid}.ssm_conv1d.weight": (SQUEEZE,),
        }

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # As the converter's Qwen3NextModel.set_gguf_parameters writes them.
        super().hf_metadata(w, notes)
        hp = w.hp
        w.u32("ssm.conv_kernel", "linear_conv_kernel_dim")
        w.u32("ssm.state_size", "linear_key_head_dim")
        w.u32("ssm.group_count", "linear_num_key_heads")
        w.u32("ssm.time_step_rank", "linear_num_value_heads")
        n = int(hp["num_hidden_layers"])
        interval = int(hp.get("full_attention_interval") or 4)
        types = hp.get("layer_types")
        if isinstance(types, list):
            if len(types) != n:
                raise FrinkError(
                    f"config.json: layer_types has {len(types)} entries for {n} layers"
                )
            recurrent = [t == "linear_attention" for t in types]
        else:  # transformers' default: every interval-th layer attends
            recurrent = [(i + 1) % interval != 0 for i in range(n)]
        w.set("attention.recurrent_layers", recurrent)
        nextn = int(hp.get("_blocks_past_trunk", 0))
        if nextn:  # MTP blocks, counted in block_count as the converter counts them
            w.set("block_count", n + nextn)
            w.set("nextn_predict_layers", nextn)
        w.set("full_attention_interval", interval)
        inner = int(hp["linear_value_head_dim"]) * int(hp["linear_num_value_heads"])
        w.set("ssm.inner_size", inner)
        # Partial rope: transformers' default factor for these models is 0.25.
        default = hp.get("partial_rotary_factor", 0.25)
        factor = hp["_rope_full"].get("partial_rotary_factor", default)
        w.set("rope.dimension_count", int(int(hp["head_dim"]) * float(factor)))
