"""The host body's attention core: softmax(q K^T + mask) V over the rows a KV cache holds.

The block around it (QKV split, QK norms, rope, output gate, o_proj) is composed once in
graph/blocks/attention.py; this module is what HostOps.attention runs. GQA maps query head h
to KV head h // (n_head / n_head_kv), as llama.cpp does.

Which code: the compiled row-wise ops' attention (rowwise.attend) where built, each query
row and head computed alone in one fixed order, so that a row's output does not depend on
the rows beside it: a prompt fed whole or in chunks,
resumed from a cache, or stepped beside other sequences gives each row the same bits (with
8-bit activations an ulp here becomes a different code in the next layer's products and
grows into different logits). Else NumPy's: blocked causal prefill over BLAS and a
mask-free decode row, whose sums run in orders that depend on the block's shape (a
prompt's rows then differ in the last bits with how it is chunked).

K and V may be a cache type's stored rows (cache/kv_types.py's `Coded`): the C reads them
as stored, each element decoded as it is read (so a typed cache is batch-invariant too);
NumPy's path decodes them, a decode row ROW_KEY_CHUNK keys at a time, a prefill batch the
rows it sees once per step.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from ...cache.kv_types import Coded, as_f32
from ...quant.blas import blas_threads
from . import rowwise
from .linear import both, host_ways

# Prefill queries are taken in blocks of this many rows, each against only the keys it can
# see: a causal batch then computes ~9/16 of the full [T, S] score matrix at T = 512, and
# a block's scores stay in cache through the softmax passes (64-96 rows measured best).
QUERY_BLOCK = 64
# A decode row's scores are taken this many keys at a time: OpenBLAS multiplies a few
# query rows by up to ~400 keys on a fast small-matrix path and by more on a packing one
# that costs 3-4x as much (g = 3 heads x 64 dims: 512 keys 47 -> 14 us, 2048 keys 202 ->
# 59 us), which at a depth of thousands of tokens was most of a decode token's attention.
ROW_KEY_CHUNK = 256


def attention_mask(
    positions: np.ndarray, n_kv: int, window: int | None, start: int = 0
) -> np.ndarray:
    """Additive mask [T, n_kv - start]: key j (from `start`) visible to the query at position
    p if j <= p and, with a window, p - j < window."""
    kv_pos = np.arange(start, n_kv)
    visible = kv_pos[None, :] <= positions[:, None]
    if window is not None:
        visible &= positions[:, None] - kv_pos[None, :] < window
    return np.where(visible, np.float32(0.0), np.float32(-np.inf))


@lru_cache(maxsize=4)
def _causal_tail(n: int) -> np.ndarray:
    """[n, n] additive mask hiding j > i: a block of consecutive queries against its own keys."""
    m = np.triu(np.full((n, n), -np.inf, np.float32), k=1)
    m.flags.writeable = False
    return m


def key_ranges(
    positions: np.ndarray, first: int, n_keys: int, window: int | None, causal: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the key positions [lo, hi) it sees over a cache whose rows hold positions
    [first, first + n_keys). Causal: [p - window + 1, p] (from 0 without a window).
    Bidirectional: every row (an encoder's sequence), or with a window the symmetric
    |p - k| < window, cut to the rows held."""
    p = np.asarray(positions, dtype=np.int64)
    if causal:
        lo = np.maximum(p - window + 1, 0) if window is not None else np.zeros_like(p)
        return lo, p + 1
    end = first + n_keys
    if window is None:
        return np.full_like(p, first), np.full_like(p, end)
    return np.maximum(p - window + 1, first), np.minimum(p + window, end)


