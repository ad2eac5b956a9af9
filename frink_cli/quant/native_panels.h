/* 8-bit dots over W's rows in panels of 16 (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q5_0,
 * Q4_1, Q8_0, IQ4_NL, IQ4_XS):
 * included by native_isa.h in the x86 regions (AVX-512, AVX2 with and without AVX-VNNI)
 * after native_kdots.h.
 *
 * The layout (native.c panel_perm, which both ways of reading it share): a panel is 16
 * consecutive rows of W, and block b of a panel (the 16 rows' block b, 16 x 144 bytes, the
 * same bytes as the file's) is laid out lane by lane, a lane being a row:
 *     0: the 16 rows' d (f16)          32: their dmin (f16)
 *    64: the 12 bytes of 6-bit scales and mins as 3 dwords, dword i of the 16 rows together
 *   256: the codes, chunk c (64 columns) then quad g (4 bytes: columns 64c + 4g .. + 3 in
 *        the low nibbles, 64c + 32 + 4g .. + 3 in the high), the 16 rows' 4 bytes together.
 * Q5_K (16 x 176 bytes) takes the same lines, and after them, at 2304, qh's quads (qh
 * bytes 4g .. 4g + 3 of the 16 rows together): a code's fifth bit is bit 2c (low nibbles)
 * or 2c + 1 (high) of its column's qh byte, and the code (0..31) is the nibble + 16 times
 * it; the rest is Q4_K's (AVX2 widens the int16 sums every 4 quads, not 8). Q6_K has its
 * own layout (its kernel's comment, below).
 * A panel occupies the bytes of its 16 rows of the file (row_bytes each), so the matrix
 * keeps its size and its rows' offsets at every 16.
 *
 * Why: with a row of W in each 32-bit lane, one byte dot instruction multiplies 4 columns
 * of 16 (AVX2: 8) rows of W by the same 4 columns of a row of x (broadcast), and the sums
 * stay per row of W: no sums across lanes, the scales multiply 16 rows at once, and a row
 * of x costs one broadcast per 4 columns. Measured on Zen 4 (docs/performance.md): 1.5
 * ns per block and row of x for 8 rows of x (the file-order tile: 2.9), 2.2 for one
 * (7.5). llama.cpp's CPU backend repacks Q4_K the same way (its 8x8 interleave).
 *
 * Per block, row of W and row of x: the integer sum d-part S = sum_j sc_j S_j and mins'
 * part M = sum_j m_j Q_j (Q_j: the sum of x's q over run j, exact integers), then
 * acc += S (d dx) and acc -= M (dmin dx) in f32, blocks in order: llama.cpp's Q4_K dot.
 * Every (row of W, row of x) pair is one lane's own chain of the same steps, so a row's
 * product is the same bits alone or in any tile, batch or chunk, on any thread count.
 */

/* The broadcast quad of x's row t of a tile of N at column col (a multiple of 4): x's
 * codes come in tiles of N rows interleaved by 4 columns (native.c panel_tile_x), so a
 * tile's rows are one pointer and constant offsets rather than N pointers, which spilled. */
#define PANEL_X(xq, N, t, col) ((xq) + (size_t)(col) * (N) + 4 * (t))
/* A kernel macro instantiated for the tile sizes panel_rows takes: KERNEL(N, args). */
#define PANEL_TILES(KERNEL, ...) KERNEL(1, __VA_ARGS__) KERNEL(2, __VA_ARGS__) KERNEL(4, __VA_ARGS__) KERNEL(8, __VA_ARGS__)
/* Bytes ahead of the block it reads that a panel walk asks the cache for. */
#ifndef PANEL_PREFETCH
#define PANEL_PREFETCH 8192
#endif

/* Step q of Q of a panel-block at p (UNIT bytes) asks for its share of the lines
 * PANEL_PREFETCH bytes ahead: a block's prefetches spread over its steps. All of them at
 * the block's start (the burst this replaced) left a decode row's panel kernels reading
 * from DRAM 1.1-1.3x slower on Zen 5 (docs/performance.md, session 20). */
#define PANEL_PREFETCH_PART(p, UNIT, q, Q)                                                     \
    for (int l_ = (q) * (((UNIT) + 63) / 64) / (Q); l_ < ((q) + 1) * (((UNIT) + 63) / 64) / (Q); \
         l_++)                                                                                 \
    __builtin_prefetch((p) + PANEL_PREFETCH + 64 * l_, 0, 2)

/* -O3's extra loop transformations (the build's default) made the 8-row kernel 1.5x
 * slower on Zen 4 (its accumulators spilled): these loops are written to be compiled as
 * they stand. */
#pragma GCC push_options
#pragma GCC optimize("O2")

/* The 6-bit scales (lo = 0) or mins (lo = 1) of runs 0-3 (hi = 0) or 4-7 (hi = 1) of each
 * lane's row, a byte each (byte j: run 4 hi + j), from the three scale dwords a0, a1, a2
 * (ggml's get_scale_min_k4, 4 runs at a time). */
#define PANEL_SCALES(V, AND, OR, SRL, SLL, SET1)                                               \
    static INLINE V ISA(panel_scales)(V a0, V a1, V a2, int mins, int hi) {                    \
        const V six = SET1(0x3f3f3f3f), four = SET1(0x0f0f0f0f), two = SET1(0x03030303);       \
        const V lo6 = mins ? a1 : a0;                                                          \
        if (!hi) return AND(lo6, six);                                                         \
        const V top = SLL(AND(SRL(lo6, 6), two), 4);                                           \
        return OR(AND(mins ? SRL(a2, 4) : a2, four), top);                                     \
    }

/* Q5_0's lane patterns over 16 bytes (4 lanes, a lane a row; a vector repeats them): pick
 * j, byte k of a lane = byte j of that lane (a vpshufb index); bit hi, byte k of a lane =
 * 1 << (4 hi + k), the bit of a qh byte that column k reads. Constants, no per-call work. */
static INLINE __m128i ISA(panel_pick)(int j) {
    return _mm_add_epi8(_mm_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c), _mm_set1_epi8((char)j));
}
static INLINE __m128i ISA(panel_bit)(int hi) { return _mm_set1_epi32((int)(0x08040201u << 4 * hi)); }

#ifdef PANEL_ZMM /* AVX-512: 16 rows of W in a zmm's lanes */

PANEL_SCALES(__m512i, _mm512_and_si512, _mm512_or_si512, _mm512_srli_epi32, _mm512_slli_epi32,
             _mm512_set1_epi32)

static INLINE __m512i ISA(panel_bcast)(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The panel's blocks times the N rows of x (a tile: PANEL_X; dx per row nb apart, bsp: per
 * row and block the 4 int16 pairs of run sums (Q0, Q2), (Q1, Q3), (Q4, Q6), (Q5, Q7)),
 * into y (rows ys apart). */
