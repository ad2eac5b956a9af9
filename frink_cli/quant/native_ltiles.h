/* The 8-bit-activation dots of the types with one scale per run of 32 (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, IQ4_NL, MXFP4, IQ4_XS): included by native_isa.h after native_int8.h in the
 * x86 regions (AVX2, AVX-512), which hand these types to it.
 *
 * Why: a run's sum is dx * (sc * S + k * Q) (native_int8.h), S its 32 code * q products,
 * exact in int32 and in f32 (|S| < 2^24). Kept as 8 lanes per run, as the per-run path
 * keeps it, each run costs each row of x a conversion, a broadcast scale and a
 * multiply-add. Here eight runs of a row of W are a group: their codes unpacked and their
 * scales (sc, k) gathered once per tile of rows of x (ROW_TILE, native.c); then per row of
 * x each run's byte products are summed to its S (integers: exact in any order) into lane
 * i of one vector, and one conversion and one multiply-add by sc * dx (the row's dx of the
 * eight runs, side by side in q8_row.d) serve the eight runs; the k terms are one more
 * multiply-add against the row's sums (q8_row.dsum32).
 *
 * A row's sums are made in the same order (groups in row order, one f32 multiply-add per
 * lane each, then the lanes summed as a tree) whatever other rows share the tile, so a
 * row's product is the same bits alone, in any tile, on any thread count.
 */

