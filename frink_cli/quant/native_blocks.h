/* Each kernel type's block, dequantized into vectors: the one place a GGUF block layout is
 * written in C.
 *
 * Included once per instruction set by native_isa.h, with VL (float lanes per vector), vf
 * and the ISA's HALF() defined. A type is two functions: head_<t>(block, &h) reads the
 * block's scales (and mins) once, unit_<t>(block, j, &h, w) writes the 32 weights of the
 * block's j-th run of 32 as NV = 32 / VL vectors, in column order. Every weight equals
 * gguf-py's dequantize (gguf/quants.py, itself ggml-quants.c's dequantize_row_*) bit for
 * bit: the same float operations in the same order, one rounding each (native.c is built
 * with -ffp-contract=off, so d * q + m is never fused into one rounding here).
 *
 * Layouts in gguf-py's terms; d, dmin are f16, e is an e8m0 exponent.
 */

#ifndef FRINK_BLOCK_HELPERS
#define FRINK_BLOCK_HELPERS

typedef uint8_t v16b __attribute__((vector_size(16)));
typedef int8_t v16sb __attribute__((vector_size(16)));

/* A block's scales and mins, per run (one run for the 32-weight types, 16 for Q2_K, Q3_K,
 * Q6_K, 8 for Q4_K, Q5_K, IQ4_XS). */
typedef struct {
    float d[16], m[16];
} block_head;

static INLINE v16b ld16(const uint8_t *p) { v16b v; memcpy(&v, p, 16); return v; }

/* Lane l of the result: bit (l + shift) of the 32-bit word at p, as 0 or `value`. */
static INLINE v16b bits16(const uint8_t *p, int shift, uint8_t value) {
    static const v16b sel = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const v16b bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    v16b bytes = {0};
    memcpy(&bytes, p + shift / 8, 2);
    return (v16b)((v16sb)((__builtin_shuffle(bytes, sel) & bit) != 0) & (int8_t)value);
}

static INLINE v16sb levels16(v16b nibbles, const int8_t *table) {
    v16sb t;
    memcpy(&t, table, 16);
    return __builtin_shuffle(t, nibbles);
}

static INLINE uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static INLINE uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* IEEE half -> float, exact for every input (subnormals, inf, NaN payloads), branch-light
 * so that loops over F16 weights vectorize: the exponent is rebased, a subnormal
 * renormalized by one float subtraction (exact), inf / NaN given the top exponent. */
static INLINE float half_to_float(uint16_t h) {
    const uint32_t shifted = 0x7c00u << 13;
    uint32_t o = (uint32_t)(h & 0x7fffu) << 13, exp = o & shifted;
    float f;
    o += (uint32_t)(127 - 15) << 23;
    if (exp == shifted) {
        o += (uint32_t)(128 - 16) << 23;
        memcpy(&f, &o, 4);
    } else if (exp == 0) {
        const uint32_t magic_bits = 113u << 23;
        float magic;
        o += 1u << 23;
        memcpy(&f, &o, 4);
        memcpy(&magic, &magic_bits, 4);
        f -= magic;
    } else {
        memcpy(&f, &o, 4);
    }
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &bits, 4);
    return f;
}

static INLINE float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* IQ4_NL / IQ4_XS levels (ggml kvalues_iq4nl) and MXFP4's e2m1 values doubled (ggml
 * kvalues_mxfp4; the block's exponent scales them by 2^(e - 128), ggml's
 * e8m0_to_fp32_half). */
