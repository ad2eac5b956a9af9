"""Mamba-1's selective scan on the host: the recurrence at the heart of the mamba mixer.

Why its own module: the scan is a primitive (Ops.selective_scan), not a block; the block
(conv, projections, gates) is composed once in graph/layer.py. Per token t and channel i,
with the state h [d_inner, d_state] (the Mamba paper's discretization, as llama.cpp's
ggml_ssm_scan and transformers' MambaMixer slow path compute it):

    h = exp(dt_t[i] * A[i]) * h + (dt_t[i] * x_t[i]) * B_t;   y_t[i] = h[i] . C_t

dt already softplus-ed, A = -exp(A_log) as the converter stores it. A prefill takes the
same per-token recurrence as a decode row, so a batch is exact against stepping.
"""

from __future__ import annotations

import numpy as np


def selective_scan(
    x: np.ndarray,
    dt: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """x, dt [T, d_inner]; a [d_inner, d_state]; b, c [T, d_state]; state [d_inner, d_state]
    (not modified) -> (y [T, d_inner], the new state)."""
    T = x.shape[0]
    y = np.empty_like(x)
    h = state
    # Every token's decay and input at once ([T, d_inner, d_state]: d_state is small).
    decay = np.exp(dt[:, :, None] * a)
    inp = (dt * x)[:, :, None] * b[:, None, :]
    for t in range(T):
        h = decay[t] * h  # a new array: the caller's state stays intact
        h += inp[t]
        y[t] = h @ c[t]
    return y, h
