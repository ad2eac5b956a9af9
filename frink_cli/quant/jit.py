"""The compiled kernels: each type's blocks unpacked in registers (simd.py's vectors), as
dot products with f32 activations and as exact dequantization.

Why two codings of every type: a dequantization must equal gguf-py's bit for bit (the
reference, gguf/quants.py, and through it ggml-quants.c), so it repeats gguf-py's float
operations in gguf-py's order and never fuses them. A dot product only has to be close to
`x @ dequantize(W).T` (its summation order differs anyway), so it is arranged for speed:
codes are cut out of the bytes in byte lanes (offsets like Q4_0's -8 included), the codes
times x summed per block or run and scaled once (`fmadd`, fused where the host has FMA),
and a min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) applied to the sum of x over its block, which
each driver computes once per call (`_sums16`).

Each type's dot is written as the steps of one block (or of one run of a block), and one
driver (`_dots`) walks W's rows with them, four rows of x at a time, so a batch's rows
share each block's unpacking. The drivers split W's rows into chunks over numba's threads
and switch on the type once per chunk, so one compiled function serves every type. The
byte layout of each type is written beside its code, in gguf-py's terms.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange, types
from numba.core.errors import TypingError
from numba.extending import overload

from . import simd
from .simd import (
    bload,
    byte_lut,
    fadd,
    fmadd,
    fmul,
    fsub,
    hsum,
    iand,
    ior,
    ishl,
    ishr,
    isub,
    itof,
    k_scales_mins,
    lane_bits,
    load_bf16,
    load_f16,
    load_f32,
    load_u8,
    load_u16,
    load_u32,
    pairsum,
    q3_scales,
    sext,
    vlane,
    vload,
    vload_bf16,
    vload_f16,
    vstore,
    vzero,
    zext,
)

# numba keys a cached kernel on the content of its own file, so a change to simd.py alone
# would leave stale compiled kernels in every cache (pip keeps __pycache__ across upgrades).
# simd.py's hash is therefore recorded here: changing it changes this file, and while it
# does not match (simd.py edited, this line not yet) nothing is cached.
_SIMD_SHA256 = "a25dc050f84c4f69a5eb511aae64c16457c3cf71fd0012be629c4b1ed0c4ab4a"
_CACHE = hashlib.sha256(Path(simd.__file__).read_bytes()).hexdigest() == _SIMD_SHA256

F16, BF16 = int(T.F16), int(T.BF16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1), int(T.Q8_0)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = int(T.Q2_K), int(T.Q3_K), int(T.Q4_K), int(T.Q5_K), int(T.Q6_K)
IQ4_NL, IQ4_XS, MXFP4 = int(T.IQ4_NL), int(T.IQ4_XS), int(T.MXFP4)

# IQ4_NL / IQ4_XS: the 16 int8 levels a nibble indexes (gguf-py IQ4_NL.kvalues, ggml
# kvalues_iq4nl), looked up in byte lanes.
_iq4_level = byte_lut((-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113))
# MXFP4: the e2m1 values doubled (gguf-py MXFP4.kvalues, ggml kvalues_mxfp4); the block's
# e8m0 exponent e scales them by 2^(e - 128), ggml's e8m0_to_fp32_half, exact in f32 for
# every e (2^-128 and 2^-127 as subnormals), so a table of the 256 scales is exact too.
_mxfp4_level = byte_lut((0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12))
_E8M0_HALF = np.ldexp(np.float32(1.0), np.arange(256) - 128).astype(np.float32)


# -- F16, BF16: 2 bytes per weight ------------------------------------------------------


@njit(cache=_CACHE)
def _deq_half(w, index, i0, i1, out, o, bf):
    n = w.shape[1] // 2
    n16 = n - n % 16
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for k in range(0, n16, 16):
            vstore(out, o0 + k, vload_bf16(w, p0 + 2 * k) if bf else vload_f16(w, p0 + 2 * k))
        for k in range(n16, n):
            out[o + i - i0, k] = load_bf16(w, p0 + 2 * k) if bf else load_f16(w, p0 + 2 * k)


# A "block" of a half type is 64 weights (128 bytes): its four vectors summed as a tree,
# so the running sum waits on one add per 64 weights, not on each fma's latency.


@njit(cache=_CACHE)
def _half_block(w, p, b, x, t, acc, bf):
    x0 = t * x.shape[1] + 64 * b
    if bf:
        a = fmadd(vload_bf16(w, p + 32), vload(x, x0 + 16), fmul(vload_bf16(w, p), vload(x, x0)))
        c = vload_bf16(w, p + 96)
        c = fmadd(c, vload(x, x0 + 48), fmul(vload_bf16(w, p + 64), vload(x, x0 + 32)))
    else:
        a = fmadd(vload_f16(w, p + 32), vload(x, x0 + 16), fmul(vload_f16(w, p), vload(x, x0)))
        c = vload_f16(w, p + 96)
        c = fmadd(c, vload(x, x0 + 48), fmul(vload_f16(w, p + 64), vload(x, x0 + 32)))
    return fadd(acc, fadd(a, c))


@njit(cache=_CACHE)
def _step_f16(w, p, h, b, j, x, xs, t, acc, off):
    return _half_block(w, p, b, x, t, acc, False), off


@njit(cache=_CACHE)
def _step_bf16(w, p, h, b, j, x, xs, t, acc, off):
    return _half_block(w, p, b, x, t, acc, True), off


@njit(cache=_CACHE)
def _half_tail(w, p0, x, t, acc, off, bf):
    """The last cols % 64 weights, one by one."""
    n = w.shape[1] // 2
    s = hsum(acc) + off
    for k in range(n - n % 64, n):
        s += (load_bf16(w, p0 + 2 * k) if bf else load_f16(w, p0 + 2 * k)) * x[t, k]
    return s


@njit(cache=_CACHE)
def _end_f16(w, p0, x, t, acc, off):
    return _half_tail(w, p0, x, t, acc, off, False)


@njit(cache=_CACHE)
def _end_bf16(w, p0, x, t, acc, off):
    return _half_tail(w, p0, x, t, acc, off, True)


# -- Q4_0 [d f16][qs 16]: w[j] = d * ((qs[j] & 15) - 8), w[j + 16] = d * ((qs[j] >> 4) - 8)


@njit(cache=_CACHE)
def _deq_q4_0(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 18):
            p = p0 + 18 * b
            d = load_f16(w, p)
            q = bload(w, p + 2)
            vstore(out, o0 + 32 * b, fmul(itof(sext(isub(iand(q, 15), 8))), d))
            vstore(out, o0 + 32 * b + 16, fmul(itof(sext(isub(ishr(q, 4), 8))), d))


@njit(cache=_CACHE)
def _step_q4_0(w, p, h, b, j, x, xs, t, acc, off):
    x0 = t * x.shape[1] + 32 * b
    d = load_f16(w, p)
    q = bload(w, p + 2)
    a = fmul(itof(sext(isub(iand(q, 15), 8))), vload(x, x0))
    a = fmadd(itof(sext(isub(ishr(q, 4), 8))), vload(x, x0 + 16), a)
    return fmadd(a, d, acc), off


# -- Q4_1 [d f16][m f16][qs 16]: w = d * nibble + m, nibbles as Q4_0 ---------------------


@njit(cache=_CACHE)
def _deq_q4_1(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 20):
            p = p0 + 20 * b
            d = load_f16(w, p)
            m = load_f16(w, p + 2)
            q = bload(w, p + 4)
            vstore(out, o0 + 32 * b, fadd(fmul(itof(zext(iand(q, 15))), d), m))
            vstore(out, o0 + 32 * b + 16, fadd(fmul(itof(zext(ishr(q, 4))), d), m))


@njit(cache=_CACHE)
def _step_q4_1(w, p, h, b, j, x, xs, t, acc, off):
    x0 = t * x.shape[1] + 32 * b
    d = load_f16(w, p)
    m = load_f16(w, p + 2)
    q = bload(w, p + 4)
    a = fmul(itof(zext(iand(q, 15))), vload(x, x0))
    a = fmadd(itof(zext(ishr(q, 4))), vload(x, x0 + 16), a)
    s = t * xs.shape[1] + 2 * b  # the block's two runs of 16: their sums of x
    return fmadd(a, d, acc), off + m * (load_f32(xs, s) + load_f32(xs, s + 1))


# -- Q5_0 [d f16][qh u32][qs 16]: w[j] = d * ((nibble | (bit j of qh) << 4) - 16) --------


@njit(cache=_CACHE)
def _q5_lo(q, qh):
    return ior(iand(q, 15), ishl(lane_bits(qh, 0), 4))


@njit(cache=_CACHE)
def _q5_hi(q, qh):
    return ior(ishr(q, 4), ishl(lane_bits(qh, 16), 4))


@njit(cache=_CACHE)
def _deq_q5_0(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 22):
            p = p0 + 22 * b
            d = load_f16(w, p)
            qh = load_u32(w, p + 2)
            q = bload(w, p + 6)
            vstore(out, o0 + 32 * b, fmul(itof(sext(isub(_q5_lo(q, qh), 16))), d))
            vstore(out, o0 + 32 * b + 16, fmul(itof(sext(isub(_q5_hi(q, qh), 16))), d))


@njit(cache=_CACHE)
def _step_q5_0(w, p, h, b, j, x, xs, t, acc, off):
    x0 = t * x.shape[1] + 32 * b
    d = load_f16(w, p)
    qh = load_u32(w, p + 2)
    q = bload(w, p + 6)
    a = fmul(itof(sext(isub(_q5_lo(q, qh), 16))), vload(x, x0))
    a = fmadd(itof(sext(isub(_q5_hi(q, qh), 16))), vload(x, x0 + 16), a)
    return fmadd(a, d, acc), off


# -- Q5_1 [d f16][m f16][qh u32][qs 16]: w = d * code + m, codes as Q5_0 -----------------


@njit(cache=_CACHE)
def _deq_q5_1(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 24):
            p = p0 + 24 * b
            d = load_f16(w, p)
            m = load_f16(w, p + 2)
            qh = load_u32(w, p + 4)
            q = bload(w, p + 8)
            vstore(out, o0 + 32 * b, fadd(fmul(itof(zext(_q5_lo(q, qh))), d), m))
            vstore(out, o0 + 32 * b + 16, fadd(fmul(itof(zext(_q5_hi(q, qh))), d), m))


@njit(cache=_CACHE)
def _step_q5_1(w, p, h, b, j, x, xs, t, acc, off):
    x0 = t * x.shape[1] + 32 * b
    d = load_f16(w, p)
    m = load_f16(w, p + 2)
    qh = load_u32(w, p + 4)
    q = bload(w, p + 8)
    a = fmul(itof(zext(_q5_lo(q, qh))), vload(x, x0))
    a = fmadd(itof(zext(_q5_hi(q, qh))), vload(x, x0 + 16), a)
    s = t * xs.shape[1] + 2 * b  # the block's two runs of 16: their sums of x
    return fmadd(a, d, acc), off + m * (load_f32(xs, s) + load_f32(xs, s + 1))


# -- Q8_0 [d f16][qs int8 32]: w[j] = qs[j] * d ------------------------------------------


@njit(cache=_CACHE)
def _deq_q8_0(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 34):
            p = p0 + 34 * b
            d = load_f16(w, p)
            vstore(out, o0 + 32 * b, fmul(itof(sext(bload(w, p + 2))), d))
            vstore(out, o0 + 32 * b + 16, fmul(itof(sext(bload(w, p + 18))), d))


@njit(cache=_CACHE)
def _step_q8_0(w, p, h, b, j, x, xs, t, acc, off):
    x0 = t * x.shape[1] + 32 * b
    d = load_f16(w, p)
    a = fmul(itof(sext(bload(w, p + 2))), vload(x, x0))
    a = fmadd(itof(sext(bload(w, p + 18))), vload(x, x0 + 16), a)
    return fmadd(a, d, acc), off


# -- Q2_K [scales 16][qs 64][d f16][dmin f16], 256 weights in 16 runs of 16 -------------
# Weight n = 128 h + 32 s + l (h < 2, s < 4, l < 32) is (qs[32 h + l] >> 2 s) & 3; its run
# i = n // 16 has scale d * (scales[i] & 15) and min dmin * (scales[i] >> 4): w = dl * q - ml.


@njit(cache=_CACHE)
def _deq_q2_k(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 84):
            p = p0 + 84 * b
            sc = bload(w, p)
            dl = fmul(itof(zext(iand(sc, 15))), load_f16(w, p + 80))  # run i's scale in lane i
            ml = fmul(itof(zext(ishr(sc, 4))), load_f16(w, p + 82))
            for h in range(2):
                for half in range(2):
                    qv = bload(w, p + 16 + 32 * h + 16 * half)
                    for s in range(4):
                        i = 8 * h + 2 * s + half
                        q = itof(zext(iand(ishr(qv, 2 * s), 3)))
                        n = 256 * b + 128 * h + 32 * s + 16 * half
                        vstore(out, o0 + n, fsub(fmul(q, vlane(dl, i)), vlane(ml, i)))


@njit(cache=_CACHE)
def _head_q2_k(w, p):
    sc = bload(w, p)
    dl = fmul(itof(zext(iand(sc, 15))), load_f16(w, p + 80))  # lane i: run i's scale
    ml = fmul(itof(zext(ishr(sc, 4))), load_f16(w, p + 82))  # and its min
    return dl, ml


@njit(cache=_CACHE)
def _start_q2_k(w, p, h, b, xs, t, off):
    return fmadd(h[1], vload(xs, t * xs.shape[1] + 16 * b), off)  # each run's min * x sum


@njit(cache=_CACHE)
def _step_q2_k(w, p, h, b, j, x, xs, t, acc, off):
    g, half, s = j // 8, (j // 4) % 2, j % 4  # runs in the order (g, half, s)
    q = itof(zext(iand(ishr(bload(w, p + 16 + 32 * g + 16 * half), 2 * s), 3)))
    a = fmul(q, vload(x, t * x.shape[1] + 256 * b + 128 * g + 32 * s + 16 * half))
    return fmadd(a, vlane(h[0], 8 * g + 2 * s + half), acc), off


# -- Q3_K [hmask 32][qs 64][scales 12][d f16], 256 weights in 16 runs of 16 -------------
# Weight n = 128 h + 32 s + l: low bits (qs[32 h + l] >> 2 s) & 3, high bit (hmask[l] >>
# (4 h + s)) & 1, code = low - (4 if the high bit is clear); run i = n // 16 has scale
# d * (six bits - 32): the low four from scales[i % 8] (nibble i // 8), the high two from
# scales[8 + i % 4] (bits 2 (i // 4) and up).


@njit(cache=_CACHE)
def _q3_dl(w, p):
    """Lane i: run i's d * (scale - 32)."""
    return fmul(itof(sext(isub(q3_scales(w, p), 32))), load_f16(w, p + 108))


