/* Dots with 8-bit activations, as llama.cpp computes them: included by native_isa.h in the
 * x86 regions (AVX-512 with VNNI, AVX2), where integer byte products are the fast path.
 *
 * Why: a weight's codes are small integers, and multiplied by integer activations a run of
 * 32 is one byte dot-product instruction (vpdpbusd; vpmaddubsw + vpmaddwd on AVX2) instead
 * of widening every code to a float. Each row of x is rounded per 32 columns to int8 with
 * one f32 scale (dx = max|x| / 127, q = round-to-nearest-even(x / dx), llama.cpp's Q8_0
 * with the scale kept in f32), once per call (quantize_x). A run's weights are, by type,
 * w = sc_h * code + k_h over each half h of 16 (native_blocks.h's heads give sc and k), so
 *
 *     sum_l w_l x_l = dx * sum_h (sc_h * S_h + k_h * Q_h),  S_h = sum code * q,  Q_h = sum q
 *
 * with S_h exact in int32 and Q_h precomputed per x. The products then equal
 * dequantize(W) @ dequantize(q8(x)).T up to f32 rounding (tests/test_quant_kernels.py).
 *
 * Codes come as 32 bytes in column order: unsigned (0..63, so AVX2's saturating pair sums
 * never overflow) or signed (|code| <= 127, the level types and Q8_0; their products go
 * through |code| and q signed by code's sign, as llama.cpp does).
 */

#ifndef I8_DOT_ACC
#error "define I8_DOT_ACC(acc_s32, a_u8, b_s8) for this ISA"
#endif
/* Each 4 adjacent byte products of a (unsigned) and b (signed) summed into an int32 lane. */
#define I8_DOT(a, b) I8_DOT_ACC(_mm256_setzero_si256(), (a), (b))

/* 16 bytes -> their low nibbles, then their high ones. (AVX-512: the 16 bytes broadcast to
 * both halves, the upper half's words shifted by 4: one shift for both.) */
static INLINE __m256i ISA(nibbles32)(const uint8_t *p) {
#ifdef I8_MASKS
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    const __m256i by = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    return _mm256_and_si256(_mm256_srlv_epi16(both, by), _mm256_set1_epi8(15));
#else
    const __m128i q = _mm_loadu_si128((const __m128i *)p);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(both, _mm256_set1_epi8(15));
#endif
}

static INLINE __m256i ISA(levels32)(const uint8_t *p, const int8_t *table) {
    const __m128i t = _mm_loadu_si128((const __m128i *)table);
    const __m256i n = ISA(nibbles32)(p);
    return _mm256_set_m128i(_mm_shuffle_epi8(t, _mm256_extracti128_si256(n, 1)),
                            _mm_shuffle_epi8(t, _mm256_castsi256_si128(n)));
}

/* codes | value in byte l where bit l of the 32-bit word at qh is set (codes < value). With
 * AVX-512 the word is a mask register and the add a masked one. */
static INLINE __m256i ISA(with_bits32)(__m256i codes, const uint8_t *qh, int value) {
#ifdef I8_MASKS
    return _mm256_mask_add_epi8(codes, (__mmask32)rd32(qh), codes, _mm256_set1_epi8((char)value));
#else
    /* byte l holds byte l / 8 of qh, is kept where its bit l % 8 is set */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)rd32(qh)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                         3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8((char)value)));
#endif
}

static INLINE __m256i ISA(shift_and)(__m256i v, int shift, int mask) {
    return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8((char)mask));
}

