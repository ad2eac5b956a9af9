"""Multiplying by a weight kept in the GGUF file's blocks: the host kernels' public face.

    y = dots(x, w)              # a few rows of x (decode, a server's batch): fused dots
    y = matmul_f32(x, w32)      # a few rows of x times an f32 W (the host's decode rows)
    y = matmul(x, w)            # prefill: dots over blocks of rows, or AMX int8 tiles
    y = gemm_f32(x, w32)        # prefill times an f32 W without the compiled kernels: BLAS
    y = linear(x, w)            # whichever of the two suits x's row count
    a = dequantize_rows(w, start, stop, out=buf)   # rows as f32: gguf-py's values exactly
    a = take_rows(w, index, out=buf)               # by index (embeddings, expert rows)

The products are float32 [T, rows]: `matmul` (and `dots` with exact activations) give
x @ dequantize(W).T up to f32 summation order (~1e-7 relative); `dots` by default rounds
each row of x to 8 bits per 32 columns first, as llama.cpp does for its quantized dot
products (where the CPU has byte dot products: AVX-512 VNNI, AVX2), and then gives
dequantize(q8(x)) @ dequantize(W).T to ~1e-7 (~5e-3 from the exact product).
`activations()` says which; FRINK_EXACT_ACTIVATIONS=1 or `exact_activations()` keeps x
exact. Why compiled kernels: a decode step reads every weight
once per token; f32 weights are 4 bytes each where a Q4_0 weight is 0.56, and read
straight from the blocks the bytes a token costs shrink with them.

The kernels are C (native.c, compiled when frink is installed; the best of AVX-512,
AVX2 with AVX-VNNI, AVX2 and the baseline picked at load; FRINK_NATIVE_ISA forces one,
and one this CPU cannot run is refused by `check_isa`, never replaced by NumPy). Where the
CPU has AMX int8 tiles and Linux grants them (ISA "avx512+amx"; FRINK_NATIVE_ISA=avx512
leaves them out), `matmul` with 8-bit activations multiplies x's 8-bit codes by W's
codes on the tiles (native_amx.h): the 8-bit dots' products, summed in another order
(~1e-7 relative), ~3-4x BLAS's f32 rate on a prompt's rows; `prompt_tiles()` says whether
it does.

`dots` makes each row's sums in one order whatever rows are beside it, so a row's
product is the same bit for bit alone or in any batch (a server's answers rely on it);
`matmul` and `matmul_f32` give a prompt's rows those same sums (AMX tiles apart), so a
prompt cut into other chunks keeps its bits too. Without the compiled module (no
compiler at install time, or FRINK_NO_NATIVE=1) every function still works: tiles of rows
dequantized by gguf-py, multiplied by BLAS, never more than a tile of f32 at a time.
`kernel_path()` says which is running.

Threads: the compiled kernels run on OpenMP threads, as many as `threads(n)` allows in
the calling thread (all cores by default; FRINK_THREADS=n sets the count outright, above
the core count too). `matmul`'s and `gemm_f32`'s tiles over BLAS run on as many Python
threads, each calling BLAS with one thread. The count never changes a result: each output
element of the compiled kernels is one row's sum, made by one thread in a fixed order, and
`matmul`'s tiles are cut from W's shape alone, each one a single-threaded BLAS call, so
which thread runs a tile changes nothing. (A multithreaded GEMM does not promise that:
OpenBLAS's Haswell kernels round differently on one and two threads, and 8-bit
activations amplify such an ulp into a different token.)
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from types import ModuleType

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as _gguf_dequantize

from ..errors import FrinkError
from .blas import blas_threads
from .blocks import PANEL_ROWS, QuantMatrix, first_rows

# Up to this many rows of x go through dots, more through tiles + BLAS (a tile + BLAS
# pays for its dequantization only when enough rows share it).
SMALL_T = 16
# matmul's largest tile: this many f32 (4 MiB), so each BLAS call has enough columns of
# the product to run at GEMM speed while the tile stays in the last-level cache.
TILE_ELEMS = 1 << 20
# matmul cuts W into about this many tiles of rows, a multiple of TILE_ROW_STEP rows each
# (more where a tile would pass TILE_ELEMS, fewer where it would drop under TILE_MIN_ROWS,
# below which BLAS's per-call packing of x shows): enough for the threads to share, cut
# from W's shape alone so the thread count never moves a tile's edges.
TILE_COUNT = 8
TILE_ROW_STEP = 32
TILE_MIN_ROWS = 64
# From this many rows of x, matmul's tiles multiply as x @ tile.T (see _numpy_matmul).
FEW_ROWS_TILE = 64
# The compiled module's type number for a plain f32 matrix (ggml's F32).
_F32 = 0
# The 2-byte float types: their products keep x in f32 (no codes to multiply as bytes).
_HALF_TYPES = frozenset({T.F16, T.BF16})


# How long an OpenMP worker spins for more work after a call before it sleeps, in libgomp's
# iterations (its default, 300000, is ~10 ms here). A prompt's step alternates kernel
# calls with attention's two Python threads and BLAS; a worker still spinning holds one
# of two cores through them. 30000 (~1 ms) still bridges a decode token's back-to-back
# calls. Measured on Gemma 3 270M, 2 cores: pp512 1250-1300 -> 1430-1550 tokens/s, tg
# unchanged within noise (59-61 tokens/s either way). Set before libgomp loads (it reads
# its environment once); a user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
OMP_SPIN_COUNT = "30000"


def _omp_spin() -> None:
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", OMP_SPIN_COUNT)


def _load_native() -> tuple[ModuleType | None, str, str | None]:
    """The compiled module (None: NumPy), what runs, and why the kernels refuse to run at
    all (FRINK_NATIVE_ISA names a variant this CPU lacks: the module says which it runs)."""
    _omp_spin()
    if os.environ.get("FRINK_NO_NATIVE"):
        return None, "numpy (FRINK_NO_NATIVE is set)", None
    try:
        from . import _native  # type: ignore[attr-defined]
    except ImportError as e:
        if e.name != f"{__package__}._native":
            # Built but refused to load: a forced variant is never quietly NumPy instead.
            refused = str(e) if str(e).startswith("FRINK_NATIVE_ISA=") else None
            return None, f"numpy ({e})", refused
        return None, "numpy (the native kernels were not built at install)", None
    return _native, f"native C ({_native.isa()})", None


def _forced_threads() -> int | None:
    """FRINK_THREADS as a thread count (None when unset); one clear line when malformed."""
    raw = os.environ.get("FRINK_THREADS", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 1024:
        raise FrinkError(f"FRINK_THREADS must be a thread count from 1 to 1024: got {raw!r}")
    return int(raw)


_NATIVE, _WHY, _REFUSED = _load_native()
FORCED_THREADS = _forced_threads()
_CORES = int(_NATIVE.max_threads()) if _NATIVE is not None else os.cpu_count() or 1
_MAX_THREADS = FORCED_THREADS or _CORES
_threads: ContextVar[int] = ContextVar("frink_kernel_threads", default=_MAX_THREADS)
# Whether `dots` keeps x in f32 (else it rounds x to 8 bits per 32 columns where the ISA
# has byte dot products, as llama.cpp does: ~1.6-2x faster decode, ~5e-3 relative error
# per product; native_int8.h). FRINK_EXACT_ACTIVATIONS=1 makes exact the default.
_exact: ContextVar[bool] = ContextVar(
    "frink_exact_activations", default=bool(os.environ.get("FRINK_EXACT_ACTIVATIONS"))
)


if _NATIVE is not None and _NATIVE.PANEL_ROWS != PANEL_ROWS:
    raise ImportError(f"frink's compiled kernels take panels of {_NATIVE.PANEL_ROWS} rows")


def _qt(w: QuantMatrix) -> int:
    """w's type as the compiled kernels number it (its panel type where w is in panels)."""
    return int(w.qtype) | (_NATIVE.PANELS if w.panels and _NATIVE is not None else 0)


