"""The compiled kernels: each type's blocks unpacked in registers (simd.py's vectors), as
dot products with f32 activations and as exact dequantization.

Why two codings of every type: a dequantization must equal gguf-py's bit for bit (the
reference, gguf/quants.py, and through it ggml-quants.c), so it repeats gguf-py's float
operations in gguf-py's order and never fuses them. A dot product only has to be close to
`x @ dequantize(W).T` (its summation order differs anyway), so it is arranged for speed:
the integer codes times x, summed per block or sub-block and scaled once (`fmadd`, fused
where the host has FMA); a block's constant part (Q4_1's min, Q4_0's -8, ...) applied to
the sum of x over the block, which each driver computes once per call (`_sums16`).

Each driver switches on the type once per row, so one compiled function serves every type
and the switch costs nothing next to a row's blocks. The byte layout of each type is
written beside its code, in gguf-py's terms.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from .simd import (
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
    lane_bits,
    load_bf16,
    load_f16,
    load_i8,
    load_u8,
    load_u16,
    load_u32,
    lut,
    vload,
    vload_bf16,
    vload_f16,
    vload_i8,
    vload_u8,
    vstore,
    vzero,
)

F16, BF16 = int(T.F16), int(T.BF16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1), int(T.Q8_0)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = int(T.Q2_K), int(T.Q3_K), int(T.Q4_K), int(T.Q5_K), int(T.Q6_K)
IQ4_NL, IQ4_XS = int(T.IQ4_NL), int(T.IQ4_XS)

# IQ4_NL / IQ4_XS: the 16 levels a nibble indexes (gguf-py IQ4_NL.kvalues, ggml kvalues_iq4nl).
_KV = np.array(
    (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113), dtype=np.float32
)


# -- F16, BF16: 2 bytes per weight ------------------------------------------------------


@njit(cache=True)
def _deq_f16(w, r, out, i, bf):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    n = w.shape[1] // 2
    n16 = n - n % 16
    for k in range(0, n16, 16):
        vstore(out, o0 + k, vload_bf16(w, p0 + 2 * k) if bf else vload_f16(w, p0 + 2 * k))
    for k in range(n16, n):
        out[i, k] = load_bf16(w, p0 + 2 * k) if bf else load_f16(w, p0 + 2 * k)


@njit(cache=True)
def _dot_f16(w, r, x, t, bf):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    n = w.shape[1] // 2
    n64 = n - n % 64
    a0 = vzero()
    a1 = vzero()
    a2 = vzero()
    a3 = vzero()
    for k in range(0, n64, 64):  # four chains: one would wait on each fma's latency
        p = p0 + 2 * k
        if bf:
            a0 = fmadd(vload_bf16(w, p), vload(x, x0 + k), a0)
            a1 = fmadd(vload_bf16(w, p + 32), vload(x, x0 + k + 16), a1)
            a2 = fmadd(vload_bf16(w, p + 64), vload(x, x0 + k + 32), a2)
            a3 = fmadd(vload_bf16(w, p + 96), vload(x, x0 + k + 48), a3)
        else:
            a0 = fmadd(vload_f16(w, p), vload(x, x0 + k), a0)
            a1 = fmadd(vload_f16(w, p + 32), vload(x, x0 + k + 16), a1)
            a2 = fmadd(vload_f16(w, p + 64), vload(x, x0 + k + 32), a2)
            a3 = fmadd(vload_f16(w, p + 96), vload(x, x0 + k + 48), a3)
    s = hsum(fadd(fadd(a0, a1), fadd(a2, a3)))
    for k in range(n64, n):
        s += (load_bf16(w, p0 + 2 * k) if bf else load_f16(w, p0 + 2 * k)) * x[t, k]
    return s


# -- Q4_0 [d f16][qs 16]: w[j] = d * ((qs[j] & 15) - 8), w[j + 16] = d * ((qs[j] >> 4) - 8)


@njit(cache=True)
def _deq_q4_0(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 18):
        p = p0 + 18 * b
        d = load_f16(w, p)
        q = vload_u8(w, p + 2)
        vstore(out, o0 + 32 * b, fmul(itof(isub(iand(q, 15), 8)), d))
        vstore(out, o0 + 32 * b + 16, fmul(itof(isub(ishr(q, 4), 8)), d))


@njit(cache=True)
def _dot_q4_0(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    off = np.float32(0.0)
    for b in range(w.shape[1] // 18):
        p = p0 + 18 * b
        d = load_f16(w, p)
        q = vload_u8(w, p + 2)
        a = fmul(itof(iand(q, 15)), vload(x, x0 + 32 * b))
        a = fmadd(itof(ishr(q, 4)), vload(x, x0 + 32 * b + 16), a)
        acc = fmadd(a, d, acc)
        off += d * (xs[t, 2 * b] + xs[t, 2 * b + 1])
    return hsum(acc) - np.float32(8.0) * off


# -- Q4_1 [d f16][m f16][qs 16]: w = d * nibble + m, nibbles as Q4_0 ---------------------


@njit(cache=True)
def _deq_q4_1(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 20):
        p = p0 + 20 * b
        d = load_f16(w, p)
        m = load_f16(w, p + 2)
        q = vload_u8(w, p + 4)
        vstore(out, o0 + 32 * b, fadd(fmul(itof(iand(q, 15)), d), m))
        vstore(out, o0 + 32 * b + 16, fadd(fmul(itof(ishr(q, 4)), d), m))


@njit(cache=True)
def _dot_q4_1(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    off = np.float32(0.0)
    for b in range(w.shape[1] // 20):
        p = p0 + 20 * b
        d = load_f16(w, p)
        m = load_f16(w, p + 2)
        q = vload_u8(w, p + 4)
        a = fmul(itof(iand(q, 15)), vload(x, x0 + 32 * b))
        a = fmadd(itof(ishr(q, 4)), vload(x, x0 + 32 * b + 16), a)
        acc = fmadd(a, d, acc)
        off += m * (xs[t, 2 * b] + xs[t, 2 * b + 1])
    return hsum(acc) + off


# -- Q5_0 [d f16][qh u32][qs 16]: w[j] = d * ((nibble | (bit j of qh) << 4) - 16) --------


@njit(cache=True)
def _q5_lo(q, qh):
    return ior(iand(q, 15), ishl(lane_bits(qh, 0), 4))


@njit(cache=True)
def _q5_hi(q, qh):
    return ior(ishr(q, 4), ishl(lane_bits(qh, 16), 4))


@njit(cache=True)
def _deq_q5_0(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 22):
        p = p0 + 22 * b
        d = load_f16(w, p)
        qh = load_u32(w, p + 2)
        q = vload_u8(w, p + 6)
        vstore(out, o0 + 32 * b, fmul(itof(isub(_q5_lo(q, qh), 16)), d))
        vstore(out, o0 + 32 * b + 16, fmul(itof(isub(_q5_hi(q, qh), 16)), d))


@njit(cache=True)
def _dot_q5_0(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    off = np.float32(0.0)
    for b in range(w.shape[1] // 22):
        p = p0 + 22 * b
        d = load_f16(w, p)
        qh = load_u32(w, p + 2)
        q = vload_u8(w, p + 6)
        a = fmul(itof(_q5_lo(q, qh)), vload(x, x0 + 32 * b))
        a = fmadd(itof(_q5_hi(q, qh)), vload(x, x0 + 32 * b + 16), a)
        acc = fmadd(a, d, acc)
        off += d * (xs[t, 2 * b] + xs[t, 2 * b + 1])
    return hsum(acc) - np.float32(16.0) * off


# -- Q5_1 [d f16][m f16][qh u32][qs 16]: w = d * code + m, codes as Q5_0 -----------------


@njit(cache=True)
def _deq_q5_1(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 24):
        p = p0 + 24 * b
        d = load_f16(w, p)
        m = load_f16(w, p + 2)
        qh = load_u32(w, p + 4)
        q = vload_u8(w, p + 8)
        vstore(out, o0 + 32 * b, fadd(fmul(itof(_q5_lo(q, qh)), d), m))
        vstore(out, o0 + 32 * b + 16, fadd(fmul(itof(_q5_hi(q, qh)), d), m))


@njit(cache=True)
def _dot_q5_1(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    off = np.float32(0.0)
    for b in range(w.shape[1] // 24):
        p = p0 + 24 * b
        d = load_f16(w, p)
        m = load_f16(w, p + 2)
        qh = load_u32(w, p + 4)
        q = vload_u8(w, p + 8)
        a = fmul(itof(_q5_lo(q, qh)), vload(x, x0 + 32 * b))
        a = fmadd(itof(_q5_hi(q, qh)), vload(x, x0 + 32 * b + 16), a)
        acc = fmadd(a, d, acc)
        off += m * (xs[t, 2 * b] + xs[t, 2 * b + 1])
    return hsum(acc) + off


# -- Q8_0 [d f16][qs int8 32]: w[j] = qs[j] * d ------------------------------------------


@njit(cache=True)
def _deq_q8_0(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 34):
        p = p0 + 34 * b
        d = load_f16(w, p)
        vstore(out, o0 + 32 * b, fmul(itof(vload_i8(w, p + 2)), d))
        vstore(out, o0 + 32 * b + 16, fmul(itof(vload_i8(w, p + 18)), d))


@njit(cache=True)
def _dot_q8_0(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    for b in range(w.shape[1] // 34):
        p = p0 + 34 * b
        d = load_f16(w, p)
        a = fmul(itof(vload_i8(w, p + 2)), vload(x, x0 + 32 * b))
        a = fmadd(itof(vload_i8(w, p + 18)), vload(x, x0 + 32 * b + 16), a)
        acc = fmadd(a, d, acc)
    return hsum(acc)


# -- Q2_K [scales 16][qs 64][d f16][dmin f16], 256 weights in 16 runs of 16 -------------
# Weight n = 128 h + 32 s + l (h < 2, s < 4, l < 32) is (qs[32 h + l] >> 2 s) & 3; its run
# i = n // 16 has scale d * (scales[i] & 15) and min dmin * (scales[i] >> 4): w = dl * q - ml.


@njit(cache=True)
def _deq_q2_k(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 84):
        p = p0 + 84 * b
        d = load_f16(w, p + 80)
        dmin = load_f16(w, p + 82)
        for h in range(2):
            for half in range(2):
                qv = vload_u8(w, p + 16 + 32 * h + 16 * half)
                for s in range(4):
                    sc = load_u8(w, p + 8 * h + 2 * s + half)
                    dl = d * np.float32(sc & 15)
                    ml = dmin * np.float32(sc >> 4)
                    q = itof(iand(ishr(qv, 2 * s), 3))
                    n = 256 * b + 128 * h + 32 * s + 16 * half
                    vstore(out, o0 + n, fsub(fmul(q, dl), ml))


@njit(cache=True)
def _dot_q2_k(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    off = np.float32(0.0)
    for b in range(w.shape[1] // 84):
        p = p0 + 84 * b
        d = load_f16(w, p + 80)
        dmin = load_f16(w, p + 82)
        for h in range(2):
            for half in range(2):
                qv = vload_u8(w, p + 16 + 32 * h + 16 * half)
                for s in range(4):
                    sc = load_u8(w, p + 8 * h + 2 * s + half)
                    n = 256 * b + 128 * h + 32 * s + 16 * half
                    q = itof(iand(ishr(qv, 2 * s), 3))
                    acc = fmadd(fmul(q, vload(x, x0 + n)), d * np.float32(sc & 15), acc)
                    off += dmin * np.float32(sc >> 4) * xs[t, n // 16]
    return hsum(acc) - off


# -- Q3_K [hmask 32][qs 64][scales 12][d f16], 256 weights in 16 runs of 16 -------------
# Weight n = 128 h + 32 s + l: low bits (qs[32 h + l] >> 2 s) & 3, high bit (hmask[l] >>
# (4 h + s)) & 1, code = low - (4 if the high bit is clear); run i = n // 16 has scale
# d * (six bits - 32): the low four from scales[i % 8] (nibble i // 8), the high two from
# scales[8 + i % 4] (bits 2 (i // 4) and up).


@njit(cache=True)
def _q3_scale(w, p, i):
    lo = (load_u8(w, p + 96 + i % 8) >> (4 * (i // 8))) & 15
    hi = (load_u8(w, p + 104 + i % 4) >> (2 * (i // 4))) & 3
    return np.float32((lo | (hi << 4)) - 32)


@njit(cache=True)
def _q3_code4(w, p, h, s, half):  # code + 4
    low = iand(ishr(vload_u8(w, p + 32 + 32 * h + 16 * half), 2 * s), 3)
    high = iand(ishr(vload_u8(w, p + 16 * half), 4 * h + s), 1)
    return ior(low, ishl(high, 2))


@njit(cache=True)
def _deq_q3_k(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 110):
        p = p0 + 110 * b
        d = load_f16(w, p + 108)
        for h in range(2):
            for half in range(2):
                for s in range(4):
                    dl = d * _q3_scale(w, p, 8 * h + 2 * s + half)
                    q = itof(isub(_q3_code4(w, p, h, s, half), 4))
                    n = 256 * b + 128 * h + 32 * s + 16 * half
                    vstore(out, o0 + n, fmul(q, dl))


@njit(cache=True)
def _dot_q3_k(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    off = np.float32(0.0)
    for b in range(w.shape[1] // 110):
        p = p0 + 110 * b
        d = load_f16(w, p + 108)
        for h in range(2):
            for half in range(2):
                for s in range(4):
                    dl = d * _q3_scale(w, p, 8 * h + 2 * s + half)
                    n = 256 * b + 128 * h + 32 * s + 16 * half
                    q = itof(_q3_code4(w, p, h, s, half))
                    acc = fmadd(fmul(q, vload(x, x0 + n)), dl, acc)
                    off += dl * xs[t, n // 16]
    return hsum(acc) - np.float32(4.0) * off


# -- Q4_K [d f16][dmin f16][scales 12][qs 128], 256 weights in 8 runs of 32 -------------
# Weight n = 64 c + 32 j + l is (qs[32 c + l] >> 4 j) & 15, in run 2 c + j; run k's 6-bit
# scale and min (gguf-py Q4_K.get_scale_min) give w = (d * sc) * q - dmin * m.


@njit(cache=True)
def _k_scale(w, p, k):  # p: the first byte of the 12 scale bytes
    if k < 4:
        return np.float32(load_u8(w, p + k) & 63)
    return np.float32((load_u8(w, p + k + 4) & 15) | ((load_u8(w, p + k - 4) >> 6) << 4))


@njit(cache=True)
def _k_min(w, p, k):
    if k < 4:
        return np.float32(load_u8(w, p + k + 4) & 63)
    return np.float32((load_u8(w, p + k + 4) >> 4) | ((load_u8(w, p + k) >> 6) << 4))


@njit(cache=True)
def _deq_q4_k(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 144):
        p = p0 + 144 * b
        d = load_f16(w, p)
        dmin = load_f16(w, p + 2)
        for c in range(4):
            for j in range(2):
                dl = d * _k_scale(w, p + 4, 2 * c + j)
                ml = dmin * _k_min(w, p + 4, 2 * c + j)
                for half in range(2):
                    q = itof(iand(ishr(vload_u8(w, p + 16 + 32 * c + 16 * half), 4 * j), 15))
                    n = 256 * b + 64 * c + 32 * j + 16 * half
                    vstore(out, o0 + n, fsub(fmul(q, dl), ml))


@njit(cache=True)
def _dot_q4_k(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    off = np.float32(0.0)
    for b in range(w.shape[1] // 144):
        p = p0 + 144 * b
        d = load_f16(w, p)
        dmin = load_f16(w, p + 2)
        for c in range(4):
            q0 = vload_u8(w, p + 16 + 32 * c)
            q1 = vload_u8(w, p + 32 + 32 * c)
            for j in range(2):
                n = 256 * b + 64 * c + 32 * j
                a = fmul(itof(iand(ishr(q0, 4 * j), 15)), vload(x, x0 + n))
                a = fmadd(itof(iand(ishr(q1, 4 * j), 15)), vload(x, x0 + n + 16), a)
                acc = fmadd(a, d * _k_scale(w, p + 4, 2 * c + j), acc)
                ms = dmin * _k_min(w, p + 4, 2 * c + j)
                off += ms * (xs[t, n // 16] + xs[t, n // 16 + 1])
    return hsum(acc) - off


# -- Q5_K [d f16][dmin f16][scales 12][qh 32][qs 128]: Q4_K plus a fifth bit, weight
# n = 32 k + l taking bit k of qh[l] -----------------------------------------------------


@njit(cache=True)
def _q5k_code(w, p, c, j, half):
    q = iand(ishr(vload_u8(w, p + 48 + 32 * c + 16 * half), 4 * j), 15)
    hb = iand(ishr(vload_u8(w, p + 16 + 16 * half), 2 * c + j), 1)
    return ior(q, ishl(hb, 4))


@njit(cache=True)
def _deq_q5_k(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 176):
        p = p0 + 176 * b
        d = load_f16(w, p)
        dmin = load_f16(w, p + 2)
        for c in range(4):
            for j in range(2):
                dl = d * _k_scale(w, p + 4, 2 * c + j)
                ml = dmin * _k_min(w, p + 4, 2 * c + j)
                for half in range(2):
                    q = itof(_q5k_code(w, p, c, j, half))
                    n = 256 * b + 64 * c + 32 * j + 16 * half
                    vstore(out, o0 + n, fsub(fmul(q, dl), ml))


@njit(cache=True)
def _dot_q5_k(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    off = np.float32(0.0)
    for b in range(w.shape[1] // 176):
        p = p0 + 176 * b
        d = load_f16(w, p)
        dmin = load_f16(w, p + 2)
        for c in range(4):
            for j in range(2):
                n = 256 * b + 64 * c + 32 * j
                a = fmul(itof(_q5k_code(w, p, c, j, 0)), vload(x, x0 + n))
                a = fmadd(itof(_q5k_code(w, p, c, j, 1)), vload(x, x0 + n + 16), a)
                acc = fmadd(a, d * _k_scale(w, p + 4, 2 * c + j), acc)
                ms = dmin * _k_min(w, p + 4, 2 * c + j)
                off += ms * (xs[t, n // 16] + xs[t, n // 16 + 1])
    return hsum(acc) - off


# -- Q6_K [ql 128][qh 64][scales int8 16][d f16], 256 weights in 16 runs of 16 ----------
# Weight n = 128 h + q (q < 128): low four bits (ql[64 h + q % 64] >> 4 (q // 64)) & 15,
# high two (qh[32 h + q % 32] >> 2 (q // 32)) & 3, minus 32; run n // 16 has scale
# d * scales[n // 16]: w = (d * scale) * (code - 32).


@njit(cache=True)
def _q6_code32(w, p, h, k):  # code + 32 of the weights 16 k .. 16 k + 15 of half h
    lo = iand(ishr(vload_u8(w, p + 64 * h + 16 * (k % 4)), 4 * (k // 4)), 15)
    hi = iand(ishr(vload_u8(w, p + 128 + 32 * h + 16 * (k % 2)), 2 * (k // 2)), 3)
    return ior(lo, ishl(hi, 4))


@njit(cache=True)
def _deq_q6_k(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 210):
        p = p0 + 210 * b
        d = load_f16(w, p + 208)
        for h in range(2):
            for k in range(8):
                dl = d * np.float32(load_i8(w, p + 192 + 8 * h + k))
                q = itof(isub(_q6_code32(w, p, h, k), 32))
                vstore(out, o0 + 256 * b + 128 * h + 16 * k, fmul(q, dl))


@njit(cache=True)
def _dot_q6_k(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    off = np.float32(0.0)
    for b in range(w.shape[1] // 210):
        p = p0 + 210 * b
        d = load_f16(w, p + 208)
        for h in range(2):
            for k in range(8):
                dl = d * np.float32(load_i8(w, p + 192 + 8 * h + k))
                n = 256 * b + 128 * h + 16 * k
                acc = fmadd(fmul(itof(_q6_code32(w, p, h, k)), vload(x, x0 + n)), dl, acc)
                off += dl * xs[t, n // 16]
    return hsum(acc) - np.float32(32.0) * off


# -- IQ4_NL [d f16][qs 16]: Q4_0's nibble order, w = d * KV[nibble] ----------------------


@njit(cache=True)
def _deq_iq4_nl(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 18):
        p = p0 + 18 * b
        d = load_f16(w, p)
        q = vload_u8(w, p + 2)
        vstore(out, o0 + 32 * b, fmul(lut(_KV, iand(q, 15)), d))
        vstore(out, o0 + 32 * b + 16, fmul(lut(_KV, ishr(q, 4)), d))


@njit(cache=True)
def _dot_iq4_nl(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    for b in range(w.shape[1] // 18):
        p = p0 + 18 * b
        d = load_f16(w, p)
        q = vload_u8(w, p + 2)
        a = fmul(lut(_KV, iand(q, 15)), vload(x, x0 + 32 * b))
        a = fmadd(lut(_KV, ishr(q, 4)), vload(x, x0 + 32 * b + 16), a)
        acc = fmadd(a, d, acc)
    return hsum(acc)


# -- IQ4_XS [d f16][scales_h u16][scales_l 4][qs 128], 256 weights in 8 runs of 32 -----
# Run k: scale d * ((((scales_l[k // 2] >> 4 (k % 2)) & 15) | ((scales_h >> 2 k) & 3) << 4)
# - 32); its 32 weights are KV[the nibbles of qs[16 k .. 16 k + 15]] in IQ4_NL's order.


@njit(cache=True)
def _iq4xs_scale(w, p, k):
    lo = (load_u8(w, p + 4 + k // 2) >> (4 * (k % 2))) & 15
    hi = (load_u16(w, p + 2) >> (2 * k)) & 3
    return np.float32((lo | (hi << 4)) - 32)


@njit(cache=True)
def _deq_iq4_xs(w, r, out, i):
    p0 = r * w.shape[1]
    o0 = i * out.shape[1]
    for b in range(w.shape[1] // 136):
        p = p0 + 136 * b
        d = load_f16(w, p)
        for k in range(8):
            dl = d * _iq4xs_scale(w, p, k)
            q = vload_u8(w, p + 8 + 16 * k)
            vstore(out, o0 + 256 * b + 32 * k, fmul(lut(_KV, iand(q, 15)), dl))
            vstore(out, o0 + 256 * b + 32 * k + 16, fmul(lut(_KV, ishr(q, 4)), dl))


@njit(cache=True)
def _dot_iq4_xs(w, r, x, t, xs):
    p0 = r * w.shape[1]
    x0 = t * x.shape[1]
    acc = vzero()
    for b in range(w.shape[1] // 136):
        p = p0 + 136 * b
        d = load_f16(w, p)
        for k in range(8):
            q = vload_u8(w, p + 8 + 16 * k)
            n = 256 * b + 32 * k
            a = fmul(lut(_KV, iand(q, 15)), vload(x, x0 + n))
            a = fmadd(lut(_KV, ishr(q, 4)), vload(x, x0 + n + 16), a)
            acc = fmadd(a, d * _iq4xs_scale(w, p, k), acc)
    return hsum(acc)


# -- the per-row switches ---------------------------------------------------------------


@njit(cache=True)
def _deq_row(qt, w, r, out, i):
    """out[i] = row r of w, dequantized."""
    if qt == Q4_0:
        _deq_q4_0(w, r, out, i)
    elif qt == Q4_1:
        _deq_q4_1(w, r, out, i)
    elif qt == Q5_0:
        _deq_q5_0(w, r, out, i)
    elif qt == Q5_1:
        _deq_q5_1(w, r, out, i)
    elif qt == Q8_0:
        _deq_q8_0(w, r, out, i)
    elif qt == Q2_K:
        _deq_q2_k(w, r, out, i)
    elif qt == Q3_K:
        _deq_q3_k(w, r, out, i)
    elif qt == Q4_K:
        _deq_q4_k(w, r, out, i)
    elif qt == Q5_K:
        _deq_q5_k(w, r, out, i)
    elif qt == Q6_K:
        _deq_q6_k(w, r, out, i)
    elif qt == IQ4_NL:
        _deq_iq4_nl(w, r, out, i)
    elif qt == IQ4_XS:
        _deq_iq4_xs(w, r, out, i)
    elif qt == F16:
        _deq_f16(w, r, out, i, False)
    elif qt == BF16:
        _deq_f16(w, r, out, i, True)


@njit(cache=True)
def _dot_row(qt, w, r, x, t, xs):
    """Row r of w . x[t]; xs = _sums16(x)."""
    if qt == Q4_0:
        return _dot_q4_0(w, r, x, t, xs)
    if qt == Q4_1:
        return _dot_q4_1(w, r, x, t, xs)
    if qt == Q5_0:
        return _dot_q5_0(w, r, x, t, xs)
    if qt == Q5_1:
        return _dot_q5_1(w, r, x, t, xs)
    if qt == Q8_0:
        return _dot_q8_0(w, r, x, t, xs)
    if qt == Q2_K:
        return _dot_q2_k(w, r, x, t, xs)
    if qt == Q3_K:
        return _dot_q3_k(w, r, x, t, xs)
    if qt == Q4_K:
        return _dot_q4_k(w, r, x, t, xs)
    if qt == Q5_K:
        return _dot_q5_k(w, r, x, t, xs)
    if qt == Q6_K:
        return _dot_q6_k(w, r, x, t, xs)
    if qt == IQ4_NL:
        return _dot_iq4_nl(w, r, x, t, xs)
    if qt == IQ4_XS:
        return _dot_iq4_xs(w, r, x, t, xs)
    if qt == F16:
        return _dot_f16(w, r, x, t, False)
    return _dot_f16(w, r, x, t, True)


@njit(cache=True)
def _dot_f32(a, x, t):
    """a[0] . x[t], a of shape [1, cols]."""
    n = a.shape[1]
    x0 = t * x.shape[1]
    n64 = n - n % 64
    a0 = vzero()
    a1 = vzero()
    a2 = vzero()
    a3 = vzero()
    for k in range(0, n64, 64):
        a0 = fmadd(vload(a, k), vload(x, x0 + k), a0)
        a1 = fmadd(vload(a, k + 16), vload(x, x0 + k + 16), a1)
        a2 = fmadd(vload(a, k + 32), vload(x, x0 + k + 32), a2)
        a3 = fmadd(vload(a, k + 48), vload(x, x0 + k + 48), a3)
    s = hsum(fadd(fadd(a0, a1), fadd(a2, a3)))
    for k in range(n64, n):
        s += a[0, k] * x[t, k]
    return s


@njit(cache=True)
def _sums16(x):
    """xs[t, k] = x[t, 16 k : 16 k + 16].sum(): what a block's constant part multiplies."""
    n16 = x.shape[1] // 16
    xs = np.empty((x.shape[0], n16), np.float32)
    for t in range(x.shape[0]):
        for k in range(n16):
            xs[t, k] = hsum(vload(x, t * x.shape[1] + 16 * k))
    return xs


