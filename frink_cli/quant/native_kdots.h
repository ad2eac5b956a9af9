/* The K-quants' 8-bit-activation dots a whole block at a time (Q4_K, Q5_K, Q6_K):
 * included by native_isa.h after native_int8.h in the x86 regions (AVX2, AVX-512), which
 * hand these types to it.
 *
 * Why a block at a time: x is rounded per 256 columns for these types (Q8_K: one scale dx
 * per block), and each run's scale is a small integer (6 bits; Q6_K's are signed 8 bits
 * per 16 columns), so a block's whole sum is exact in int32:
 *
 *     Q4_K, Q5_K:  sum_l w_l x_l = d dx sum_j sc_j S_j  -  dmin sum_j m_j (dx Q_j)
 *     Q6_K:        sum_l w_l x_l = d dx sum_k sc_k S_k  -  32 d sum_k sc_k (dx Q_k)
 *
 * with S the code * q products of run j (32 columns) or half-run k (16), Q the sums of q
 * (native.c's dsum32 / dsum, already times dx). The run's byte products (vpmaddubsw) are
 * multiplied by the run's scale in the same instruction that widens them to int32
 * (vpmaddwd), summed as integers over the block, and turned into floats once per block:
 * one multiply-add per block and row of x where the per-run form (native_int8.h) paid a
 * conversion, a broadcast and a multiply-add per run. The mins' terms are one vector
 * multiply-add of the block's 8 (16) float scales by x's sums. Codes are unpacked and
 * scales decoded once per block for every tile of up to KD_TILE rows of x.
 *
 * Every row of x gets its own accumulators, made in the same order (blocks in row order;
 * in a block, runs in order, integers exactly) however many rows share the call: a row's
 * product is the same bits alone or in any batch or chunk, on any thread count.
 */

/* Rows of x sharing one unpacking of a block (a tile: ROW_TILE, native.c). */
#define KD_TILE ROW_TILE

static INLINE float ISA(kd_hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Q4_K / Q5_K: the 12 bytes of 6-bit scales and mins (ggml's get_scale_min_k4 for k = 0..7)
 * as 8 scale bytes then 8 min bytes, four at a time with 32-bit masks. */
static INLINE void ISA(kd_scales_k)(const uint8_t *s, uint8_t out[16]) {
    uint32_t a[3], o[4];
    memcpy(a, s, 12);
    o[0] = a[0] & 0x3f3f3f3fu;                                              /* sc 0-3 */
    o[1] = (a[2] & 0x0f0f0f0fu) | (((a[0] >> 6) & 0x03030303u) << 4);       /* sc 4-7 */
    o[2] = a[1] & 0x3f3f3f3fu;                                              /* m 0-3 */
    o[3] = ((a[2] >> 4) & 0x0f0f0f0fu) | (((a[1] >> 6) & 0x03030303u) << 4); /* m 4-7 */
    memcpy(out, o, 16);
}

/* Broadcast word w of each 128-bit half of v across that half (hi: the word for the upper
 * half, lo: the lower's). */
static INLINE __m256i ISA(kd_words)(__m256i v, int lo, int hi) {
    const __m256i pick = _mm256_setr_epi8(
        (char)(2 * lo), (char)(2 * lo + 1), (char)(2 * lo), (char)(2 * lo + 1), (char)(2 * lo),
        (char)(2 * lo + 1), (char)(2 * lo), (char)(2 * lo + 1), (char)(2 * lo), (char)(2 * lo + 1),
        (char)(2 * lo), (char)(2 * lo + 1), (char)(2 * lo), (char)(2 * lo + 1), (char)(2 * lo),
        (char)(2 * lo + 1), (char)(2 * hi), (char)(2 * hi + 1), (char)(2 * hi), (char)(2 * hi + 1),
        (char)(2 * hi), (char)(2 * hi + 1), (char)(2 * hi), (char)(2 * hi + 1), (char)(2 * hi),
        (char)(2 * hi + 1), (char)(2 * hi), (char)(2 * hi + 1), (char)(2 * hi), (char)(2 * hi + 1),
        (char)(2 * hi), (char)(2 * hi + 1));
    return _mm256_shuffle_epi8(v, pick);
}

/* One unpacked block: each run's 32 codes (unsigned, < 64), each run's int16 scales as
 * vpmaddwd takes them (the first 16 columns' in the lower half), the float factor of the
 * integer sum (d or d * 1, times dx per row later) and the mins' float scales against x's
 * sums (per 32 columns: 8; Q6_K per 16: 16). */
typedef struct {
    __m256i codes[8], sc[8];
    __m256 mins[2];
    float d;
} ISA(kd_block);

static INLINE void ISA(kd_unpack_q4_k)(const uint8_t *p, ISA(kd_block) *k) {
    uint8_t s[16];
    ISA(kd_scales_k)(p + 4, s);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)s)));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + 8))));
    k->d = HALF(p), k->mins[0] = _mm256_mul_ps(m, _mm256_set1_ps(HALF(p + 2)));
    const __m256i low = _mm256_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
        k->codes[2 * c] = _mm256_and_si256(q, low);
        k->codes[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
    }
    for (int j = 0; j < 8; j++) k->sc[j] = ISA(kd_words)(sc, j, j);
}

