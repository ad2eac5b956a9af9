"""The host body's row-wise ops in C (rowwise.c, compiled when frink is installed): RMSNorm,
rope, the gated activations and attention, each one pass over its rows on the product
kernels' threads. norms.py, rope.py, ffn.py and attention.py here call these first and
run their NumPy when they return None: arrays the C does not take (not float32, more than
3 dims, a strided last dim), or no compiled module (no compiler at install, or FRINK_NO_NATIVE=1).
`path()` says which runs; `frink info` shows it.

The C computes what the NumPy computes, as llama.cpp does, to within float rounding (a
few ulp: the RMS sum is taken in double, exp is a polynomial); tests/test_rowwise.py
holds the two to each other and to float64.
"""

from __future__ import annotations

import os
from types import ModuleType

import numpy as np

from ...cache.kv_types import Paged, Rows, stored_dtype
from ...quant import kernels

F32 = np.float32
# The activations rowwise.c has, by its numbers.
GLU_ACTS = {"silu": 0, "gelu_tanh": 1}
# The KV cache types rowwise_kv.h reads, by its numbers.
KV_TYPES = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3, "q4_0": 4}


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("FRINK_NO_NATIVE"):
        return None, "numpy (FRINK_NO_NATIVE is set)"
    try:
        from . import _rowwise  # type: ignore[attr-defined]
    except ImportError:
        return None, "numpy (the native row-wise ops were not built at install)"
    return _rowwise, f"native C (attention {_rowwise.attend_isa()})"


_C, _WHY = _load()


def path() -> str:
    """Which row-wise ops run: "native C (attention avx512|avx2|portable)" (the attention
    loops' variant: avx2 under FRINK_NATIVE_ISA=avx2, portable under =base) or "numpy (why)"."""
    return _WHY


def compiled() -> bool:
    return _C is not None


def _takes(x: np.ndarray) -> bool:
    """Whether the C takes x: float32, 1-3 dims, the last contiguous."""
    return x.dtype == F32 and 1 <= x.ndim <= 3 and x.strides[-1] == 4


def _stored(rows: Rows) -> tuple[np.ndarray, int] | None:
    """K or V rows as the C attention takes them: (stored rows [Hkv, S, stored width], cache
    type number), a paged cache's page buffer for its rows; None where it does not (not 3
    dims, a strided last dim)."""
    data, kind = (rows, "f32") if isinstance(rows, np.ndarray) else (rows.data, rows.kind)
    if data.ndim != 3 or data.dtype != stored_dtype(kind) or data.strides[-1] != data.itemsize:
        return None
    return data, KV_TYPES[kind]


def _paging(K: Rows, V: Rows) -> tuple[np.ndarray | None, int, int] | None:
    """The page table the C reads K and V through, (table int32, page rows, logical rows);
    (None, 0, 0) for unpaged rows; None where only one of them is paged (NumPy's path)."""
    if isinstance(K, Paged) and isinstance(V, Paged) and K.table is V.table and K.n == V.n:
        return np.ascontiguousarray(K.table, dtype=np.int32), K.page, K.n
    if isinstance(K, Paged) or isinstance(V, Paged):
        return None
    return None, 0, 0