#define PANEL_ROWS_N(N, TYPE, UNIT, Q5)                                                            \
    static void ISA(panel_##TYPE##_##N)(const uint8_t *pan, int nb, const int8_t *xq,         \
                                        const float *dx, const int32_t *bsp, size_t xu, float *y, \
                                        size_t ys) {                                           \
        __m512 acc[N];                                                                          \
        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) acc[t] = _mm512_setzero_ps();      \
        const __m512i low = _mm512_set1_epi8(15), byte = _mm512_set1_epi32(0xff);               \
        const __m512i pair = _mm512_set1_epi32(0x00ff00ff), sixteen = _mm512_set1_epi8(16);     \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *p = pan + (size_t)b * UNIT;                                          \
            const __m512i a0 = _mm512_loadu_si512(p + 64), a1 = _mm512_loadu_si512(p + 128);    \
            const __m512i a2 = _mm512_loadu_si512(p + 192);                                     \
            __m512i is[N], ms[N];                                                               \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) is[t] = ms[t] = _mm512_setzero_si512(); \
            for (int c = 0; c < 4; c++) {                                                       \
                PANEL_PREFETCH_PART(p, UNIT, c, 4);                                                \
                const int8_t *xc = PANEL_X(xq, N, 0, b * 256 + 64 * c); /* chunk c's quads */  \
                const __m512i bl = _mm512_set1_epi8((char)(1 << 2 * c)), bh = _mm512_set1_epi8((char)(2 << 2 * c)); \
                __m512i aL[N], aH[N];                                                           \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) aL[t] = aH[t] = _mm512_setzero_si512(); \
                _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {                           \
                    const __m512i w = _mm512_loadu_si512(p + 256 + (c * 8 + g) * 64);           \
                    __m512i lo = _mm512_and_si512(w, low);                                      \
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);                \
                    if (Q5) { /* 16 or-ed in where qh quad g's bit 2c (lo), 2c + 1 (hi) is set */ \
                        const __m512i qh = _mm512_loadu_si512(p + 2304 + 64 * g);               \
                        lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, bl), lo, sixteen); \
                        hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, bh), hi, sixteen); \
                    }                                                                           \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                       \
                        aL[t] = _mm512_dpbusd_epi32(aL[t], lo, ISA(panel_bcast)(PANEL_X(xc, N, t, 4 * g))); \
                        aH[t] = _mm512_dpbusd_epi32(aH[t], hi, ISA(panel_bcast)(PANEL_X(xc, N, t, 32 + 4 * g))); \
                    }                                                                           \
                }                                                                               \
                /* runs 2c (low nibbles) and 2c + 1 (high): bytes 2(c % 2), + 1 of a dword */   \
                const __m512i sc = ISA(panel_scales)(a0, a1, a2, 0, c >= 2);                    \
                const __m512i sL = _mm512_and_si512(_mm512_srli_epi32(sc, 16 * (c % 2)), byte); \
                const __m512i sH = _mm512_and_si512(_mm512_srli_epi32(sc, 16 * (c % 2) + 8), byte); \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                             \
                    is[t] = _mm512_add_epi32(is[t], _mm512_add_epi32(_mm512_mullo_epi32(aL[t], sL), \
                                                                     _mm512_mullo_epi32(aH[t], sH))); \
            }                                                                                   \
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                               \
                const __m512i m = ISA(panel_scales)(a0, a1, a2, 1, h);                          \
                const __m512i m02 = _mm512_and_si512(m, pair);                                  \
                const __m512i m13 = _mm512_and_si512(_mm512_srli_epi32(m, 8), pair);            \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                           \
                    const int32_t *s = bsp + (size_t)t * xu + (size_t)b * PANEL_SUMS + 2 * h;                \
                    ms[t] = _mm512_add_epi32(ms[t], _mm512_madd_epi16(m02, _mm512_set1_epi32(s[0]))); \
                    ms[t] = _mm512_add_epi32(ms[t], _mm512_madd_epi16(m13, _mm512_set1_epi32(s[1]))); \
                }                                                                               \
            }                                                                                   \
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));          \
            const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));  \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                               \
                const __m512 x = _mm512_set1_ps(dx[(size_t)t * xu + b]);                        \
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(d, x), acc[t]); \
                acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms[t]), _mm512_mul_ps(dm, x), acc[t]); \
            }                                                                                   \
        }                                                                                       \
        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) _mm512_storeu_ps(y + t * ys, acc[t]); \
    }



/* The legacy types (native.c panel_perm): units of two runs of 32 columns, a run's 16 d
 * at 32 u of its unit. Per run, row of W and row of x an exact integer S = sum code q by
 * vpdpbusd on the unsigned codes, then acc += S (d dx), as llama.cpp's dots take a block:
 *   Q4_0 (576-byte units: d, 4 quads of qs per run): code = nibble; S starts from -8
 *     times x's sum over the run (bsp, a broadcast), leaving sum (code - 8) q.
 *   Q5_0 (704-byte units: d, the 16 rows' qh words per run, 4 quads of qs per run): code =
 *     nibble | qh's bit << 4; S starts from -16 times x's sum over the run (bsp, a
 *     broadcast), leaving sum (code - 16) q. A quad's fifth bits: qh's byte spread to the
 *     quad's 4 bytes (vpshufb), tested against each byte's own bit (a mask), 16 added.
 *   Q8_0 (1088-byte units: d, 8 quads of qs per run): the int8 codes plus 128 (a xor of
 *     the sign bit), S started from -128 times x's sum.
 *   IQ4_NL (576-byte units, Q4_0's layout): code = the nibble's level plus 128 (a vpshufb
 *     of the levels table, biased), S started from -128 times x's sum.
 *   Q4_1 (640-byte units: d, the rows' m per run at 64 + 32 u, 4 quads of qs per run): w =
 *     d code + m; S starts from 0, and apart from acc, off += m s (a multiply, then an
 *     add; s: the run's k term of x, quantize_row's half(dx sum q), in bsp as f32 bits);
 *     y = acc + off, llama.cpp's Q4_1 dot (its min terms summed apart).
 * The AVX2 form (below) takes the same integer sums and f32 steps: the same bits. */
typedef struct {
    __m512i low, sixteen, sign, iq4, pick[4], bit[2];
} ISA(panel_consts);

static INLINE ISA(panel_consts) ISA(panel_consts_make)(void) {
    ISA(panel_consts) k;
    k.low = _mm512_set1_epi8(15), k.sixteen = _mm512_set1_epi8(16);
    k.sign = _mm512_set1_epi8((char)0x80);
    k.iq4 = _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128((const __m128i *)IQ4_LEVEL), _mm_set1_epi8((char)0x80)));
    for (int j = 0; j < 4; j++) k.pick[j] = _mm512_broadcast_i32x4(ISA(panel_pick)(j));
    for (int j = 0; j < 2; j++) k.bit[j] = _mm512_broadcast_i32x4(ISA(panel_bit)(j));
    return k;
}

/* Quad g of run u of unit p as unsigned bytes: columns 4g .. 4g + 3 (lo), 16 + 4g .. (hi). */
static INLINE void ISA(codes_q50)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                  __m512i *lo, __m512i *hi) {
    const __m512i qh = _mm512_loadu_si512(p + 64 + 64 * u);
    const __m512i qs = _mm512_loadu_si512(p + 192 + (4 * u + g) * 64);
    const __mmask64 ml = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, k->pick[g / 2]), k->bit[g % 2]);
    const __mmask64 mh = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, k->pick[2 + g / 2]), k->bit[g % 2]);
    *lo = _mm512_and_si512(qs, k->low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), k->low);
    *lo = _mm512_mask_add_epi8(*lo, ml, *lo, k->sixteen);
    *hi = _mm512_mask_add_epi8(*hi, mh, *hi, k->sixteen);
}
static INLINE void ISA(codes_q80)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                  __m512i *lo, __m512i *hi) {
    *lo = _mm512_xor_si512(_mm512_loadu_si512(p + 64 + (8 * u + g) * 64), k->sign);
    *hi = _mm512_xor_si512(_mm512_loadu_si512(p + 64 + (8 * u + 4 + g) * 64), k->sign);
}
/* The nibbles of a quad's 64 bytes at qs: low ones (lo), high ones (hi). */
static INLINE void ISA(codes_nibbles)(const uint8_t *qs, const ISA(panel_consts) *k, __m512i *lo,
                                      __m512i *hi) {
    const __m512i v = _mm512_loadu_si512(qs);
    *lo = _mm512_and_si512(v, k->low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), k->low);
}
static INLINE void ISA(codes_q41)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                  __m512i *lo, __m512i *hi) {
    ISA(codes_nibbles)(p + 128 + (4 * u + g) * 64, k, lo, hi);
}
static INLINE void ISA(codes_q40)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                  __m512i *lo, __m512i *hi) {
    ISA(codes_nibbles)(p + 64 + (4 * u + g) * 64, k, lo, hi);
}
static INLINE void ISA(codes_iq4nl)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                    __m512i *lo, __m512i *hi) {
    ISA(codes_nibbles)(p + 64 + (4 * u + g) * 64, k, lo, hi);
    *lo = _mm512_shuffle_epi8(k->iq4, *lo);
    *hi = _mm512_shuffle_epi8(k->iq4, *hi);
}

/* The legacy types' kernel: TYPE's codes (codes_TYPE), UNIT bytes a unit, MINS: Q4_1's m
 * terms (bsp holds s) rather than a code offset (bsp holds its start). */
