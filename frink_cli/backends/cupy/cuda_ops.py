"""The Ops interface (graph/ops.py) over a CUDA kernel table, and the step and KV-cache
context a run hands it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...graph.ops import AttentionCall
from .gemm import F32
from .geometry import AttentionGeometry


class CudaStep:
    """The step context a run passes to the ops: the cache rows before the batch
    (n_prefix), and the batch's cos/sin tables [T, rope_dim/2] per rope key on the device."""

    def __init__(self, n_prefix: int, tables: dict[Any, tuple[Any, Any, int, bool]]) -> None:
        self.n_prefix = n_prefix
        self.tables = tables


class KvRows:
    """A carried layer's device KV cache (K [Hkv, rows, hd_k], V [Hkv, rows, hd_v]) and the
    new rows attention wrote there (views of this step's QKV rows), which the run brings
    back to the host cache in its one download."""

    def __init__(self, k_cache: Any, v_cache: Any) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache
        self.rows: tuple[Any, Any] | None = None


def _locate(view: Any) -> tuple[Any, int]:
    """(buf [T, stride], column offset) of a heads view [T, heads, hd] that sits inside a
    contiguous row buffer -- how the composition's QKV views (graph/blocks/attention.py) reach the
    kernels, which normalize, rotate and attend in place at an offset."""
    root = view
    while root.base is not None:
        root = root.base
    T, _, hd = view.shape
    itemsize = view.dtype.itemsize
    if root.ndim == 2 and root.shape[0] == T and root.flags.c_contiguous:
        buf = root  # the usual case: the QKV GEMM's own [T, stride] output
    elif root is view and view.flags.c_contiguous:
        # Heads of their own (a gained Q, a product): rows of H * hd, offset 0.
        buf = view.reshape(T, -1)
    else:
        # (A one-row view's outer stride is arbitrary, so it is read only for T > 1.)
        stride = view.strides[0] // itemsize
        if T == 1 or view.strides[2] != itemsize or root.size < T * stride:
            raise ValueError(
                f"heads view {view.shape} with strides {view.strides} is not a row-buffer view"
            )
        buf = root.reshape(-1)[: T * stride].reshape(T, stride)
    stride = buf.shape[1]
    if view.strides[2] != itemsize or (view.shape[1] > 1 and view.strides[1] != hd * itemsize):
        raise ValueError(
            f"heads view {view.shape} with strides {view.strides} is not contiguous heads"
        )
    offset = (_address(view) - _address(buf)) // itemsize
    if not 0 <= offset <= stride - view.shape[1] * hd:
        raise ValueError(f"heads view at element offset {offset} lies outside its rows")
    return buf, offset


def _address(a: Any) -> int:
    data = getattr(a, "data", None)
    if data is not None and hasattr(data, "ptr"):  # cupy.ndarray
        return int(data.ptr)
    return int(a.__array_interface__["data"][0])


