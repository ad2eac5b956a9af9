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

import dataclasses
from typing import ClassVar

from ..errors import FrinkError
from ..formats import Checkpoint
from ..model.config import ModelConfig
from .base import Arch, get
from .hf_plan import HfModelType


class Talkie(Arch):
    name = "talkie"
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
        return dataclasses.replace(
            cfg,
            weightless_norms=True,
            embd_skip=True,
            attn_q_gain=True,
            proj_scales="blk.0.attn_output.scale" in names or "blk.0.ffn_down.scale" in names,
            logit_scale=None if logit_scale == 1.0 else 1.0 / logit_scale,
        )