static INLINE __m256i ISA(load32)(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* A row of x rounded as quantize_row (native.c) rounds it, bit for bit, with vectors:
 * max |x| per block, x * mul rounded half to even (vroundps), packed to bytes. */
static INLINE float ISA(hmax8)(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static INLINE int ISA(hsum8i)(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

static void ISA(quantize_row)(const float *xt, int cols, int scheme, int8_t *qt, float *dt,
                              float *st, float *s32) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const int span = scheme == X_Q8_K ? 256 : 32;
    for (int b0 = 0; b0 < cols; b0 += span) {
        const float *xb = xt + b0;
        __m256 vmax = _mm256_setzero_ps();
        for (int l = 0; l < span; l += 8)
            vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + l)));
        const float amax = ISA(hmax8)(vmax);
        float dx, mul, draw, m = 0.0f;
        if (scheme == X_Q8_K) {
            const __m256 target = _mm256_set1_ps(amax);
            for (int l = 0; l < span; l += 8) {
                const int hit = _mm256_movemask_ps(
                    _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + l)), target, _CMP_EQ_OQ));
                if (hit) {
                    m = xb[l + __builtin_ctz((unsigned)hit)]; /* the first of largest magnitude */
                    break;
                }
            }
            const float is = amax != 0.0f ? -127.0f / m : 0.0f;
            mul = is, dx = amax != 0.0f ? 1.0f / is : 0.0f, draw = dx;
        } else {
            draw = amax / 127.0f;
            mul = amax != 0.0f ? 127.0f / amax : 0.0f;
            dx = round_to_half(draw);
        }
        const __m256 vmul = _mm256_set1_ps(mul);
        for (int b = b0 / 32; b < (b0 + span) / 32; b++) {
            const float *xs = xt + 32 * b;
            __m256i i[4];
            for (int k = 0; k < 4; k++)
                i[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xs + 8 * k), vmul),
                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            const int s0 = ISA(hsum8i)(_mm256_add_epi32(i[0], i[1]));
            const int s1 = ISA(hsum8i)(_mm256_add_epi32(i[2], i[3]));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(qt + 32 * b), p);
            dt[b] = dx, st[2 * b] = dx * (float)s0, st[2 * b + 1] = dx * (float)s1;
            s32[b] = scheme == X_Q8_1 ? round_to_half(draw * (float)(s0 + s1)) : dx * (float)(s0 + s1);
        }
    }
}

/* Unit j of a block: its codes, whether they are signed, and per half its sc and k. */
typedef struct {
    __m256i codes;
    int is_signed; /* codes signed (else unsigned, 0..63) */
    int split;     /* the halves' sc and k differ (else sc[0], k[0] serve both) */
    int has_k;     /* a k term at all */
    float sc[2], k[2];
} ISA(icodes);

#define SAME(s, kk) (c->split = 0, c->sc[0] = (s), c->k[0] = (kk), c->has_k = 1)
#define SCALE_ONLY(s) (c->split = 0, c->sc[0] = (s), c->has_k = 0)
#define HALVES_SK(s0, s1, k0, k1) (c->split = 1, c->sc[0] = (s0), c->sc[1] = (s1), c->k[0] = (k0), c->k[1] = (k1), c->has_k = 1)

