"""Launches of the kernels of kernels/*.cu through a `launch(kernel, grid, block, args)`
function: CuPy's RawModule on a GPU, or the CPU emulator in the test suite, so the launch
arithmetic (grids, strides, offsets) is itself tested without a GPU.

Buffers are row-major and contiguous. Q, K and V stay where the fused QKV GEMM put them,
[T, row_stride] with heads side by side at a column offset, and are normed, rotated and
attended in place: no transposes between the GEMMs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ...resources import KERNELS_DIR
from .gemm import F32, GEMV_LANES, GEMV_MAX_X, GEMV_ROWS, DeviceQuantPart, GemmOps
from .geometry import AttentionGeometry

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


class KernelOps(GemmOps):
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
        geo: AttentionGeometry,
        slopes: Any = None,
    ) -> Any:
        self._check(qkv, k_cache, v_cache, *(() if slopes is None else (slopes,)))
        if slopes is not None and slopes.shape != (geo.n_head,):
            raise ValueError(f"ALiBi slopes {slopes.shape} for {geo.n_head} heads")
        T, stride = qkv.shape
        if k_cache.shape[1] != v_cache.shape[1] or geo.n_prefix + T > k_cache.shape[1]:
            raise ValueError(f"KV cache of {k_cache.shape[1]} rows cannot hold {geo.n_prefix + T}")
        out = self.xp.empty((T, geo.out_width), F32)
        self.launch(
            "causal_gqa_attention_f32",
            T * geo.n_head,
            ATTN_THREADS,
            (
                qkv,
                _i64(stride),
                _i32(q_off),
                k_cache,
                v_cache,
                _i64(k_cache.shape[1]),
                _i32(geo.n_prefix),
                out,
                _i64(geo.out_width),
                _i32(T),
                _i32(geo.n_head),
                _i32(geo.n_head_kv),
                _i32(geo.head_dim),
                _i32(geo.head_dim_v),
                F32(geo.scale),
                _i32(geo.window or 0),
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