/* Lane i: the sum of the 8 int32 lanes of p[i]. */
static INLINE __m256i ISA(lt_reduce8)(const __m256i *p) {
    /* per 128-bit half: [p0, p1, p2, p3] of that half's 4 lanes, then p4..p7 */
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

/* m floats from p (m <= 8), zeros after them. */
static INLINE __m256 ISA(lt_load)(const float *p, int m) {
    if (m == 8) return _mm256_loadu_ps(p);
    float a[8] = {0};
    memcpy(a, p, sizeof(float) * (size_t)m);
    return _mm256_loadu_ps(a);
}

#define LT_EIGHT(a) a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]

/* Group g of a row's runs (M of them: 8, or fewer in the last group, whose missing runs'
 * codes and scales are zero and where x is not read past its row) times the N rows xs. */
#define LT_GROUP(HEAD, UNIT, NBYTES, N, M)                                                     \
    {                                                                                          \
        ISA(icodes) cd[8];                                                                     \
        float sc[8] = {0}, kk[8] = {0};                                                        \
        for (int i = 0; i < (M); i++) {                                                        \
            const int u = g + i, j = u % units;                                                \
            const uint8_t *p = row + (size_t)(u / units) * NBYTES;                             \
            if (j == 0) {                                                                      \
                __builtin_prefetch(p + PREFETCH_AHEAD);                                        \
                ISA(HEAD)(p, &h);                                                              \
            }                                                                                  \
            ISA(UNIT)(p, j, &h, &cd[i]);                                                       \
            sc[i] = cd[i].sc[0], kk[i] = cd[i].has_k ? cd[i].k[0] : 0.0f;                      \
        }                                                                                      \
        /* a whole group's scales built in registers (no store then wider load to stall) */ \
        const __m256 scv = (M) == 8 ? _mm256_setr_ps(LT_EIGHT(sc)) : _mm256_loadu_ps(sc);      \
        const __m256 kv = (M) == 8 ? _mm256_setr_ps(LT_EIGHT(kk)) : _mm256_loadu_ps(kk);       \
        for (int t = 0; t < N; t++) {                                                          \
            __m256i pr[8];                                                                     \
            for (int i = 0; i < 8; i++)                                                        \
                pr[i] = i < (M) ? ISA(unit_products)(&cd[i], xs[t]->q + 32 * (g + i))          \
                                : _mm256_setzero_si256();                                      \
            const __m256 s = _mm256_cvtepi32_ps(ISA(lt_reduce8)(pr));                          \
            acc[t] = _mm256_fmadd_ps(s, _mm256_mul_ps(scv, ISA(lt_load)(xs[t]->d + g, M)), acc[t]); \
            if (cd[0].has_k)                                                                   \
                off[t] = _mm256_fmadd_ps(kv, ISA(lt_load)(xs[t]->dsum32 + g, M), off[t]);      \
        }                                                                                      \
    }

/* Row `row` of W times the N rows xs of a tile (N a constant, so the loops unroll): into
 * yt[t], its runs eight at a time. */
#define LT_TILE_ROW(HEAD, UNIT, ELEMS, NBYTES, N)                                              \
    {                                                                                          \
        __m256 acc[N], off[N];                                                                 \
        for (int t = 0; t < N; t++) acc[t] = off[t] = _mm256_setzero_ps();                     \
        block_head h;                                                                          \
        int g = 0;                                                                             \
        for (; g + 8 <= nu; g += 8) LT_GROUP(HEAD, UNIT, NBYTES, N, 8)                         \
        if (g < nu) LT_GROUP(HEAD, UNIT, NBYTES, N, nu - g)                                    \
        for (int t = 0; t < N; t++) yt[t] = ISA(kd_hsum)(acc[t]) + ISA(kd_hsum)(off[t]);       \
    }

/* y[t, r] = x[t] . W[r] for r in [r0, r1), every t < T (y's rows ys apart): the rows of x
 * in tiles of ROW_TILE, a short tile run as 1, 4 or 8 rows (its missing rows repeat the
 * last row, and their sums are dropped). */
#define LT_BODY(HEAD, UNIT, ELEMS, NBYTES)                                                     \
    for (size_t r = r0; r < r1; r++) {                                                         \
        const uint8_t *row = w + r * rb;                                                       \
        const int nu = blocks * units;                                                         \
        for (int t0 = 0; t0 < T; t0 += ROW_TILE) {                                             \
            const int n = T - t0 < ROW_TILE ? T - t0 : ROW_TILE;                               \
            const q8_row *xs[ROW_TILE];                                                        \
            float yt[ROW_TILE];                                                                \
            for (int t = 0; t < ROW_TILE; t++) xs[t] = x + (t < n ? t0 + t : T - 1);           \
            if (n == 1) LT_TILE_ROW(HEAD, UNIT, ELEMS, NBYTES, 1)                              \
            else if (n <= 4) LT_TILE_ROW(HEAD, UNIT, ELEMS, NBYTES, 4)                         \
            else LT_TILE_ROW(HEAD, UNIT, ELEMS, NBYTES, ROW_TILE)                              \
            for (int t = 0; t < n; t++) y[(size_t)(t0 + t) * ys + r] = yt[t];                  \
        }                                                                                      \
    }

/* The types this path takes (a subset of I8_TYPES: one scale and k per run). */
#define LT_TYPES(X, BODY)                                                                      \
    X(QT_Q4_0, head_q4_0, q4_0, 32, 18, BODY)                                                  \
    X(QT_Q4_1, head_q4_1, q4_1, 32, 20, BODY)                                                  \
    X(QT_Q5_0, head_q5_0, q5_0, 32, 22, BODY)                                                  \
    X(QT_Q5_1, head_q5_1, q5_1, 32, 24, BODY)                                                  \
    X(QT_Q8_0, head_q8_0, q8_0, 32, 34, BODY)                                                  \
    X(QT_IQ4_NL, head_iq4_nl, iq4_nl, 32, 18, BODY)                                            \
    X(QT_IQ4_XS, head_iq4_xs, iq4_xs, 256, 136, BODY)                                          \
    X(QT_MXFP4, head_mxfp4, mxfp4, 32, 17, BODY)

/* Whether lt_rows takes type qt (1) or leaves it to the per-run path (0). */
static INLINE int ISA(lt_rows)(int qt, const uint8_t *w, size_t rb, size_t r0, size_t r1,
                               const q8_row *x, int T, int cols, float *y, size_t ys) {
    switch (qt) {
    LT_TYPES(I8_CASE, LT_BODY)
    default: return 0;
    }
    return 1;
}

#undef LT_TYPES
#undef LT_BODY
#undef LT_TILE_ROW
#undef LT_GROUP
#undef LT_EIGHT