def in_panels(w: QuantMatrix) -> QuantMatrix:
    """w with its rows in panels (`QuantMatrix.panels`) where the kernels running now have
    panel dots for its type (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q5_0, Q4_1, Q8_0, IQ4_NL,
    IQ4_XS: whole units) and round x to 8 bits, w's rows come in whole panels, and
    AMX tiles do not take its prompts; else w itself. The panels are a new buffer of w's size
    (the caller drops w's). Why: a row of W per vector lane lets one byte dot multiply 16
    rows by 4 columns of x, and a row of x cost one broadcast: ~2x faster for 8 rows of x,
    and for one (docs/performance.md)."""
    if w.panels:
        return w
    return stacked_in_panels([w]) or w


def stacked_in_panels(parts: list[QuantMatrix]) -> QuantMatrix | None:
    """Matrices of one type and width, their rows stacked in order, as one matrix in panels
    (in_panels of their concatenation), each repacked straight into its rows of the result:
    a fused Q/K/V or gate/up is copied once at load, not concatenated first. None where
    in_panels would keep the rows in the file's order, or a part's rows are not whole
    panels."""
    w = parts[0]
    if (
        _NATIVE is None
        or any(p.panels or p.qtype != w.qtype or p.cols != w.cols for p in parts)
        or any(p.rows % PANEL_ROWS for p in parts)
        or activations() != "8-bit"
        or not _NATIVE.panels_for(int(w.qtype), w.cols)
        or on_tiles(w)
    ):
        return None
    rows = sum(p.rows for p in parts)
    data = _aligned((rows, w.data.shape[1]))
    for p, r0 in zip(parts, first_rows(parts), strict=True):
        dst = data[r0 : r0 + p.rows]
        _NATIVE.panel(int(w.qtype), p.data, dst, p.rows, p.cols, True, _threads.get())
    return QuantMatrix(data, w.qtype, rows, w.cols, panels=True)