@njit(cache=_CACHE)
def _q3_code(w, p, h, s, half):
    low = iand(ishr(bload(w, p + 32 + 32 * h + 16 * half), 2 * s), 3)
    high = iand(ishr(bload(w, p + 16 * half), 4 * h + s), 1)
    return sext(isub(ior(low, ishl(high, 2)), 4))


@njit(cache=_CACHE)
def _deq_q3_k(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 110):
            p = p0 + 110 * b
            dl = _q3_dl(w, p)
            for h in range(2):
                for half in range(2):
                    for s in range(4):
                        q = itof(_q3_code(w, p, h, s, half))
                        n = 256 * b + 128 * h + 32 * s + 16 * half
                        vstore(out, o0 + n, fmul(q, vlane(dl, 8 * h + 2 * s + half)))


@njit(cache=_CACHE)
def _step_q3_k(w, p, h, b, j, x, xs, t, acc, off):
    g, half, s = j // 8, (j // 4) % 2, j % 4  # runs in the order (g, half, s)
    q = itof(_q3_code(w, p, g, s, half))
    a = fmul(q, vload(x, t * x.shape[1] + 256 * b + 128 * g + 32 * s + 16 * half))
    return fmadd(a, vlane(h, 8 * g + 2 * s + half), acc), off


# -- Q4_K [d f16][dmin f16][scales 12][qs 128], 256 weights in 8 runs of 32 -------------
# Weight n = 64 c + 32 j + l is (qs[32 c + l] >> 4 j) & 15, in run k = 2 c + j, whose 6-bit
# scale and min (simd.k_scales_mins) give w = (d * sc) * q - dmin * m.


