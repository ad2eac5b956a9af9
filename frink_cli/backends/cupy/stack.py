"""dense_stack: a run of dense layers over new rows (a prompt batch or one decode row),
in one device round trip.

Why one call: on a GPU the cost is the traffic and the syncs, not the math. The hidden
rows go up once; every layer's norms, rope, attention, activations and residual adds
run as kernels between cuBLAS GEMMs on resident weights, attention reading the layer's
device KV cache (the backend's mirror of the host cache); every layer's new K/V rows and
the final hidden rows -- or, when the run ends the model, the logits -- come back in ONE
download (one submission in the ledger). Nothing is written to the host cache here: the
backend pushes the K/V rows only after the whole run has come back, so a run that fails
part way leaves every host cache as it was.

The layer is the architecture's composition (ModelConfig.ext.layer) over CudaOps (cuda_ops.py)
and its array module: NumPy on CI, CuPy on a GPU; this module only holds the resident
weights and packs what comes back into one download.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...model.config import LayerShape, ModelConfig
from ...model.weights import LayerWeights, Linear, map_layer
from ...quant.blocks import QuantRows
from ...quant.kernels import file_order
from .cuda_ops import CudaOps, CudaStep, KvRows
from .gemm import DeviceQuant, DeviceQuantPart

F32 = np.float32


@dataclass
class DeviceLinear:
    w: Any  # [out, in] on the device: f32 or f16, or DeviceQuant (the file's blocks)
    b: Any | None  # [out] f32


def _device_linear(ops: Any, lin: Linear, dtype: Any) -> DeviceLinear:
    b = None if lin.b is None else ops.to_device(lin.b)
    if isinstance(lin.w, QuantRows):
        # Held as the host holds it: the file's blocks, byte for byte (F16 and BF16 too).
        parts = tuple(
            DeviceQuantPart(ops.to_device(file_order(p).data, np.uint8), p.qtype, p.rows, p.cols)
            for p in lin.w.parts
        )
        return DeviceLinear(DeviceQuant(parts, np.dtype(dtype)), b)
    return DeviceLinear(ops.to_device(lin.w, dtype), b)


def upload_layer(ops: Any, w: LayerWeights, dtype: Any) -> LayerWeights:
    """A layer's weights on the device (the host's fields, model.weights.map_layer):
    matrices the host keeps in the file's blocks stay in them (multiplied by
    kernels/quant.cu); the others (f32, or types the host dequantizes at load) in `dtype`;
    vectors in f32."""
    return map_layer(w, ops.to_device, lambda lin: _device_linear(ops, lin, dtype))


@dataclass
class DeviceHead:
    """The lm head, resident: final norm (and its bias, a LayerNorm's) and output matrix
    (token_embd's when tied); its decorations (logit scale, softcap) are the composition's."""

    norm: Any
    output: DeviceLinear
    norm_b: Any | None = None


def upload_head(
    ops: Any,
    output_norm: np.ndarray,
    output: Linear,
    dtype: Any,
    output_norm_b: np.ndarray | None = None,
) -> DeviceHead:
    return DeviceHead(
        ops.to_device(output_norm),
        _device_linear(ops, output, dtype),
        None if output_norm_b is None else ops.to_device(output_norm_b),
    )


@dataclass
class StackOutput:
    main: np.ndarray  # [T, n_embd] hidden rows, or [rows, n_vocab] logits when a head rode along
    k_rows: list[np.ndarray]  # per layer of the run: [T, n_head_kv, head_dim_k]
    v_rows: list[np.ndarray]  # per layer of the run: [T, n_head_kv, head_dim_v]


def dense_stack(
    ops: CudaOps,
    cfg: ModelConfig,
    layers: Sequence[LayerWeights],
    shapes: Sequence[LayerShape],
    rope_keys: Sequence[Any],
    pos: CudaStep,
    x: np.ndarray,
    kv: Sequence[tuple[Any, Any]],
    head: DeviceHead | None = None,
    all_logits: bool = False,
) -> StackOutput:
    """Run `layers` (the architecture's composition over the kernels) on the hidden rows
    x [T, n_embd] (host) at positions pos.n_prefix.. .

    shapes[i], rope_keys[i]: layer i's LayerShape and its key into pos.tables (cos/sin at
    the batch's positions). kv[i]: layer i's device KV cache (K [n_head_kv, rows, hd_k],
    V [n_head_kv, rows, hd_v]) holding positions 0..n_prefix-1; the run writes its rows
    n_prefix.. there and attends over them. The caller advances its idea of the cache's
    length only after the run has come back, so rows written by a run that failed are
    simply written again. head: when given, the logits of the last row (or all rows) come
    back instead of the hidden rows, from the same submission.
    """
    xp = ops.xp
    T, d = x.shape
    hk, hv = cfg.head_dim_k, cfg.head_dim_v
    # Each layer's own KV heads (per-layer sizes), and where its rows sit in the
    # one buffer that comes back.
    n_kv = [s.n_head_kv for s in shapes]
    widths = [h * (hk + hv) for h in n_kv]

    # The residual stream: a copy of its own, so the caller's x stays as it was even where
    # the "device" is the host (NumPy standing in).
    resid = ops.k.to_device(x).copy()
    rows = []
    for w, shape, rope, (kc, vc) in zip(layers, shapes, rope_keys, kv):
        view = KvRows(kc, vc)
        resid = cfg.ext.layer(ops, cfg, shape, w, resid, pos, view, rope)
        assert view.rows is not None  # attention wrote the step's rows (every layer attends)
        rows.append(view.rows)

    if head is None:
        main = resid
    else:
        last = resid if all_logits else resid[T - 1 :]
        main = cfg.ext.head(ops, cfg, head.norm, head.output, last, head.norm_b)
    # One device buffer for everything that comes back, so it comes back in one copy:
    # the hidden rows (or logits), then each layer's [T, K row | V row].
    main_size = main.size
    bases = [main_size + T * sum(widths[:i]) for i in range(len(layers))]
    out = xp.empty(main_size + T * sum(widths), F32)
    out[:main_size].reshape(main.shape)[...] = main
    for (k, v), base, Hkv, width in zip(rows, bases, n_kv, widths):
        block = out[base : base + T * width].reshape(T, width)
        block[:, : Hkv * hk] = k.reshape(T, Hkv * hk)
        block[:, Hkv * hk :] = v.reshape(T, Hkv * hv)

    host = ops.k.to_host(out)  # the one sync of the run
    main_host = host[:main_size].reshape(main.shape)
    k_rows, v_rows = [], []
    for base, Hkv, width in zip(bases, n_kv, widths):
        kv_rows = host[base : base + T * width].reshape(T, width)
        k_rows.append(kv_rows[:, : Hkv * hk].reshape(T, Hkv, hk))
        v_rows.append(kv_rows[:, Hkv * hk :].reshape(T, Hkv, hv))
    return StackOutput(main_host, k_rows, v_rows)
