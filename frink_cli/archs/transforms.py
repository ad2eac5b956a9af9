"""Tensor transforms more than one architecture applies on the way from HF to GGUF, as
convert_hf_to_gguf.py applies them (an architecture's own transforms live in its module).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .hf_plan import Transform


def _add_one(w: np.ndarray, hp: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    # In float32, as transformers' Gemma3RMSNorm computes (1 + w.float()).
    return w + np.float32(1.0)


def _neg_exp(w: np.ndarray, hp: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    return -np.exp(w)


def _reshape(w: np.ndarray, hp: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    return w.reshape(shape)


# RMSNorms that scale by (1 + w) (Gemma, Qwen3.5, Qwen3-Next): llama.cpp's norm scales by w,
# so the converter stores w + 1.
ADD_ONE = Transform(_add_one)
# The norms every such model stores as (1 + w): the final norm and each layer's attention
# side (the input norm, the one after attention, the Q/K norms); a model adds its own.
ONE_CENTERED_NORMS = (
    "output_norm",
    "blk.{bid}.attn_norm",
    "blk.{bid}.post_attention_norm",
    "blk.{bid}.attn_q_norm",
    "blk.{bid}.attn_k_norm",
)
# The delta net's A_log is stored as -exp(A_log), the decay rate llama.cpp multiplies by.
NEG_EXP = Transform(_neg_exp)
# Unit dimensions dropped (the depthwise conv kernel [channels, 1, k] -> [channels, k]).
SQUEEZE = Transform(_reshape, lambda s, hp: tuple(d for d in s if d != 1))


def add_one(norms: tuple[str, ...]) -> dict[str, tuple[Transform, ...]]:
    """ADD_ONE on each of these norms' weights (GGUF name patterns without `.weight`)."""
    return {f"{n}.weight": (ADD_ONE,) for n in norms}