class CudaOps:
    """The Ops interface (graph/ops.py) over a kernel table: `ReferenceOps` (NumPy, CI) or
    `KernelOps` (kernels/*.cu through CuPy or the CPU emulator). GEMMs go to cuBLAS; norms
    (RMS and Layer), rope, attention (with ALiBi), the activations, the QKV clamp and the
    residual adds to the kernels; the few scalar elementwise decorations use the array
    module's own kernels. Primitives of the blocks eligibility.py refuses (gated delta net,
    MoE, mamba) are not implemented here."""

    def __init__(self, kernels: Any) -> None:
        self.k = kernels
        self.xp = kernels.xp
        # ALiBi slopes on the device, per slope tuple (one per model): uploaded once.
        self._slopes: dict[tuple[float, ...], Any] = {}

    def linear(self, x: Any, w: Any) -> Any:
        y = self.k.matmul(x, w.w)
        if w.b is not None:
            self.k.add_bias(y, w.b)
        return y

    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        if x.ndim == 3:
            return self.rms_norm_(x.copy(), w, eps)
        return self.k.rms_norm(self.xp.ascontiguousarray(x), w, eps)

    def rms_norm_(self, x: Any, w: Any, eps: float) -> Any:
        if x.ndim == 3:  # heads inside the QKV rows: normalized where they lie
            buf, offset = _locate(x)
            self.k.rms_norm_heads(buf, offset, x.shape[1], x.shape[2], w, eps)
            return x
        return self.rms_norm(x, w, eps)

    def add_(self, x: Any, y: Any) -> Any:
        self.k.add(x, self.xp.ascontiguousarray(y))
        return x

    def concat(self, parts: list[Any], axis: int = -1) -> Any:
        return self.xp.concatenate(parts, axis=axis)

    def scale_(self, x: Any, s: float) -> Any:
        x *= F32(s)
        return x

    def softcap_(self, x: Any, cap: float) -> Any:
        return self.xp.tanh(x / F32(cap)) * F32(cap)

    def glu(self, h: Any, act: str) -> Any:
        return self.k.glu(self.xp.ascontiguousarray(h), h.shape[-1] // 2, act)

    def act(self, x: Any, act: str) -> Any:
        return self.k.act(self.xp.ascontiguousarray(x), act)

    def layer_norm(self, x: Any, w: Any, b: Any | None, eps: float) -> Any:
        if x.ndim != 2:
            # The composition norms hidden rows only with LayerNorm (its QK norms are RMS).
            raise NotImplementedError(f"LayerNorm over a {x.ndim}-d array")
        return self.k.layer_norm(self.xp.ascontiguousarray(x), w, b, eps)

    def clamp_(self, x: Any, c: float) -> Any:
        x = self.xp.ascontiguousarray(x)  # (the QKV GEMM's output already is)
        self.k.clamp(x, c)
        return x

    def sigmoid(self, x: Any) -> Any:
        return F32(1.0) / (F32(1.0) + self.xp.exp(-x))

    def sigmoid_mul_(self, x: Any, gate: Any) -> Any:
        return x * self.sigmoid(gate)

    def index(self, values: tuple[int, ...]) -> Any:
        return self.xp.asarray(values)

    def rope_(self, x: Any, pos: CudaStep, rope: Any) -> Any:
        buf, offset = _locate(x)
        cos, sin, dims, neox = pos.tables[rope]
        self.k.rope(buf, offset, x.shape[1], x.shape[2], cos, sin, dims, neox)
        return x

    def attention(
        self, q: Any, k: Any, v: Any, kv: KvRows, pos: CudaStep, call: AttentionCall[Any]
    ) -> Any:
        if call.chunk is not None or call.temperature is not None:
            raise NotImplementedError("chunked attention / temperature (eligibility refuses it)")
        if not call.causal or call.bias is not None:
            raise NotImplementedError(
                "bidirectional attention, relative bias (eligibility refuses them)"
            )
        if call.softcap:
            raise NotImplementedError("attention logit softcap (eligibility refuses it)")
        if call.sinks is not None:
            raise NotImplementedError("attention sinks (eligibility refuses attn_sinks)")
        T, H, hk = q.shape
        Hkv, hv = v.shape[1], v.shape[2]
        P = pos.n_prefix
        kv.k_cache[:, P : P + T] = k.transpose(1, 0, 2)
        kv.v_cache[:, P : P + T] = v.transpose(1, 0, 2)
        kv.rows = (k, v)
        buf, q_off = _locate(q)
        slopes = None
        alibi = call.alibi
        if alibi is not None:
            if alibi not in self._slopes:
                self._slopes[alibi] = self.k.to_device(np.asarray(alibi, dtype=F32))
            slopes = self._slopes[alibi]
        geo = AttentionGeometry(P, H, Hkv, hk, hv, call.scale, call.window)
        return self.k.attention(buf, q_off, kv.k_cache, kv.v_cache, geo, slopes)

    def _refused(self, *args: Any) -> Any:
        raise NotImplementedError(
            "gated delta net / MoE / mamba / lightning primitives: eligibility refuses these layers"
        )

    causal_conv = l2_norm = softplus = delta_rule = route = experts = _refused
    selective_scan = lightning_attention = _refused
