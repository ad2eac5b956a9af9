"""BitNet b1.58 (`bitnet`): a llama block with two sub-norms and ternary weights.

Follows llama.cpp's src/models/bitnet.cpp: an RMSNorm on the attention output before
o_proj (`attn_sub_norm`, weight [n_embd]) and one on the FFN's gated activation before
ffn_down (`ffn_sub_norm`, weight [n_ff]); SiLU-gated FFN (LLM_FFN_SILU, LLM_FFN_PAR); NeoX
rope; the lm head is always the token embedding (llama.cpp never creates an output tensor
for bitnet). transformers' BitNetForCausalLM computes the same graph with the config's
`hidden_act`; its default (and Microsoft's 2B-4T) is relu2, which llama.cpp does not
apply: a GGUF carries no activation key and llama.cpp runs SiLU, so frink does too (from
the HF dir it says so in a note).

The weights are ternary: the converter (conversion/bitnet.py: BitnetModel.weight_quant)
rounds each projection matrix to {-s, 0, +s} with s = mean|W| (clamped at 1e-5), in f32,
so an F32 GGUF already holds the ternary values; llama-quantize stores them as TQ1_0 /
TQ2_0 (per-256-block f16 scale times {-1, 0, 1}), which frink dequantizes to f32 on load.
llama.cpp multiplies in 8-bit activations on those types (q8_K), frink in f32: the
difference is llama.cpp's rounding (tests/test_bitnet.py bounds it).

llama.cpp's graph also multiplies each projection by an optional per-tensor `*.scale`
tensor ([1]; build_lora_mm's w_s). The converter never writes one (it folds s into the
weights); a file that has them is refused by name rather than run without them.

HF names: transformers' `self_attn.attn_sub_norm` / `mlp.ffn_sub_norm`, and the 1bitLLM
names the converter's tensor map knows (`self_attn.inner_attn_ln` / `mlp.ffn_layernorm`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..model.config import LayerPlan, LayerShape, ModelConfig
from .base import Arch
from .decoder import DecoderConfig, with_ext
from .hf import HF_CORE_TENSORS, MetadataWriter, hf_types
from .hf_plan import Transform


@dataclass(frozen=True)
class BitnetConfig(DecoderConfig):
    """BitNet's sub-norms: an RMSNorm on the attention output before o_proj (attn_sub_norm
    [n_head*hd_v]) and on the FFN's gated activation before down (ffn_sub_norm [n_ff]):
    the blocks apply them where the weights hold them."""

    attn_sub_norm: bool = False
    ffn_sub_norm: bool = False

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        plan = super().layer_plan(cfg, shape)
        return dataclasses.replace(plan, sub_norms=self.attn_sub_norm or self.ffn_sub_norm)


# The projections the converter ternarizes (its modify_tensors list).
TERNARY_TENSORS = (
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


def ternarize(w: np.ndarray) -> np.ndarray:
    """The converter's weight_quant: W rounded to {-s, 0, +s}, s = mean|W| (>= 1e-5), as
    (W * (1/s)).round().clamp(-1, 1) / (1/s) in f32 (round half to even, as torch)."""
    w = np.asarray(w, np.float32)
    scale = np.float32(max(np.float32(np.abs(w).mean(dtype=np.float32)), np.float32(1e-5)))
    iscale = np.float32(1.0) / scale
    return (np.clip(np.round(w * iscale), -1.0, 1.0) / iscale).astype(np.float32)


TERNARIZE = Transform(lambda w, hp, shape: ternarize(w))


class Bitnet(Arch):
    ext_class = BitnetConfig
    name = "bitnet"
    hf_model_types = hf_types("bitnet")
    rope_type = "neox"
    hf_tensors = HF_CORE_TENSORS + (
        ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.ffn_norm"),
        ("model.layers.{bid}.self_attn.attn_sub_norm", "blk.{bid}.attn_sub_norm"),
        ("model.layers.{bid}.self_attn.inner_attn_ln", "blk.{bid}.attn_sub_norm"),
        ("model.layers.{bid}.mlp.ffn_sub_norm", "blk.{bid}.ffn_sub_norm"),
        ("model.layers.{bid}.mlp.ffn_layernorm", "blk.{bid}.ffn_sub_norm"),
    )

    def check_metadata(self, ckpt: Checkpoint, rope_dim: int) -> None:
        scales = sorted(n for n in ckpt.tensors.names() if n.endswith(".scale"))
        if scales:
            raise FrinkError(
                f"{ckpt.path}: bitnet per-tensor scales ({scales[0]}, {len(scales)} in all) "
                "are not supported (llama.cpp's converter folds them into the weights)"
            )

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        cfg = with_ext(cfg, attn_sub_norm=True, ffn_sub_norm=True)
        return dataclasses.replace(cfg, tied_embeddings=True)

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return {f"blk.{{bid}}.{t}.weight": (TERNARIZE,) for t in TERNARY_TENSORS}

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        # BitnetModel.set_gguf_parameters: linear rope scaling by 1 (no scaling).
        w.set("rope.scaling.type", "linear")
        w.set("rope.scaling.factor", 1.0)
        act: Any = w.hp.get("hidden_act")
        if act not in (None, "silu"):
            notes.append(
                f"config hidden_act={act!r} is not applied (bitnet runs SiLU, as llama.cpp does)"
            )
