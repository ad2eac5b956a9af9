"""The ops between the GEMMs, twice: NumPy references and launches of kernels/*.cu.

The stack (stack.py) is written once against an `ops` table and its array module `xp`.
`ReferenceOps` is NumPy: each method is the reference its kernel is tested against, and
with it the whole stack runs on CI machines with no GPU (the test suite also checks each
reference against the host body's own block). `KernelOps` launches the CUDA kernels
through a `launch(kernel, grid, block, args)` function: CuPy's RawModule on a GPU, or the
CPU emulator in the test suite, so the launch arithmetic (grids, strides, offsets) is
itself tested without a GPU.

Buffers are row-major and contiguous. Q, K and V stay where the fused QKV GEMM put them,
[T, row_stride] with heads side by side at a column offset, and are normed, rotated and
attended in place: no transposes between the GEMMs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from ...quant import kernels as host_kernels
from ...quant.blocks import QuantMatrix, first_rows, row_bytes
from ...resources import KERNELS_DIR
from ..host.ffn import ACTIVATIONS
from ..host.norms import layer_norm

F32 = np.float32

# kernels/quant.cu: rows of x one gemv launch takes (FRINK_GEMV_MAX_X), and its block shape
# (FRINK_GEMV_ROWS rows of W per block, FRINK_GEMV_LANES threads per row).
GEMV_MAX_X = 8
GEMV_ROWS = 8
GEMV_LANES = 32
# A prompt's product with a quantized W dequantizes rows into one reusable operand buffer of
# at most this many elements (64 MiB in f32) and hands each tile to cuBLAS; Gemma 3's
# 262k-row head would be 670 MiB as one f32 operand.
QUANT_TILE_ELEMS = 1 << 24


@dataclass(frozen=True)
class DeviceQuantPart:
    """Rows of a weight on the device in the file's own blocks: data is uint8
    [rows, row_bytes], exactly the file's bytes (quant/blocks.py's QuantMatrix, uploaded)."""

    data: Any
    qtype: GGMLQuantizationType
    rows: int
    cols: int

    @property
    def kernel(self) -> str:
        """The type's name in kernels/quant.cu (gemv_q4_k, dequant_q4_k_f32, ...)."""
        return self.qtype.name.lower()

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.qtype, self.cols)


@dataclass(frozen=True)
class DeviceQuant:
    """A weight [rows, cols] held on the device as runs of rows in blocks, one type each (a
    fused QKV of a Q4_K_M file: Q4_K rows, then Q6_K rows); `dtype` is the GEMM operand
    type its prompt tiles are dequantized to (f32, or f16 under FRINK_CUDA_DTYPE)."""

    parts: tuple[DeviceQuantPart, ...]
    dtype: Any

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.rows for p in self.parts), self.parts[0].cols)

    def offsets(self) -> list[int]:
        return first_rows(self.parts)


