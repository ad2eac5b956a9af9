"""The dense gated FFN: down(act(gate(x)) * up(x)), gate/up fused into one matrix."""

from __future__ import annotations

import numpy as np

_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def dense_ffn(x: np.ndarray, w_gate_up: np.ndarray, w_down: np.ndarray, act: str) -> np.ndarray:
    h = x @ w_gate_up.T
    n_ff = w_gate_up.shape[0] // 2
    return (ACTIVATIONS[act](h[:, :n_ff]) * h[:, n_ff:]) @ w_down.T