# -- the drivers ------------------------------------------------------------------------


@njit(cache=True, parallel=True)
def matvec(qt, w, x, out):
    """out[t, r] = x[t] . W[r] by the fused dot of W's type: decode's kernel (T = 1), which
    reads W's bytes once; each further row of x reads them again."""
    xs = _sums16(x)
    for r in prange(w.shape[0]):
        for t in range(x.shape[0]):
            out[t, r] = _dot_row(qt, w, r, x, t, xs)


@njit(cache=True, parallel=True)
def matmul_small(qt, w, x, out):
    """out = x @ W.T for a few rows of x: each row of W dequantized once into a buffer the
    size of one row (cache-resident), then dotted with every row of x."""
    rows = w.shape[0]
    chunk = 16
    for c in prange((rows + chunk - 1) // chunk):
        buf = np.empty((1, x.shape[1]), np.float32)
        for r in range(chunk * c, min(rows, chunk * c + chunk)):
            _deq_row(qt, w, r, buf, 0)
            for t in range(x.shape[0]):
                out[t, r] = _dot_f32(buf, x, t)


@njit(cache=True, parallel=True)
def dequantize(qt, w, out):
    """out[i] = W[i] for every row of w, exactly as gguf-py dequantizes it."""
    for i in prange(w.shape[0]):
        _deq_row(qt, w, i, out, i)


@njit(cache=True, parallel=True)
def dequantize_take(qt, w, index, out):
    """out[i] = W[index[i]] (the caller has checked the indices)."""
    for i in prange(index.shape[0]):
        _deq_row(qt, w, index[i], out, i)