@njit(cache=_CACHE)
def _k_scales(w, p):
    """Lanes [m0..m7, sc0..sc7] of the block at p as float32."""
    return itof(zext(k_scales_mins(w, p)))


@njit(cache=_CACHE)
def _deq_q4_k(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 144):
            p = p0 + 144 * b
            sm = _k_scales(w, p)
            dl = fmul(sm, load_f16(w, p))  # run k's d * sc in lane 8 + k
            ml = fmul(sm, load_f16(w, p + 2))  # its dmin * m in lane k
            for c in range(4):
                for j in range(2):
                    for half in range(2):
                        q = itof(zext(iand(ishr(bload(w, p + 16 + 32 * c + 16 * half), 4 * j), 15)))
                        n = 256 * b + 64 * c + 32 * j + 16 * half
                        k = 2 * c + j
                        vstore(out, o0 + n, fsub(fmul(q, vlane(dl, 8 + k)), vlane(ml, k)))


@njit(cache=_CACHE)
def _head_k(w, p):
    sm = _k_scales(w, p)
    return sm, fmul(sm, load_f16(w, p))  # lanes 8 + k: run k's d * sc


@njit(cache=_CACHE)
def _start_k(w, p, h, b, xs, t, off):
    # lanes 0..7: run k's dmin * m times its x sum; lanes 8..15: times 0
    return fmadd(fmul(h[0], load_f16(w, p + 2)), pairsum(vload(xs, t * xs.shape[1] + 16 * b)), off)


@njit(cache=_CACHE)
def _step_q4_k(w, p, h, b, j, x, xs, t, acc, off):
    c, i = j // 2, j % 2  # run j = 2 c + i: nibble i of qs[32 c ..]
    x0 = t * x.shape[1] + 256 * b + 32 * j
    a = fmul(itof(zext(iand(ishr(bload(w, p + 16 + 32 * c), 4 * i), 15))), vload(x, x0))
    a = fmadd(itof(zext(iand(ishr(bload(w, p + 32 + 32 * c), 4 * i), 15))), vload(x, x0 + 16), a)
    return fmadd(a, vlane(h[1], 8 + j), acc), off


# -- Q5_K [d f16][dmin f16][scales 12][qh 32][qs 128]: Q4_K plus a fifth bit, weight
# n = 32 k + l taking bit k of qh[l] -----------------------------------------------------


@njit(cache=_CACHE)
def _q5k_code(w, p, c, j, half):
    q = iand(ishr(bload(w, p + 48 + 32 * c + 16 * half), 4 * j), 15)
    hb = iand(ishr(bload(w, p + 16 + 16 * half), 2 * c + j), 1)
    return zext(ior(q, ishl(hb, 4)))


