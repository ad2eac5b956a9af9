"""The dense FFNs: gated (down(act(gate(h)) * up(h)), gate/up fused into one matrix) and
plain (down(act(up(h))))."""

from __future__ import annotations

from typing import Any

from ..ops import A, Ops
from .norms import optional_rms_norm_


def gated_ffn(ops: Ops[A], act: str, w: Any, h: A, eps: float) -> A:
    """down(sub_norm(act(gate(h)) * up(h))): w holds gate_up [2*n_ff, n_embd] (gate rows,
    then up rows), down, and the optional ffn_sub_norm [n_ff] on the rows down reads."""
    g = ops.glu(ops.linear(h, w.gate_up), act)
    return ops.linear(optional_rms_norm_(ops, g, w.ffn_sub_norm, eps), w.down)


def plain_ffn(ops: Ops[A], act: str, w: Any, h: A) -> A:
    """down(act(up(h))): w holds up [n_ff, n_embd] and down."""
    return ops.linear(ops.act(ops.linear(h, w.up), act), w.down)