#define PANEL_RUNS(N, TYPE, UNIT, MINS)                                                         \
    static void ISA(panel_##TYPE##_##N)(const uint8_t *pan, int nb, const int8_t *xq,         \
                                        const float *dx, const int32_t *bsp, size_t xu, float *y, \
                                        size_t ys) {                                           \
        const ISA(panel_consts) k = ISA(panel_consts_make)();                                   \
        __m512 acc[N], off[N];                                                                  \
        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) acc[t] = off[t] = _mm512_setzero_ps(); \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *p = pan + (size_t)b * UNIT;                                          \
            _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                               \
                const size_t r = 2 * (size_t)b + u; /* the run */                              \
                const int8_t *xr = PANEL_X(xq, N, 0, 32 * r); /* its quads */                  \
                __m512i aL[N], aH[N];                                                           \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                           \
                    aL[t] = MINS ? _mm512_setzero_si512() : _mm512_set1_epi32(bsp[t * xu + r]); \
                    aH[t] = _mm512_setzero_si512();                                             \
                }                                                                               \
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {                           \
                    PANEL_PREFETCH_PART(p, UNIT, 4 * u + g, 8);                                    \
                    __m512i lo, hi;                                                             \
                    ISA(codes_##TYPE)(p, u, g, &k, &lo, &hi);                                   \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                       \
                        aL[t] = _mm512_dpbusd_epi32(aL[t], lo, ISA(panel_bcast)(PANEL_X(xr, N, t, 4 * g))); \
                        aH[t] = _mm512_dpbusd_epi32(aH[t], hi, ISA(panel_bcast)(PANEL_X(xr, N, t, 16 + 4 * g))); \
                    }                                                                           \
                }                                                                               \
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32 * u))); \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                           \
                    const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(dx[t * xu + r]));         \
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(aL[t], aH[t])), dd, acc[t]); \
                    if (MINS) {                                                                 \
                        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 64 + 32 * u))); \
                        float s;                                                                \
                        memcpy(&s, &bsp[t * xu + r], 4);                                        \
                        off[t] = _mm512_add_ps(off[t], _mm512_mul_ps(m, _mm512_set1_ps(s)));    \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                                     \
            _mm512_storeu_ps(y + t * ys, MINS ? _mm512_add_ps(acc[t], off[t]) : acc[t]);        \
    }
PANEL_TILES(PANEL_RUNS, q40, 576, 0)
PANEL_TILES(PANEL_RUNS, iq4nl, 576, 0)
PANEL_TILES(PANEL_RUNS, q50, 704, 0)
PANEL_TILES(PANEL_RUNS, q80, 1088, 0)
PANEL_TILES(PANEL_RUNS, q41, 640, 1)
#undef PANEL_RUNS

/* Q6_K (native.c's 3360-byte panel-blocks: ql quad q's 16 rows at 64 q, qh quad q's at
 * 2048 + 64 q, the scales' dword i at 3072 + 64 i, d at 3328). Column 128 n + 32 m + 4 g + k
 * (n < 2, m < 4, g < 8, k < 4) has code (ql quad 16 n + 8 (m % 2) + g's low nibble for m < 2,
 * high for m >= 2) + 16 (qh quad 8 n + g's bits 2m, 2m + 1): ggml's order, the code 0..63;
 * half-run j (columns 16 j ..) has the row's signed scale byte j. Per block, row of W and
 * row of x: I = sum_j sc_j S_j - 32 sum_j sc_j Q_j (S_j: codes times q over half-run j; Q_j:
 * x's sums, bsp's pairs), exact in int32; acc += I (d dx): llama.cpp's Q6_K dot, its
 * offset of 32 taken in the integers. The AVX2 form takes the same integers and f32 steps. */
static INLINE __m512i ISA(codes_q6k)(const uint8_t *p, int n, int m, int g, __m512i low, __m512i top) {
    const __m512i ql = _mm512_loadu_si512(p + 64 * (16 * n + 8 * (m % 2) + g));
    const __m512i qh = _mm512_loadu_si512(p + 2048 + 64 * (8 * n + g));
    const __m512i l4 = m < 2 ? ql : _mm512_srli_epi16(ql, 4);
    const __m512i h = m == 0 ? _mm512_slli_epi16(qh, 4) : m == 1 ? _mm512_slli_epi16(qh, 2) : m == 2 ? qh : _mm512_srli_epi16(qh, 2);
    /* low ? l4 : h bit by bit (vpternlogd 0xCA), then the code's six bits */
    return _mm512_and_si512(_mm512_ternarylogic_epi32(low, l4, h, 0xCA), _mm512_or_si512(low, top));
}
/* Q6_K's signed scales: line i (scales 4i .. 4i + 3 of each row, a dword a row) as stored
 * (no mins: mine untouched). */
static INLINE void ISA(scales_q6k)(const uint8_t *p, __m512i line[4], __m512i mine[4]) {
    (void)mine;
    for (int i = 0; i < 4; i++) line[i] = _mm512_loadu_si512(p + 3072 + 64 * i);
}

/* Q3_K (native.c's 1760-byte panel-blocks: hmask quad g's 16 rows at 64 g, qs quad q's at
 * 512 + 64 q, the 12 scale bytes' dwords at 1536 + 64 i, d at 1728). Column 128 n + 32 m +
 * 4 g + k has code (qs quad 8 n + g >> 2m & 3) + 4 (hmask quad g's bit 4n + m), 0..7, and
 * weight d s (code - 4); half-run j's scale s = six bits (ggml's packing) - 32. */
static INLINE __m512i ISA(codes_q3k)(const uint8_t *p, int n, int m, int g, __m512i low, __m512i top) {
    (void)low, (void)top;
    const __m512i q = _mm512_loadu_si512(p + 512 + 64 * (8 * n + g));
    const __m512i hm = _mm512_loadu_si512(p + 64 * g);
    const __m512i l2 = _mm512_and_si512(_mm512_srli_epi16(q, 2 * m), _mm512_set1_epi8(3));
    const __m512i h = _mm512_and_si512(_mm512_srli_epi16(hm, 4 * n + m), _mm512_set1_epi8(1));
    return _mm512_or_si512(l2, _mm512_slli_epi16(h, 2));
}
/* Q3_K's scales as Q6_K's lines: scale 4i + k in byte k of each row's dword, less 32. */
static INLINE void ISA(scales_q3k)(const uint8_t *p, __m512i line[4], __m512i mine[4]) {
    (void)mine;
    const __m512i d0 = _mm512_loadu_si512(p + 1536), d1 = _mm512_loadu_si512(p + 1600);
    const __m512i d2 = _mm512_loadu_si512(p + 1664), nib = _mm512_set1_epi8(15);
    for (int i = 0; i < 4; i++) {
        const __m512i lo = i < 2 ? (i ? d1 : d0) : _mm512_srli_epi32(i == 3 ? d1 : d0, 4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(d2, 2 * i), _mm512_set1_epi8(3));
        line[i] = _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(lo, nib), _mm512_slli_epi32(hi, 4)),
                                  _mm512_set1_epi8(32));
    }
}

/* Q2_K (native.c's 1344-byte panel-blocks: qs quad q's 16 rows at 64 q, the 16 scale
 * bytes' dwords at 1024 + 64 i, d at 1280, dmin at 1312). Column 128 n + 32 m + 4 g + k has
 * code qs quad 8 n + g >> 2m & 3 and weight d sc code - dmin mn, half-run j's sc and mn its
 * scale byte's low and high nibbles (llama.cpp's Q2_K dot: mins apart). */
static INLINE __m512i ISA(codes_q2k)(const uint8_t *p, int n, int m, int g, __m512i low, __m512i top) {
    (void)low, (void)top;
    const __m512i q = _mm512_loadu_si512(p + 64 * (8 * n + g));
    return _mm512_and_si512(_mm512_srli_epi16(q, 2 * m), _mm512_set1_epi8(3));
}
static INLINE void ISA(scales_q2k)(const uint8_t *p, __m512i line[4], __m512i mine[4]) {
    const __m512i nib = _mm512_set1_epi8(15);
    for (int i = 0; i < 4; i++) {
        const __m512i sd = _mm512_loadu_si512(p + 1024 + 64 * i);
        line[i] = _mm512_and_si512(sd, nib), mine[i] = _mm512_and_si512(_mm512_srli_epi32(sd, 4), nib);
    }
}

/* The types with a scale per 16 columns (half-runs): a code offset 2^SHIFT (Q6_K: 32;
 * Q3_K: 4) taken in the integers, or (MOFF, Q2_K) mins apart: M = sum_j mn_j Q_j and acc -=
 * M (dmin dx), dmin at MOFF, as Q4_K's. UNIT bytes a panel-block, its d at DOFF; codes_TYPE,
 * scales_TYPE. */