static INLINE void ISA(i8_q4_0)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    (void)j, c->codes = ISA(nibbles32)(p + 2), c->is_signed = 0, SAME(h->d[0], -8.0f * h->d[0]);
}
static INLINE void ISA(i8_q4_1)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    (void)j, c->codes = ISA(nibbles32)(p + 4), c->is_signed = 0, SAME(h->d[0], h->m[0]);
}
static INLINE void ISA(i8_q5_0)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    (void)j;
    c->codes = ISA(with_bits32)(ISA(nibbles32)(p + 6), p + 2, 16);
    c->is_signed = 0, SAME(h->d[0], -16.0f * h->d[0]);
}
static INLINE void ISA(i8_q5_1)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    (void)j;
    c->codes = ISA(with_bits32)(ISA(nibbles32)(p + 8), p + 4, 16);
    c->is_signed = 0, SAME(h->d[0], h->m[0]);
}
static INLINE void ISA(i8_q8_0)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    (void)j, c->codes = ISA(load32)(p + 2), c->is_signed = 1, SCALE_ONLY(h->d[0]);
}
static INLINE void ISA(i8_iq4_nl)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    (void)j, c->codes = ISA(levels32)(p + 2, IQ4_LEVEL), c->is_signed = 1, SCALE_ONLY(h->d[0]);
}
static INLINE void ISA(i8_mxfp4)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    (void)j, c->codes = ISA(levels32)(p + 1, MXFP4_LEVEL), c->is_signed = 1, SCALE_ONLY(h->d[0]);
}
static INLINE void ISA(i8_q2_k)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    c->codes = ISA(shift_and)(ISA(load32)(p + 16 + 32 * (j / 4)), 2 * (j % 4), 3);
    c->is_signed = 0;
    HALVES_SK(h->d[2 * j], h->d[2 * j + 1], -h->m[2 * j], -h->m[2 * j + 1]);
}
static INLINE void ISA(i8_q3_k)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    const __m256i low = ISA(shift_and)(ISA(load32)(p + 32 + 32 * (j / 4)), 2 * (j % 4), 3);
    const __m256i high = ISA(shift_and)(ISA(load32)(p), 4 * (j / 4) + j % 4, 1);
    c->codes = _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
    c->is_signed = 0;
    HALVES_SK(h->d[2 * j], h->d[2 * j + 1], -4.0f * h->d[2 * j], -4.0f * h->d[2 * j + 1]);
}
static INLINE void ISA(i8_q4_k)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    c->codes = ISA(shift_and)(ISA(load32)(p + 16 + 32 * (j / 2)), 4 * (j % 2), 15);
    c->is_signed = 0, SAME(h->d[j], -h->m[j]);
}
static INLINE void ISA(i8_q5_k)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    const __m256i low = ISA(shift_and)(ISA(load32)(p + 48 + 32 * (j / 2)), 4 * (j % 2), 15);
    const __m256i high = ISA(shift_and)(ISA(load32)(p + 16), j, 1);
    c->codes = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    c->is_signed = 0, SAME(h->d[j], -h->m[j]);
}
static INLINE void ISA(i8_q6_k)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    const int hh = j / 4, r = j % 4;
    const __m256i low = ISA(shift_and)(ISA(load32)(p + 64 * hh + 32 * (r % 2)), 4 * (r / 2), 15);
    const __m256i high = ISA(shift_and)(ISA(load32)(p + 128 + 32 * hh), 2 * r, 3);
    c->codes = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    c->is_signed = 0;
    HALVES_SK(h->d[2 * j], h->d[2 * j + 1], -32.0f * h->d[2 * j], -32.0f * h->d[2 * j + 1]);
}
static INLINE void ISA(i8_iq4_xs)(const uint8_t *p, int j, const block_head *h, ISA(icodes) *c) {
    c->codes = ISA(levels32)(p + 8 + 16 * j, IQ4_LEVEL), c->is_signed = 1, SCALE_ONLY(h->d[j]);
}
#undef SAME
#undef SCALE_ONLY
#undef HALVES_SK

/* The int32 sums of each 4 adjacent code * q products (lanes 0-3: the first 16 columns). */
static INLINE __m256i ISA(unit_products)(const ISA(icodes) *c, const int8_t *q) {
    const __m256i xq = _mm256_loadu_si256((const __m256i *)q);
    if (c->is_signed) return I8_DOT(_mm256_sign_epi8(c->codes, c->codes), _mm256_sign_epi8(xq, c->codes));
    return I8_DOT(c->codes, xq);
}

/* A run of a tile for the N rows of x (tile_x's layout: xq, xd, xs the run's first row),
 * for a type with one scale per run: a row's steps are the same alone (N = 1) or in a tile.
 * Where the codes' offset is folded (i8_zero; xs then holds each row's 8 int32 lane sums of
 * -zero q), a row's integer sums start from its lane sums, so they are exactly
 * sum (code - zero) q, and the run has no k term; else the k term goes to off. */
static INLINE void ISA(tile_unit_i8)(const ISA(icodes) *c, const int8_t *xq, const float *xd,
                                     const float *xs, int N, int folded, __m256 *acc, float *off) {
    float dd[ROW_TILE];
    ISA(tile_scales)(c->sc[0], xd, N, dd);
#pragma GCC unroll 8
    for (int t = 0; t < N; t++) {
        const __m256i is =
            folded ? I8_DOT_ACC(_mm256_loadu_si256((const __m256i *)(xs + 8 * t)), c->codes,
                                _mm256_loadu_si256((const __m256i *)(xq + 32 * t)))
                   : ISA(unit_products)(c, xq + 32 * t);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(dd[t]), acc[t]);
    }
    if (folded || !c->has_k) return;
    /* off[t] += k xs[t], a multiply then an add per lane: the scalar steps' bits */
    if (N == 8)
        _mm256_storeu_ps(off, _mm256_add_ps(_mm256_loadu_ps(off), _mm256_mul_ps(_mm256_set1_ps(c->k[0]), _mm256_loadu_ps(xs))));
    else if (N == 4)
        _mm_storeu_ps(off, _mm_add_ps(_mm_loadu_ps(off), _mm_mul_ps(_mm_set1_ps(c->k[0]), _mm_loadu_ps(xs))));
    else
        for (int t = 0; t < N; t++) off[t] += c->k[0] * xs[t];
}

