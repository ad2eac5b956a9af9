"""dense_stack: a run of dense layers over new rows (a prompt batch or one decode row),
in one device round trip.

Why one call: on a GPU the cost is the traffic and the syncs, not the math. The hidden
rows go up once; every layer's norms, rope, attention, gated activation and residual adds
run as kernels between cuBLAS GEMMs on resident weights, attention reading the layer's
device KV cache (the backend's mirror of the host cache); every layer's new K/V rows and
the final hidden rows -- or, when the run ends the model, the logits -- come back in ONE
download (one submission in the ledger). Nothing is written to the host cache here: the
backend pushes the K/V rows only after the whole run has come back, so a run that fails
part way leaves every host cache as it was.

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
class DeviceHead:
    """The lm head, resident: final norm, output matrix (token_embd's when tied), softcap."""

    norm: Any
    output: DeviceLinear
    softcap: float | None


def upload_head(ops: Any, output_norm: np.ndarray, output: Linear, softcap: float | None, dtype: Any) -> DeviceHead:
    b = None if output.b is None else ops.to_device(output.b)
    return DeviceHead(ops.to_device(output_norm), DeviceLinear(ops.to_device(output.w, dtype), b), softcap or None)


@dataclass
class StackOutput:
    main: np.ndarray  # [T, n_embd] hidden rows, or [rows, n_vocab] logits when a head rode along
    k_rows: list[np.ndarray]  # per layer of the run: [T, n_head_kv, head_dim_k]
    v_rows: list[np.ndarray]  # per layer of the run: [T, n_head_kv, head_dim_v]


def dense_stack(
    ops: Any,
    cfg: ModelConfig,
    layers: Sequence[DeviceLayer],
    windows: Sequence[int | None],
    rope_tables: Sequence[tuple[np.ndarray, np.ndarray]],
    x: np.ndarray,
    kv: Sequence[tuple[Any, Any]],
    n_prefix: int,
    head: DeviceHead | None = None,
    all_logits: bool = False,
) -> StackOutput:
    """Run `layers` over the hidden rows x [T, n_embd] (host) at positions n_prefix.. .

    windows[i]: layer i's sliding window in positions, or None.
    rope_tables[i]: (cos, sin) [T, rope_dim/2] for layer i at the batch's positions.
    kv[i]: layer i's device KV cache (K [n_head_kv, rows, hd_k], V [n_head_kv, rows, hd_v])
    holding positions 0..n_prefix-1; this run writes its rows n_prefix.. there and reads
    attention from it. The caller advances its idea of the cache's length only after the
    run has come back, so rows written by a run that failed are simply written again.
    head: when given, the logits of the last row (or all rows) come back instead of the
    hidden rows, from the same submission.
    """
    xp = ops.xp
    T, d = x.shape
    P = n_prefix
    H, Hkv, hk, hv = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
    q_off, k_off, v_off = 0, H * hk, (H + Hkv) * hk
    kv_width = Hkv * (hk + hv)
    neox = cfg.rope_type == "neox"
    eps = cfg.norm_eps
    n_ff = cfg.n_ff
    main_width = 0 if head is None else (T if all_logits else 1) * cfg.n_vocab
    main_size = T * d if head is None else main_width

    # One device buffer for everything that comes back, so it comes back in one copy:
    # the hidden rows (or logits), then each layer's [T, K row | V row].
    out = xp.empty(main_size + len(layers) * T * kv_width, F32)
    # The residual stream, updated in place by the add kernel: a copy of its own, so the
    # caller's x stays as it was even where the "device" is the host (NumPy standing in).
    resid = ops.to_device(x).copy()

    # Layers that share a rope base share their tables: each distinct table goes up once.
    tables: dict[int, Any] = {}

    def table(a: np.ndarray) -> Any:
        if id(a) not in tables:
            tables[id(a)] = ops.to_device(a)
        return tables[id(a)]

    for i, w in enumerate(layers):
        cos, sin = (table(t) for t in rope_tables[i])
        kc, vc = kv[i]

        h = ops.rms_norm(resid, w.attn_norm, eps)
        qkv = _linear(ops, h, w.qkv)  # [T, (H + 2 Hkv) hd]
        if w.q_norm is not None:
            ops.rms_norm_heads(qkv, q_off, H, hk, w.q_norm, eps)
            ops.rms_norm_heads(qkv, k_off, Hkv, hk, w.k_norm, eps)
        ops.rope(qkv, q_off, H, hk, cos, sin, cfg.rope_dim, neox)
        ops.rope(qkv, k_off, Hkv, hk, cos, sin, cfg.rope_dim, neox)
        kc[:, P : P + T] = qkv[:, k_off:v_off].reshape(T, Hkv, hk).transpose(1, 0, 2)
        vc[:, P : P + T] = qkv[:, v_off:].reshape(T, Hkv, hv).transpose(1, 0, 2)
        att = ops.attention(qkv, q_off, kc, vc, P, H, Hkv, hk, hv, cfg.attn_scale, windows[i])
        a = _linear(ops, att, w.wo)
        if w.post_attn_norm is not None:
            a = ops.rms_norm(a, w.post_attn_norm, eps)
        ops.add(resid, a)

        h = ops.rms_norm(resid, w.ffn_norm, eps)
        f = _linear(ops, ops.glu(_linear(ops, h, w.gate_up), n_ff, cfg.ffn_act), w.down)
        if w.post_ffn_norm is not None:
            f = ops.rms_norm(f, w.post_ffn_norm, eps)
        ops.add(resid, f)

        base = main_size + i * T * kv_width
        out[base : base + T * kv_width].reshape(T, kv_width)[...] = qkv[:, k_off:]

    if head is None:
        out[:main_size].reshape(T, d)[...] = resid
    else:
        rows = resid if all_logits else resid[T - 1 :]
        logits = _linear(ops, ops.rms_norm(xp.ascontiguousarray(rows), head.norm, eps), head.output)
        if head.softcap:
            logits = xp.tanh(logits / F32(head.softcap)) * F32(head.softcap)
        out[:main_size].reshape(logits.shape)[...] = logits

    host = ops.to_host(out)  # the one sync of the run
    main = host[:main_size].reshape(T if head is None or all_logits else 1, -1)
    k_rows, v_rows = [], []
    for i in range(len(layers)):
        base = main_size + i * T * kv_width
        kv_rows = host[base : base + T * kv_width].reshape(T, kv_width)
        k_rows.append(kv_rows[:, : Hkv * hk].reshape(T, Hkv, hk))
        v_rows.append(kv_rows[:, Hkv * hk :].reshape(T, Hkv, hv))
    return StackOutput(main, k_rows, v_rows)