#define PANEL_BY16_N(N, TYPE, UNIT, SHIFT, DOFF, MOFF)                                             \
    static void ISA(panel_##TYPE##_##N)(const uint8_t *pan, int nb, const int8_t *xq,         \
                                        const float *dx, const int32_t *bsp, size_t xu, float *y, \
                                        size_t ys) {                                           \
        const __m512i low = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);                \
        __m512 acc[N];                                                                          \
        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) acc[t] = _mm512_setzero_ps();      \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *p = pan + (size_t)b * UNIT;                                          \
            __m512i line[4], mine[4];                                                           \
            ISA(scales_##TYPE)(p, line, mine);                                                  \
            /* from -2^SHIFT sum_j sc_j Q_j (MOFF: M, to be subtracted apart): the scales (or \
             * mins) as int16 pairs by x's pairs */                                             \
            __m512i is[N];                                                                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) is[t] = _mm512_setzero_si512(); \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                               \
                const __m512i v = MOFF ? mine[i] : line[i];                                     \
                const __m512i e02 = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8);              \
                const __m512i e13 = _mm512_srai_epi16(v, 8);                                    \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                           \
                    const int32_t *s = bsp + (size_t)t * xu + (size_t)b * 2 * PANEL_SUMS + 2 * i; \
                    is[t] = _mm512_add_epi32(is[t], _mm512_madd_epi16(e02, _mm512_set1_epi32(s[0]))); \
                    is[t] = _mm512_add_epi32(is[t], _mm512_madd_epi16(e13, _mm512_set1_epi32(s[1]))); \
                }                                                                               \
            }                                                                                   \
            __m512i ms[N];                                                                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                               \
                ms[t] = is[t];                                                                  \
                is[t] = MOFF ? _mm512_setzero_si512()                                           \
                             : _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(is[t], SHIFT)); \
            }                                                                                   \
            for (int n = 0; n < 2; n++)                                                         \
                _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++)                             \
                    _Pragma("GCC unroll 2") for (int f = 0; f < 2; f++) { /* half-run j */     \
                        const int j = 8 * n + 2 * m + f;                                        \
                        PANEL_PREFETCH_PART(p, UNIT, j, 16);                                       \
                        /* each half-run's codes made in it: hoisted, GCC kept them on the stack */ \
                        const uint8_t *pj = p;                                                  \
                        __asm__("" : "+r"(pj));                                                 \
                        const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(line[j / 4], 24 - 8 * (j % 4)), 24); \
                        const int8_t *xc = PANEL_X(xq, N, 0, b * 256 + 128 * n + 32 * m);     \
                        __m512i a[N];                                                           \
                        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) a[t] = _mm512_setzero_si512(); \
                        _Pragma("GCC unroll 4") for (int g = 4 * f; g < 4 * f + 4; g++) {       \
                            const __m512i c = ISA(codes_##TYPE)(pj, n, m, g, low, top);         \
                            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                 \
                                a[t] = _mm512_dpbusd_epi32(a[t], c, ISA(panel_bcast)(PANEL_X(xc, N, t, 4 * g))); \
                        }                                                                       \
                        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                     \
                            is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(a[t], sc));      \
                    }                                                                           \
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + DOFF))); \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                               \
                const __m512 x = _mm512_set1_ps(dx[(size_t)t * xu + b]);                        \
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(d, x), acc[t]); \
                if (MOFF) {                                                                     \
                    const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + MOFF))); \
                    acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms[t]), _mm512_mul_ps(dm, x), acc[t]); \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) _mm512_storeu_ps(y + t * ys, acc[t]); \
    }
PANEL_TILES(PANEL_BY16_N, q6k, 3360, 5, 3328, 0)
PANEL_TILES(PANEL_BY16_N, q3k, 1760, 2, 1728, 0)
PANEL_TILES(PANEL_BY16_N, q2k, 1344, 0, 1280, 1312)
#undef PANEL_BY16_N

/* IQ4_XS (native.c's 2176-byte panel-blocks: the 16 rows' d at 0, scales_h at 32, scales_l
 * at 64, qs quad q at 128 + 64 q): run j's (32 columns) codes are qs quads 4j .. 4j + 3,
 * low nibbles columns 32 j + 4 g .., high 32 j + 16 + 4 g ..; its scale s_j = (scales_l's
 * nibble j | scales_h's bits 2j, 2j + 1 << 4) - 32. Per block, row of W and row of x:
 * I = sum_j s_j S_j, S_j = sum level q over run j, exact; acc += I (d dx). With VNNI a
 * code is its level plus 128 (IQ4_NL's table) and S_j starts from -128 times x's sum over
 * the run (bsp), then times s_j (vpmulld). The AVX2 form takes the same integers. */
static INLINE __m512i ISA(iq4xs_scale)(__m512i sl, __m512i sh, int j) {
    const __m512i lo4 = _mm512_and_si512(_mm512_srli_epi32(sl, 4 * j), _mm512_set1_epi32(15));
    const __m512i hi2 = _mm512_and_si512(_mm512_srli_epi32(sh, 2 * j), _mm512_set1_epi32(3));
    return _mm512_sub_epi32(_mm512_or_si512(lo4, _mm512_slli_epi32(hi2, 4)), _mm512_set1_epi32(32));
}

#define PANEL_IQ4XS_N(N, ...)                                                                      \
    static void ISA(panel_iq4xs_##N)(const uint8_t *pan, int nb, const int8_t *xq,            \
                                     const float *dx, const int32_t *bsp, size_t xu, float *y, \
                                     size_t ys) {                                              \
        const ISA(panel_consts) k = ISA(panel_consts_make)();                                   \
        __m512 acc[N];                                                                          \
        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) acc[t] = _mm512_setzero_ps();      \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *p = pan + (size_t)b * 2176;                                          \
            const __m512i sl = _mm512_loadu_si512(p + 64);                                      \
            const __m512i sh = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 32))); \
            __m512i is[N];                                                                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) is[t] = _mm512_setzero_si512(); \
            for (int j = 0; j < 8; j++) {                                                       \
                PANEL_PREFETCH_PART(p, 2176, j, 8);                                                \
                const size_t r = 8 * (size_t)b + j; /* the run */                              \
                const int8_t *xr = PANEL_X(xq, N, 0, 32 * r);                                  \
                __m512i a[N];                                                                   \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) a[t] = _mm512_set1_epi32(bsp[t * xu + r]); \
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {                           \
                    __m512i lo, hi;                                                             \
                    ISA(codes_nibbles)(p + 128 + (4 * j + g) * 64, &k, &lo, &hi);               \
                    lo = _mm512_shuffle_epi8(k.iq4, lo);                                        \
                    hi = _mm512_shuffle_epi8(k.iq4, hi);                                        \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                       \
                        a[t] = _mm512_dpbusd_epi32(a[t], lo, ISA(panel_bcast)(PANEL_X(xr, N, t, 4 * g))); \
                        a[t] = _mm512_dpbusd_epi32(a[t], hi, ISA(panel_bcast)(PANEL_X(xr, N, t, 16 + 4 * g))); \
                    }                                                                           \
                }                                                                               \
                const __m512i sc = ISA(iq4xs_scale)(sl, sh, j);                                 \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                             \
                    is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(a[t], sc));              \
            }                                                                                   \
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));          \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                               \
                const __m512 x = _mm512_set1_ps(dx[(size_t)t * xu + b]);                        \
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(d, x), acc[t]); \
            }                                                                                   \
        }                                                                                       \
        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) _mm512_storeu_ps(y + t * ys, acc[t]); \
    }
PANEL_TILES(PANEL_IQ4XS_N, )
#undef PANEL_IQ4XS_N

#else /* AVX2: the panel's two halves of 8 rows, a ymm's lanes each */

/* A run's byte products and their widening by the run's scale (sc: an int16 pair (sc, sc)
 * in each int32 lane), the one place the two ymm forms differ:
 *  - AVX2 (PANEL_INT16 1): PANEL_DOT16 adds a quad's vpmaddubsw pairs to int16 sums, which
 *    PANEL_WIDEN multiplies by (sc, sc) into int32 (vpmaddwd) before they can overflow;
 *  - AVX-VNNI (KD_DPBUSD): PANEL_DOT16 sums a quad's products into int32 lanes (vpdpbusd),
 *    and PANEL_WIDEN multiplies a whole run's sum by sc once (vpmulld).
 * PANEL_DOT_SCALED / PANEL_RUN_SCALED: the same for products too large to add as int16
 * (the signed levels): AVX2 widens each quad by the scale, AVX-VNNI a run's sum. Both forms
 * give every lane the same exact integers, so the same bits. */
#ifdef KD_DPBUSD
#define PANEL_INT16 0
#define PANEL_DOT16(a, u, x) _mm256_dpbusd_avx_epi32((a), (u), (x))
#define PANEL_WIDEN(s, a, sc) _mm256_add_epi32((s), _mm256_mullo_epi32((a), _mm256_srai_epi32((sc), 16)))
#define PANEL_WIDEN1(s, a) _mm256_add_epi32((s), (a))
#define PANEL_DOT_SCALED(a, u, x, sc) _mm256_dpbusd_avx_epi32((a), (u), (x))
#define PANEL_RUN_SCALED(s, a, sc) PANEL_WIDEN(s, a, sc)
#else
#define PANEL_INT16 1
#define PANEL_DOT16(a, u, x) _mm256_add_epi16((a), _mm256_maddubs_epi16((u), (x)))
#define PANEL_WIDEN(s, a, sc) _mm256_add_epi32((s), _mm256_madd_epi16((a), (sc)))
#define PANEL_WIDEN1(s, a) _mm256_add_epi32((s), _mm256_madd_epi16((a), _mm256_set1_epi16(1)))
#define PANEL_DOT_SCALED(a, u, x, sc)                                                          \
    _mm256_add_epi32((a), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (x)), (sc)))
