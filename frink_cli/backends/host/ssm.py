"""Mamba's selective scan on the host: the recurrence at the heart of the mamba mixers.

Why its own module: the scan is a primitive (Ops.selective_scan), not a block; the block
(conv, projections, gates) is composed once in graph/blocks/mamba.py. Per token t and channel i,
with the state h [d_inner, d_state] (the Mamba paper's discretization, as llama.cpp's
ggml_ssm_scan and transformers' MambaMixer slow path compute it):

    h = exp(dt_t[i] * A[i]) * h + (dt_t[i] * x_t[i]) * B_t;   y_t[i] = h[i] . C_t

dt already softplus-ed, A = -exp(A_log) as the converter stores it. Mamba-2 (SSD) is the
same recurrence with its per-head dt and scalar A repeated over the head's channels (A
[d_inner, 1], broadcast over the state) and B_t, C_t per group: channel i reads group
i // (d_inner / G) (llama.cpp's ggml_ssm_scan for mamba2; Mamba-1 is one group). A prefill
takes the same per-token recurrence as a decode row, so a batch is exact against stepping.
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
    """x, dt [T, d_inner]; a [d_inner, d_state] or [d_inner, 1]; b, c [T, G, d_state];
    state [d_inner, d_state] (not modified) -> (y [T, d_inner], the new state)."""
    T, di = x.shape
    G, ds = b.shape[1], b.shape[2]
    y = np.empty_like(x)
    h = state
    for c0 in range(0, T, CHUNK):
        c1 = min(T, c0 + CHUNK)
        n = c1 - c0
        # A chunk's decays and inputs at once, [C, d_inner, d_state] each (d_state is small,
        # and CHUNK bounds them for a long prompt on a wide model; Mamba-2's decays are
        # [C, d_inner, 1]).
        decay = np.exp(dt[c0:c1, :, None] * a)
        xdt = (dt[c0:c1] * x[c0:c1]).reshape(n, G, di // G, 1)
        inp = (xdt * b[c0:c1, :, None, :]).reshape(n, di, ds)
        for j in range(n):
            h = decay[j] * h  # a new array: the caller's state stays intact
            h += inp[j]
            y[c0 + j] = (h.reshape(G, di // G, ds) @ c[c0 + j, :, :, None]).reshape(di)
    return y, h