def repacks(qtype: int) -> bool:
    """Whether `in_panels` repacks matrices of GGML type qtype with the kernels running now
    (matrices of whole panels and units; for `frink info`)."""
    return (
        _NATIVE is not None
        and activations() == "8-bit"
        and bool(_NATIVE.panels_for(qtype, 256))
        and not (prompt_tiles() and _NATIVE.tiles_for(qtype))
    )


# The panels' first byte sits on a cache line: the panel dots read 64 bytes at a time (a
# read across two lines made a Q4_K step ~1.5x slower; NumPy's large arrays start 16 bytes
# past a page).
PANEL_ALIGN = 64


def _aligned(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialized uint8 array of shape whose first byte is PANEL_ALIGN-aligned."""
    n = int(np.prod(shape))
    raw = np.empty(n + PANEL_ALIGN, np.uint8)
    at = -raw.ctypes.data % PANEL_ALIGN
    return raw[at : at + n].reshape(shape)


def file_order(w: QuantMatrix) -> QuantMatrix:
    """w with its rows in the file's order: w itself, or a copy out of its panels."""
    if not w.panels:
        return w
    assert _NATIVE is not None  # (panels are only made with the compiled kernels)
    data = np.empty(w.data.shape, np.uint8)
    _NATIVE.panel(int(w.qtype), w.data, data, w.rows, w.cols, False)
    return QuantMatrix(data, w.qtype, w.rows, w.cols)


def file_rows(w: QuantMatrix, index: np.ndarray) -> np.ndarray:
    """Rows W[index] as the file stores them (uint8 [len(index), row bytes]): the rows of w's
    data, or out of the panels that hold them."""
    idx = np.asarray(index, dtype=np.int64).reshape(-1)
    if not w.panels:
        return np.ascontiguousarray(w.data[idx])
    assert _NATIVE is not None
    out = np.empty((idx.size, w.data.shape[1]), np.uint8)
    panel = np.empty((PANEL_ROWS, w.data.shape[1]), np.uint8)
    for p in np.unique(idx // PANEL_ROWS):
        r0 = int(p) * PANEL_ROWS
        _NATIVE.panel(int(w.qtype), w.data[r0 : r0 + PANEL_ROWS], panel, PANEL_ROWS, w.cols, False)
        mine = idx // PANEL_ROWS == p
        out[mine] = panel[idx[mine] - r0]
    return out


def check_isa() -> None:
    """A FrinkError (one line: the variable, its value, the variants this CPU runs) when
    FRINK_NATIVE_ISA forces a variant this CPU cannot run; loading a model asks first."""
    if _REFUSED is not None:
        raise FrinkError(_REFUSED)


def kernel_path() -> str:
    """Which kernels run: "native C (isa, activations)", or "numpy (why)"; a FrinkError
    when FRINK_NATIVE_ISA forces a variant this CPU cannot run (`check_isa`)."""
    check_isa()
    if _NATIVE is None:
        return _WHY
    return f"native C ({_NATIVE.isa()}, {activations()} activations)"


def activations() -> str:
    """How `dots` treats x: "8-bit" (rounded per 32 columns, llama.cpp's way) or "f32"."""
    if _NATIVE is None or _exact.get() or not _NATIVE.has_int8():
        return "f32"
    return "8-bit"


def prompt_tiles() -> bool:
    """Whether `matmul` multiplies (most types) by AMX int8 tiles now, on the compiled
    kernels' threads, rather than by BLAS: 8-bit activations on a CPU with AMX."""
    return _NATIVE is not None and activations() == "8-bit" and _NATIVE.has_tiles()


def on_tiles(w: QuantMatrix) -> bool:
    """Whether `matmul` multiplies by w on AMX tiles now (`prompt_tiles`, and w's type)."""
    return _NATIVE is not None and prompt_tiles() and bool(_NATIVE.tiles_for(_qt(w)))


@contextmanager
def exact_activations(on: bool = True) -> Iterator[None]:
    """Inside the block (in this thread) `dots` keeps x exact in f32 (on) or rounds it to 8
    bits where the ISA has byte dot products (off)."""
    token = _exact.set(on)
    try:
        yield
    finally:
        _exact.reset(token)


def compiled() -> bool:
    """Whether the compiled kernels run (else every function here is NumPy's)."""
    return _NATIVE is not None


@contextmanager
def threads(n: int | None) -> Iterator[None]:
    """At most n threads for the kernels called in this thread inside the block (None:
    leave the setting alone). Restored afterwards."""
    if n is None:
        yield
        return
    token = _threads.set(max(1, min(int(n), _MAX_THREADS)))
    try:
        yield
    finally:
        _threads.reset(token)


def current_threads() -> int:
    """The threads the kernels called in this thread may use now (`threads`)."""
    return _threads.get()


def _activations(x: np.ndarray, w: QuantMatrix) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.cols:
        raise ValueError(f"x must be [T, {w.cols}]: got {list(x.shape)}")
    return x


def _result(out: np.ndarray | None, shape: tuple[int, int]) -> np.ndarray:
    if out is None:
        return np.empty(shape, np.float32)
    if out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be C-contiguous float32 {list(shape)}: got {out.dtype} {list(out.shape)}"
        )
    return out


def dots(x: np.ndarray, w: QuantMatrix, out: np.ndarray | None = None) -> np.ndarray:
    """x [T, cols] @ W.T for a few rows of x, W's blocks dequantized a chunk at a time in
    cache and dotted with every row of x (W's bytes read once per call). A row's product
    does not depend on the other rows of x."""
    x = _activations(x, w)
    y = _result(out, (x.shape[0], w.rows))
    if _NATIVE is None:
        return _numpy_matmul(x, w, None, y)
    if w.rows and x.shape[0]:
        _NATIVE.dots(_qt(w), w.data, w.rows, w.cols, x, x.shape[0], y, _threads.get(), _exact.get())
    return y


def matmul_f32(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x [T, cols] @ W.T for an f32 W [rows, cols] (C-contiguous), read straight from W
    (blocks of x's rows for a prompt): for one row as fast as BLAS's GEMV, for 2-16 rows
    ~2x faster than its GEMM (which packs W), and each row's sums made in one order
    whatever T is, so a row's product never depends on the rows beside it or on how a
    prompt is chunked (the server's batches rely on it)."""
    if w.dtype != np.float32 or w.ndim != 2 or not w.flags.c_contiguous:
        raise ValueError(f"w must be a C-contiguous float32 matrix: got {w.dtype} {w.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x must be [T, {w.shape[1]}]: got {list(x.shape)}")
    y = _result(out, (x.shape[0], w.shape[0]))
    if _NATIVE is None:
        np.matmul(x, w.T, out=y)
    elif w.shape[0] and x.shape[0]:
        step = dot_block_rows(4 * w.shape[1])
        for t0 in range(0, x.shape[0], step):
            xb, yb = x[t0 : t0 + step], y[t0 : t0 + step]
            _NATIVE.dots(_F32, w, w.shape[0], w.shape[1], xb, len(xb), yb, _threads.get(), True)
    return y


def matmul(
    x: np.ndarray, w: QuantMatrix, tile_rows: int | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """x [T, cols] @ W.T for many rows of x (prefill). Compiled: `dots` over blocks of x's
    rows (each block's codes, or f32 rows, stay in cache while W streams past), the decode
    rows' own products, so that a row's product is the same bits whichever way it comes
    (alone, in a batch, in a prompt or chunk of any length, resumed from a cache), on any
    thread count, with 8-bit or exact activations and for every type; where the CPU has AMX
    (`prompt_tiles()`), the 8-bit codes' products on int8 tiles, summed in another order
    (~1e-7 relative: a prompt's rows then differ from decode rows in the last bits, never
    with the thread count). Without the compiled module: W cut into tiles of rows
    (tile_rows, default `tile_rows_for` W's shape), each dequantized into a buffer and
    multiplied by BLAS on one thread, the tiles shared by `threads()` threads: the same
    bits on any thread count, but not those of `dots` (float sums in another order)."""
    x = _activations(x, w)
    y = _result(out, (x.shape[0], w.rows))
    if _NATIVE is None:
        return _numpy_matmul(x, w, tile_rows, y)
    if not (w.rows and x.shape[0]):
        return y
    if _rounds_x(w) and on_tiles(w):
        # AMX int8 tiles: the dots' own products (x's codes times W's codes).
        _NATIVE.tiles(_qt(w), w.data, w.rows, w.cols, x, x.shape[0], y, _threads.get())
        return y
    step = dot_block_rows(w.cols if _rounds_x(w) else 4 * w.cols)
    for t0 in range(0, x.shape[0], step):
        dots(x[t0 : t0 + step], w, out=y[t0 : t0 + step])
    return y


# How many bytes of x's 8-bit codes one `dots` call of a prompt product holds: small enough
# to stay in a core's L2 cache while every row of W is dotted with them.
DOT_BLOCK_BYTES = 1 << 18


def dot_block_rows(row_bytes: int) -> int:
    """The rows of x one `dots` call of a prompt product takes, for rows of x of row_bytes
    each as the kernel reads them (8-bit codes or f32): a multiple of the kernel's 4-row
    group, so every block but the last fills its groups."""
    return max(4, (DOT_BLOCK_BYTES // max(1, row_bytes)) // 4 * 4)


def _rounds_x(w: QuantMatrix) -> bool:
    """Whether products with w round x to 8 bits now (the types with 8-bit dots)."""
    return w.qtype not in _HALF_TYPES and activations() == "8-bit"


def linear(x: np.ndarray, w: QuantMatrix, out: np.ndarray | None = None) -> np.ndarray:
    """x @ W.T by the kernel that suits x's row count."""
    t = np.shape(x)[0] if np.ndim(x) == 2 else 0
    if t <= SMALL_T:
        y = dots(x, w)
        if out is None:
            return y
        _result(out, y.shape)[...] = y
        return out
    return matmul(x, w, out=out)


def _numpy_matmul(
    x: np.ndarray, w: QuantMatrix, tile_rows: int | None, y: np.ndarray
) -> np.ndarray:
    def tile(r0: int, r1: int, buf: np.ndarray) -> np.ndarray:
        # One kernel thread: the tiles themselves are what the threads share.
        with threads(1):
            return dequantize_rows(w, r0, r1, out=buf[: r1 - r0])

    return _tiled(x, w.rows, w.cols, tile, tile_rows, y)


def gemm_f32(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x [T, cols] @ W.T for an f32 W [rows, cols] and many rows of x (a prompt): BLAS over
    tiles of W's rows cut from W's shape alone, on `threads()` threads, BLAS on one each;
    the same bits on any thread count."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x must be [T, {w.shape[-1]}]: got {list(x.shape)}")
    y = _result(out, (x.shape[0], w.shape[0]))

    def tile(r0: int, r1: int, buf: np.ndarray) -> np.ndarray:
        if w.dtype == np.float32:
            return w[r0:r1]
        buf[: r1 - r0] = w[r0:r1]
        return buf[: r1 - r0]

    return _tiled(x, w.shape[0], w.shape[1], tile, None, y)


def tile_rows_for(rows: int, cols: int) -> int:
    """The rows of W one tile of a prompt's product holds: W cut into about TILE_COUNT
    tiles, within TILE_ELEMS f32 and at least TILE_MIN_ROWS rows (a tile may hold
    more rows than W has). A function of W's shape only: where a tile's edges fall never
    depends on the threads."""
    per = -(-rows // TILE_COUNT)
    per = -(-per // TILE_ROW_STEP) * TILE_ROW_STEP
    return max(TILE_MIN_ROWS, min(per, TILE_ELEMS // max(1, cols)))


TileSource = Callable[[int, int, np.ndarray], np.ndarray]


def _tiled(
    x: np.ndarray,
    rows: int,
    cols: int,
    tile_of: TileSource,
    tile_rows: int | None,
    y: np.ndarray,
) -> np.ndarray:
    """y = x @ W.T, W given a tile of rows at a time by tile_of(r0, r1, buf) (f32 [r1 - r0,
    cols], in buf or not), each tile one single-threaded BLAS product, the tiles shared by
    `threads()` threads (this one and the pool's)."""
    if tile_rows is None:
        tile_rows = tile_rows_for(rows, cols)
    if tile_rows < 1:
        raise ValueError(f"tile_rows must be positive: {tile_rows}")
    n = min(tile_rows, rows)
    if n == 0 or x.shape[0] == 0:
        return y
    starts = range(0, rows, n)
    # For a few rows of x, tile @ x.T runs 2-3x faster in OpenBLAS than x @ tile.T; for a
    # prompt's rows x @ tile.T is the faster. Either goes into a contiguous buffer, then is
    # copied: a strided out (a column slice of y) would take numpy's slow path.
    few = x.shape[0] < FEW_ROWS_TILE
    next_tile = itertools.count()  # (next() on it is atomic under the GIL)

    def work() -> None:
        buf = np.empty((n, cols), np.float32)
        prod = np.empty((n, x.shape[0]) if few else (x.shape[0], n), np.float32)
        while (i := next(next_tile)) < len(starts):
            r0 = starts[i]
            r1 = min(rows, r0 + n)
            t = tile_of(r0, r1, buf)
            if few:
                np.matmul(t, x.T, out=prod[: r1 - r0])
                y[:, r0:r1] = prod[: r1 - r0].T
            else:
                np.matmul(x, t.T, out=prod[:, : r1 - r0])
                y[:, r0:r1] = prod[:, : r1 - r0]

    ways = min(current_threads(), len(starts))
    with blas_threads.limit(1):
        if ways <= 1:
            work()
        else:
            others = [_tile_pool().submit(work) for _ in range(ways - 1)]
            try:
                work()
            finally:
                for f in others:
                    f.result()
    return y


@lru_cache(maxsize=1)
def _tile_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, _MAX_THREADS - 1), thread_name_prefix="frink-tiles")


def dequantize_rows(
    w: QuantMatrix, row_start: int = 0, row_stop: int | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """Rows [row_start, row_stop) of W as float32 [n, cols], equal to gguf-py's dequantize
    of the same bytes, into out when given (a reusable tile buffer)."""
    stop = w.rows if row_stop is None else row_stop
    if not 0 <= row_start <= stop <= w.rows:
        raise ValueError(f"rows [{row_start}, {stop}) of a {w.rows}-row matrix")
    y = _result(out, (stop - row_start, w.cols))
    if _NATIVE is None:
        y[...] = _gguf_dequantize(w.data[row_start:stop], w.qtype).reshape(y.shape)
    elif stop > row_start:
        index = np.arange(row_start, stop, dtype=np.int64)
        _NATIVE.dequantize(_qt(w), w.data, w.rows, w.cols, index, y, _threads.get())
    return y


def take_rows(w: QuantMatrix, index: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Rows W[index] as float32 [len(index), cols] (embedding lookup, an expert's rows)."""
    idx = np.ascontiguousarray(index, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= w.rows):
        raise IndexError(f"row index out of range for a {w.rows}-row matrix")
    y = _result(out, (idx.size, w.cols))
    if _NATIVE is None:
        y[...] = _gguf_dequantize(w.data[idx], w.qtype).reshape(y.shape)
    elif idx.size:
        _NATIVE.dequantize(_qt(w), w.data, w.rows, w.cols, idx, y, _threads.get())
    return y