static const int8_t IQ4_LEVEL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t MXFP4_LEVEL[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static INLINE float e8m0_half(uint8_t e) {
    /* 2^(e - 128): normal for e >= 2, the subnormals 2^-127 (e = 1) and 2^-128 (e = 0). */
    uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00400000u >> (1 - e);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K / Q5_K: run k's 6-bit scale and min (ggml get_scale_min_k4). */
static INLINE void k_scale_min(const uint8_t *s, int k, int *sc, int *m) {
    if (k < 4) {
        *sc = s[k] & 63;
        *m = s[k + 4] & 63;
    } else {
        *sc = (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4);
        *m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
    }
}

/* Weight k of an F16, BF16 or F32 row, one at a time (the columns past its last 32). */
static INLINE float tail_weight(int qt, const uint8_t *row, int k) {
    return qt == QT_F16 ? half_to_float(rd16(row + 2 * k))
           : qt == QT_BF16 ? bf16_to_float(rd16(row + 2 * k))
                           : ((const float *)row)[k];
}
#endif /* FRINK_BLOCK_HELPERS */

#ifdef ISA


/* The ISA-specific half of the helpers: lanes of a 16-byte vector widened to floats. */
typedef uint8_t ISA(vbl) __attribute__((vector_size(VL)));
typedef int8_t ISA(vsbl) __attribute__((vector_size(VL)));
typedef int32_t ISA(vil) __attribute__((vector_size(4 * VL)));
typedef uint32_t ISA(vul) __attribute__((vector_size(4 * VL)));
typedef uint16_t ISA(vhl) __attribute__((vector_size(2 * VL)));
#define NV (32 / VL)

/* Lanes [VL i, VL i + VL) of a 16-byte vector as floats, by the ISA's widening (U8F, S8F:
 * one instruction each where the ISA has them). */
static INLINE vf ISA(u8f)(v16b b, int i) { return (void)i, U8F(b, i); }
static INLINE vf ISA(s8f)(v16sb b, int i) { return (void)i, S8F(b, i); }

/* w[0 .. NV) = the 16 codes lo then the 16 codes hi, each as float times d (or d, + m). */
#define PUT(w, lo, hi, conv, expr)                                                              \
    for (int i = 0; i < 16 / VL; i++) {                                                        \
        vf q = ISA(conv)(lo, i);                                                               \
        w[i] = expr;                                                                           \
        q = ISA(conv)(hi, i);                                                                  \
        w[16 / VL + i] = expr;                                                                 \
    }

/* -- the 32-weight types: a block is one unit ----------------------------------------- */

/* Q4_0 [d][qs 16]: w[l] = d * ((qs[l] & 15) - 8), w[l + 16] = d * ((qs[l] >> 4) - 8). */
static INLINE void ISA(head_q4_0)(const uint8_t *p, block_head *h) { h->d[0] = HALF(p); }
static INLINE void ISA(unit_q4_0)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j;
    const v16b q = ld16(p + 2);
    const v16sb lo = (v16sb)(q & 15) - 8, hi = (v16sb)(q >> 4) - 8;
    const float d = h->d[0];
    PUT(w, lo, hi, s8f, d * q)
}

/* Q4_1 [d][m][qs 16]: w = d * nibble + m. */
static INLINE void ISA(head_q4_1)(const uint8_t *p, block_head *h) {
    h->d[0] = HALF(p), h->m[0] = HALF(p + 2);
}
static INLINE void ISA(unit_q4_1)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j;
    const v16b q = ld16(p + 4), lo = q & 15, hi = q >> 4;
    const float d = h->d[0], m = h->m[0];
    PUT(w, lo, hi, u8f, d * q + m)
}

/* Q5_0 [d][qh u32][qs 16]: w[l] = d * ((nibble | (bit l of qh) << 4) - 16), the high
 * nibbles taking bits 16..31. */
static INLINE void ISA(head_q5_0)(const uint8_t *p, block_head *h) { h->d[0] = HALF(p); }
static INLINE void ISA(unit_q5_0)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j;
    const v16b q = ld16(p + 6);
    const v16sb lo = (v16sb)((q & 15) | bits16(p + 2, 0, 16)) - 16;
    const v16sb hi = (v16sb)((q >> 4) | bits16(p + 2, 16, 16)) - 16;
    const float d = h->d[0];
    PUT(w, lo, hi, s8f, d * q)
}

/* Q5_1 [d][m][qh u32][qs 16]: w = d * code + m, codes as Q5_0 without the offset. */
static INLINE void ISA(head_q5_1)(const uint8_t *p, block_head *h) {
    h->d[0] = HALF(p), h->m[0] = HALF(p + 2);
}
static INLINE void ISA(unit_q5_1)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j;
    const v16b q = ld16(p + 8);
    const v16b lo = (q & 15) | bits16(p + 4, 0, 16), hi = (q >> 4) | bits16(p + 4, 16, 16);
    const float d = h->d[0], m = h->m[0];
    PUT(w, lo, hi, u8f, d * q + m)
}

/* Q8_0 [d][qs int8 32]: w = d * qs. */
static INLINE void ISA(head_q8_0)(const uint8_t *p, block_head *h) { h->d[0] = HALF(p); }
static INLINE void ISA(unit_q8_0)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j;
    const v16sb lo = (v16sb)ld16(p + 2), hi = (v16sb)ld16(p + 18);
    const float d = h->d[0];
    PUT(w, lo, hi, s8f, d * q)
}

/* IQ4_NL [d][qs 16]: Q4_0's nibble order, w = d * level[nibble]. */
static INLINE void ISA(head_iq4_nl)(const uint8_t *p, block_head *h) { h->d[0] = HALF(p); }
static INLINE void ISA(unit_iq4_nl)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j;
    const v16b q = ld16(p + 2);
    const v16sb lo = levels16(q & 15, IQ4_LEVEL), hi = levels16(q >> 4, IQ4_LEVEL);
    const float d = h->d[0];
    PUT(w, lo, hi, s8f, d * q)
}