#define PANEL_RUN_SCALED(s, a, sc) _mm256_add_epi32((s), (a))
#endif

PANEL_SCALES(__m256i, _mm256_and_si256, _mm256_or_si256, _mm256_srli_epi32, _mm256_slli_epi32,
             _mm256_set1_epi32)

static INLINE __m256i ISA(panel_bcast)(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* As the AVX-512 form, a block's halves h (rows 8h .. 8h + 7) one after the other. Without VNNI a
 * run's byte products are vpmaddubsw pairs added as int16 (8 quads of 2 x 15 x 127 stay
 * under 2^15), then times the run's scale (an int16 pair (sc, sc)) by vpmaddwd. */
#define PANEL_ROWS_N(N, TYPE, UNIT, Q5)                                                            \
    static void ISA(panel_##TYPE##_##N)(const uint8_t *pan, int nb, const int8_t *xq,         \
                                        const float *dx, const int32_t *bsp, size_t xu, float *y, \
                                        size_t ys) {                                           \
        const __m256i low = _mm256_set1_epi8(15), byte = _mm256_set1_epi32(0xff);               \
        const __m256i pair = _mm256_set1_epi32(0x00ff00ff), sixteen = _mm256_set1_epi8(16);     \
        __m256 acc[2][N];                                                                       \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) acc[h][t] = _mm256_setzero_ps(); \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *p = pan + (size_t)b * UNIT;                                          \
            for (int h = 0; h < 2; h++) { /* each line of the block read in one pass */         \
                const __m256i a0 = _mm256_loadu_si256((const __m256i *)(p + 64 + 32 * h));      \
                const __m256i a1 = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));     \
                const __m256i a2 = _mm256_loadu_si256((const __m256i *)(p + 192 + 32 * h));     \
                __m256i is[N], ms[N];                                                           \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) is[t] = ms[t] = _mm256_setzero_si256(); \
                for (int c = 0; c < 4; c++) {                                                   \
                    const int8_t *xc = PANEL_X(xq, N, 0, b * 256 + 64 * c); /* chunk c's quads */ \
                    const __m256i sc = ISA(panel_scales)(a0, a1, a2, 0, c >= 2);                \
                    _Pragma("GCC unroll 2") for (int f = 0; f < 2; f++) { /* run 2c + f */     \
                        PANEL_PREFETCH_PART(p, UNIT, 8 * h + 2 * c + f, 16);                \
                        __m256i s = _mm256_and_si256(_mm256_srli_epi32(sc, 16 * (c % 2) + 8 * f), byte); \
                        s = _mm256_or_si256(s, _mm256_slli_epi32(s, 16));                       \
                        __m256i a[N];                                                           \
                        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) a[t] = _mm256_setzero_si256(); \
                        _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {                   \
                            const __m256i w = _mm256_loadu_si256((const __m256i *)(p + 256 + (c * 8 + g) * 64 + 32 * h)); \
                            __m256i v = f ? _mm256_and_si256(_mm256_srli_epi16(w, 4), low) : _mm256_and_si256(w, low); \
                            if (Q5) { /* qh quad g's bit 2c + f, as 16 */                       \
                                const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 2304 + 64 * g + 32 * h)); \
                                const __m256i hb = _mm256_slli_epi16(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + f)), 4); \
                                v = _mm256_or_si256(v, _mm256_and_si256(hb, sixteen));          \
                            }                                                                   \
                            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {               \
                                a[t] = PANEL_DOT16(a[t], v, ISA(panel_bcast)(PANEL_X(xc, N, t, 32 * f + 4 * g))); \
                                /* each row's sum kept a chain in a register: reassociated,  \
                                 * GCC stored every product to the stack first */            \
                                __asm__("" : "+x"(a[t]));                                       \
                            }                                                                   \
                            if (PANEL_INT16 && Q5 && g == 3) /* 4 quads of 2 x 31 x 127: widened */ \
                                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {           \
                                    is[t] = PANEL_WIDEN(is[t], a[t], s);                        \
                                    a[t] = _mm256_setzero_si256();                              \
                                }                                                               \
                        }                                                                       \
                        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                     \
                            is[t] = PANEL_WIDEN(is[t], a[t], s);                                \
                    }                                                                           \
                }                                                                               \
                _Pragma("GCC unroll 2") for (int hh = 0; hh < 2; hh++) {                        \
                    const __m256i m = ISA(panel_scales)(a0, a1, a2, 1, hh);                     \
                    const __m256i m02 = _mm256_and_si256(m, pair);                              \
                    const __m256i m13 = _mm256_and_si256(_mm256_srli_epi32(m, 8), pair);        \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                       \
                        const int32_t *s = bsp + (size_t)t * xu + (size_t)b * PANEL_SUMS + 2 * hh;            \
                        ms[t] = _mm256_add_epi32(ms[t], _mm256_madd_epi16(m02, _mm256_set1_epi32(s[0]))); \
                        ms[t] = _mm256_add_epi32(ms[t], _mm256_madd_epi16(m13, _mm256_set1_epi32(s[1]))); \
                    }                                                                           \
                }                                                                               \
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));      \
                const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * h))); \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                           \
                    const __m256 x = _mm256_set1_ps(dx[(size_t)t * xu + b]);                    \
                    acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(d, x), acc[h][t]); \
                    acc[h][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms[t]), _mm256_mul_ps(dm, x), acc[h][t]); \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) _mm256_storeu_ps(y + t * ys + 8 * h, acc[h][t]); \
    }


/* The legacy types as the AVX-512 form (the same units, the same integer sums, the same
 * f32 steps, so the same bits), a unit's halves of 8 rows one after the other (bytes 32 h
 * of each line, 16 h of the d and m lines). Without VNNI a quad's byte products are
 * vpmaddubsw pairs added as int16 over GROUP quads (Q5_0: 2 quads of 2 x 31 x 127, 4 x
 * 7874 under 2^15; Q4_0, Q4_1: all 4 quads of 2 x 15 x 127), widened by vpmaddwd with ones. Q5_0's
 * fifth bits: qh's byte spread to the quad's 4 bytes (vpshufb), each byte kept where its
 * own bit is set (vpcmpeqb), 16 or-ed in. Q8_0's and IQ4_NL's signed codes take their own
 * kernel (below); lv, av: IQ4_NL's levels and their magnitudes. */
typedef struct {
    __m256i low, sixteen, pick[4], bit[2], lv, av;
} ISA(panel_consts);

static INLINE ISA(panel_consts) ISA(panel_consts_make)(void) {
    ISA(panel_consts) k;
    k.low = _mm256_set1_epi8(15), k.sixteen = _mm256_set1_epi8(16);
    for (int j = 0; j < 4; j++) k.pick[j] = _mm256_broadcastsi128_si256(ISA(panel_pick)(j));
    for (int j = 0; j < 2; j++) k.bit[j] = _mm256_broadcastsi128_si256(ISA(panel_bit)(j));
    k.lv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_LEVEL));
    k.av = _mm256_abs_epi8(k.lv);
    return k;
}

/* Quad g of run u of unit p's half at p (p + 32 h) as unsigned bytes: columns 4g .. 4g + 3
 * (lo), 16 + 4g .. (hi). */
static INLINE void ISA(codes_q50)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                  __m256i *lo, __m256i *hi) {
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 64 + 64 * u));
    const __m256i qs = _mm256_loadu_si256((const __m256i *)(p + 192 + (4 * u + g) * 64));
    const __m256i b0 = k->bit[g % 2];
    const __m256i ml = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, k->pick[g / 2]), b0), b0);
    const __m256i mh = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, k->pick[2 + g / 2]), b0), b0);
    *lo = _mm256_or_si256(_mm256_and_si256(qs, k->low), _mm256_and_si256(ml, k->sixteen));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), k->low), _mm256_and_si256(mh, k->sixteen));
}
/* The nibbles of a quad's 32 bytes at qs: low ones (lo), high ones (hi). */
static INLINE void ISA(codes_nibbles)(const uint8_t *qs, const ISA(panel_consts) *k, __m256i *lo,
                                      __m256i *hi) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)qs);
    *lo = _mm256_and_si256(v, k->low);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), k->low);
}
static INLINE void ISA(codes_q41)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                  __m256i *lo, __m256i *hi) {
    ISA(codes_nibbles)(p + 128 + (4 * u + g) * 64, k, lo, hi);
}
static INLINE void ISA(codes_q40)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                  __m256i *lo, __m256i *hi) {
    ISA(codes_nibbles)(p + 64 + (4 * u + g) * 64, k, lo, hi);
}

