"""Norms as blocks use them: the model's norm kind, and the optional norm on a branch."""

from __future__ import annotations

from ..ops import A, Ops


def norm(ops: Ops[A], layer_norm: bool, x: A, w: A, b: A | None, eps: float) -> A:
    """x normed into a new array: a LayerNorm (with its bias, if any) when `layer_norm`,
    else an RMSNorm (b unused)."""
    if layer_norm:
        return ops.layer_norm(x, w, b, eps)
    return ops.rms_norm(x, w, eps)


def optional_rms_norm_(ops: Ops[A], y: A, w: A | None, eps: float) -> A:
    """y RMS-normed (in place where the ops may) by w, or y as it is when w is None: a
    post-norm or sub-norm the model may not have."""
    return y if w is None else ops.rms_norm_(y, w, eps)


def scaled(y: A, scale: A | None) -> A:
    """y times a per-tensor scale [1] when there is one."""
    return y if scale is None else y * scale