static INLINE float ISA(finish_i8)(__m256 acc, float off) {
    float a[8];
    memcpy(a, &acc, sizeof a);
    for (int w = 4; w; w /= 2)
        for (int i = 0; i < w; i++) a[i] += a[i + w];
    return a[0] + off;
}

/* Row `row` of W times the N rows of a tile of x (tile_x's layout from xq, xd, xs), into
 * yt[t]: each run's codes unpacked once for the tile, each row's steps its own. */
#define I8_TILE_ROW(HEAD, UNIT, ELEMS, NBYTES, N)                                              \
    {                                                                                          \
        __m256 acc[N];                                                                         \
        float off[N];                                                                          \
        for (int t = 0; t < N; t++) acc[t] = _mm256_setzero_ps(), off[t] = 0.0f;               \
        EACH_RUN(HEAD, ELEMS, NBYTES, {                                                        \
            ISA(icodes) cd;                                                                    \
            ISA(UNIT)(p, j, &h, &cd);                                                          \
            ISA(tile_unit_i8)(&cd, xq + (size_t)u * N * 32, xd + (size_t)u * N,                \
                              xs + (size_t)u * N * (folded ? 8 : 1), N, folded, acc, off);     \
        })                                                                                     \
        for (int t = 0; t < N; t++) yt[t] = ISA(finish_i8)(acc[t], off[t]);                    \
    }

/* y[t, r] = x[t] . W[r] for the types with a scale per run (x in tile_x's tiles of runs):
 * tiles outer, rows of W inner, a row's sums in one order alone or in a tile. */
#define I8_TILE_BODY(HEAD, UNIT, ELEMS, NBYTES)                                                \
    for (int t0 = 0; t0 < T; t0 += ROW_TILE) {                                                 \
        const int n = T - t0 < ROW_TILE ? T - t0 : ROW_TILE;                                   \
        const int8_t *xq = x[t0].q;                                                            \
        const float *xd = x[t0].d, *xs = x[t0].dsum32;                                         \
        const int folded = ISA(i8_zero)(qt) != 0;                                              \
        for (size_t r = r0; r < r1; r++) {                                                     \
            const uint8_t *row = w + r * rb;                                                   \
            float yt[ROW_TILE];                                                                \
            if (n == 1) I8_TILE_ROW(HEAD, UNIT, ELEMS, NBYTES, 1)                              \
            else if (n == 2) I8_TILE_ROW(HEAD, UNIT, ELEMS, NBYTES, 2)                         \
            else if (n <= 4) I8_TILE_ROW(HEAD, UNIT, ELEMS, NBYTES, 4)                         \
            else I8_TILE_ROW(HEAD, UNIT, ELEMS, NBYTES, ROW_TILE)                              \
            for (int t = 0; t < n; t++) y[(size_t)(t0 + t) * ys + r] = yt[t];                  \
        }                                                                                      \
    }

/* The types the int8 paths take, BODY given each one's head, i8 unit, block elements and
 * bytes: the dot rows below and the AMX panels (native_amx.h) both switch on this table. */
#define I8_CASE(QT, HEAD, NAME, ELEMS, NBYTES, BODY)                                           \
    case QT: ROWS_OF_TYPE(HEAD, i8_##NAME, ELEMS, NBYTES, BODY) break;
#define EACH_I8_TYPE(BODY)                                                                     \
    switch (qt) {                                                                              \
    I8_TYPES(I8_CASE, BODY)                                                                    \
    default: break;                                                                            \
    }

static void ISA(dot_rows_i8)(int qt, const uint8_t *w, size_t rb, size_t r0, size_t r1,
                             const q8_row *x, int T, int cols, float *y, size_t ys) {
    if (ISA(kd_serves)(qt)) {
        ISA(kd_rows)(qt, w, rb, r0, r1, x, T, cols, y, ys); /* a block at a time */
        return;
    }
    EACH_I8_TYPE(I8_TILE_BODY) /* the rest: in tile_x's runs (x_tile_unit 32) */
}

#undef I8_DOT
#undef I8_TILE_BODY
#undef I8_TILE_ROW