/* The legacy types' kernel: TYPE's codes (codes_TYPE), UNIT bytes a unit, MINS as the
 * AVX-512 form's, GROUP quads summed as int16 before widening. */
#define PANEL_RUNS(N, TYPE, UNIT, MINS, GROUP)                                                  \
    static void ISA(panel_##TYPE##_##N)(const uint8_t *pan, int nb, const int8_t *xq,         \
                                        const float *dx, const int32_t *bsp, size_t xu, float *y, \
                                        size_t ys) {                                           \
        const ISA(panel_consts) k = ISA(panel_consts_make)();                                   \
        __m256 acc[2][N], off[2][N];                                                            \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) acc[h][t] = off[h][t] = _mm256_setzero_ps(); \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *p = pan + (size_t)b * UNIT;                                          \
            for (int h = 0; h < 2; h++) /* rows 8 h .. 8 h + 7 */                               \
                _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                           \
                    PANEL_PREFETCH_PART(p, UNIT, 2 * h + u, 4);                                    \
                    /* x's broadcasts made again for each half: hoisted out of h, GCC kept \
                     * all 64 on the stack, 1.15x slower (Zen 5) */                            \
                    const int8_t *xh = xq;                                                      \
                    __asm__("" : "+r"(xh));                                                     \
                    const size_t r = 2 * (size_t)b + u; /* the run */                          \
                    const int8_t *xr = PANEL_X(xh, N, 0, 32 * r); /* its quads */              \
                    __m256i s[N];                                                               \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                         \
                        s[t] = MINS ? _mm256_setzero_si256() : _mm256_set1_epi32(bsp[t * xu + r]); \
                    _Pragma("GCC unroll 4") for (int g0 = 0; g0 < 4; g0 += GROUP) {             \
                        __m256i lo[GROUP], hi[GROUP];                                           \
                        _Pragma("GCC unroll 4") for (int g = 0; g < GROUP; g++)                 \
                            ISA(codes_##TYPE)(p + 32 * h, u, g0 + g, &k, &lo[g], &hi[g]);       \
                        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                   \
                            const int col = 4 * g0;                                             \
                            __m256i a = _mm256_setzero_si256();                                 \
                            _Pragma("GCC unroll 4") for (int g = 0; g < GROUP; g++) {           \
                                a = PANEL_DOT16(a, lo[g], ISA(panel_bcast)(PANEL_X(xr, N, t, col + 4 * g))); \
                                a = PANEL_DOT16(a, hi[g], ISA(panel_bcast)(PANEL_X(xr, N, t, col + 16 + 4 * g))); \
                            }                                                                   \
                            s[t] = PANEL_WIDEN1(s[t], a);                                       \
                        }                                                                       \
                    }                                                                           \
                    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 * u + 16 * h))); \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                       \
                        const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(dx[t * xu + r]));     \
                        acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), dd, acc[h][t]);   \
                        if (MINS) {                                                             \
                            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 64 + 32 * u + 16 * h))); \
                            float sx;                                                           \
                            memcpy(&sx, &bsp[t * xu + r], 4);                                   \
                            off[h][t] = _mm256_add_ps(off[h][t], _mm256_mul_ps(m, _mm256_set1_ps(sx))); \
                        }                                                                       \
                    }                                                                           \
                }                                                                               \
        }                                                                                       \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                                 \
                _mm256_storeu_ps(y + t * ys + 8 * h, MINS ? _mm256_add_ps(acc[h][t], off[h][t]) : acc[h][t]); \
    }
PANEL_TILES(PANEL_RUNS, q40, 576, 0, 4)
PANEL_TILES(PANEL_RUNS, q50, 704, 0, 2)
PANEL_TILES(PANEL_RUNS, q41, 640, 1, 4)
#undef PANEL_RUNS

/* The signed codes (IQ4_NL's levels, -127 .. 113, in Q4_0's units; Q8_0's, -128 .. 127, in
 * its 1088-byte units): no bias keeps vpmaddubsw's pair sums under 2^15, so a quad's
 * product is the codes' magnitudes (al, ah) by x given each code's sign (sl, sh; vpsignb,
 * which zeroes x where a code is 0), each widened alone (a pair sum reaches 2 x 128 x 127;
 * x is never -128). S is sum code q from zero: the AVX-512 form's integer (which starts
 * from -128 sum q over code + 128), so the same bits. Quad g of run u of the half at p
 * (p + 32 h): columns 4g .. 4g + 3 (l), 16 + 4g .. (h). */
static INLINE void ISA(signed_iq4nl)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                     __m256i *al, __m256i *sl, __m256i *ah, __m256i *sh) {
    __m256i lo, hi;
    ISA(codes_nibbles)(p + 64 + (4 * u + g) * 64, k, &lo, &hi);
    *sl = _mm256_shuffle_epi8(k->lv, lo), *al = _mm256_shuffle_epi8(k->av, lo);
    *sh = _mm256_shuffle_epi8(k->lv, hi), *ah = _mm256_shuffle_epi8(k->av, hi);
}
static INLINE void ISA(signed_q80)(const uint8_t *p, int u, int g, const ISA(panel_consts) *k,
                                   __m256i *al, __m256i *sl, __m256i *ah, __m256i *sh) {
    (void)k;
    *sl = _mm256_loadu_si256((const __m256i *)(p + 64 + (8 * u + g) * 64)), *al = _mm256_abs_epi8(*sl);
    *sh = _mm256_loadu_si256((const __m256i *)(p + 64 + (8 * u + 4 + g) * 64)), *ah = _mm256_abs_epi8(*sh);
}

#define PANEL_RUNS_SIGNED(N, TYPE, UNIT)                                                        \
    static void ISA(panel_##TYPE##_##N)(const uint8_t *pan, int nb, const int8_t *xq,         \
                                        const float *dx, const int32_t *bsp, size_t xu, float *y, \
                                        size_t ys) {                                           \
        (void)bsp;                                                                              \
        const ISA(panel_consts) k = ISA(panel_consts_make)();                                   \
        __m256 acc[2][N];                                                                       \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) acc[h][t] = _mm256_setzero_ps(); \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *p = pan + (size_t)b * UNIT;                                          \
            for (int h = 0; h < 2; h++)                                                         \
                _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                           \
                    PANEL_PREFETCH_PART(p, UNIT, 2 * h + u, 4);                                    \
                    const int8_t *xh = xq; /* (as PANEL_RUNS's) */                              \
                    __asm__("" : "+r"(xh));                                                     \
                    const size_t r = 2 * (size_t)b + u;                                         \
                    const int8_t *xr = PANEL_X(xh, N, 0, 32 * r);                              \
                    __m256i s[N];                                                               \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) s[t] = _mm256_setzero_si256(); \
                    _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {                       \
                        __m256i al, sl, ah, sh;                                                 \
                        ISA(signed_##TYPE)(p + 32 * h, u, g, &k, &al, &sl, &ah, &sh);           \
                        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                   \
                            s[t] = I8_DOT_ACC(s[t], al, _mm256_sign_epi8(ISA(panel_bcast)(PANEL_X(xr, N, t, 4 * g)), sl)); \
                            s[t] = I8_DOT_ACC(s[t], ah, _mm256_sign_epi8(ISA(panel_bcast)(PANEL_X(xr, N, t, 16 + 4 * g)), sh)); \
                        }                                                                       \
                    }                                                                           \
                    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 * u + 16 * h))); \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                       \
                        const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(dx[t * xu + r]));     \
                        acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), dd, acc[h][t]);   \
                    }                                                                           \
                }                                                                               \
        }                                                                                       \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) _mm256_storeu_ps(y + t * ys + 8 * h, acc[h][t]); \
    }
PANEL_TILES(PANEL_RUNS_SIGNED, iq4nl, 576)
PANEL_TILES(PANEL_RUNS_SIGNED, q80, 1088)
#undef PANEL_RUNS_SIGNED