/* MXFP4 [e][qs 16]: Q4_0's nibble order, w = level[nibble] * 2^(e - 128). */
static INLINE void ISA(head_mxfp4)(const uint8_t *p, block_head *h) { h->d[0] = e8m0_half(p[0]); }
static INLINE void ISA(unit_mxfp4)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j;
    const v16b q = ld16(p + 1);
    const v16sb lo = levels16(q & 15, MXFP4_LEVEL), hi = levels16(q >> 4, MXFP4_LEVEL);
    const float d = h->d[0];
    PUT(w, lo, hi, s8f, q * d)
}

/* -- the 256-weight types: eight units of 32 per block ---------------------------------- */

/* Q2_K [scales 16][qs 64][d][dmin]: weight n = 128 h + 32 s + l is (qs[32 h + l] >> 2 s) & 3
 * in run n / 16, whose scale is d * (scales & 15) and min dmin * (scales >> 4):
 * w = dl * q - ml. Unit j = 4 h + s. */
static INLINE void ISA(head_q2_k)(const uint8_t *p, block_head *h) {
    const float d = HALF(p + 80), dmin = HALF(p + 82);
    for (int i = 0; i < 16; i++) h->d[i] = d * (float)(p[i] & 15), h->m[i] = dmin * (float)(p[i] >> 4);
}
static INLINE void ISA(unit_q2_k)(const uint8_t *p, int j, const block_head *h, vf *w) {
    const int s = 2 * (j % 4);
    const uint8_t *q = p + 16 + 32 * (j / 4);
    const v16b lo = (ld16(q) >> s) & 3, hi = (ld16(q + 16) >> s) & 3;
    const float dl = h->d[2 * j], ml = h->m[2 * j], dh = h->d[2 * j + 1], mh = h->m[2 * j + 1];
    for (int i = 0; i < 16 / VL; i++) {
        w[i] = dl * ISA(u8f)(lo, i) - ml;
        w[16 / VL + i] = dh * ISA(u8f)(hi, i) - mh;
    }
}

/* Q3_K [hmask 32][qs 64][scales 12][d]: weight n = 128 h + 32 s + l has low bits
 * (qs[32 h + l] >> 2 s) & 3 and high bit (hmask[l] >> (4 h + s)) & 1, code = low - 4 when
 * the high bit is clear; run i = n / 16 has scale d * (six bits - 32), the low four from
 * scales[i % 8] (nibble i / 8), the high two from scales[8 + i % 4] (bits 2 (i / 4)). */