static INLINE void ISA(kd_unpack_q5_k)(const uint8_t *p, ISA(kd_block) *k) {
    ISA(kd_unpack_q4_k)(p, k); /* same head; its codes read from p + 16 are replaced below */
    const __m256i low = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(p + 48 + 32 * c));
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one);
        k->codes[2 * c] = _mm256_or_si256(_mm256_and_si256(q, low), _mm256_slli_epi16(h0, 4));
        k->codes[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                                              _mm256_slli_epi16(h1, 4));
    }
}

static INLINE void ISA(kd_unpack_q6_k)(const uint8_t *p, ISA(kd_block) *k) {
    const __m128i s8 = _mm_loadu_si128((const __m128i *)(p + 192));
    const __m256i lo8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s8));
    const __m256i hi8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(s8, 8)));
    const float d = HALF(p + 208);
    const __m256 d32 = _mm256_set1_ps(32.0f * d);
    k->d = d;
    k->mins[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8)), d32);
    k->mins[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8))), d32);
    const __m256i low = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
    for (int j = 0; j < 8; j++) {
        const int hh = j / 4, r = j % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(p + 64 * hh + 32 * (r % 2)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * hh));
        const __m256i l4 = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (r / 2)), low);
        const __m256i h2 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), three);
        k->codes[j] = _mm256_or_si256(l4, _mm256_slli_epi16(h2, 4));
        k->sc[j] = ISA(kd_words)(j < 4 ? lo8 : hi8, 2 * (j % 4), 2 * (j % 4) + 1);
    }
}

/* Block b (unpacked in k) times the N rows xs of a tile of x, into each row's sums acc[t]
 * and off[t]: run after run, each run's codes and scales held while every row's byte
 * products are made and added into that row's int32 sums (exact, so their order is free),
 * then per row one conversion and one multiply-add by d * dx, and the mins' term. */
static INLINE void ISA(kd_tile_block)(const ISA(kd_block) *k, const q8_row *const *xs, int N,
                                      int b, int NM, __m256 *acc, __m256 *off) {
    __m256i is[KD_TILE];
    for (int t = 0; t < N; t++) is[t] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const __m256i c = k->codes[j], s = k->sc[j];
        for (int t = 0; t < N; t++) {
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(xs[t]->q + 256 * (size_t)b + 32 * j));
            is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(_mm256_maddubs_epi16(c, xq), s));
        }
    }
    for (int t = 0; t < N; t++) {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_set1_ps(k->d * xs[t]->d[8 * b]), acc[t]);
        if (NM == 1)
            off[t] = _mm256_fmadd_ps(k->mins[0], _mm256_loadu_ps(xs[t]->dsum32 + 8 * b), off[t]);
        else {
            off[t] = _mm256_fmadd_ps(k->mins[0], _mm256_loadu_ps(xs[t]->dsum + 16 * b), off[t]);
            off[t] = _mm256_fmadd_ps(k->mins[1], _mm256_loadu_ps(xs[t]->dsum + 16 * b + 8), off[t]);
        }
    }
}

