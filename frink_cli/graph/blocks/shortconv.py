"""The gated short convolution (llama.cpp's build_shortconv_block; the architectures
that use it name their references)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ops import A, Ops
from .step import each_sequence


@dataclass(frozen=True)
class ShortConvConfig:
    """Short-conv layers: in_proj -> B, C, x; y = C * conv(B * x), a causal depthwise conv
    without bias; out_proj. The recurrent state is the conv tail alone, [conv_kernel-1,
    n_embd] per layer."""

    layers: tuple[bool, ...]  # per layer: a short conv instead of attention
    conv_kernel: int  # shortconv.l_cache: the conv's width (L_cache)

    def state_bytes(self, n_embd: int) -> int:
        """f32 bytes of recurrent state one sequence holds: the conv tail per conv layer."""
        return 4 * (self.conv_kernel - 1) * n_embd * sum(self.layers)


def shortconv(ops: Ops[A], n_embd: int, w: Any, h: A, slot: Any) -> A:
    """Normed rows h [T, n_embd]:

        B, C, x = split(W_in h);  y = C * conv(B * x);  out = W_out y

    conv: causal and depthwise over L_cache taps, no bias. The slot holds the conv tail (the
    last L_cache - 1 rows of B * x) and an empty second state; the new tail is staged on it."""
    d = n_embd
    bcx = ops.linear(h, w.in_proj)

    def conv(slot: Any, _pos: Any, bx: A) -> A:
        tail, state = slot.recurrent_state()
        y, new_tail = ops.causal_conv(bx, tail, w.conv)
        slot.set_recurrent_state(new_tail, state)
        return y

    y = each_sequence(ops, slot, None, conv, bcx[:, :d] * bcx[:, 2 * d :])
    return ops.linear(bcx[:, d : 2 * d] * y, w.out)
