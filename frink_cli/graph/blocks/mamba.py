"""Mamba-1 and Mamba-2 selective state-space mixers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ops import A, Ops
from .step import each_sequence


@dataclass(frozen=True)
class MambaConfig:
    """Mamba layers: Mamba-1 (llama.cpp `mamba`) or Mamba-2 (`mamba2`: n_group > 0). Every
    layer a selective state-space mixer with no attention and no FFN, unless `layers` names
    the mamba layers of a hybrid stack. Per layer the recurrent state is the conv tail
    [conv_kernel-1, conv_dim] and the scan state [d_inner, d_state] (Mamba-2's
    [n_head, head_dim, d_state], flattened the same way)."""

    conv_kernel: int  # ssm.conv_kernel: width of the causal depthwise conv
    d_inner: int  # ssm.inner_size: the expanded width (x and z each)
    d_state: int  # ssm.state_size: N, the state per channel
    # ssm.time_step_rank: Mamba-1's low-rank width dt is projected from; Mamba-2's head
    # count (one dt, A and D per head), as llama.cpp reads it.
    dt_rank: int
    # ssm.dt_b_c_rms: RMSNorms on dt, B and C before they are used.
    dt_b_c_rms: bool = False
    # ssm.group_count: Mamba-2's B/C groups (heads h*G/n_head .. share one); 0: Mamba-1.
    n_group: int = 0
    # Per layer: a mamba mixer (hybrid stacks); None: every layer is one.
    layers: tuple[bool, ...] | None = None
    # Each mamba mixer runs beside the layer's attention (mixer "attention+mamba2"), not
    # instead of it.
    parallel: bool = False
    # A Mamba-1 mixer with heads (group_count 0 with heads in llama.cpp's keys): dt, A and
    # D one per head of d_inner / heads channels, dt_rank being then x_proj's dt width. 0:
    # per channel. The architecture's reader lays its tensors out as Mamba-1's.
    heads: int = 0

    @property
    def version2(self) -> bool:
        return self.n_group > 0

    @property
    def conv_dim(self) -> int:
        """Channels of the conv (and its tail): x (Mamba-1); x, B and C (Mamba-2)."""
        return self.d_inner + (2 * self.n_group * self.d_state if self.version2 else 0)

    def is_layer(self, layer: int) -> bool:
        return self.layers is None or self.layers[layer]

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv tail, scan state) shapes of one layer's recurrent state."""
        return (self.conv_kernel - 1, self.conv_dim), (self.d_inner, self.d_state)

    def state_bytes(self, n_layer: int) -> int:
        """f32 bytes of recurrent state one sequence holds: conv tail + scan state per layer."""
        per_layer = (self.conv_kernel - 1) * self.conv_dim + self.d_inner * self.d_state
        n = n_layer if self.layers is None else sum(self.layers)
        return 4 * per_layer * n


def mamba(ops: Ops[A], m: MambaConfig, eps: float, w: Any, h: A, slot: Any) -> A:
    """Mamba-1's selective state-space mixer (llama.cpp's build_mamba_layer, transformers'
    MambaMixer), over normed rows h [T, n_embd]:

        x, z = split(W_in h);  x = silu(conv(x) + conv_b)        causal depthwise conv
                                                          (no conv_b: none added)
        dt, B, C = split(W_x x)      (each RMS-normed when w has dt/b/c norms)
        dt = softplus(W_dt dt + dt_bias)
        h = exp(dt A) h + dt x B;  y = C.h + D x                 per channel (selective_scan)
        out = W_out (y * silu(z))

    The slot holds the conv tail and the scan state [d_inner, d_state]; the new ones are
    staged on it."""
    di, ds, r = m.d_inner, m.d_state, m.dt_rank
    xz = ops.linear(h, w.in_proj)

    def scan(slot: Any, _pos: Any, xz: A) -> A:
        tail, state = slot.recurrent_state()
        x, new_tail = ops.causal_conv(xz[:, :di], tail, w.conv)
        if w.conv_b is not None:
            x = ops.add_(x, w.conv_b)
        x = ops.act(x, "silu")
        dbc = ops.linear(x, w.x_proj)
        dt, b, c = dbc[:, :r], dbc[:, r : r + ds], dbc[:, r + ds :]
        if w.dt_norm is not None:
            dt = ops.rms_norm(dt, w.dt_norm, eps)
            b = ops.rms_norm(b, w.b_norm, eps)
            c = ops.rms_norm(c, w.c_norm, eps)
        dt = ops.softplus(ops.linear(dt, w.dt_proj))
        y, new_state = ops.selective_scan(x, dt, w.a, b[:, None], c[:, None], state)
        slot.set_recurrent_state(new_tail, new_state)
        return ops.add_(y, x * w.d) * ops.act(xz[:, di:], "silu")

    return ops.linear(each_sequence(ops, slot, None, scan, xz), w.out)


def mamba2(ops: Ops[A], m: MambaConfig, eps: float, w: Any, h: A, slot: Any) -> A:
    """Mamba-2's SSD mixer (llama.cpp's build_mamba2_layer, transformers' Mamba2Mixer), over
    normed rows h [T, n_embd], with n_head heads of head_dim channels and G groups:

        z, xBC, dt = split(W_in h);  xBC = silu(conv(xBC) + conv_b)   causal depthwise conv
        x, B, C = split(xBC)            B, C [G, d_state] per token: head h reads group
                                        h // (n_head / G)
        dt = softplus(dt + dt_bias);  A = -exp(A_log)                 one each per head
        h = exp(dt A) h + dt x B;  y = C.h + D x      per head, state [head_dim, d_state]
        out = W_out (rmsnorm_per_group(y * silu(z)) * norm_w)     (no norm when w.norm is None)

    The scan is Mamba-1's primitive with each head's dt and A repeated over its channels.
    The slot holds the conv tail and the scan state [d_inner, d_state]; the new ones are
    staged on it."""
    di, ds, G, T = m.d_inner, m.d_state, m.n_group, h.shape[0]
    conv_dim = m.conv_dim
    proj = ops.linear(h, w.in_proj)
    head_dim = di // m.dt_rank
    heads = ops.index(tuple(i // head_dim for i in range(di)))  # each channel's head
    dt = ops.softplus(ops.add_(proj[:, di + conv_dim :], w.dt_bias))[:, heads]

    def scan(slot: Any, _pos: Any, conv_in: A, dt: A) -> A:
        t = conv_in.shape[0]
        tail, state = slot.recurrent_state()
        xbc, new_tail = ops.causal_conv(conv_in, tail, w.conv)
        xbc = ops.act(ops.add_(xbc, w.conv_b), "silu")
        x = xbc[:, :di]
        b = xbc[:, di : di + G * ds].reshape(t, G, ds)
        c = xbc[:, di + G * ds :].reshape(t, G, ds)
        y, new_state = ops.selective_scan(x, dt, w.a[heads][:, None], b, c, state)
        slot.set_recurrent_state(new_tail, new_state)
        return ops.add_(y, x * w.d[heads])

    y = each_sequence(ops, slot, None, scan, proj[:, di : di + conv_dim], dt)
    y = y * ops.act(proj[:, :di], "silu")
    if w.norm is not None:
        y = (ops.rms_norm_(y.reshape(T, G, di // G), None, eps) * w.norm).reshape(T, di)
    return ops.linear(y, w.out)
