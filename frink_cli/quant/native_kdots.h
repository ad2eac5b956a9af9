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
 * scales decoded once per block for every KD_GROUP rows of x.
 *
 * Every row of x gets its own accumulators, made in the same order (blocks in row order;
 * in a block, runs in order, integers exactly) however many rows share the call: a row's
 * product is the same bits alone or in any batch or chunk, on any thread count.
 */

/* Rows of x sharing one unpacking of a block (a group short of them repeats its last
 * row, whose sums are dropped: a whole group's steps unrolled, its sums in registers). */
#define KD_GROUP 4

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

/* The block's int32 sums against one row of x's codes (q: the block's 256). */
static INLINE __m256i ISA(kd_isum)(const ISA(kd_block) *k, const int8_t *q) {
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < 8; j++) {
        const __m256i xq = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(k->codes[j], xq), k->sc[j]);
        s[j & 1] = _mm256_add_epi32(s[j & 1], p);
    }
    return _mm256_add_epi32(s[0], s[1]);
}

/* Block b (unpacked in k) times row xt of x, into that row's sums acc and off. */
#define KD_ROW_BLOCK(xt, acc, off, NM)                                                         \
    {                                                                                          \
        const __m256i is_ = ISA(kd_isum)(&k, (xt)->q + 256 * (size_t)b);                       \
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is_), _mm256_set1_ps(k.d * (xt)->d[8 * b]), acc); \
        if (NM == 1)                                                                           \
            off = _mm256_fmadd_ps(k.mins[0], _mm256_loadu_ps((xt)->dsum32 + 8 * b), off);       \
        else {                                                                                 \
            off = _mm256_fmadd_ps(k.mins[0], _mm256_loadu_ps((xt)->dsum + 16 * b), off);        \
            off = _mm256_fmadd_ps(k.mins[1], _mm256_loadu_ps((xt)->dsum + 16 * b + 8), off);    \
        }                                                                                      \
    }

/* y[t, r] = x[t] . W[r] for r in [r0, r1), every t < T (y's rows ys apart), for one of the
 * three types (UNPACK its block reader, NM its mins' vectors: 1 per 32 columns, 2 per 16). */
#define KD_ROWS(UNPACK, NBYTES, NM)                                                            \
    for (size_t r = r0; r < r1; r++) {                                                         \
        const uint8_t *row = w + r * rb;                                                       \
        if (T == 1) { /* the same steps as a group's, with the sums kept in registers */       \
            __m256 acc = _mm256_setzero_ps(), off = acc;                                       \
            for (int b = 0; b < blocks; b++) {                                                 \
                const uint8_t *p = row + (size_t)b * NBYTES;                                   \
                for (int l = 0; l < NBYTES; l += 64) __builtin_prefetch(p + PREFETCH_AHEAD + l); \
                ISA(kd_block) k;                                                               \
                ISA(UNPACK)(p, &k);                                                            \
                KD_ROW_BLOCK(x, acc, off, NM)                                                  \
            }                                                                                  \
            y[r] = ISA(kd_hsum)(acc) - ISA(kd_hsum)(off);                                      \
            continue;                                                                          \
        }                                                                                      \
        for (int t0 = 0; t0 < T; t0 += KD_GROUP) {                                             \
            const int n = T - t0 < KD_GROUP ? T - t0 : KD_GROUP;                               \
            const q8_row *xs[KD_GROUP];                                                        \
            __m256 acc[KD_GROUP], off[KD_GROUP];                                               \
            for (int t = 0; t < KD_GROUP; t++) {                                               \
                xs[t] = x + (t < n ? t0 + t : T - 1);                                          \
                acc[t] = off[t] = _mm256_setzero_ps();                                         \
            }                                                                                  \
            for (int b = 0; b < blocks; b++) {                                                 \
                const uint8_t *p = row + (size_t)b * NBYTES;                                   \
                for (int l = 0; l < NBYTES; l += 64) __builtin_prefetch(p + PREFETCH_AHEAD + l); \
                ISA(kd_block) k;                                                               \
                ISA(UNPACK)(p, &k);                                                            \
                _Pragma("GCC unroll 4")                                                        \
                for (int t = 0; t < KD_GROUP; t++) KD_ROW_BLOCK(xs[t], acc[t], off[t], NM)      \
            }                                                                                  \
            for (int t = 0; t < n; t++)                                                        \
                y[(size_t)(t0 + t) * ys + r] = ISA(kd_hsum)(acc[t]) - ISA(kd_hsum)(off[t]);    \
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
#undef KD_ROW_BLOCK
#undef KD_GROUP
