"""TII Falcon-H1 (`falcon-h1`): attention and a Mamba-2 mixer in parallel in every layer.

Follows llama.cpp's src/models/falcon-h1.cpp and transformers' FalconH1ForCausalLM. Each
layer norms its input once; attention (neox rope) and the Mamba-2 mixer both read those rows
and their outputs are summed into the residual stream (mixer "attention+mamba2"), then the
gated SiLU FFN. The mamba mixer's gated norm is there only when the file holds ssm_norm
(HF mamba_rms_norm); without it the output is y * silu(z).

Falcon-H1's multipliers are no part of llama.cpp's graph: its converter (FalconH1Model)
folds every one into the weights, and the HF side here does the same, in the same f32
order: the embedding (embedding_multiplier) and the head (lm_head_multiplier); q and v by
attention_in_multiplier, k by key_multiplier then attention_in_multiplier, o by
attention_out_multiplier; in_proj by ssm_in_multiplier then its z, x, B, C and dt rows by
the five ssm_multipliers; out_proj by ssm_out_multiplier; the FFN's gate and down rows by
mlp_multipliers. The FFN norm is written without a .weight suffix, as the converter names
it (pre_ff_layernorm -> blk.N.ffn_norm).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.attention import attention
from ..graph.blocks.mamba import mamba2
from ..graph.blocks.norms import scaled
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import LayerShape, ModelConfig
from .base import Arch
from .decoder import with_ext
from .hf import HF_ATTENTION_TENSORS, MetadataWriter, hf_types
from .hf_plan import Transform
from .mamba import MAMBA2_TRANSFORMS, MambaStackConfig
from .mamba_hybrid import MIXER_MODULES, MIXER_WHOLE, mamba2_config, mamba2_metadata

F32 = np.float32


def _times(*keys: str | tuple[str, int]) -> Transform:
    """The tensor multiplied by each config multiplier in turn (a key, or a list's entry),
    each an f32 multiply as the converter's torch makes it."""

    def apply(w: np.ndarray, hp: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
        for k in keys:
            value = hp[k[0]][k[1]] if isinstance(k, tuple) else hp[k]
            w = w * F32(value)
        return w

    return Transform(apply)


def _in_proj(w: np.ndarray, hp: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    """in_proj by ssm_in_multiplier, then its z, x, B, C and dt rows each by their entry of
    ssm_multipliers (the converter's zxbcdt_multipliers, transformers' mup_vector)."""
    w = w * F32(hp["ssm_in_multiplier"])
    mult = hp["ssm_multipliers"]
    di, gs = int(hp["mamba_d_ssm"]), int(hp["mamba_n_groups"]) * int(hp["mamba_d_state"])
    edges = (0, di, 2 * di, 2 * di + gs, 2 * di + 2 * gs, w.shape[0])
    for j in range(5):
        w[edges[j] : edges[j + 1]] *= F32(mult[j])
    return w


_TRANSFORMS: dict[str, tuple[Transform, ...]] = {
    "token_embd.weight": (_times("embedding_multiplier"),),
    "output.weight": (_times("lm_head_multiplier"),),
    "blk.{bid}.attn_q.weight": (_times("attention_in_multiplier"),),
    "blk.{bid}.attn_k.weight": (_times("key_multiplier", "attention_in_multiplier"),),
    "blk.{bid}.attn_v.weight": (_times("attention_in_multiplier"),),
    "blk.{bid}.attn_output.weight": (_times("attention_out_multiplier"),),
    "blk.{bid}.ssm_in.weight": (Transform(_in_proj),),
    "blk.{bid}.ssm_out.weight": (_times("ssm_out_multiplier"),),
    "blk.{bid}.ffn_gate.weight": (_times(("mlp_multipliers", 0)),),
    "blk.{bid}.ffn_down.weight": (_times(("mlp_multipliers", 1)),),
}


@dataclass(frozen=True)
class FalconH1Config(MambaStackConfig):
    """Every layer runs attention and a Mamba-2 mixer side by side on the same normed rows
    (mixer "attention+mamba2"); the slot holds the K/V rows and the mamba state."""

    def mixer(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, at: At
    ) -> Array:
        if shape.mixer != "attention+mamba2":
            return super().mixer(ops, cfg, shape, w, h, at)
        a = scaled(attention(ops, self.attention_spec(cfg, shape), w, h, *at), w.wo_scale)
        return ops.add_(a, mamba2(ops, self._m(), cfg.norm_eps, w.mamba2, h, at.kv))


class FalconH1(Arch):
    name = "falcon-h1"
    ext_class = FalconH1Config
    rope_type = "neox"
    hf_model_types = hf_types("falcon_h1")
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = (
        ("model.embed_tokens", "token_embd"),
        ("model.final_layernorm", "output_norm"),
        ("lm_head", "output"),
        *HF_ATTENTION_TENSORS,
        ("model.layers.{bid}.feed_forward.gate_proj", "blk.{bid}.ffn_gate"),
        ("model.layers.{bid}.feed_forward.up_proj", "blk.{bid}.ffn_up"),
        ("model.layers.{bid}.feed_forward.down_proj", "blk.{bid}.ffn_down"),
        *MIXER_MODULES,
    )
    hf_tensors_whole: ClassVar[tuple[tuple[str, str], ...]] = (
        *MIXER_WHOLE,
        ("model.layers.{bid}.pre_ff_layernorm.weight", "blk.{bid}.ffn_norm"),
    )

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        m = dataclasses.replace(mamba2_config(self, ckpt), parallel=True)
        return with_ext(cfg, mamba=m)

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return {**MAMBA2_TRANSFORMS, **_TRANSFORMS}

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # As the converter's FalconH1Model (over Mamba2Model) writes them.
        super().hf_metadata(w, notes)
        hp = w.hp
        for flag in ("projectors_bias", "attention_bias", "mlp_bias"):
            if hp.get(flag):
                raise FrinkError(
                    f"config.json: {flag} is not supported for falcon-h1: llama.cpp's graph "
                    "has no such bias"
                )
        if hp.get("mamba_rms_norm") and hp.get("mamba_norm_before_gate"):
            # llama.cpp norms y * silu(z); transformers would norm y, then gate.
            raise FrinkError(
                "config.json: mamba_norm_before_gate with mamba_rms_norm is not supported "
                "(llama.cpp's mamba2 graph gates before its norm)"
            )
        inner = int(hp["mamba_d_ssm"])
        heads = int(hp["mamba_n_heads"])
        d_head = hp.get("mamba_d_head")
        d_head = inner // heads if d_head in (None, "auto") else int(d_head)
        if inner % d_head:
            raise FrinkError(f"config.json: mamba_d_ssm {inner} is not a multiple of {d_head}")
        mamba2_metadata(w, inner, inner // d_head)
        for key in ("mlp_multipliers", "ssm_multipliers"):
            _check_list(hp, key, 2 if key == "mlp_multipliers" else 5)


def _check_list(hp: dict[str, Any], key: str, n: int) -> None:
    value = hp.get(key)
    if not isinstance(value, list) or len(value) != n:
        raise FrinkError(f"config.json: {key} must be a list of {n} numbers, got {value!r}")
