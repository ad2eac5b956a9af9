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

The drivers split W's rows into chunks over numba's threads and switch on the type once
per chunk, so one compiled function serves every type. The byte layout of each type is
written beside its code, in gguf-py's terms.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

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
_SIMD_SHA256 = "d24ce56212ce901acee8a9f6be5d0236fc801a60a782dde77070a3be90dc5234"
_CACHE = hashlib.sha256(Path(simd.__file__).read_bytes()).hexdigest() == _SIMD_SHA256

F16, BF16 = int(T.F16), int(T.BF16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1), int(T.Q8_0)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = int(T.Q2_K), int(T.Q3_K), int(T.Q4_K), int(T.Q5_K), int(T.Q6_K)
IQ4_NL, IQ4_XS = int(T.IQ4_NL), int(T.IQ4_XS)

# IQ4_NL / IQ4_XS: the 16 int8 levels a nibble indexes (gguf-py IQ4_NL.kvalues, ggml
# kvalues_iq4nl), looked up in byte lanes.
_iq4_level = byte_lut((-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113))


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


@njit(cache=_CACHE)
def _dot_half(w, r0, r1, x, out, bf):
    n = w.shape[1] // 2
    n64 = n - n % 64
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
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
            out[t, r] = s


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
def _dot_q4_0(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            acc = vzero()
            for b in range(w.shape[1] // 18):
                p = p0 + 18 * b
                d = load_f16(w, p)
                q = bload(w, p + 2)
                a = fmul(itof(sext(isub(iand(q, 15), 8))), vload(x, x0 + 32 * b))
                a = fmadd(itof(sext(isub(ishr(q, 4), 8))), vload(x, x0 + 32 * b + 16), a)
                acc = fmadd(a, d, acc)
            out[t, r] = hsum(acc)


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
def _dot_q4_1(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            acc = vzero()
            off = np.float32(0.0)
            for b in range(w.shape[1] // 20):
                p = p0 + 20 * b
                d = load_f16(w, p)
                m = load_f16(w, p + 2)
                q = bload(w, p + 4)
                a = fmul(itof(zext(iand(q, 15))), vload(x, x0 + 32 * b))
                a = fmadd(itof(zext(ishr(q, 4))), vload(x, x0 + 32 * b + 16), a)
                acc = fmadd(a, d, acc)
                off += m * (xs[t, 2 * b] + xs[t, 2 * b + 1])
            out[t, r] = hsum(acc) + off


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
def _dot_q5_0(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            acc = vzero()
            for b in range(w.shape[1] // 22):
                p = p0 + 22 * b
                d = load_f16(w, p)
                qh = load_u32(w, p + 2)
                q = bload(w, p + 6)
                a = fmul(itof(sext(isub(_q5_lo(q, qh), 16))), vload(x, x0 + 32 * b))
                a = fmadd(itof(sext(isub(_q5_hi(q, qh), 16))), vload(x, x0 + 32 * b + 16), a)
                acc = fmadd(a, d, acc)
            out[t, r] = hsum(acc)


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
def _dot_q5_1(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            acc = vzero()
            off = np.float32(0.0)
            for b in range(w.shape[1] // 24):
                p = p0 + 24 * b
                d = load_f16(w, p)
                m = load_f16(w, p + 2)
                qh = load_u32(w, p + 4)
                q = bload(w, p + 8)
                a = fmul(itof(zext(_q5_lo(q, qh))), vload(x, x0 + 32 * b))
                a = fmadd(itof(zext(_q5_hi(q, qh))), vload(x, x0 + 32 * b + 16), a)
                acc = fmadd(a, d, acc)
                off += m * (xs[t, 2 * b] + xs[t, 2 * b + 1])
            out[t, r] = hsum(acc) + off


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
def _dot_q8_0(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            acc = vzero()
            for b in range(w.shape[1] // 34):
                p = p0 + 34 * b
                d = load_f16(w, p)
                a = fmul(itof(sext(bload(w, p + 2))), vload(x, x0 + 32 * b))
                a = fmadd(itof(sext(bload(w, p + 18))), vload(x, x0 + 32 * b + 16), a)
                acc = fmadd(a, d, acc)
            out[t, r] = hsum(acc)


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
def _dot_q2_k(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            s0 = t * xs.shape[1]
            acc = vzero()
            off = vzero()
            for b in range(w.shape[1] // 84):
                p = p0 + 84 * b
                sc = bload(w, p)
                dl = fmul(itof(zext(iand(sc, 15))), load_f16(w, p + 80))
                ml = fmul(itof(zext(ishr(sc, 4))), load_f16(w, p + 82))
                off = fmadd(ml, vload(xs, s0 + 16 * b), off)  # run i's min times its x sum
                for h in range(2):
                    for half in range(2):
                        qv = bload(w, p + 16 + 32 * h + 16 * half)
                        for s in range(4):
                            n = 256 * b + 128 * h + 32 * s + 16 * half
                            q = itof(zext(iand(ishr(qv, 2 * s), 3)))
                            acc = fmadd(
                                fmul(q, vload(x, x0 + n)), vlane(dl, 8 * h + 2 * s + half), acc
                            )
            out[t, r] = hsum(acc) - hsum(off)


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
def _dot_q3_k(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            acc = vzero()
            for b in range(w.shape[1] // 110):
                p = p0 + 110 * b
                dl = _q3_dl(w, p)
                for h in range(2):
                    for half in range(2):
                        for s in range(4):
                            n = 256 * b + 128 * h + 32 * s + 16 * half
                            q = itof(_q3_code(w, p, h, s, half))
                            acc = fmadd(
                                fmul(q, vload(x, x0 + n)), vlane(dl, 8 * h + 2 * s + half), acc
                            )
            out[t, r] = hsum(acc)


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
def _dot_q4_k(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            s0 = t * xs.shape[1]
            acc = vzero()
            off = vzero()
            for b in range(w.shape[1] // 144):
                p = p0 + 144 * b
                sm = _k_scales(w, p)
                dl = fmul(sm, load_f16(w, p))
                # lanes 0..7: run k's dmin * m times its x sum; lanes 8..15: times 0
                off = fmadd(fmul(sm, load_f16(w, p + 2)), pairsum(vload(xs, s0 + 16 * b)), off)
                for c in range(4):
                    q0 = bload(w, p + 16 + 32 * c)
                    q1 = bload(w, p + 32 + 32 * c)
                    for j in range(2):
                        n = 256 * b + 64 * c + 32 * j
                        a = fmul(itof(zext(iand(ishr(q0, 4 * j), 15))), vload(x, x0 + n))
                        a = fmadd(itof(zext(iand(ishr(q1, 4 * j), 15))), vload(x, x0 + n + 16), a)
                        acc = fmadd(a, vlane(dl, 8 + 2 * c + j), acc)
            out[t, r] = hsum(acc) - hsum(off)


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
def _dot_q5_k(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            s0 = t * xs.shape[1]
            acc = vzero()
            off = vzero()
            for b in range(w.shape[1] // 176):
                p = p0 + 176 * b
                sm = _k_scales(w, p)
                dl = fmul(sm, load_f16(w, p))
                off = fmadd(fmul(sm, load_f16(w, p + 2)), pairsum(vload(xs, s0 + 16 * b)), off)
                for c in range(4):
                    for j in range(2):
                        n = 256 * b + 64 * c + 32 * j
                        a = fmul(itof(_q5k_code(w, p, c, j, 0)), vload(x, x0 + n))
                        a = fmadd(itof(_q5k_code(w, p, c, j, 1)), vload(x, x0 + n + 16), a)
                        acc = fmadd(a, vlane(dl, 8 + 2 * c + j), acc)
            out[t, r] = hsum(acc) - hsum(off)


# -- Q6_K [ql 128][qh 64][scales int8 16][d f16], 256 weights in 16 runs of 16 ----------
# Weight n = 128 h + q (q < 128): low four bits (ql[64 h + q % 64] >> 4 (q // 64)) & 15,
# high two (qh[32 h + q % 32] >> 2 (q // 32)) & 3, minus 32; run n // 16 has scale
# d * scales[n // 16]: w = (d * scale) * (code - 32).


@njit(cache=_CACHE)
def _q6_code(w, p, h, k):  # the codes of weights 16 k .. 16 k + 15 of half h
    lo = iand(ishr(bload(w, p + 64 * h + 16 * (k % 4)), 4 * (k // 4)), 15)
    hi = iand(ishr(bload(w, p + 128 + 32 * h + 16 * (k % 2)), 2 * (k // 2)), 3)
    return sext(isub(ior(lo, ishl(hi, 4)), 32))


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
def _dot_q6_k(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            acc = vzero()
            for b in range(w.shape[1] // 210):
                p = p0 + 210 * b
                dl = fmul(itof(sext(bload(w, p + 192))), load_f16(w, p + 208))
                for h in range(2):
                    for k in range(8):
                        n = 256 * b + 128 * h + 16 * k
                        q = itof(_q6_code(w, p, h, k))
                        acc = fmadd(fmul(q, vload(x, x0 + n)), vlane(dl, 8 * h + k), acc)
            out[t, r] = hsum(acc)


# -- IQ4_NL [d f16][qs 16]: Q4_0's nibble order, w = d * KV[nibble] ----------------------


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
def _dot_iq4_nl(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            acc = vzero()
            for b in range(w.shape[1] // 18):
                p = p0 + 18 * b
                d = load_f16(w, p)
                q = bload(w, p + 2)
                a = fmul(itof(sext(_iq4_level(iand(q, 15)))), vload(x, x0 + 32 * b))
                a = fmadd(itof(sext(_iq4_level(ishr(q, 4)))), vload(x, x0 + 32 * b + 16), a)
                acc = fmadd(a, d, acc)
            out[t, r] = hsum(acc)


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
def _dot_iq4_xs(w, r0, r1, x, xs, out):
    for r in range(r0, r1):
        p0 = r * w.shape[1]
        for t in range(x.shape[0]):
            x0 = t * x.shape[1]
            acc = vzero()
            for b in range(w.shape[1] // 136):
                p = p0 + 136 * b
                d = load_f16(w, p)
                for k in range(8):
                    q = bload(w, p + 8 + 16 * k)
                    n = 256 * b + 32 * k
                    a = fmul(itof(sext(_iq4_level(iand(q, 15)))), vload(x, x0 + n))
                    a = fmadd(itof(sext(_iq4_level(ishr(q, 4)))), vload(x, x0 + n + 16), a)
                    acc = fmadd(a, d * _iq4xs_scale(w, p, k), acc)
            out[t, r] = hsum(acc)


# -- the switches: one branch per type, each with its own loop over the rows ---------------
# so each type's kernel is inlined into a loop of its own; a switch per row, a call the
# optimizer cannot inline, measured 30% slower on Q4_0 decode (as did a literal_unroll
# over a tuple of the kernels, which numba calls through pointers).


@njit(cache=_CACHE)
def _dot_rows(qt, w, r0, r1, x, xs, out):
    """out[t, r] = x[t] . W[r] for the rows [r0, r1); xs = _sums16(x)."""
    if qt == Q4_0:
        _dot_q4_0(w, r0, r1, x, xs, out)
    elif qt == Q4_1:
        _dot_q4_1(w, r0, r1, x, xs, out)
    elif qt == Q5_0:
        _dot_q5_0(w, r0, r1, x, xs, out)
    elif qt == Q5_1:
        _dot_q5_1(w, r0, r1, x, xs, out)
    elif qt == Q8_0:
        _dot_q8_0(w, r0, r1, x, xs, out)
    elif qt == Q2_K:
        _dot_q2_k(w, r0, r1, x, xs, out)
    elif qt == Q3_K:
        _dot_q3_k(w, r0, r1, x, xs, out)
    elif qt == Q4_K:
        _dot_q4_k(w, r0, r1, x, xs, out)
    elif qt == Q5_K:
        _dot_q5_k(w, r0, r1, x, xs, out)
    elif qt == Q6_K:
        _dot_q6_k(w, r0, r1, x, xs, out)
    elif qt == IQ4_NL:
        _dot_iq4_nl(w, r0, r1, x, xs, out)
    elif qt == IQ4_XS:
        _dot_iq4_xs(w, r0, r1, x, xs, out)
    elif qt == F16:
        _dot_half(w, r0, r1, x, out, False)
    elif qt == BF16:
        _dot_half(w, r0, r1, x, out, True)


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
    """out[t, r] = x[t] . W[r] by the fused dot of W's type: decode's kernel (T = 1), which
    reads W's bytes once; each further row of x reads them again."""
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
