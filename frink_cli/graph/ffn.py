"""The dense gated FFN: down(act(gate(x)) * up(x)), gate/up fused into one matrix."""

from __future__ import annotations

import numpy as np

from ..model.weights import Linear
from .linear import linear

_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def dense_ffn(x: np.ndarray, gate_up: Linear, down: Linear, act: str) -> np.ndarray:
    h = linear(x, gate_up)
    n_ff = gate_up.w.shape[0] // 2
    return linear(ACTIVATIONS[act](h[:, :n_ff]) * h[:, n_ff:], down)
