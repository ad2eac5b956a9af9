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

CHUNK = 64  # tokens whose decays and inputs are formed together in a prefill


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
    for c0 in range(0, T, CHUNK):
        c1 = min(T, c0 + CHUNK)
        # A chunk's decays and inputs at once, [C, d_inner, d_state] each (d_state is small,
        # and CHUNK bounds them for a long prompt on a wide model).
        decay = np.exp(dt[c0:c1, :, None] * a)
        inp = (dt[c0:c1] * x[c0:c1])[:, :, None] * b[c0:c1, None, :]
        for j in range(c1 - c0):
            h = decay[j] * h  # a new array: the caller's state stays intact
            h += inp[j]
            y[c0 + j] = h @ c[c0 + j]
    return y, h
