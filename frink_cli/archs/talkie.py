"""Talkie (`talkie`): a llama-sized decoder with a skip stream and no norm weights.

Follows llama.cpp's src/models/talkie.cpp (and conversion/talkie.py, its converter from the
remote-code TalkieForCausalLM; transformers has no Talkie, so there is no HF-dir path):

- the looked-up embeddings are RMS-normed with no weight; that normed embedding is both
  the residual stream's start and the skip stream: every layer adds it, times its own
  scalar `blk.N.layer_output_scale` [1], into its output after the FFN's residual add
  (ModelConfig.embd_skip);
- every norm is weightless: the attention and FFN pre-norms, the final norm, and the
  per-head Q and K RMSNorms (weightless_norms; eps from the file, the converter writes
  float32's machine epsilon);
- Q gets a per-head gain after its norm: `blk.N.attn_q_norm` is [n_head, 1], one scalar per
  head (attn_q_gain); K has none. llama.cpp norms Q and K after the rotation; with
  rope_dim == head_dim (which it asserts) the RMS of a head and a per-head scalar commute
  with the rotation, so frink's norm-then-rope order is the same arithmetic;
- the attention and FFN output projections are scaled by `attn_output.scale` and
  `ffn_down.scale` [1] (talkie's attn_gain / mlp_gain; llama.cpp's generic per-tensor
  weight scales, proj_scales);
- the logits are MULTIPLIED by `talkie.logit_scale` (lm_head_gain; required), unlike
  granite's division: frink's logit_scale divides, so it holds the reciprocal;
- NeoX rope (the converter flips the sign of each Q/K head's second half to absorb the
  reference's inverse rotation), SwiGLU FFN, untied output head (required), q.k scaled by
  1/sqrt(head_dim).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import HeadPlan, LayerPlan, LayerShape, ModelConfig
from ..model.weights import LayerWeights, TensorReader
from .base import Arch, get
from .decoder import DecoderConfig, extended, with_ext
from .hf_plan import HfModelType


@dataclass
class TalkieLayerWeights(LayerWeights):
    """A layer's weights with its skip-stream scale [1] (layer_output_scale)."""

    skip_scale: np.ndarray | None = None


@dataclass(frozen=True)
class TalkieConfig(DecoderConfig):
    """The skip stream, weightless norms, the per-head Q gain and the projection scales."""

    # The layer norms, the final norm and the QK norms have no weight tensors (all ones:
    # the loader fills them in, so every backend that reads the weights carries it).
    weightless_norms: bool = False
    # The looked-up embeddings are RMS-normed (weightless) into the residual stream, and
    # that same normed embedding, times a per-layer scalar (layer_output_scale), is added
    # into every layer's output. It rides beside the residual stream between layers: rows
    # are [stream | skip], 2 * n_embd wide.
    embd_skip: bool = False
    # A per-head Q gain (attn_q_norm [n_head, 1]) after a weightless per-head RMSNorm of Q;
    # K is RMS-normed per head with no weight.
    attn_q_gain: bool = False
    # The attention and FFN output projections' per-tensor scales (attn_output.scale,
    # ffn_down.scale [1]).
    proj_scales: bool = False

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        return replace(
            super().layer_plan(cfg, shape),
            weightless=self.weightless_norms,
            qk_norm="weightless" if self.attn_q_gain else "",
            q_gain=self.attn_q_gain,
            proj_scales=self.proj_scales,
        )

    def head_plan(self, cfg: ModelConfig) -> HeadPlan:
        return replace(
            super().head_plan(cfg),
            weightless=self.weightless_norms,
            embd_norm="ones" if self.embd_skip else "",
        )

    def read_layer(self, r: TensorReader, cfg: ModelConfig, layer: int, base: Any) -> Any:
        if not self.embd_skip:
            return base
        scale = r.get(f"blk.{layer}.layer_output_scale.weight", (1,))
        return extended(TalkieLayerWeights, base, skip_scale=scale)

    def residual_width(self, cfg: ModelConfig) -> int:
        return 2 * cfg.n_embd if self.embd_skip else cfg.n_embd

    def embed(self, ops: Ops, cfg: ModelConfig, w: Any, x: Array, lookup: Any) -> Array:
        """The embeddings RMS-normed (w.token_embd_norm: ones) start both the residual
        stream and the skip stream -> [T, 2*n_embd] rows [stream | skip]."""
        x = super().embed(ops, cfg, w, x, lookup)
        if not self.embd_skip:
            return x
        x = ops.rms_norm(x, w.token_embd_norm, cfg.norm_eps)
        return ops.concat([x, x])

    def compose(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, x: Array, at: At
    ) -> Array:
        """The decoder layer on the residual stream, then the skip stream times this layer's
        scale [1] joins its output (llama.cpp's talkie.cpp: after the FFN's residual add)."""
        if not self.embd_skip:
            return super().compose(ops, cfg, shape, w, x, at)
        n = cfg.n_embd
        x, skip = x[:, :n], x[:, n:]
        out = super().compose(ops, cfg, shape, w, x, at)
        out = ops.add_(out, skip * w.skip_scale)
        return ops.concat([out, skip])


class Talkie(Arch):
    name = "talkie"
    ext_class = TalkieConfig
    hf_model_types: ClassVar[dict[str, HfModelType]] = {}
    rope_type = "neox"

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        names = set(ckpt.tensors.names())
        where = ckpt.path
        if cfg.tied_embeddings:
            raise FrinkError(f"{where}: talkie needs an output.weight tensor (as llama.cpp)")
        if cfg.head_dim_k != cfg.head_dim_v or cfg.rope_dim != cfg.head_dim_k:
            raise FrinkError(
                f"{where}: talkie needs key_length == value_length == rope dimensions "
                f"({cfg.head_dim_k}, {cfg.head_dim_v}, {cfg.rope_dim}), as llama.cpp asserts"
            )
        logit_scale = float(get(ckpt.metadata, self.key("logit_scale"), required=True))
        if not logit_scale or logit_scale != logit_scale or abs(logit_scale) == float("inf"):
            raise FrinkError(
                f"{where}: bad model metadata ({self.key('logit_scale')} = {logit_scale})"
            )
        return with_ext(
            cfg,
            weightless_norms=True,
            embd_skip=True,
            attn_q_gain=True,
            proj_scales="blk.0.attn_output.scale" in names or "blk.0.ffn_down.scale" in names,
            logit_scale=None if logit_scale == 1.0 else 1.0 / logit_scale,
        )
