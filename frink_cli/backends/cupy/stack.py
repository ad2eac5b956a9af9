"""dense_prefill_stack: a run of dense layers over a prompt batch, in one device round trip.

Why one call: on a GPU the cost of prefill is the traffic and the syncs, not the math. The
hidden batch goes up once; every layer's norms, rope, attention, SwiGLU and residual adds
run as kernels between cuBLAS GEMMs on resident weights; every layer's new K/V rows and
the final hidden batch come back in ONE download (one submission in the ledger). Nothing
is written to the host cache here: the backend pushes the K/V rows only after the whole
run has come back, so a run that fails part way leaves every cache as it was.

Written once against `ops` (ops.py) and its array module: NumPy on CI, CuPy on a GPU. The
order of operations is the host body's (graph/body.py), block for block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...model.config import ModelConfig
from ...model.weights import LayerWeights, Linear

F32 = np.float32


@dataclass
class DeviceLinear:
    w: Any  # [out, in] on the device, f32 or f16
    b: Any | None  # [out] f32


@dataclass
class DeviceLayer:
    """One layer's weights, resident on the device from load."""

    attn_norm: Any
    qkv: DeviceLinear
    q_norm: Any | None
    k_norm: Any | None
    wo: DeviceLinear
    post_attn_norm: Any | None
    ffn_norm: Any
    gate_up: DeviceLinear
    down: DeviceLinear
    post_ffn_norm: Any | None


def upload_layer(ops: Any, w: LayerWeights, dtype: Any) -> DeviceLayer:
    """Copy a layer's weights to the device: matrices in `dtype`, vectors in f32."""

    def vec(a: np.ndarray | None) -> Any:
        return None if a is None else ops.to_device(a)

    def lin(x: Linear) -> DeviceLinear:
        return DeviceLinear(ops.to_device(x.w, dtype), vec(x.b))

    return DeviceLayer(
        attn_norm=vec(w.attn_norm), qkv=lin(w.qkv), q_norm=vec(w.q_norm), k_norm=vec(w.k_norm),
        wo=lin(w.wo), post_attn_norm=vec(w.post_attn_norm), ffn_norm=vec(w.ffn_norm),
        gate_up=lin(w.gate_up), down=lin(w.down), post_ffn_norm=vec(w.post_ffn_norm),
    )


def _linear(ops: Any, x: Any, lin: DeviceLinear) -> Any:
    y = ops.matmul(x, lin.w)
    if lin.b is not None:
        ops.add_bias(y, lin.b)
    return y


@dataclass
class StackOutput:
    hidden: np.ndarray  # [T, n_embd]
    k_rows: list[np.ndarray]  # per layer of the run: [T, n_head_kv, head_dim_k]
    v_rows: list[np.ndarray]  # per layer of the run: [T, n_head_kv, head_dim_v]


def dense_prefill_stack(
    ops: Any,
    cfg: ModelConfig,
    layers: Sequence[DeviceLayer],
    rope_tables: Sequence[tuple[np.ndarray, np.ndarray]],
    x: np.ndarray,
    prefixes: Sequence[tuple[np.ndarray, np.ndarray]],
) -> StackOutput:
    """Run `layers` over the hidden batch x [T, n_embd] (host).

    rope_tables[i]: (cos, sin) [T, rope_dim/2] for layer i at the batch's positions.
    prefixes[i]: the cache's rows before the batch for layer i, K [n_head_kv, P, hd_k] and
    V [n_head_kv, P, hd_v] (host arrays; P may be 0).
    """
    xp = ops.xp
    T, d = x.shape
    H, Hkv, hk, hv = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
    q_off, k_off, v_off = 0, H * hk, (H + Hkv) * hk
    kv_width = Hkv * (hk + hv)
    neox = cfg.rope_type == "neox"
    eps = cfg.norm_eps
    n_ff = cfg.n_ff

    # One device buffer for everything that comes back, so it comes back in one copy:
    # the hidden batch, then each layer's [T, K row | V row].
    out = xp.empty(T * d + len(layers) * T * kv_width, F32)
    h_out = out[: T * d].reshape(T, d)
    h_out[...] = ops.to_device(x)
    resid = h_out  # the residual stream, updated in place by the add kernel

    # Layers that share a rope base share their tables: each distinct table goes up once.
    tables: dict[int, Any] = {}

    def table(a: np.ndarray) -> Any:
        if id(a) not in tables:
            tables[id(a)] = ops.to_device(a)
        return tables[id(a)]

    for i, w in enumerate(layers):
        cos, sin = (table(t) for t in rope_tables[i])
        kp, vp = (ops.to_device(p) for p in prefixes[i])

        h = ops.rms_norm(resid, w.attn_norm, eps)
        qkv = _linear(ops, h, w.qkv)  # [T, (H + 2 Hkv) hd]
        if w.q_norm is not None:
            ops.rms_norm_heads(qkv, q_off, H, hk, w.q_norm, eps)
            ops.rms_norm_heads(qkv, k_off, Hkv, hk, w.k_norm, eps)
        ops.rope(qkv, q_off, H, hk, cos, sin, cfg.rope_dim, neox)
        ops.rope(qkv, k_off, Hkv, hk, cos, sin, cfg.rope_dim, neox)
        att = ops.attention(qkv, q_off, k_off, v_off, kp, vp, H, Hkv, hk, hv, cfg.attn_scale)
        a = _linear(ops, att, w.wo)
        if w.post_attn_norm is not None:
            a = ops.rms_norm(a, w.post_attn_norm, eps)
        ops.add(resid, a)

        h = ops.rms_norm(resid, w.ffn_norm, eps)
        f = _linear(ops, ops.swiglu(_linear(ops, h, w.gate_up), n_ff), w.down)
        if w.post_ffn_norm is not None:
            f = ops.rms_norm(f, w.post_ffn_norm, eps)
        ops.add(resid, f)

        base = T * d + i * T * kv_width
        out[base : base + T * kv_width].reshape(T, kv_width)[...] = qkv[:, k_off:]

    host = ops.to_host(out)  # the one sync of the run
    hidden = host[: T * d].reshape(T, d)
    k_rows, v_rows = [], []
    for i in range(len(layers)):
        base = T * d + i * T * kv_width
        kv = host[base : base + T * kv_width].reshape(T, kv_width)
        k_rows.append(kv[:, : Hkv * hk].reshape(T, Hkv, hk))
        v_rows.append(kv[:, Hkv * hk :].reshape(T, Hkv, hv))
    return StackOutput(hidden, k_rows, v_rows)