/* Q6_K as the AVX-512 form (its layout, codes and integers; the same f32 steps, so the same
 * bits), a block's halves h (rows 8 h .. 8 h + 7: bytes 32 h of each line, 16 h of d's)
 * one after the other. A half-run's 4 quads are vpmaddubsw pairs added as int16 two
 * quads at a time (2 x 2 x 63 x 127 under 2^15), times the scale (an int16 pair (sc, sc))
 * by vpmaddwd. */
static INLINE __m256i ISA(codes_q6k)(const uint8_t *p, int n, int m, int g, __m256i low, __m256i top) {
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(p + 64 * (16 * n + 8 * (m % 2) + g)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 2048 + 64 * (8 * n + g)));
    const __m256i l4 = _mm256_and_si256(m < 2 ? ql : _mm256_srli_epi16(ql, 4), low);
    const __m256i h = m == 0 ? _mm256_slli_epi16(qh, 4) : m == 1 ? _mm256_slli_epi16(qh, 2) : m == 2 ? qh : _mm256_srli_epi16(qh, 2);
    return _mm256_or_si256(l4, _mm256_and_si256(h, top));
}
static INLINE void ISA(scales_q6k)(const uint8_t *p, __m256i line[4], __m256i mine[4]) {
    (void)mine;
    for (int i = 0; i < 4; i++) line[i] = _mm256_loadu_si256((const __m256i *)(p + 3072 + 64 * i));
}
static INLINE __m256i ISA(codes_q3k)(const uint8_t *p, int n, int m, int g, __m256i low, __m256i top) {
    (void)low, (void)top;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(p + 512 + 64 * (8 * n + g)));
    const __m256i hm = _mm256_loadu_si256((const __m256i *)(p + 64 * g));
    const __m256i l2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * m), _mm256_set1_epi8(3));
    const __m256i h = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * n + m), _mm256_set1_epi8(1));
    return _mm256_or_si256(l2, _mm256_slli_epi16(h, 2));
}
static INLINE void ISA(scales_q3k)(const uint8_t *p, __m256i line[4], __m256i mine[4]) {
    (void)mine;
    const __m256i d0 = _mm256_loadu_si256((const __m256i *)(p + 1536));
    const __m256i d1 = _mm256_loadu_si256((const __m256i *)(p + 1600));
    const __m256i d2 = _mm256_loadu_si256((const __m256i *)(p + 1664)), nib = _mm256_set1_epi8(15);
    for (int i = 0; i < 4; i++) {
        const __m256i lo = i < 2 ? (i ? d1 : d0) : _mm256_srli_epi32(i == 3 ? d1 : d0, 4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(d2, 2 * i), _mm256_set1_epi8(3));
        line[i] = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(lo, nib), _mm256_slli_epi32(hi, 4)),
                                  _mm256_set1_epi8(32));
    }
}

static INLINE __m256i ISA(codes_q2k)(const uint8_t *p, int n, int m, int g, __m256i low, __m256i top) {
    (void)low, (void)top;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(p + 64 * (8 * n + g)));
    return _mm256_and_si256(_mm256_srli_epi16(q, 2 * m), _mm256_set1_epi8(3));
}
static INLINE void ISA(scales_q2k)(const uint8_t *p, __m256i line[4], __m256i mine[4]) {
    const __m256i nib = _mm256_set1_epi8(15);
    for (int i = 0; i < 4; i++) {
        const __m256i sd = _mm256_loadu_si256((const __m256i *)(p + 1024 + 64 * i));
        line[i] = _mm256_and_si256(sd, nib), mine[i] = _mm256_and_si256(_mm256_srli_epi32(sd, 4), nib);
    }
}

/* The by-16 types as the AVX-512 form (their layouts, codes and integers; the same f32
 * steps, so the same bits), a block's halves h (rows 8 h .. 8 h + 7: bytes 32 h of each
 * line, 16 h of d's) one after the other. A half-run's 4 quads are vpmaddubsw pairs added
 * as int16 GROUP quads at a time (Q6_K 2: 2 x 2 x 63 x 127 under 2^15; Q3_K, Q2_K all 4
 * of 2 x 7 x 127 or less), times the scale (an int16 pair (sc, sc)) by vpmaddwd. */
#define PANEL_BY16_N(N, TYPE, UNIT, SHIFT, DOFF, GROUP, MOFF)                                      \
    static void ISA(panel_##TYPE##_##N)(const uint8_t *pan, int nb, const int8_t *xq,         \
                                        const float *dx, const int32_t *bsp, size_t xu, float *y, \
                                        size_t ys) {                                           \
        const __m256i low = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);                \
        /* (sc, sc) from a dword's sign-extended int16 pairs: word 0 or word 1 of each */      \
        const __m256i pick0 = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, \
                                               0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13); \
        const __m256i pick1 = _mm256_add_epi8(pick0, _mm256_set1_epi8(2));                      \
        __m256 acc[2][N];                                                                       \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) acc[h][t] = _mm256_setzero_ps(); \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *p = pan + (size_t)b * UNIT;                                          \
            for (int h = 0; h < 2; h++) {                                                       \
                const uint8_t *ph = p + 32 * h;                                                 \
                /* x's broadcasts made again for each half (as PANEL_RUNS's) */                \
                const int8_t *xh = xq;                                                          \
                __asm__("" : "+r"(xh));                                                         \
                __m256i line[4], mine[4];                                                       \
                ISA(scales_##TYPE)(ph, line, mine);                                             \
                __m256i is[N];                                                                  \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) is[t] = _mm256_setzero_si256(); \
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                           \
                    const __m256i v = MOFF ? mine[i] : line[i];                                 \
                    const __m256i e02 = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);          \
                    const __m256i e13 = _mm256_srai_epi16(v, 8);                                \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                       \
                        const int32_t *s = bsp + (size_t)t * xu + (size_t)b * 2 * PANEL_SUMS + 2 * i; \
                        is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(e02, _mm256_set1_epi32(s[0]))); \
                        is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(e13, _mm256_set1_epi32(s[1]))); \
                    }                                                                           \
                }                                                                               \
                __m256i ms[N];                                                                  \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                           \
                    ms[t] = is[t];                                                              \
                    is[t] = MOFF ? _mm256_setzero_si256()                                       \
                                 : _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(is[t], SHIFT)); \
                }                                                                               \
                for (int n = 0; n < 2; n++)                                                     \
                    _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++)                         \
                        _Pragma("GCC unroll 2") for (int f = 0; f < 2; f++) { /* half-run j */ \
                            const int j = 8 * n + 2 * m + f;                                    \
                            PANEL_PREFETCH_PART(p, UNIT, 16 * h + j, 32);                      \
                            const uint8_t *pj = ph; /* (as the AVX-512 form's) */              \
                            __asm__("" : "+r"(pj));                                             \
                            const __m256i e = j % 2 ? _mm256_srai_epi16(line[j / 4], 8)         \
                                                    : _mm256_srai_epi16(_mm256_slli_epi16(line[j / 4], 8), 8); \
                            const __m256i sc = _mm256_shuffle_epi8(e, j % 4 >= 2 ? pick1 : pick0); \
                            const int8_t *xc = PANEL_X(xh, N, 0, b * 256 + 128 * n + 32 * m);   \
                            _Pragma("GCC unroll 2") for (int g0 = 4 * f; g0 < 4 * f + 4; g0 += GROUP) { \
                                __m256i c[GROUP];                                               \
                                _Pragma("GCC unroll 4") for (int g = 0; g < GROUP; g++)         \
                                    c[g] = ISA(codes_##TYPE)(pj, n, m, g0 + g, low, top);       \
                                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {           \
                                    __m256i s16 = _mm256_setzero_si256();                       \
                                    _Pragma("GCC unroll 4") for (int g = 0; g < GROUP; g++)     \
                                        s16 = PANEL_DOT16(s16, c[g], ISA(panel_bcast)(PANEL_X(xc, N, t, 4 * (g0 + g)))); \
                                    is[t] = PANEL_WIDEN(is[t], s16, sc);                        \
                                }                                                               \
                            }                                                                   \
                        }                                                                       \
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + DOFF + 16 * h))); \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                           \
                    const __m256 x = _mm256_set1_ps(dx[(size_t)t * xu + b]);                    \
                    acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(d, x), acc[h][t]); \
                    if (MOFF) {                                                                 \
                        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + MOFF + 16 * h))); \
                        acc[h][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms[t]), _mm256_mul_ps(dm, x), acc[h][t]); \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) _mm256_storeu_ps(y + t * ys + 8 * h, acc[h][t]); \
    }