class _GemmOps:
    """y = x @ W.T, for W [out, in] resident as a dense f32 or f16 matrix (through the array
    module: cuBLAS under CuPy; f16 rounds x to f16, cuBLAS accumulates in f32, the result
    comes back in f32) or in the file's blocks (DeviceQuant): up to GEMV_MAX_X rows of x
    read the blocks once through the gemv kernel, more rows multiply tiles of W
    dequantized into one reusable buffer. Each table supplies `gemv` and
    `dequantize`."""

    xp: Any

    def matmul(self, x: Any, w: Any) -> Any:
        if isinstance(w, DeviceQuant):
            return self._quant_matmul(x, w)
        xp = self.xp
        # Contiguous results: the kernels that follow index rows by a fixed stride.
        if w.dtype == F32:
            return xp.ascontiguousarray(xp.matmul(x, w.T))
        return xp.ascontiguousarray(xp.matmul(x.astype(w.dtype), w.T), dtype=F32)

    def _quant_matmul(self, x: Any, w: DeviceQuant) -> Any:
        x = self.xp.ascontiguousarray(x, dtype=F32)
        T = x.shape[0]
        rows, cols = w.shape
        y = self.xp.empty((T, rows), F32)
        if T == 0:
            return y
        for part, r0 in zip(w.parts, w.offsets()):
            if T <= GEMV_MAX_X:
                self.gemv(part, x, y, r0)
                continue
            n = max(1, QUANT_TILE_ELEMS // cols)
            for a in range(0, part.rows, n):
                b = min(part.rows, a + n)
                y[:, r0 + a : r0 + b] = self.matmul(x, self.dequantize(part, a, b, w.dtype))
        return y

    def gemv(self, part: DeviceQuantPart, x: Any, y: Any, col: int) -> None:
        """y[:, col : col + part.rows] = x @ part.T for at most GEMV_MAX_X rows of x, in f32."""
        raise NotImplementedError

    def dequantize(self, part: DeviceQuantPart, start: int, stop: int, dtype: Any) -> Any:
        """Rows [start, stop) of part as a dense [n, cols] operand of dtype (f32 or f16),
        possibly a view of a buffer the next call reuses."""
        raise NotImplementedError

    def to_device(self, a: np.ndarray, dtype: Any = F32) -> Any:
        return self.xp.asarray(np.ascontiguousarray(a), dtype=dtype)

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(a)


def _heads(buf: np.ndarray, offset: int, heads: int, head_dim: int) -> np.ndarray:
    """The [T, heads, head_dim] view of the heads at column `offset` of every row."""
    view = buf[:, offset : offset + heads * head_dim].reshape(buf.shape[0], heads, head_dim)
    # Writes through the view must land in buf: reshape may not have copied.
    if not np.shares_memory(view, buf):
        raise RuntimeError("QKV heads view is a copy")
    return view


def _host_matrix(part: DeviceQuantPart) -> QuantMatrix:
    return QuantMatrix(np.asarray(part.data), part.qtype, part.rows, part.cols)


class ReferenceOps(_GemmOps):
    """The NumPy reference of every kernel (same arguments, same in-place behaviour)."""

    xp = np

    def gemv(self, part: DeviceQuantPart, x: np.ndarray, y: np.ndarray, col: int) -> None:
        """gemv_<type>: x @ dequantize(W).T in f32 -- the host kernels' exact-activation dots,
        which read the blocks as they go (no f32 copy of a 262k-row head per token)."""
        with host_kernels.exact_activations():
            y[:, col : col + part.rows] = host_kernels.dots(x, _host_matrix(part))

    def dequantize(self, part: DeviceQuantPart, start: int, stop: int, dtype: Any) -> np.ndarray:
        """dequant_<type>_f32 / _f16: gguf-py's values (the host kernels equal them bit for
        bit), rounded to f16 to nearest even for an f16 operand."""
        w = host_kernels.dequantize_rows(_host_matrix(part), start, stop)
        return w if np.dtype(dtype) == F32 else w.astype(dtype)

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        """rms_norm_f32 over rows of x [n, d] -> a new array."""
        ms = np.einsum("...i,...i->...", x, x) / F32(x.shape[-1])
        scale = 1.0 / np.sqrt(ms + F32(eps), dtype=F32)
        return (x * scale[..., None]) * w

    def rms_norm_heads(
        self, buf: np.ndarray, offset: int, heads: int, head_dim: int, w: np.ndarray, eps: float
    ) -> None:
        """rms_norm_f32 in place on `heads` heads at column `offset` of every row (QK norm)."""
        view = _heads(buf, offset, heads, head_dim)
        view[...] = self.rms_norm(view, w, eps)

    def rope(
        self,
        buf: np.ndarray,
        offset: int,
        heads: int,
        head_dim: int,
        cos: np.ndarray,
        sin: np.ndarray,
        rope_dim: int,
        neox: bool,
    ) -> None:
        """rope_f32 in place; cos/sin [T, rope_dim/2] for each row's position."""
        x = _heads(buf, offset, heads, head_dim)
        c, s = cos[:, None, :], sin[:, None, :]
        d = rope_dim
        ia, ib = (slice(0, d // 2), slice(d // 2, d)) if neox else (slice(0, d, 2), slice(1, d, 2))
        a, b = x[..., ia].copy(), x[..., ib].copy()
        x[..., ia] = a * c - b * s
        x[..., ib] = b * c + a * s

    def attention(
        self,
        qkv: np.ndarray,
        q_off: int,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        n_prefix: int,
        n_head: int,
        n_head_kv: int,
        head_dim: int,
        head_dim_v: int,
        scale: float,
        window: int | None,
        slopes: np.ndarray | None = None,
    ) -> np.ndarray:
        """causal_gqa_attention_f32: new rows t = 0..T-1 at positions n_prefix + t over
        the cache rows 0..n_prefix + t (the new rows' K/V already written there), or the
        last `window` of them. k_cache/v_cache [n_head_kv, rows, hd]; returns
        [T, n_head * head_dim_v]. slopes [n_head]: ALiBi, head h's score against position
        j gets -slopes[h] * (its position - j)."""
        T = qkv.shape[0]
        S = n_prefix + T
        H, Hkv, g = n_head, n_head_kv, n_head // n_head_kv
        q = qkv[:, q_off : q_off + H * head_dim].reshape(T, H, head_dim)
        K, V = k_cache[:, :S], v_cache[:, :S]  # [Hkv, S, hd]
        qg = (q * F32(scale)).transpose(1, 0, 2).reshape(Hkv, g * T, head_dim)
        scores = (qg @ K.transpose(0, 2, 1)).reshape(Hkv, g, T, S)
        pos = n_prefix + np.arange(T)
        if slopes is not None:
            dist = (pos[:, None] - np.arange(S)[None, :]).astype(F32)  # [T, S]
            scores -= slopes.reshape(Hkv, g, 1, 1) * dist
        visible = np.arange(S)[None, :] <= pos[:, None]
        if window is not None:
            visible &= pos[:, None] - np.arange(S)[None, :] < window
        scores += np.where(visible, F32(0.0), F32(-np.inf))
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out = scores.reshape(Hkv, g * T, S) @ V
        return np.ascontiguousarray(
            out.reshape(H, T, head_dim_v).transpose(1, 0, 2).reshape(T, H * head_dim_v)
        )

    def glu(self, gu: np.ndarray, n_ff: int, act: str) -> np.ndarray:
        """glu_f32: act(gate) * up over [T, 2*n_ff] (gate columns first); act is "silu" or
        "gelu_tanh", the host body's own functions."""
        return ACTIVATIONS[act](gu[:, :n_ff]) * gu[:, n_ff:]

    def act(self, x: np.ndarray, act: str) -> np.ndarray:
        """act_f32: act(x) into a new array (the plain FFN's activation)."""
        return ACTIVATIONS[act](x)

    def layer_norm(
        self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float
    ) -> np.ndarray:
        """layer_norm_f32 over rows of x [n, d] -> a new array: the host body's own."""
        return layer_norm(x, w, b, eps)

    def clamp(self, x: np.ndarray, c: float) -> None:
        """clamp_f32: x clipped to [-c, c] in place."""
        np.clip(x, F32(-c), F32(c), out=x)

    def add(self, x: np.ndarray, a: np.ndarray) -> None:
        """add_f32: x += a."""
        x += a

    def add_bias(self, y: np.ndarray, b: np.ndarray) -> None:
        """add_bias_f32: y[r] += b."""
        y += b


# --- the kernels ---------------------------------------------------------------------------

KERNEL_FILES = (
    "rms_norm.cu",
    "layer_norm.cu",
    "rope.cu",
    "elementwise.cu",
    "attention.cu",
    "quant.cu",
)
# Threads per block: a power of two (the block reductions halve it), at most 256.
ROW_THREADS = 256
ATTN_THREADS = 128
ELEMENTWISE_THREADS = 256
# Grid-stride loops need no more blocks than this to fill any current GPU.
MAX_BLOCKS = 65535
# The `act` codes of glu_f32 and act_f32 (FRINK_ACT_* in elementwise.cu), by the config's
# activation name: every activation the kernels carry.
ACT_CODES = {"silu": 0, "gelu_tanh": 1}


def kernel_source(name: str) -> str:
    """A kernel file as one self-contained source: NVRTC (CuPy's RawModule) gets no include
    path, so common.cuh is pasted where it is included."""
    text = (KERNELS_DIR / name).read_text()
    common = (KERNELS_DIR / "common.cuh").read_text().replace("#pragma once", "")
    return text.replace('#include "common.cuh"', common)


def kernel_names(name: str) -> list[str]:
    """The extern "C" kernels of a kernel file: those written out, and the three per type
    each FRINK_QUANT_KERNELS(type) line of quant.cu expands to."""
    source = kernel_source(name)
    names = re.findall(r'extern "C" __global__ void (\w+)\(', source)
    for t in re.findall(r"^FRINK_QUANT_KERNELS\((\w+)\)", source, re.M):
        names += [f"gemv_{t}", f"dequant_{t}_f32", f"dequant_{t}_f16"]
    return names


Launch = Callable[[str, int, int, tuple], None]


def _i32(v: int) -> np.int32:
    return np.int32(v)


def _i64(v: int) -> np.int64:
    return np.int64(v)


def _blocks(n: int, threads: int) -> int:
    return max(1, min(MAX_BLOCKS, -(-n // threads)))


class KernelOps(_GemmOps):
    """The kernels of kernels/*.cu, launched through `launch(name, grid, block, args)`.
    Integer arguments are passed as the exact C types the kernels declare (int32 for int,
    int64 for long long, float32 for float): a launcher copies their bytes as they are."""

    def __init__(self, xp: Any, launch: Launch) -> None:
        self.xp = xp
        self.launch = launch
        # The prompt path's dequantized tiles, one growing buffer per operand type: kernels
        # on one stream run in order, so a tile's GEMM has read it before the next
        # dequantize overwrites it.
        self._tiles: dict[Any, Any] = {}

    def gemv(self, part: DeviceQuantPart, x: Any, y: Any, col: int) -> None:
        self._check(x, y)
        T, cols = x.shape
        if not 0 < T <= GEMV_MAX_X or cols != part.cols or col + part.rows > y.shape[1]:
            raise ValueError(f"gemv of {T} rows of {cols} into {y.shape} at {col}: {part.qtype}")
        self.launch(
            f"gemv_{part.kernel}",
            -(-part.rows // GEMV_ROWS),
            GEMV_ROWS * GEMV_LANES,
            (
                part.data,
                _i64(part.row_bytes),
                _i32(part.rows),
                _i32(cols),
                x,
                _i64(cols),
                _i32(T),
                y,
                _i64(y.shape[1]),
                _i32(col),
            ),
        )

    def dequantize(self, part: DeviceQuantPart, start: int, stop: int, dtype: Any) -> Any:
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(F32), np.dtype(np.float16)):
            raise ValueError(f"no dequantize kernel to {dtype}")
        n = (stop - start) * part.cols
        buf = self._tiles.get(dtype)
        if buf is None or buf.size < n:
            buf = self._tiles[dtype] = self.xp.empty(n, dtype)
        out = buf[:n].reshape(stop - start, part.cols)
        suffix = "f32" if dtype == np.dtype(F32) else "f16"
        runs = (stop - start) * (-(-part.cols // 32))
        self.launch(
            f"dequant_{part.kernel}_{suffix}",
            _blocks(runs, ELEMENTWISE_THREADS),
            ELEMENTWISE_THREADS,
            (part.data[start:stop], _i64(part.row_bytes), _i32(stop - start), _i32(part.cols), out),
        )
        return out

    def _check(self, *arrays: Any) -> None:
        for a in arrays:
            if a.dtype != F32 or not a.flags.c_contiguous:
                raise ValueError(
                    f"kernel operand must be contiguous float32, got {a.dtype} {a.shape}"
                )

    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        self._check(x, w)
        n, d = x.shape
        y = self.xp.empty_like(x)
        self.launch(
            "rms_norm_f32",
            n,
            ROW_THREADS,
            (x, y, w, _i32(n), _i32(d), _i32(1), _i64(d), _i64(d), F32(eps)),
        )
        return y

    def rms_norm_heads(
        self, buf: Any, offset: int, heads: int, head_dim: int, w: Any, eps: float
    ) -> None:
        self._check(buf, w)
        T, stride = buf.shape
        # A view at the offset: CuPy and the emulator both pass a view's own start address.
        view = buf.reshape(-1)[offset:]
        n = T * heads
        self.launch(
            "rms_norm_f32",
            n,
            ROW_THREADS,
            (
                view,
                view,
                w,
                _i32(n),
                _i32(head_dim),
                _i32(heads),
                _i64(stride),
                _i64(stride),
                F32(eps),
            ),
        )

    def rope(
        self,
        buf: Any,
        offset: int,
        heads: int,
        head_dim: int,
        cos: Any,
        sin: Any,
        rope_dim: int,
        neox: bool,
    ) -> None:
        self._check(buf, cos, sin)
        T, stride = buf.shape
        n = T * heads * (rope_dim // 2)
        self.launch(
            "rope_f32",
            -(-n // ELEMENTWISE_THREADS),
            ELEMENTWISE_THREADS,
            (
                buf,
                cos,
                sin,
                _i32(T),
                _i32(heads),
                _i32(head_dim),
                _i64(stride),
                _i32(offset),
                _i32(rope_dim),
                _i32(1 if neox else 0),
            ),
        )

    def attention(
        self,
        qkv: Any,
        q_off: int,
        k_cache: Any,
        v_cache: Any,
        n_prefix: int,
        n_head: int,
        n_head_kv: int,
        head_dim: int,
        head_dim_v: int,
        scale: float,
        window: int | None,
        slopes: Any | None = None,
    ) -> Any:
        self._check(qkv, k_cache, v_cache, *(() if slopes is None else (slopes,)))
        if slopes is not None and slopes.shape != (n_head,):
            raise ValueError(f"ALiBi slopes {slopes.shape} for {n_head} heads")
        T, stride = qkv.shape
        if k_cache.shape[1] != v_cache.shape[1] or n_prefix + T > k_cache.shape[1]:
            raise ValueError(f"KV cache of {k_cache.shape[1]} rows cannot hold {n_prefix + T}")
        out = self.xp.empty((T, n_head * head_dim_v), F32)
        self.launch(
            "causal_gqa_attention_f32",
            T * n_head,
            ATTN_THREADS,
            (
                qkv,
                _i64(stride),
                _i32(q_off),
                k_cache,
                v_cache,
                _i64(k_cache.shape[1]),
                _i32(n_prefix),
                out,
                _i64(n_head * head_dim_v),
                _i32(T),
                _i32(n_head),
                _i32(n_head_kv),
                _i32(head_dim),
                _i32(head_dim_v),
                F32(scale),
                _i32(window or 0),
                # Without ALiBi the kernel never reads the slopes; qkv stands in for them.
                qkv if slopes is None else slopes,
                _i32(slopes is not None),
            ),
        )
        return out

    def glu(self, gu: Any, n_ff: int, act: str) -> Any:
        self._check(gu)
        T = gu.shape[0]
        h = self.xp.empty((T, n_ff), F32)
        self.launch(
            "glu_f32",
            _blocks(T * n_ff, ELEMENTWISE_THREADS),
            ELEMENTWISE_THREADS,
            (gu, h, _i64(T), _i32(n_ff), _i32(ACT_CODES[act])),
        )
        return h

    def act(self, x: Any, act: str) -> Any:
        self._check(x)
        y = self.xp.empty_like(x)
        self.launch(
            "act_f32",
            _blocks(x.size, ELEMENTWISE_THREADS),
            ELEMENTWISE_THREADS,
            (x, y, _i64(x.size), _i32(ACT_CODES[act])),
        )
        return y

    def layer_norm(self, x: Any, w: Any, b: Any | None, eps: float) -> Any:
        self._check(x, w, *(() if b is None else (b,)))
        n, d = x.shape
        y = self.xp.empty_like(x)
        # Without a bias the kernel never reads b; w stands in for the pointer CuPy needs.
        self.launch(
            "layer_norm_f32",
            n,
            ROW_THREADS,
            (x, y, w, w if b is None else b, _i32(b is not None), _i32(n), _i32(d), F32(eps)),
        )
        return y

    def clamp(self, x: Any, c: float) -> None:
        self._check(x)
        self.launch(
            "clamp_f32",
            _blocks(x.size, ELEMENTWISE_THREADS),
            ELEMENTWISE_THREADS,
            (x, _i64(x.size), F32(c)),
        )

    def add(self, x: Any, a: Any) -> None:
        self._check(x, a)
        n = x.size
        self.launch(
            "add_f32", _blocks(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, (x, a, _i64(n))
        )

    def add_bias(self, y: Any, b: Any) -> None:
        self._check(y, b)
        T, n = y.shape
        self.launch(
            "add_bias_f32",
            _blocks(T * n, ELEMENTWISE_THREADS),
            ELEMENTWISE_THREADS,
            (y, b, _i64(T), _i32(n)),
        )


# --- the Ops interface over the kernels ----------------------------------------------------


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
        # Heads of their own (talkie's gained Q, a product): rows of H * hd, offset 0.
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
        self,
        q: Any,
        k: Any,
        v: Any,
        kv: KvRows,
        pos: CudaStep,
        window: int | None,
        scale: float,
        softcap: float | None,
        alibi: tuple[float, ...] | None = None,
        sinks: Any | None = None,
    ) -> Any:
        if softcap:
            raise NotImplementedError("attention logit softcap (eligibility refuses it)")
        if sinks is not None:
            raise NotImplementedError("attention sinks (eligibility refuses attn_sinks)")
        T, H, hk = q.shape
        Hkv, hv = v.shape[1], v.shape[2]
        P = pos.n_prefix
        kv.k_cache[:, P : P + T] = k.transpose(1, 0, 2)
        kv.v_cache[:, P : P + T] = v.transpose(1, 0, 2)
        kv.rows = (k, v)
        buf, q_off = _locate(q)
        slopes = None
        if alibi is not None:
            if alibi not in self._slopes:
                self._slopes[alibi] = self.k.to_device(np.asarray(alibi, dtype=F32))
            slopes = self._slopes[alibi]
        return self.k.attention(
            buf, q_off, kv.k_cache, kv.v_cache, P, H, Hkv, hk, hv, scale, window, slopes
        )

    def _refused(self, *args: Any) -> Any:
        raise NotImplementedError(
            "gated delta net / MoE / mamba primitives: eligibility refuses these layers"
        )

    causal_conv = l2_norm = softplus = delta_rule = route = experts = _refused
    selective_scan = _refused