/* Row `row` of W (`blocks` blocks of NBYTES, read by UNPACK) times the N rows xs of x (N a
 * constant: the loops unroll, the sums stay in registers where they fit), into y[t]. */
#define KD_TILE_ROW(UNPACK, NBYTES, NM, N)                                                     \
    {                                                                                          \
        __m256 acc[N], off[N];                                                                 \
        for (int t = 0; t < N; t++) acc[t] = off[t] = _mm256_setzero_ps();                     \
        for (int b = 0; b < blocks; b++) {                                                     \
            const uint8_t *p = row + (size_t)b * NBYTES;                                       \
            for (int l = 0; l < NBYTES; l += 64) __builtin_prefetch(p + PREFETCH_AHEAD + l);   \
            ISA(kd_block) k;                                                                   \
            ISA(UNPACK)(p, &k);                                                                \
            ISA(kd_tile_block)(&k, xs, N, b, NM, acc, off);                                    \
        }                                                                                      \
        for (int t = 0; t < N; t++) yt[t] = ISA(kd_hsum)(acc[t]) - ISA(kd_hsum)(off[t]);       \
    }

/* y[t, r] = x[t] . W[r] for r in [r0, r1), every t < T (y's rows ys apart), for one of the
 * three types (UNPACK its block reader, NM its mins' vectors: 1 per 32 columns, 2 per 16):
 * the rows of x in tiles of up to KD_TILE, each tile's block unpacked once. A tile of n
 * rows runs as 1, 4 or 8 (a short one repeats its last row, whose sums are dropped). */
#define KD_ROWS(UNPACK, NBYTES, NM)                                                            \
    for (size_t r = r0; r < r1; r++) {                                                         \
        const uint8_t *row = w + r * rb;                                                       \
        for (int t0 = 0; t0 < T; t0 += KD_TILE) {                                              \
            const int n = T - t0 < KD_TILE ? T - t0 : KD_TILE;                                 \
            const q8_row *xs[KD_TILE];                                                         \
            float yt[KD_TILE];                                                                 \
            for (int t = 0; t < KD_TILE; t++) xs[t] = x + (t < n ? t0 + t : T - 1);            \
            if (n == 1) KD_TILE_ROW(UNPACK, NBYTES, NM, 1)                                     \
            else if (n <= 4) KD_TILE_ROW(UNPACK, NBYTES, NM, 4)                                \
            else KD_TILE_ROW(UNPACK, NBYTES, NM, KD_TILE)                                      \
            for (int t = 0; t < n; t++) y[(size_t)(t0 + t) * ys + r] = yt[t];                  \
        }                                                                                      \
    }

/* Whether kd_rows takes type qt. */
static INLINE int ISA(kd_serves)(int qt) { return qt == QT_Q4_K || qt == QT_Q5_K || qt == QT_Q6_K; }

static void ISA(kd_rows)(int qt, const uint8_t *w, size_t rb, size_t r0, size_t r1,
                         const q8_row *x, int T, int cols, float *y, size_t ys) {
    const int blocks = cols / 256;
    if (qt == QT_Q4_K) KD_ROWS(kd_unpack_q4_k, 144, 1)
    else if (qt == QT_Q5_K) KD_ROWS(kd_unpack_q5_k, 176, 1)
    else if (qt == QT_Q6_K) KD_ROWS(kd_unpack_q6_k, 210, 2)
}

#undef KD_ROWS
#undef KD_TILE_ROW
#undef KD_TILE