PANEL_TILES(PANEL_BY16_N, q6k, 3360, 5, 3328, 4 - 2 * PANEL_INT16, 0)
PANEL_TILES(PANEL_BY16_N, q3k, 1760, 2, 1728, 4, 0)
PANEL_TILES(PANEL_BY16_N, q2k, 1344, 0, 1280, 4, 1312)
#undef PANEL_BY16_N

/* IQ4_XS as the AVX-512 form (its layout, integers and f32 steps: the same bits), a
 * block's halves one after the other: a quad's product is IQ4_NL's (the levels'
 * magnitudes by x given each level's sign), widened by vpmaddwd with the run's scale as
 * an int16 pair (sc, sc): 2 x 127 x 127 x 32 a lane, exact. */
static INLINE __m256i ISA(iq4xs_scale)(__m256i sl, __m256i sh, int j) {
    const __m256i lo4 = _mm256_and_si256(_mm256_srli_epi32(sl, 4 * j), _mm256_set1_epi32(15));
    const __m256i hi2 = _mm256_and_si256(_mm256_srli_epi32(sh, 2 * j), _mm256_set1_epi32(3));
    const __m256i s = _mm256_sub_epi32(_mm256_or_si256(lo4, _mm256_slli_epi32(hi2, 4)), _mm256_set1_epi32(32));
    return _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(s, 16));
}

#define PANEL_IQ4XS_N(N, ...)                                                                      \
    static void ISA(panel_iq4xs_##N)(const uint8_t *pan, int nb, const int8_t *xq,            \
                                     const float *dx, const int32_t *bsp, size_t xu, float *y, \
                                     size_t ys) {                                              \
        (void)bsp;                                                                              \
        const ISA(panel_consts) k = ISA(panel_consts_make)();                                   \
        const __m256i lv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_LEVEL)); \
        const __m256i av = _mm256_abs_epi8(lv);                                                 \
        __m256 acc[2][N];                                                                       \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) acc[h][t] = _mm256_setzero_ps(); \
        for (int b = 0; b < nb; b++) {                                                          \
            const uint8_t *p = pan + (size_t)b * 2176;                                          \
            for (int h = 0; h < 2; h++) {                                                       \
                const __m256i sl = _mm256_loadu_si256((const __m256i *)(p + 64 + 32 * h));      \
                const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * h))); \
                const int8_t *xh = xq; /* (as PANEL_RUNS's) */                                  \
                __asm__("" : "+r"(xh));                                                         \
                __m256i is[N];                                                                  \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) is[t] = _mm256_setzero_si256(); \
                for (int j = 0; j < 8; j++) {                                                   \
                    PANEL_PREFETCH_PART(p, 2176, 8 * h + j, 16);                                   \
                    const int8_t *xr = PANEL_X(xh, N, 0, 256 * (size_t)b + 32 * j);            \
                    const __m256i sc = ISA(iq4xs_scale)(sl, sh, j);                             \
                    __m256i a[N];                                                               \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) a[t] = _mm256_setzero_si256(); \
                    _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {                       \
                        __m256i lo, hi;                                                         \
                        ISA(codes_nibbles)(p + 32 * h + 128 + (4 * j + g) * 64, &k, &lo, &hi);  \
                        const __m256i sl8 = _mm256_shuffle_epi8(lv, lo), al = _mm256_shuffle_epi8(av, lo); \
                        const __m256i sh8 = _mm256_shuffle_epi8(lv, hi), ah = _mm256_shuffle_epi8(av, hi); \
                        _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                   \
                            a[t] = PANEL_DOT_SCALED(a[t], al, _mm256_sign_epi8(ISA(panel_bcast)(PANEL_X(xr, N, t, 4 * g)), sl8), sc); \
                            a[t] = PANEL_DOT_SCALED(a[t], ah, _mm256_sign_epi8(ISA(panel_bcast)(PANEL_X(xr, N, t, 16 + 4 * g)), sh8), sc); \
                        }                                                                       \
                    }                                                                           \
                    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) is[t] = PANEL_RUN_SCALED(is[t], a[t], sc); \
                }                                                                               \
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h))); \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) {                           \
                    const __m256 x = _mm256_set1_ps(dx[(size_t)t * xu + b]);                    \
                    acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(d, x), acc[h][t]); \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int h = 0; h < 2; h++)                                                             \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++) _mm256_storeu_ps(y + t * ys + 8 * h, acc[h][t]); \
    }
PANEL_TILES(PANEL_IQ4XS_N, )
#undef PANEL_IQ4XS_N

#endif

PANEL_TILES(PANEL_ROWS_N, q4k, 2304, 0)
PANEL_TILES(PANEL_ROWS_N, q5k, 2816, 1)
#undef PANEL_INT16
#undef PANEL_DOT16
#undef PANEL_WIDEN
#undef PANEL_WIDEN1
#undef PANEL_DOT_SCALED
#undef PANEL_RUN_SCALED

/* Whether panel_rows takes W's type qt (its panels' type, native.c panel_base): every
 * panel type on every x86 variant. Q5_K, Q6_K and Q8_0 came into the ymm variants with
 * PANEL_PREFETCH_PART: with the burst it replaced, their panels read a decode row 1.1-1.5x
 * slower than the file order (docs/performance.md, sessions 19-20). */
static int ISA(panel_serves)(int qt) {
    return qt == QT_Q8_0 || qt == QT_Q4_K || qt == QT_Q5_K || qt == QT_Q6_K || qt == QT_Q3_K || qt == QT_Q2_K ||
           qt == QT_Q4_0 || qt == QT_Q5_0 || qt == QT_Q4_1 || qt == QT_IQ4_NL || qt == QT_IQ4_XS;
}

/* y[t, r] = x[t] . W[r] for the rows of panels [p0, p1) of W (type qt, in panels; rb: a
 * row's bytes, so a panel is 16 rb), every t < T: x's rounded rows q in tiles (panel_tile:
 * 8 rows, then 4, 2, 1 for the rest; tile t0's n rows from q + t0 cols, interleaved as
 * PANEL_X reads them), dx per row and block (nb apart), bsp per row and block (native.c
 * panel_sums); each panel read once per tile. */
static void ISA(panel_rows)(int qt, const uint8_t *w, size_t rb, size_t p0, size_t p1,
                            const int8_t *q, const float *dx, const int32_t *bsp, int T, int cols,
                            float *y, size_t ys) {
    const size_t xu = (size_t)cols / 32; /* a row's dx and sums: at most one per 32 columns */
    for (size_t P = p0; P < p1; P++) {
        const uint8_t *pan = w + P * 16 * rb;
        for (int t0 = 0, n; t0 < T; t0 += n) {
            n = panel_tile(T - t0);
            const int8_t *xq = q + (size_t)t0 * cols;
            const float *d = dx + (size_t)t0 * xu;
            const int32_t *s = bsp + (size_t)t0 * xu;
            float *yy = y + (size_t)t0 * ys + 16 * P;
#define PANEL_CALL(TYPE, NB)                                                                   \
    if (n == 1) ISA(panel_##TYPE##_1)(pan, NB, xq, d, s, xu, yy, ys);                          \
    else if (n == 2) ISA(panel_##TYPE##_2)(pan, NB, xq, d, s, xu, yy, ys);                     \
    else if (n == 4) ISA(panel_##TYPE##_4)(pan, NB, xq, d, s, xu, yy, ys);                     \
    else ISA(panel_##TYPE##_8)(pan, NB, xq, d, s, xu, yy, ys);
            if (qt == QT_Q4_0) { PANEL_CALL(q40, cols / 64) } else
            if (qt == QT_Q5_0) { PANEL_CALL(q50, cols / 64) } else
            if (qt == QT_Q4_1) { PANEL_CALL(q41, cols / 64) } else
            if (qt == QT_IQ4_NL) { PANEL_CALL(iq4nl, cols / 64) } else
            if (qt == QT_IQ4_XS) { PANEL_CALL(iq4xs, cols / 256) } else
            if (qt == QT_Q8_0) { PANEL_CALL(q80, cols / 64) } else
            if (qt == QT_Q6_K) { PANEL_CALL(q6k, cols / 256) } else
            if (qt == QT_Q3_K) { PANEL_CALL(q3k, cols / 256) } else
            if (qt == QT_Q2_K) { PANEL_CALL(q2k, cols / 256) } else
            if (qt == QT_Q5_K) { PANEL_CALL(q5k, cols / 256) } else
            { PANEL_CALL(q4k, cols / 256) }
#undef PANEL_CALL
        }
    }
}

#pragma GCC pop_options

#undef PANEL_ROWS_N
#undef PANEL_SCALES
#undef PANEL_X
#undef PANEL_TILES
#undef PANEL_PREFETCH