@njit(cache=_CACHE)
def _deq_q5_k(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 176):
            p = p0 + 176 * b
            sm = _k_scales(w, p)
            dl = fmul(sm, load_f16(w, p))
            ml = fmul(sm, load_f16(w, p + 2))
            for c in range(4):
                for j in range(2):
                    for half in range(2):
                        q = itof(_q5k_code(w, p, c, j, half))
                        n = 256 * b + 64 * c + 32 * j + 16 * half
                        k = 2 * c + j
                        vstore(out, o0 + n, fsub(fmul(q, vlane(dl, 8 + k)), vlane(ml, k)))


@njit(cache=_CACHE)
def _step_q5_k(w, p, h, b, j, x, xs, t, acc, off):
    c, i = j // 2, j % 2
    x0 = t * x.shape[1] + 256 * b + 32 * j
    a = fmul(itof(_q5k_code(w, p, c, i, 0)), vload(x, x0))
    a = fmadd(itof(_q5k_code(w, p, c, i, 1)), vload(x, x0 + 16), a)
    return fmadd(a, vlane(h[1], 8 + j), acc), off


# -- Q6_K [ql 128][qh 64][scales int8 16][d f16], 256 weights in 16 runs of 16 ----------
# Weight n = 128 h + q (q < 128): low four bits (ql[64 h + q % 64] >> 4 (q // 64)) & 15,
# high two (qh[32 h + q % 32] >> 2 (q // 32)) & 3, minus 32; run n // 16 has scale
# d * scales[n // 16]: w = (d * scale) * (code - 32).