static INLINE void ISA(head_q3_k)(const uint8_t *p, block_head *h) {
    const float d = HALF(p + 108);
    const uint8_t *sc = p + 96;
    for (int i = 0; i < 16; i++) {
        const int six = ((sc[i % 8] >> (4 * (i / 8))) & 15) | (((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4);
        h->d[i] = d * (float)(six - 32);
    }
}
static INLINE void ISA(unit_q3_k)(const uint8_t *p, int j, const block_head *h, vf *w) {
    const int s = j % 4, hb = 4 * (j / 4) + s;
    const uint8_t *q = p + 32 + 32 * (j / 4);
    const v16sb lo = (v16sb)(((ld16(q) >> (2 * s)) & 3) | (((ld16(p) >> hb) & 1) << 2)) - 4;
    const v16sb hi = (v16sb)(((ld16(q + 16) >> (2 * s)) & 3) | (((ld16(p + 16) >> hb) & 1) << 2)) - 4;
    const float dl = h->d[2 * j], dh = h->d[2 * j + 1];
    for (int i = 0; i < 16 / VL; i++) {
        w[i] = dl * ISA(s8f)(lo, i);
        w[16 / VL + i] = dh * ISA(s8f)(hi, i);
    }
}

/* Q4_K [d][dmin][scales 12][qs 128]: weight n = 64 c + 32 k + l is (qs[32 c + l] >> 4 k) & 15
 * in run (unit) 2 c + k: w = (d * sc) * q - dmin * m. */
static INLINE void ISA(head_k)(const uint8_t *p, block_head *h) {
    const float d = HALF(p), dmin = HALF(p + 2);
    for (int k = 0; k < 8; k++) {
        int sc, m;
        k_scale_min(p + 4, k, &sc, &m);
        h->d[k] = d * (float)sc, h->m[k] = dmin * (float)m;
    }
}
static INLINE void ISA(unit_q4_k)(const uint8_t *p, int j, const block_head *h, vf *w) {
    const uint8_t *q = p + 16 + 32 * (j / 2);
    const int s = 4 * (j % 2);
    const v16b lo = (ld16(q) >> s) & 15, hi = (ld16(q + 16) >> s) & 15;
    const float d = h->d[j], m = h->m[j];
    PUT(w, lo, hi, u8f, d * q - m)
}

/* Q5_K [d][dmin][scales 12][qh 32][qs 128]: Q4_K plus a fifth bit, weight n = 32 k + l
 * taking bit k of qh[l]. */
static INLINE void ISA(unit_q5_k)(const uint8_t *p, int j, const block_head *h, vf *w) {
    const uint8_t *q = p + 48 + 32 * (j / 2);
    const int s = 4 * (j % 2);
    const v16b lo = ((ld16(q) >> s) & 15) | (((ld16(p + 16) >> j) & 1) << 4);
    const v16b hi = ((ld16(q + 16) >> s) & 15) | (((ld16(p + 32) >> j) & 1) << 4);
    const float d = h->d[j], m = h->m[j];
    PUT(w, lo, hi, u8f, d * q - m)
}

/* Q6_K [ql 128][qh 64][scales int8 16][d]: weight n = 128 h + r (r < 128) has low four bits
 * (ql[64 h + r % 64] >> 4 (r / 64)) & 15 and high two (qh[32 h + r % 32] >> 2 (r / 32)) & 3,
 * minus 32; run n / 16 has scale d * scales[n / 16]: w = (d * scale) * code. Unit j =
 * 4 h + r / 32. */
static INLINE void ISA(head_q6_k)(const uint8_t *p, block_head *h) {
    const float d = HALF(p + 208);
    const int8_t *sc = (const int8_t *)(p + 192);
    for (int i = 0; i < 16; i++) h->d[i] = d * (float)sc[i];
}
static INLINE void ISA(unit_q6_k)(const uint8_t *p, int j, const block_head *h, vf *w) {
    const int hh = j / 4, r = j % 4;
    const uint8_t *ql = p + 64 * hh + 32 * (r % 2), *qh = p + 128 + 32 * hh;
    const int sl = 4 * (r / 2), sh = 2 * r;
    const v16sb lo = (v16sb)(((ld16(ql) >> sl) & 15) | (((ld16(qh) >> sh) & 3) << 4)) - 32;
    const v16sb hi = (v16sb)(((ld16(ql + 16) >> sl) & 15) | (((ld16(qh + 16) >> sh) & 3) << 4)) - 32;
    const float dl = h->d[2 * j], dh = h->d[2 * j + 1];
    for (int i = 0; i < 16 / VL; i++) {
        w[i] = dl * ISA(s8f)(lo, i);
        w[16 / VL + i] = dh * ISA(s8f)(hi, i);
    }
}

/* IQ4_XS [d][scales_h u16][scales_l 4][qs 128]: run k has scale d * (six bits - 32), the low
 * four from scales_l[k / 2] (nibble k % 2), the high two from scales_h (bits 2 k); its 32
 * weights are levels of qs[16 k ..] in IQ4_NL's order. */
static INLINE void ISA(head_iq4_xs)(const uint8_t *p, block_head *h) {
    const float d = HALF(p);
    const uint16_t sh = rd16(p + 2);
    for (int k = 0; k < 8; k++) {
        const int six = ((p[4 + k / 2] >> (4 * (k % 2))) & 15) | (((sh >> (2 * k)) & 3) << 4);
        h->d[k] = d * (float)(six - 32);
    }
}
static INLINE void ISA(unit_iq4_xs)(const uint8_t *p, int j, const block_head *h, vf *w) {
    const v16b q = ld16(p + 8 + 16 * j);
    const v16sb lo = levels16(q & 15, IQ4_LEVEL), hi = levels16(q >> 4, IQ4_LEVEL);
    const float d = h->d[j];
    PUT(w, lo, hi, s8f, d * q)
}

/* -- 2-byte floats: a "block" is 32 weights, no head; rows need not be whole blocks (the
 * last cols % 32 are read one by one, `tail_half`). */
static INLINE void ISA(head_none)(const uint8_t *p, block_head *h) { (void)p, (void)h; }
static INLINE void ISA(unit_f16)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j, (void)h;
    for (int i = 0; i < NV; i++) w[i] = HALVES(p + 2 * VL * i);
}
static INLINE void ISA(unit_bf16)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j, (void)h;
    for (int i = 0; i < NV; i++) {
        ISA(vhl) b;
        memcpy(&b, p + 2 * VL * i, 2 * VL);
        ISA(vul) u = __builtin_convertvector(b, ISA(vul)) << 16;
        memcpy(&w[i], &u, sizeof u);
    }
}
static INLINE void ISA(unit_f32)(const uint8_t *p, int j, const block_head *h, vf *w) {
    (void)j, (void)h;
    memcpy(w, p, 128);
}
#undef PUT

#endif /* ISA */