def attend(
    q: np.ndarray,
    K: np.ndarray | Coded,
    V: np.ndarray | Coded,
    first: int,
    positions: np.ndarray,
    window: int | None,
    softcap: float | None,
    slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    causal: bool = True,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """softmax(q K^T + mask) V for scaled queries q [T, H, hk] at `positions` over keys
    K [Hkv, S, hk] and values V [Hkv, S, hv], key row j at position first + j (a window
    cache holds no rows before its window); returns [T, H * hv]. slopes [H]: ALiBi, each
    head's scores get -slope_h * (query position - key position). sinks [H]: each head's
    sink logit joins its softmax's denominator (and its max), with no value. K, V: f32
    rows or a cache type's `Coded` rows. causal False: bidirectional, every key row is
    visible to every query, or with a window those with |query - key position| < window.
    bias [H, 2c + 1] (odd width): head h's score for a key at distance d = key - query
    position gets bias[h, clip(d + c, 0, 2c)] (a relative-position bias whose edge columns
    stand for every farther distance)."""
    if bias is not None and (
        bias.ndim != 2 or bias.shape[0] != q.shape[1] or bias.shape[1] % 2 == 0
    ):
        raise ValueError(f"attention bias must be [{q.shape[1]}, odd], not {bias.shape}")
    keys = key_ranges(positions, first, K.shape[1], window, causal)
    extra = (softcap, slopes, sinks, bias)
    out = rowwise.attend(q, K, V, first, positions, keys, extra)
    if out is not None:
        return out
    if not causal or bias is not None:
        return _attend_ranges(q, as_f32(K), as_f32(V), first, positions, keys, extra)
    if q.shape[0] == 1:
        return _attend_row(q, K, V, first, int(positions[0]), window, softcap, slopes, sinks)
    return _attend_blocks(q, as_f32(K), as_f32(V), first, positions, window, extra)


def _attend_blocks(
    q: np.ndarray,
    K: np.ndarray,
    V: np.ndarray,
    first: int,
    positions: np.ndarray,
    window: int | None,
    extra: tuple,
) -> np.ndarray:
    """attend's causal prompt rows in NumPy (where the C kernel does not run): blocks of
    QUERY_BLOCK queries, two GEMMs per KV head each, over f32 K and V."""
    softcap, slopes, sinks, _ = extra
    T, H, hk = q.shape
    Hkv, hv = K.shape[0], V.shape[2]
    g = H // Hkv
    # [Hkv, 1, g, 1]: head kvh * g + j's slope, against scores [Hkv, Tb, g, n].
    head_slopes = slopes.reshape(Hkv, 1, g, 1) if slopes is not None else None
    head_sinks = sinks.reshape(Hkv, 1, g, 1).astype(np.float32) if sinks is not None else None
    # [Hkv, T, g, hk]: query heads grouped under the KV head they read, rows in (token,
    # head) order, so a block of tokens is one contiguous [Tb * g, hk] matrix per KV head
    # and each block costs 2 * Hkv GEMMs.
    qg = np.ascontiguousarray(q.reshape(T, Hkv, g, hk).transpose(1, 0, 2, 3))
    out = np.empty((Hkv, T, g, hv), np.float32)
    run = bool((np.diff(positions) == 1).all())  # consecutive positions, the usual case

    def block(r0: int) -> None:
        r1 = min(T, r0 + QUERY_BLOCK)
        n_rows = r1 - r0
        pos = positions[r0:r1]
        q0, last = (int(pos[0]), int(pos[-1])) if run else (int(pos.min()), int(pos.max()))
        # Keys at positions [lo, hi): none after the block's last query, none before its
        # first query's window (which the cache still holds).
        hi = last + 1
        lo = max(0, q0 - window + 1) if window is not None else 0
        assert lo >= first, "the cache no longer holds keys this query sees"
        qb = qg[:, r0:r1].reshape(Hkv, n_rows * g, hk)
        scores = np.matmul(qb, K[:, lo - first : hi - first].transpose(0, 2, 1))  # [Hkv, Tb * g, n]
        _softcap_(scores, softcap)
        if head_slopes is not None:
            dist = (pos[:, None] - np.arange(lo, hi)[None, :]).astype(np.float32)
            scores.reshape(Hkv, n_rows, g, hi - lo)[...] -= head_slopes * dist[None, :, None, :]
        if n_rows > 1:  # (one query sees every key in [lo, hi))
            s4 = scores.reshape(Hkv, n_rows, g, hi - lo)
            # The causal tail alone where no key in [lo, hi) is out of any query's window
            # (every window layer of a prompt no longer than its window): the full mask's
            # build and add cost a window layer ~2x the rest of its softmax.
            if run and (window is None or last - lo < window):
                s4[..., hi - lo - n_rows :] += _causal_tail(n_rows)[:, None, :]
            else:
                s4 += attention_mask(pos, hi, window, lo)[:, None, :]
        # Normalized after the PV product: hv columns to divide instead of n.
        total = _exp_(scores.reshape(Hkv, n_rows, g, hi - lo), head_sinks)
        total = total.reshape(Hkv, n_rows * g, 1)
        ob = out[:, r0:r1].reshape(Hkv, n_rows * g, hv)
        np.matmul(scores, V[:, lo - first : hi - first], out=ob)
        ob /= total

    _each_block(block, T)
    return out.transpose(1, 0, 2, 3).reshape(T, H * hv)


def attend_chunked(
    q: np.ndarray,
    K: np.ndarray | Coded,
    V: np.ndarray | Coded,
    first: int,
    positions: np.ndarray,
    chunk: int,
    extra: tuple[float | None, np.ndarray | None, np.ndarray | None],
) -> np.ndarray:
    """`attend` with chunked local attention: the query at p sees only the keys at
    [p // chunk * chunk, p]. The queries are taken by chunk, each group causally over the
    contiguous key rows from its chunk's start, as positions counted from there (a row's
    arithmetic is attend's over that range, whatever rows beside it). extra: (softcap,
    slopes, sinks) as attend takes them."""
    softcap, slopes, sinks = extra
    starts = positions // chunk * chunk
    out = np.empty((q.shape[0], q.shape[1] * V.shape[2]), np.float32)
    for start in np.unique(starts):
        rows = np.nonzero(starts == start)[0]
        lo = int(start) - first
        assert lo >= 0, "the cache no longer holds keys this query sees"
        # Positions counted from the chunk's start (the keys before it do not exist for
        # these rows; nothing in attend depends on where the range starts but the mask).
        rel = positions[rows] - start
        out[rows] = attend(q[rows], K[:, lo:], V[:, lo:], 0, rel, None, softcap, slopes, sinks)
    return out


def temperature_factors(positions: np.ndarray, floor_scale: float, scale: float) -> np.ndarray:
    """Llama 4's attention temperature per query position p (f32 [T]):
    log(floor((p + 1) / floor_scale) + 1) * scale + 1."""
    p = positions.astype(np.float64)
    return (np.log(np.floor((p + 1.0) / floor_scale) + 1.0) * scale + 1.0).astype(np.float32)


def _attend_ranges(
    q: np.ndarray,
    K: np.ndarray,
    V: np.ndarray,
    first: int,
    positions: np.ndarray,
    keys: tuple[np.ndarray, np.ndarray],
    extra: rowwise.Decorations,
) -> np.ndarray:
    """NumPy's attend where each query t sees the keys at positions [lo[t], hi[t]) of any
    shape (bidirectional, symmetric windows) and the scores may carry a relative bias:
    each block of QUERY_BLOCK rows against the keys any of its rows sees, the rest masked."""
    softcap, slopes, sinks, bias = extra
    T, H, hk = q.shape
    Hkv, hv = K.shape[0], V.shape[2]
    g = H // Hkv
    lo_all, hi_all = keys
    pos = np.asarray(positions, dtype=np.int64)
    out = np.empty((T, H, hv), np.float32)
    head_sinks = sinks.reshape(1, H, 1).astype(np.float32) if sinks is not None else None

    def block(r0: int) -> None:
        r1 = min(T, r0 + QUERY_BLOCK)
        p, lo, hi = pos[r0:r1, None], lo_all[r0:r1, None], hi_all[r0:r1, None]
        a, b = int(lo.min()), int(hi.max())
        kp = np.arange(a, b)[None, :]  # [1, n] key positions
        qb = q[r0:r1].reshape(r1 - r0, Hkv, g, hk)
        scores = np.einsum("tkgd,ksd->tkgs", qb, K[:, a - first : b - first]).reshape(
            r1 - r0, H, b - a
        )
        _softcap_(scores, softcap)
        if slopes is not None:
            scores -= slopes[None, :, None] * (p - kp).astype(np.float32)[:, None, :]
        if bias is not None:
            c = (bias.shape[1] - 1) // 2
            cols = np.clip(kp - p + c, 0, 2 * c)  # [Tb, n]
            scores += bias[:, cols].transpose(1, 0, 2)
        scores += np.where((kp >= lo) & (kp < hi), np.float32(0), np.float32(-np.inf))[:, None, :]
        total = _exp_(scores, head_sinks)
        o = np.einsum(
            "tkgs,ksd->tkgd", scores.reshape(r1 - r0, Hkv, g, b - a), V[:, a - first : b - first]
        )
        out[r0:r1] = o.reshape(r1 - r0, H, hv) / total

    _each_block(block, T)
    return out.reshape(T, H * hv)


def _each_block(block: Callable[[int], None], T: int) -> None:
    """block(r0) for each query block's first row r0 of T rows.

    The blocks' GEMMs are small ([Tb * g, hk] x [hk, n]); split over BLAS threads they
    only pay hand-offs (and a multithreaded GEMM may round by its thread count). BLAS
    has one thread, and where the step has two (linear.host_ways) the blocks, each
    writing its own rows, go two ways: every other one on a second Python thread. A
    block's arithmetic is the same on either thread."""
    starts = range(0, T, QUERY_BLOCK)
    with blas_threads.limit(1):
        if len(starts) > 1 and host_ways() > 1:

            def blocks(every_other: range) -> None:
                for r0 in every_other:
                    block(r0)

            both(lambda: blocks(starts[::2]), lambda: blocks(starts[1::2]))
        else:
            for r0 in starts:
                block(r0)


def _attend_row(
    q: np.ndarray,
    K: np.ndarray | Coded,
    V: np.ndarray | Coded,
    first: int,
    pos: int,
    window: int | None,
    softcap: float | None,
    slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """_attend for one query row at position `pos`: the same arithmetic with no block loop
    and no mask (every key in [lo, pos] is visible), since a decode token pays per NumPy
    call. Its GEMMs are too small for BLAS to split them, so no thread limit is needed."""
    _, H, hk = q.shape
    Hkv, hv = K.shape[0], V.shape[2]
    lo = max(0, pos - window + 1) if window is not None else 0
    assert lo >= first, "the cache no longer holds keys this query sees"
    Kr, Vr = K[:, lo - first : pos + 1 - first], V[:, lo - first : pos + 1 - first]
    qg, n = q.reshape(Hkv, H // Hkv, hk), Kr.shape[1]
    if n <= ROW_KEY_CHUNK:
        scores = np.matmul(qg, as_f32(Kr).transpose(0, 2, 1))  # [Hkv, g, n]
    else:
        scores = np.empty((Hkv, H // Hkv, n), np.float32)
        for a in range(0, n, ROW_KEY_CHUNK):
            b = min(n, a + ROW_KEY_CHUNK)
            np.matmul(qg, as_f32(Kr[:, a:b]).transpose(0, 2, 1), out=scores[:, :, a:b])
    _softcap_(scores, softcap)
    if slopes is not None:
        dist = (pos - np.arange(lo, pos + 1)).astype(np.float32)  # [n]
        scores -= slopes.reshape(Hkv, H // Hkv, 1) * dist
    head_sinks = sinks.reshape(Hkv, H // Hkv, 1).astype(np.float32) if sinks is not None else None
    scores /= _exp_(scores, head_sinks)
    if isinstance(Vr, np.ndarray):
        return np.matmul(scores, Vr).reshape(1, H * hv)
    out = np.matmul(scores[:, :, :ROW_KEY_CHUNK], Vr[:, :ROW_KEY_CHUNK].f32())
    for a in range(ROW_KEY_CHUNK, n, ROW_KEY_CHUNK):  # stored rows, decoded a chunk at a time
        b = min(n, a + ROW_KEY_CHUNK)
        out += np.matmul(scores[:, :, a:b], Vr[:, a:b].f32())
    return out.reshape(1, H * hv)


def _softcap_(scores: np.ndarray, softcap: float | None) -> None:
    """scores = softcap * tanh(scores / softcap) in place (nothing without a softcap)."""
    if softcap:
        c = np.float32(softcap)
        scores /= c
        np.tanh(scores, out=scores)
        scores *= c


def _exp_(scores: np.ndarray, sinks: np.ndarray | None) -> np.ndarray:
    """exp(scores - row max) in place; returns the softmax denominators (with the heads'
    sinks, broadcast against scores, where given)."""
    if sinks is not None:
        return _exp_with_sinks_(scores, sinks)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    return scores.sum(axis=-1, keepdims=True)


def _exp_with_sinks_(scores: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """exp(scores - m) in place and the softmax denominators sum(exp(scores - m)) +
    exp(sink - m), with m the larger of the row's max score and its head's sink (sinks
    broadcast against scores, one per row's head)."""
    m = np.maximum(scores.max(axis=-1, keepdims=True), sinks)
    scores -= m
    np.exp(scores, out=scores)
    return scores.sum(axis=-1, keepdims=True) + np.exp(sinks - m)