def rms_norm(
    x: np.ndarray, weight: np.ndarray | None, eps: float, out: np.ndarray | None
) -> np.ndarray | None:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, into out (which may be x) or a
    new array; None where the C does not take the arrays."""
    if _C is None or not _takes(x):
        return None
    if weight is not None and (weight.dtype != F32 or weight.shape != x.shape[-1:]):
        return None
    if out is None:
        out = np.empty(x.shape, F32)
    elif out.shape != x.shape or not _takes(out):
        return None
    _C.rms_norm(x, weight, eps, out, kernels.current_threads())
    return out


def rope(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, positions: np.ndarray, neox: bool
) -> bool:
    """x [T, heads, head_dim] (or [T, head_dim]) rotated in place by the tables' rows at
    `positions`; False where the C does not take the arrays."""
    if _C is None or not _takes(x) or not x.flags.writeable:
        return False
    pos = np.ascontiguousarray(positions, dtype=np.int64)
    _C.rope(x, cos, sin, pos, neox, kernels.current_threads())
    return True


def glu(h: np.ndarray, act: str) -> np.ndarray | None:
    """act(gate) * up over rows [..., gate | up] into a new C-contiguous array (what the
    down projection reads); None where the C does not take h or has no such act."""
    if _C is None or act not in GLU_ACTS or not _takes(h) or h.ndim != 2:
        return None
    out = np.empty((h.shape[0], h.shape[1] // 2), F32)
    _C.glu(h, GLU_ACTS[act], out, kernels.current_threads())
    return out


# An attention's decorations, as attention.attend takes them: (softcap, ALiBi slopes [H], sink
# logits [H], a relative score bias [H, 2c + 1] by key - query position + c), each None where
# absent.
Decorations = tuple[float | None, np.ndarray | None, np.ndarray | None, np.ndarray | None]


def attend(
    q: np.ndarray,
    K: Rows,
    V: Rows,
    first: int,
    positions: np.ndarray,
    keys: tuple[np.ndarray, np.ndarray],
    extra: Decorations,
) -> np.ndarray | None:
    """softmax(q K^T + bias) V as attention.attend takes it ([T, H, hk] scaled queries, keys
    [Hkv, S, hk] and values [Hkv, S, hv], key row j at position first + j), query t over
    the keys at positions [lo[t], hi[t]) (keys = (lo, hi)), each query row and head on its
    own in one fixed order: a row's output is the same bits whatever rows, chunk or batch
    it comes in, on any thread count and instruction set. K and V: f32 rows or a cache
    type's `Coded` rows, read as stored (rowwise_kv.h: the bits of the f32 kernel on the
    decoded rows), or `Paged` rows read in place through their page table. [T, H * hv];
    None where the C does not take the arrays (then attention.py's NumPy runs)."""
    stored_k, stored_v, paging = _stored(K), _stored(V), _paging(K, V)
    if _C is None or not _takes(q) or q.ndim != 3 or stored_k is None or stored_v is None:
        return None
    if paging is None:
        return None
    softcap, slopes, sinks, bias = extra
    T, H, _ = q.shape
    out = np.empty((T, H, V.shape[2]), F32)
    pos, lo, hi = (np.ascontiguousarray(a, dtype=np.int64) for a in (positions, *keys))
    vectors = [None if a is None else np.ascontiguousarray(a, dtype=F32) for a in (slopes, sinks)]
    table = None if bias is None else np.ascontiguousarray(bias, dtype=F32)
    center = 0 if table is None else (table.shape[-1] - 1) // 2
    threads = kernels.current_threads()
    _C.attend(
        q,
        *stored_k,
        *stored_v,
        int(first),
        pos,
        lo,
        hi,
        float(softcap or 0),
        *vectors,
        table,
        center,
        out,
        threads,
        *paging,
    )
    return out.reshape(T, H * V.shape[2])


def delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    decay: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    delta: bool = True,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The gated delta rule (gdn.delta_rule_steps' arguments and results, with the decays
    e^g [T, H] in place of g; delta False: S = decay S + k (beta v)^T, decayed linear
    attention) token by token in one fixed order (rowwise_delta.h): a token's bits whatever
    else is in the call. None without the compiled ops. state is not modified."""
    if _C is None:
        return None
    q, k, v, decay, beta = (np.ascontiguousarray(a, dtype=F32) for a in (q, k, v, decay, beta))
    new_state = np.array(state, dtype=F32, order="C")  # a copy: the caller's stays
    o = np.empty(v.shape, F32)
    _C.delta_rule(q, k, v, decay, beta, new_state, o, delta, kernels.current_threads())
    return o, new_state


def exp(x: np.ndarray) -> np.ndarray:
    """The e^x the C activations use (for tests)."""
    if _C is None:
        raise RuntimeError(f"no compiled row-wise ops: {_WHY}")
    out = np.empty(x.shape, F32)
    _C.exp(np.ascontiguousarray(x, dtype=F32), out)
    return out