@njit(cache=_CACHE)
def _q6_code(w, p, h, k):  # the codes of weights 16 k .. 16 k + 15 of half h
    lo = iand(ishr(zext(bload(w, p + 64 * h + 16 * (k % 4))), 4 * (k // 4)), 15)
    hi = iand(ishr(zext(bload(w, p + 128 + 32 * h + 16 * (k % 2))), 2 * (k // 2)), 3)
    return isub(ior(lo, ishl(hi, 4)), 32)


@njit(cache=_CACHE)
def _deq_q6_k(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 210):
            p = p0 + 210 * b
            dl = fmul(itof(sext(bload(w, p + 192))), load_f16(w, p + 208))  # lane i: run i's
            for h in range(2):
                for k in range(8):
                    q = itof(_q6_code(w, p, h, k))
                    vstore(out, o0 + 256 * b + 128 * h + 16 * k, fmul(q, vlane(dl, 8 * h + k)))


@njit(cache=_CACHE)
def _head_q6_k(w, p):
    return fmul(itof(sext(bload(w, p + 192))), load_f16(w, p + 208))  # lane i: run i's scale


@njit(cache=_CACHE)
def _step_q6_k(w, p, h, b, j, x, xs, t, acc, off):
    q = itof(_q6_code(w, p, j // 8, j % 8))
    return fmadd(fmul(q, vload(x, t * x.shape[1] + 256 * b + 16 * j)), vlane(h, j), acc), off


# -- IQ4_NL [d f16][qs 16]: Q4_0's nibble order, w = d * KV[nibble] ----------------------


@njit(cache=_CACHE)
def _levels_dot(lo, hi, x, x0):
    """A 32-weight run in Q4_0's nibble order, its low-nibble levels lo then its high ones
    hi (int8 lanes), times x[x0 : x0 + 32]: the table types' (IQ4_*, MXFP4) one product."""
    return fmadd(itof(sext(hi)), vload(x, x0 + 16), fmul(itof(sext(lo)), vload(x, x0)))


@njit(cache=_CACHE)
def _deq_iq4_nl(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 18):
            p = p0 + 18 * b
            d = load_f16(w, p)
            q = bload(w, p + 2)
            vstore(out, o0 + 32 * b, fmul(itof(sext(_iq4_level(iand(q, 15)))), d))
            vstore(out, o0 + 32 * b + 16, fmul(itof(sext(_iq4_level(ishr(q, 4)))), d))


@njit(cache=_CACHE)
def _step_iq4_nl(w, p, h, b, j, x, xs, t, acc, off):
    q = bload(w, p + 2)
    a = _levels_dot(_iq4_level(iand(q, 15)), _iq4_level(ishr(q, 4)), x, t * x.shape[1] + 32 * b)
    return fmadd(a, load_f16(w, p), acc), off


# -- IQ4_XS [d f16][scales_h u16][scales_l 4][qs 128], 256 weights in 8 runs of 32 -----
# Run k: scale d * ((((scales_l[k // 2] >> 4 (k % 2)) & 15) | ((scales_h >> 2 k) & 3) << 4)
# - 32); its 32 weights are KV[the nibbles of qs[16 k .. 16 k + 15]] in IQ4_NL's order.


@njit(cache=_CACHE)
def _iq4xs_scale(w, p, k):
    lo = (load_u8(w, p + 4 + k // 2) >> (4 * (k % 2))) & 15
    hi = (load_u16(w, p + 2) >> (2 * k)) & 3
    return np.float32((lo | (hi << 4)) - 32)


@njit(cache=_CACHE)
def _deq_iq4_xs(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 136):
            p = p0 + 136 * b
            d = load_f16(w, p)
            for k in range(8):
                dl = d * _iq4xs_scale(w, p, k)
                q = bload(w, p + 8 + 16 * k)
                vstore(out, o0 + 256 * b + 32 * k, fmul(itof(sext(_iq4_level(iand(q, 15)))), dl))
                vstore(
                    out, o0 + 256 * b + 32 * k + 16, fmul(itof(sext(_iq4_level(ishr(q, 4)))), dl)
                )


@njit(cache=_CACHE)
def _step_iq4_xs(w, p, h, b, j, x, xs, t, acc, off):
    x0 = t * x.shape[1] + 256 * b + 32 * j
    q = bload(w, p + 8 + 16 * j)
    a = _levels_dot(_iq4_level(iand(q, 15)), _iq4_level(ishr(q, 4)), x, x0)
    return fmadd(a, h * _iq4xs_scale(w, p, j), acc), off


# -- MXFP4 [e u8][qs 16]: Q4_0's nibble order, w = 2^(e - 128) * KV[nibble] ---------------


@njit(cache=_CACHE)
def _deq_mxfp4(w, index, i0, i1, out, o):
    for i in range(i0, i1):
        p0 = index[i] * w.shape[1]
        o0 = (o + i - i0) * out.shape[1]
        for b in range(w.shape[1] // 17):
            p = p0 + 17 * b
            d = _E8M0_HALF[load_u8(w, p)]
            q = bload(w, p + 1)
            vstore(out, o0 + 32 * b, fmul(itof(sext(_mxfp4_level(iand(q, 15)))), d))
            vstore(out, o0 + 32 * b + 16, fmul(itof(sext(_mxfp4_level(ishr(q, 4)))), d))


@njit(cache=_CACHE)
def _step_mxfp4(w, p, h, b, j, x, xs, t, acc, off):
    q = bload(w, p + 1)
    lo, hi = _mxfp4_level(iand(q, 15)), _mxfp4_level(ishr(q, 4))
    a = _levels_dot(lo, hi, x, t * x.shape[1] + 32 * b)
    return fmadd(a, _E8M0_HALF[load_u8(w, p)], acc), off


# -- the dot products: one driver over every type's block step -------------------------
# A type's step adds one block of row W[r] times x[t] to a running sum: `acc` (16 lanes)
# and `off` (what the type's mins contribute: a float, or 16 lanes for the K-quants), and
# its end turns the two into the product element. Each element is its row's blocks added
# in order, whatever else the call computes, so a row of x gets the same numbers alone or
# in any batch (a server's answers rely on it). The driver steps four (or two) rows of x
# through a block together: LLVM inlines the calls and unpacks the block's bytes once for
# all of them (each call reads them; nothing is stored between), which is where a batch's
# rows come cheap (SmolLM2's Q4_1 linears, two cores: 14 ms for one row, 16 for two, 49
# for eight; Q2_K, Q3_K and Q6_K do not merge, see kernels.SHARED_UNPACK).
#
# The type reaches the driver as a compile-time constant (numba types a literal int
# argument as its value), and `_block`/`_head`/`_start`/`_step`/`_end` resolve to the
# type's own while compiling, so each type's loop is a specialization with its steps
# inlined: a switch per block, or a call through a pointer, measured 30% slower.


@njit(cache=_CACHE)
def _no_head(w, p):
    return np.float32(0.0)


@njit(cache=_CACHE)
def _no_start(w, p, h, b, xs, t, off):
    return off


@njit(cache=_CACHE)
def _head_d(w, p):
    return load_f16(w, p)


@njit(cache=_CACHE)
def _plus(w, p0, x, t, acc, off):
    return hsum(acc) + off


@njit(cache=_CACHE)
def _minus(w, p0, x, t, acc, off):
    return hsum(acc) - hsum(off)


# type: (bytes per block, runs per block, head, start, step, end, mins in 16 lanes)
# head: what a block's runs share (its scales), read once per block for all rows of x;
# start: a row's sums before the block's runs (a K-quant's mins); step: run j of the
# block added; end: the row's two sums made one number.
_KINDS = {
    Q4_0: (18, 1, _no_head, _no_start, _step_q4_0, _plus, False),
    Q4_1: (20, 1, _no_head, _no_start, _step_q4_1, _plus, False),
    Q5_0: (22, 1, _no_head, _no_start, _step_q5_0, _plus, False),
    Q5_1: (24, 1, _no_head, _no_start, _step_q5_1, _plus, False),
    Q8_0: (34, 1, _no_head, _no_start, _step_q8_0, _plus, False),
    Q2_K: (84, 16, _head_q2_k, _start_q2_k, _step_q2_k, _minus, True),
    Q3_K: (110, 16, _q3_dl, _no_start, _step_q3_k, _plus, False),
    Q4_K: (144, 8, _head_k, _start_k, _step_q4_k, _minus, True),
    Q5_K: (176, 8, _head_k, _start_k, _step_q5_k, _minus, True),
    Q6_K: (210, 16, _head_q6_k, _no_start, _step_q6_k, _plus, False),
    IQ4_NL: (18, 1, _no_head, _no_start, _step_iq4_nl, _plus, False),
    IQ4_XS: (136, 8, _head_d, _no_start, _step_iq4_xs, _plus, False),
    MXFP4: (17, 1, _no_head, _no_start, _step_mxfp4, _plus, False),
    F16: (128, 1, _no_head, _no_start, _step_f16, _end_f16, False),
    BF16: (128, 1, _no_head, _no_start, _step_bf16, _end_bf16, False),
}


def _kind(qt: Any) -> tuple[Any, ...]:
    if not isinstance(qt, types.IntegerLiteral):
        raise TypingError("a dot kernel's type must be a compile-time constant")
    return _KINDS[qt.literal_value]


# Names that only compiled code calls: each overload below resolves it to qt's own
# function while numba compiles `_dots`; called from Python, they say so.
def _compiled_only() -> None:
    raise TypeError("the dot kernels' per-type steps run only inside compiled code")


def _block(qt):
    _compiled_only()


def _head(qt, w, p):
    _compiled_only()


def _start(qt, w, p, h, b, xs, t, off):
    _compiled_only()


def _step(qt, w, p, h, b, j, x, xs, t, acc, off):
    _compiled_only()


def _end(qt, w, p0, x, t, acc, off):
    _compiled_only()


@overload(_block, inline="always")
def _block_of(qt):
    size, runs, zero_lanes = _kind(qt)[0], _kind(qt)[1], _kind(qt)[6]
    if zero_lanes:
        return lambda qt: (size, runs, vzero())
    return lambda qt: (size, runs, np.float32(0.0))


@overload(_head, inline="always")
def _head_of(qt, w, p):
    f = _kind(qt)[2]
    return lambda qt, w, p: f(w, p)


@overload(_start, inline="always")
def _start_of(qt, w, p, h, b, xs, t, off):
    f = _kind(qt)[3]
    return lambda qt, w, p, h, b, xs, t, off: f(w, p, h, b, xs, t, off)


@overload(_step, inline="always")
def _step_of(qt, w, p, h, b, j, x, xs, t, acc, off):
    f = _kind(qt)[4]
    return lambda qt, w, p, h, b, j, x, xs, t, acc, off: f(w, p, h, b, j, x, xs, t, acc, off)


@overload(_end, inline="always")
def _end_of(qt, w, p0, x, t, acc, off):
    f = _kind(qt)[5]
    return lambda qt, w, p0, x, t, acc, off: f(w, p0, x, t, acc, off)


@njit(cache=_CACHE)
def _dots(qt, w, r0, r1, x, xs, out):
    """out[t, r] = x[t] . W[r] for the rows [r0, r1), W of the constant type qt."""
    T = x.shape[0]
    size, runs, off0 = _block(qt)
    nb = w.shape[1] // size
    if T == 1:  # decode's one row: the same sums, with x's row a constant (~15% faster)
        for r in range(r0, r1):
            p0 = r * w.shape[1]
            a0 = vzero()
            o0 = off0
            for b in range(nb):
                p = p0 + size * b
                h = _head(qt, w, p)
                o0 = _start(qt, w, p, h, b, xs, 0, o0)
                for j in range(runs):
                    a0, o0 = _step(qt, w, p, h, b, j, x, xs, 0, a0, o0)
            out[0, r] = _end(qt, w, p0, x, 0, a0, o0)
        return
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        t = 0
        while t < T:
            if T - t >= 3:  # four rows (three repeat the last; repeats written first)
                t1 = min(t + 1, T - 1)
                t2 = min(t + 2, T - 1)
                t3 = min(t + 3, T - 1)
                a0 = a1 = a2 = a3 = vzero()
                o0 = o1 = o2 = o3 = off0
                for b in range(nb):
                    p = p0 + size * b
                    h = _head(qt, w, p)
                    o0 = _start(qt, w, p, h, b, xs, t, o0)
                    o1 = _start(qt, w, p, h, b, xs, t1, o1)
                    o2 = _start(qt, w, p, h, b, xs, t2, o2)
                    o3 = _start(qt, w, p, h, b, xs, t3, o3)
                    for j in range(runs):
                        a0, o0 = _step(qt, w, p, h, b, j, x, xs, t, a0, o0)
                        a1, o1 = _step(qt, w, p, h, b, j, x, xs, t1, a1, o1)
                        a2, o2 = _step(qt, w, p, h, b, j, x, xs, t2, a2, o2)
                        a3, o3 = _step(qt, w, p, h, b, j, x, xs, t3, a3, o3)
                out[t3, r] = _end(qt, w, p0, x, t3, a3, o3)
                out[t2, r] = _end(qt, w, p0, x, t2, a2, o2)
                out[t1, r] = _end(qt, w, p0, x, t1, a1, o1)
                out[t, r] = _end(qt, w, p0, x, t, a0, o0)
                t += 4
            elif T - t == 2:
                a0 = a1 = vzero()
                o0 = o1 = off0
                for b in range(nb):
                    p = p0 + size * b
                    h = _head(qt, w, p)
                    o0 = _start(qt, w, p, h, b, xs, t, o0)
                    o1 = _start(qt, w, p, h, b, xs, t + 1, o1)
                    for j in range(runs):
                        a0, o0 = _step(qt, w, p, h, b, j, x, xs, t, a0, o0)
                        a1, o1 = _step(qt, w, p, h, b, j, x, xs, t + 1, a1, o1)
                out[t + 1, r] = _end(qt, w, p0, x, t + 1, a1, o1)
                out[t, r] = _end(qt, w, p0, x, t, a0, o0)
                t += 2
            else:
                a0 = vzero()
                o0 = off0
                for b in range(nb):
                    p = p0 + size * b
                    h = _head(qt, w, p)
                    o0 = _start(qt, w, p, h, b, xs, t, o0)
                    for j in range(runs):
                        a0, o0 = _step(qt, w, p, h, b, j, x, xs, t, a0, o0)
                out[t, r] = _end(qt, w, p0, x, t, a0, o0)
                t += 1


# -- the switches: one branch per type, each a specialization of its own ----------------


@njit(cache=_CACHE)
def _dot_rows(qt, w, r0, r1, x, xs, out):
    """out[t, r] = x[t] . W[r] for the rows [r0, r1); xs = _sums16(x)."""
    if qt == Q4_0:
        _dots(Q4_0, w, r0, r1, x, xs, out)
    elif qt == Q4_1:
        _dots(Q4_1, w, r0, r1, x, xs, out)
    elif qt == Q5_0:
        _dots(Q5_0, w, r0, r1, x, xs, out)
    elif qt == Q5_1:
        _dots(Q5_1, w, r0, r1, x, xs, out)
    elif qt == Q8_0:
        _dots(Q8_0, w, r0, r1, x, xs, out)
    elif qt == Q2_K:
        _dots(Q2_K, w, r0, r1, x, xs, out)
    elif qt == Q3_K:
        _dots(Q3_K, w, r0, r1, x, xs, out)
    elif qt == Q4_K:
        _dots(Q4_K, w, r0, r1, x, xs, out)
    elif qt == Q5_K:
        _dots(Q5_K, w, r0, r1, x, xs, out)
    elif qt == Q6_K:
        _dots(Q6_K, w, r0, r1, x, xs, out)
    elif qt == IQ4_NL:
        _dots(IQ4_NL, w, r0, r1, x, xs, out)
    elif qt == IQ4_XS:
        _dots(IQ4_XS, w, r0, r1, x, xs, out)
    elif qt == MXFP4:
        _dots(MXFP4, w, r0, r1, x, xs, out)
    elif qt == F16:
        _dots(F16, w, r0, r1, x, xs, out)
    elif qt == BF16:
        _dots(BF16, w, r0, r1, x, xs, out)


@njit(cache=_CACHE)
def _deq_rows(qt, w, index, i0, i1, out, o):
    """out[o + i - i0] = W[index[i]] for i in [i0, i1), exactly gguf-py's values."""
    if qt == Q4_0:
        _deq_q4_0(w, index, i0, i1, out, o)
    elif qt == Q4_1:
        _deq_q4_1(w, index, i0, i1, out, o)
    elif qt == Q5_0:
        _deq_q5_0(w, index, i0, i1, out, o)
    elif qt == Q5_1:
        _deq_q5_1(w, index, i0, i1, out, o)
    elif qt == Q8_0:
        _deq_q8_0(w, index, i0, i1, out, o)
    elif qt == Q2_K:
        _deq_q2_k(w, index, i0, i1, out, o)
    elif qt == Q3_K:
        _deq_q3_k(w, index, i0, i1, out, o)
    elif qt == Q4_K:
        _deq_q4_k(w, index, i0, i1, out, o)
    elif qt == Q5_K:
        _deq_q5_k(w, index, i0, i1, out, o)
    elif qt == Q6_K:
        _deq_q6_k(w, index, i0, i1, out, o)
    elif qt == IQ4_NL:
        _deq_iq4_nl(w, index, i0, i1, out, o)
    elif qt == IQ4_XS:
        _deq_iq4_xs(w, index, i0, i1, out, o)
    elif qt == MXFP4:
        _deq_mxfp4(w, index, i0, i1, out, o)
    elif qt == F16:
        _deq_half(w, index, i0, i1, out, o, False)
    elif qt == BF16:
        _deq_half(w, index, i0, i1, out, o, True)


# -- f32 rows times a few rows of x: one summation order for any row count ---------------
# Every product element x[t] . W[r] is made the same way: four 16-lane chains over columns
# k mod 64 (sequential in k), the fourth-of-64 tail into the first chain, the chains added
# as (0 + 1) + (2 + 3), summed across lanes, then the last cols % 16 columns one by one.
# Three loop shapes make it, by the rows of x, each fastest where it is used (SmolLM2's
# matrices, streamed from memory; GB/s of W on one core / two): one row of x, W read as
# one sequential stream (~20-25 / 28-40, BLAS's GEMV ~12-18 / 21); 2-4 rows, each W row
# dotted with four rows of x at once (~20 / 26); more, two W rows with two rows of x, so
# each load feeds two FMAs (~8 / 11 at 8 rows, BLAS's GEMM ~3.5 / 6). As the sums are the
# same in all three, a row's product does not depend on the rows beside it.


@njit(cache=_CACHE)
def _sum4(a0, a1, a2, a3):
    return hsum(fadd(fadd(a0, a1), fadd(a2, a3)))


@njit(cache=_CACHE)
def _f32_one(w, b, n, x, out, o):
    """out[0, o + j] = w[b + j] . x[0] for j < n (x has one row)."""
    cols = w.shape[1]
    c64 = cols - cols % 64
    c16 = cols - cols % 16
    for j in range(n):
        p = (b + j) * cols
        a0 = vzero()
        a1 = vzero()
        a2 = vzero()
        a3 = vzero()
        for k in range(0, c64, 64):
            a0 = fmadd(vload(w, p + k), vload(x, k), a0)
            a1 = fmadd(vload(w, p + k + 16), vload(x, k + 16), a1)
            a2 = fmadd(vload(w, p + k + 32), vload(x, k + 32), a2)
            a3 = fmadd(vload(w, p + k + 48), vload(x, k + 48), a3)
        for k in range(c64, c16, 16):
            a0 = fmadd(vload(w, p + k), vload(x, k), a0)
        s = _sum4(a0, a1, a2, a3)
        for k in range(c16, cols):
            s += w[b + j, k] * x[0, k]
        out[0, o + j] = s


@njit(cache=_CACHE)
def _f32_four(w, b, n, x, out, o):
    """out[t, o + j] = w[b + j] . x[t]: each row of w against four rows of x at a time
    (rows past x's last repeat it; their sums are dropped)."""
    cols = w.shape[1]
    c64 = cols - cols % 64
    c16 = cols - cols % 16
    T = x.shape[0]
    for j in range(n):
        p = (b + j) * cols
        for t in range(0, T, 4):
            t1 = min(t + 1, T - 1)
            t2 = min(t + 2, T - 1)
            t3 = min(t + 3, T - 1)
            x0 = t * cols
            x1 = t1 * cols
            x2 = t2 * cols
            x3 = t3 * cols
            a0 = vzero()
            a1 = vzero()
            a2 = vzero()
            a3 = vzero()
            b0 = vzero()
            b1 = vzero()
            b2 = vzero()
            b3 = vzero()
            c0 = vzero()
            c1 = vzero()
            c2 = vzero()
            c3 = vzero()
            d0 = vzero()
            d1 = vzero()
            d2 = vzero()
            d3 = vzero()
            for k in range(0, c64, 64):
                u0 = vload(w, p + k)
                u1 = vload(w, p + k + 16)
                u2 = vload(w, p + k + 32)
                u3 = vload(w, p + k + 48)
                a0 = fmadd(u0, vload(x, x0 + k), a0)
                a1 = fmadd(u1, vload(x, x0 + k + 16), a1)
                a2 = fmadd(u2, vload(x, x0 + k + 32), a2)
                a3 = fmadd(u3, vload(x, x0 + k + 48), a3)
                b0 = fmadd(u0, vload(x, x1 + k), b0)
                b1 = fmadd(u1, vload(x, x1 + k + 16), b1)
                b2 = fmadd(u2, vload(x, x1 + k + 32), b2)
                b3 = fmadd(u3, vload(x, x1 + k + 48), b3)
                c0 = fmadd(u0, vload(x, x2 + k), c0)
                c1 = fmadd(u1, vload(x, x2 + k + 16), c1)
                c2 = fmadd(u2, vload(x, x2 + k + 32), c2)
                c3 = fmadd(u3, vload(x, x2 + k + 48), c3)
                d0 = fmadd(u0, vload(x, x3 + k), d0)
                d1 = fmadd(u1, vload(x, x3 + k + 16), d1)
                d2 = fmadd(u2, vload(x, x3 + k + 32), d2)
                d3 = fmadd(u3, vload(x, x3 + k + 48), d3)
            for k in range(c64, c16, 16):
                u0 = vload(w, p + k)
                a0 = fmadd(u0, vload(x, x0 + k), a0)
                b0 = fmadd(u0, vload(x, x1 + k), b0)
                c0 = fmadd(u0, vload(x, x2 + k), c0)
                d0 = fmadd(u0, vload(x, x3 + k), d0)
            sa = _sum4(a0, a1, a2, a3)
            sb = _sum4(b0, b1, b2, b3)
            sc = _sum4(c0, c1, c2, c3)
            sd = _sum4(d0, d1, d2, d3)
            for k in range(c16, cols):
                sa += w[b + j, k] * x[t, k]
                sb += w[b + j, k] * x[t1, k]
                sc += w[b + j, k] * x[t2, k]
                sd += w[b + j, k] * x[t3, k]
            # Repeated rows are written first, the real ones last.
            out[t3, o + j] = sd
            out[t2, o + j] = sc
            out[t1, o + j] = sb
            out[t, o + j] = sa


@njit(cache=_CACHE)
def _f32_pairs(w, b, n, x, out, o):
    """out[t, o + j] = w[b + j] . x[t]: two rows of w against two rows of x at a time, so
    each load feeds two FMAs (rows past the last repeat it; their sums are dropped)."""
    cols = w.shape[1]
    c64 = cols - cols % 64
    c16 = cols - cols % 16
    T = x.shape[0]
    for j in range(0, n, 2):
        jb = min(j + 1, n - 1)
        pa = (b + j) * cols
        pb = (b + jb) * cols
        for t in range(0, T, 2):
            tb = min(t + 1, T - 1)
            xa = t * cols
            xb = tb * cols
            a0 = vzero()
            a1 = vzero()
            a2 = vzero()
            a3 = vzero()
            b0 = vzero()
            b1 = vzero()
            b2 = vzero()
            b3 = vzero()
            c0 = vzero()
            c1 = vzero()
            c2 = vzero()
            c3 = vzero()
            d0 = vzero()
            d1 = vzero()
            d2 = vzero()
            d3 = vzero()
            for k in range(0, c64, 64):
                u0 = vload(w, pa + k)
                u1 = vload(w, pa + k + 16)
                u2 = vload(w, pa + k + 32)
                u3 = vload(w, pa + k + 48)
                v0 = vload(w, pb + k)
                v1 = vload(w, pb + k + 16)
                v2 = vload(w, pb + k + 32)
                v3 = vload(w, pb + k + 48)
                y0 = vload(x, xa + k)
                y1 = vload(x, xa + k + 16)
                y2 = vload(x, xa + k + 32)
                y3 = vload(x, xa + k + 48)
                a0 = fmadd(u0, y0, a0)
                a1 = fmadd(u1, y1, a1)
                a2 = fmadd(u2, y2, a2)
                a3 = fmadd(u3, y3, a3)
                c0 = fmadd(v0, y0, c0)
                c1 = fmadd(v1, y1, c1)
                c2 = fmadd(v2, y2, c2)
                c3 = fmadd(v3, y3, c3)
                z0 = vload(x, xb + k)
                z1 = vload(x, xb + k + 16)
                z2 = vload(x, xb + k + 32)
                z3 = vload(x, xb + k + 48)
                b0 = fmadd(u0, z0, b0)
                b1 = fmadd(u1, z1, b1)
                b2 = fmadd(u2, z2, b2)
                b3 = fmadd(u3, z3, b3)
                d0 = fmadd(v0, z0, d0)
                d1 = fmadd(v1, z1, d1)
                d2 = fmadd(v2, z2, d2)
                d3 = fmadd(v3, z3, d3)
            for k in range(c64, c16, 16):
                u0 = vload(w, pa + k)
                v0 = vload(w, pb + k)
                y0 = vload(x, xa + k)
                z0 = vload(x, xb + k)
                a0 = fmadd(u0, y0, a0)
                c0 = fmadd(v0, y0, c0)
                b0 = fmadd(u0, z0, b0)
                d0 = fmadd(v0, z0, d0)
            sa = _sum4(a0, a1, a2, a3)
            sb = _sum4(b0, b1, b2, b3)
            sc = _sum4(c0, c1, c2, c3)
            sd = _sum4(d0, d1, d2, d3)
            for k in range(c16, cols):
                sa += w[b + j, k] * x[t, k]
                sb += w[b + j, k] * x[tb, k]
                sc += w[b + jb, k] * x[t, k]
                sd += w[b + jb, k] * x[tb, k]
            out[tb, o + jb] = sd
            out[t, o + jb] = sc
            out[tb, o + j] = sb
            out[t, o + j] = sa


@njit(cache=_CACHE)
def _dots_f32(buf, b, n, x, out, o):
    """out[t, o + j] = buf[b + j] . x[t] for j < n, in the one summation order above."""
    if x.shape[0] == 1:
        _f32_one(buf, b, n, x, out, o)
    elif x.shape[0] <= 4:
        _f32_four(buf, b, n, x, out, o)
    else:
        _f32_pairs(buf, b, n, x, out, o)


@njit(cache=_CACHE)
def _sums16(x):
    """xs[t, k] = x[t, 16 k : 16 k + 16].sum(): what a block's min multiplies."""
    n16 = x.shape[1] // 16
    xs = np.empty((x.shape[0], n16), np.float32)
    for t in range(x.shape[0]):
        for k in range(n16):
            xs[t, k] = hsum(vload(x, t * x.shape[1] + 16 * k))
    return xs


# -- the drivers: row chunks over numba's threads ----------------------------------------
# prange counts in uint64; the chunk bounds are cast to int64 so the callees compile for
# one signature, not two. 16 rows a chunk: fine enough to balance two threads on 576 rows.

_CHUNK = 16


@njit(cache=_CACHE, parallel=True)
def matvec(qt, w, x, out):
    """out[t, r] = x[t] . W[r] by the fused dots of W's type: decode's kernel, W's bytes read
    once per call, each block unpacked once per four rows of x (where LLVM merges it)."""
    xs = _sums16(x)
    rows = w.shape[0]
    for c in prange((rows + _CHUNK - 1) // _CHUNK):
        r0 = np.int64(c) * _CHUNK
        _dot_rows(qt, w, r0, min(rows, r0 + _CHUNK), x, xs, out)


@njit(cache=_CACHE, parallel=True)
def matmul_small(qt, w, x, out):
    """out = x @ W.T for a few rows of x: a chunk of W's rows dequantized into a buffer
    (cache-resident), then each row dotted with every row of x."""
    rows = w.shape[0]
    every = np.arange(rows)
    for c in prange((rows + _CHUNK - 1) // _CHUNK):
        r0 = np.int64(c) * _CHUNK
        r1 = min(rows, r0 + _CHUNK)
        buf = np.empty((_CHUNK, x.shape[1]), np.float32)
        _deq_rows(qt, w, every, r0, r1, buf, np.int64(0))
        _dots_f32(buf, np.int64(0), r1 - r0, x, out, r0)


@njit(cache=_CACHE, parallel=True)
def dequantize(qt, w, index, out):
    """out[i] = W[index[i]], exactly as gguf-py dequantizes it (the caller has checked the
    indices; a row range is an arange)."""
    n = index.shape[0]
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        i0 = np.int64(c) * _CHUNK
        _deq_rows(qt, w, index, i0, min(n, i0 + _CHUNK), out, i0)


@njit(cache=_CACHE, parallel=True)
def matmul_f32(w, x, out):
    """out = x @ W.T for an f32 W [rows, cols] and a few rows of x, read straight from W:
    the host's small-batch product (decode rows), the same sums for any row count of x."""
    rows = w.shape[0]
    for c in prange((rows + _CHUNK - 1) // _CHUNK):
        r0 = np.int64(c) * _CHUNK
        _dots_f32(w, r0, min(rows, r0 + _CHUNK) - r0, x, out, r0)
