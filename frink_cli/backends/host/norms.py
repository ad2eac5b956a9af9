"""RMSNorm as llama.cpp computes it: x / sqrt(mean(x^2) + eps) * w, in f32; and LayerNorm
(ggml_norm, then its weight and bias): (x - mean) / sqrt(mean((x - mean)^2) + eps) * w + b."""

from __future__ import annotations

import numpy as np

from . import rowwise


def rms_norm(
    x: np.ndarray, weight: np.ndarray | None, eps: float, out: np.ndarray | None = None
) -> np.ndarray:
    """Normalize over the last axis (rows of hidden states, or heads' rows for QK norm);
    into `out` when given (it may be x itself), else into a new array. weight None: no
    weight (a norm whose weight the caller applies in another shape)."""
    done = rowwise.rms_norm(x, weight, eps, out)  # one pass in C, where it takes x
    if done is not None:
        return done
    # One code path for any row count: a row's norm must not depend on the rows beside it
    # (a server's batch; einsum and the ops below reduce each row alone). In place on the
    # small [rows] vector: a decode row pays per NumPy call, not per byte.
    ms = np.asarray(np.einsum("...i,...i->...", x, x))  # a 0-d array, not a scalar, for 1-D x
    ms *= np.float32(1.0 / x.shape[-1])
    ms += np.float32(eps)
    np.sqrt(ms, out=ms)
    np.reciprocal(ms, out=ms)
    out = np.multiply(x, ms[..., None], out=out)
    if weight is not None:
        out *= weight
    return out


def layer_norm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float
) -> np.ndarray:
    """LayerNorm over the last axis into a new array (x is left as it was)."""
    out = x - x.mean(axis=-1, keepdims=True)
    var = np.einsum("...i,...i->...", out, out)[..., None]
    var *= np.float32(1.0 / x.shape[-1])
    var += np.float32(eps)
    np.sqrt(var, out=var)
    out /= var
    out *= weight
    if bias is not None:
        out += bias
    return out
