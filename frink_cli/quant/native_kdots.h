/* The K-quants' 8-bit-activation dots a whole block at a time (Q2_K .. Q6_K):
 * included by native_isa.h after native_int8.h in the x86 regions (AVX2, AVX-512), which
 * hand these types to it.
 *
 * Why a block at a time: x is rounded per 256 columns for these types (Q8_K: one scale dx
 * per block), and each run's scale is a small integer (6 bits; Q6_K's are signed 8 bits
 * per 16 columns), so a block's whole sum is exact in int32:
 *
 *     Q4_K, Q5_K:  sum_l w_l x_l = d dx sum_j sc_j S_j  -  dmin sum_j m_j (dx Q_j)
 *     Q6_K:        sum_l w_l x_l = d dx sum_k sc_k S_k  -  32 d sum_k sc_k (dx Q_k)
 *     Q3_K:        sum_l w_l x_l = d dx sum_k sc_k S_k  -  4 d sum_k sc_k (dx Q_k)
 *     Q2_K:        sum_l w_l x_l = d dx sum_k sc_k S_k  -  dmin sum_k m_k (dx Q_k)
 * (Q3_K's and Q2_K's scales, per 16 columns as Q6_K's, take Q6_K's order and groups; their
 * codes, 0..7 and 0..3, add as int16 with room to spare.)
 *
 * with S the code * q products of run j (32 columns) or half-run k (16), Q the sums of q
 * (native.c's dsum32 / dsum, already times dx). The byte products (vpmaddubsw) of a group
 * of vectors whose int16 lanes share their scales are added as int16, multiplied by the
 * scales in the instruction that widens them to int32 (vpmaddwd), summed as integers over
 * the block, and turned into floats once per block: 8 byte-product and 2 (Q6_K: 4) scale
 * multiplies per block and row of x, where one vpmaddwd per run paid 8. For that, W's codes
 * and x's q are both read in one order of a block's columns (kd_order below): x is put in
 * it once per call (tile_x), W's codes on unpacking, so W's bytes stay the file's. The
 * mins' terms are one vector multiply-add of the block's 8 (16) float scales by x's sums.
 * Codes are unpacked and scales decoded once per block for every tile of up to KD_TILE
 * rows of x, and the tiles are laid out by tile_x (below; the legacy types' runs too) so
 * that every row of a tile sits at a constant offset from the tile's: no pointer per row.
 * With VNNI a Q4_K group's products are summed by vpdpbusd (kd_isum). The loops take the
 * tiles outer and a work item's rows of W inner (a tile of x stays in L1 or L2 for them).
 * The instruction count per block and row of x, not the multiplies, bounded the earlier
 * build (docs/performance.md).
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

/* The codes' offset this ISA folds into x's lane sums (native.c x_zero): with VNNI the
 * dot instruction starts from them for free; AVX2 would pay an add per run and row of x,
 * more than the k term it saves in a tile (measured: 1.05x the time for 8 rows). */
static INLINE int ISA(i8_zero)(int qt) {
#ifdef KD_DPBUSD
    return x_zero(qt);
#else
    (void)qt;
    return 0;
#endif
}

/* Whether kd_rows takes type qt. */
static INLINE int ISA(kd_serves)(int qt) {
    return qt == QT_Q4_K || qt == QT_Q5_K || qt == QT_Q6_K || qt == QT_Q3_K || qt == QT_Q2_K;
}

/* Whether type qt has a scale per 16 columns (kd_order's Q6_K order, 16 sums of x a block). */
static INLINE int ISA(kd_by16_type)(int qt) { return qt == QT_Q6_K || qt == QT_Q3_K || qt == QT_Q2_K; }

/* The order of a block's 256 bytes (codes of W, or x's rounded q) that the sums below read:
 * eight vectors of 32, grouped so that each int16 lane of a vpmaddubsw product holds
 * columns of one scale in every vector of a group, and a group's byte products can be
 * added as int16 before one vpmaddwd by the scales (no overflow: Q4_K 4 x 2 x 15 x 127,
 * Q5_K 4 x 2 x 31 x 127, Q6_K 2 x 2 x 63 x 127 are all under 2^15).
 *  Q4_K, Q5_K (scale per run of 32): runs 0, 2, 4, 6 transposed as 4 x 4 dwords in each
 *    128-bit half (vector m, lane 4h + c: run 2c, columns 4(4h + m) .. + 3), then runs 1,
 *    3, 5, 7 the same way: two groups of four, each int32 lane one run's.
 *  Q6_K (scale per 16): runs 2p and 2p + 1 interleaved by 8 columns (vpunpck[lh]qdq): four
 *    groups of two, each 64-bit lane one half-run's.
 * tile_x puts each row of x in this order once per call; the unpackers make W's codes in
 * it from the file's bytes, so W is read as the file holds it. */
static INLINE void ISA(kd_t4)(const __m256i in[4], __m256i out[4]) {
    const __m256i a = _mm256_unpacklo_epi32(in[0], in[1]), b = _mm256_unpackhi_epi32(in[0], in[1]);
    const __m256i c = _mm256_unpacklo_epi32(in[2], in[3]), d = _mm256_unpackhi_epi32(in[2], in[3]);
    out[0] = _mm256_unpacklo_epi64(a, c), out[1] = _mm256_unpackhi_epi64(a, c);
    out[2] = _mm256_unpacklo_epi64(b, d), out[3] = _mm256_unpackhi_epi64(b, d);
}

/* Runs r (the natural order: v[r] run r's 32 columns) into the order above. */
static INLINE void ISA(kd_order)(int q6, const __m256i v[8], __m256i out[8]) {
    if (q6) {
        for (int p = 0; p < 4; p++) {
            out[2 * p] = _mm256_unpacklo_epi64(v[2 * p], v[2 * p + 1]);
            out[2 * p + 1] = _mm256_unpackhi_epi64(v[2 * p], v[2 * p + 1]);
        }
        return;
    }
    const __m256i even[4] = {v[0], v[2], v[4], v[6]}, odd[4] = {v[1], v[3], v[5], v[7]};
    ISA(kd_t4)(even, out);
    ISA(kd_t4)(odd, out + 4);
}

/* Rows a tile of n rows of x is laid out as (the last one padded by repeating its last row;
 * the sums of padded rows are dropped): 1, 2, 4 or KD_TILE. (Two rows are a decode step of
 * two sequences, or a draft model catching up on a kept draft and the target's token.) */
static INLINE int ISA(kd_tile_rows)(int n) { return n <= 2 ? n : n <= 4 ? 4 : KD_TILE; }

/* dd[t] = f * xd[t] for the N rows of a tile (one vector multiply where N is 4 or 8: the same
 * products as N scalar ones). */
static INLINE void ISA(tile_scales)(float f, const float *xd, int N, float *dd) {
    if (N == 8) _mm256_storeu_ps(dd, _mm256_mul_ps(_mm256_set1_ps(f), _mm256_loadu_ps(xd)));
    else if (N == 4) _mm_storeu_ps(dd, _mm_mul_ps(_mm_set1_ps(f), _mm_loadu_ps(xd)));
    else for (int t = 0; t < N; t++) dd[t] = f * xd[t];
}

/* The rounded rows x into the tiles the 8-bit dots read (native.c's x_tile_unit, tiles_bytes),
 * in buf: each tile of up to KD_TILE rows from row t0, NT = kd_tile_rows rows, unit after
 * unit (a unit: a block of 256 for the K-quants, a run of 32 for the others), so that a
 * unit's rows sit at constant offsets: unit i of the tile's row t has its q at
 * q + (i NT + t) UNIT (a K-quant block's in kd_order's order), its dx at d + i NT + t and its
 * SW sums of q times dx at s + (i NT + t) SW (Q4_K, Q5_K: 8 per 32 columns; Q6_K: 16 per
 * 16; a run: 1; a run of Q4_0, Q5_0: 8 int32 lane sums instead where i8_zero folds them), where
 * q, d, s are the tile's (t0 cols, t0 units, t0 units SW into their regions). Each row's
 * q8_row then points at its row in its tile (the dots read the tile's first). */
static void ISA(tile_x)(int qt, q8_row *x, int T, int cols, void *buf) {
    const int K = ISA(kd_serves)(qt), q6 = ISA(kd_by16_type)(qt);
    const int zero = ISA(i8_zero)(qt);
    const int UNIT = K ? 256 : 32, SW = q6 ? 16 : K || zero ? 8 : 1, units = cols / UNIT;
    float *dbase = buf, *sbase = dbase + (size_t)(T + KD_TILE) * units;
    int8_t *qbase = (int8_t *)(sbase + (size_t)(T + KD_TILE) * units * SW);
    for (int t0 = 0; t0 < T; t0 += KD_TILE) {
        const int n = T - t0 < KD_TILE ? T - t0 : KD_TILE, NT = ISA(kd_tile_rows)(n);
        int8_t *q = qbase + (size_t)t0 * cols;
        float *d = dbase + (size_t)t0 * units, *s = sbase + (size_t)t0 * units * SW;
        for (int t = 0; t < NT; t++) {
            const q8_row *src = x + t0 + (t < n ? t : n - 1);
            for (int i = 0; i < units; i++) {
                const size_t at = (size_t)i * NT + t;
                if (K) {
                    __m256i v[8], o[8];
                    for (int r = 0; r < 8; r++) v[r] = _mm256_loadu_si256((const __m256i *)(src->q + 256 * i + 32 * r));
                    ISA(kd_order)(q6, v, o);
                    for (int r = 0; r < 8; r++) _mm256_storeu_si256((__m256i *)(q + 256 * at + 32 * r), o[r]);
                } else
                    memcpy(q + 32 * at, src->q + 32 * i, 32);
                d[at] = src->d[UNIT / 32 * i];
                if (zero) { /* per 4 columns -zero times their q's sum (i8_zero) */
                    const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)(src->q + 32 * i)));
                    _mm256_storeu_si256((__m256i *)(s + SW * at), _mm256_madd_epi16(pairs, _mm256_set1_epi16((short)-zero)));
                } else
                    memcpy(s + SW * at, q6 ? src->dsum + 16 * i : src->dsum32 + SW * i, SW * sizeof(float));
            }
        }
        for (int t = 0; t < n; t++) x[t0 + t] = (q8_row){q + UNIT * t, d + t, s + SW * t, s + SW * t};
    }
}

/* One unpacked block: its codes in the order above (unsigned, < 64), each group's int16
 * scales as vpmaddwd takes them, the float factor of the integer sum (d, times dx per row
 * later) and the mins' float scales against x's sums (per 32 columns: 8; Q6_K per 16: 16). */
typedef struct {
    __m256i codes[8], sc[4]; /* sc: Q6_K's 4 groups; Q4_K's 2, then its 8 paired (kd_isum) */
    __m256 mins[2];
    float d;
} ISA(kd_block);

/* Words w0 (lanes 0-3), w1 (4-7) of v's lower half and w2, w3 of its upper half's, each
 * spread over the quarter of the result's half they name. */
static INLINE __m256i ISA(kd_words4)(__m256i v, int w0, int w1, int w2, int w3) {
#define KD_W(w) (char)(2 * (w)), (char)(2 * (w) + 1)
#define KD_W4(w) KD_W(w), KD_W(w), KD_W(w), KD_W(w)
    const __m256i pick = _mm256_setr_epi8(KD_W4(w0), KD_W4(w1), KD_W4(w2), KD_W4(w3));
#undef KD_W4
#undef KD_W
    return _mm256_shuffle_epi8(v, pick);
}

static INLINE void ISA(kd_unpack_q4_k)(const uint8_t *p, ISA(kd_block) *k) {
    uint8_t s[16];
    ISA(kd_scales_k)(p + 4, s);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)s)));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + 8))));
    k->d = HALF(p), k->mins[0] = _mm256_mul_ps(m, _mm256_set1_ps(HALF(p + 2)));
    /* the int32 lane 4h + c of group f holds run 2c + f */
    const __m256i pick_even = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                               0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    k->sc[0] = _mm256_shuffle_epi8(sc, pick_even);
    k->sc[1] = _mm256_shuffle_epi8(sc, _mm256_add_epi8(pick_even, _mm256_set1_epi8(2)));
#ifdef KD_DPBUSD
    k->sc[2] = sc; /* int32 lane c: (sc of run 2c, sc of run 2c + 1) (kd_isum) */
#endif
    const __m256i low = _mm256_set1_epi8(15);
    __m256i in[4], t[4];
    for (int c = 0; c < 4; c++) in[c] = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
    ISA(kd_t4)(in, t); /* the low nibbles of chunk c are run 2c's codes, the high 2c + 1's */
    for (int m = 0; m < 4; m++) {
        k->codes[m] = _mm256_and_si256(t[m], low);
        k->codes[4 + m] = _mm256_and_si256(_mm256_srli_epi16(t[m], 4), low);
    }
}

static INLINE void ISA(kd_unpack_q5_k)(const uint8_t *p, ISA(kd_block) *k) {
    ISA(kd_unpack_q4_k)(p, k); /* same head; its codes read from p + 16 are replaced below */
    const __m256i low = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
    const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    __m256i in[4], t[4];
    for (int c = 0; c < 4; c++) in[c] = _mm256_loadu_si256((const __m256i *)(p + 48 + 32 * c));
    ISA(kd_t4)(in, t);
    for (int m = 0; m < 4; m++) {
        /* column 4(4h + m) + byte of run 2c + f: bit 2c + f of qh at that column */
        const __m256i h = _mm256_shuffle_epi32(qh, m * 0x55);
        const __m256i h0 = _mm256_and_si256(_mm256_srlv_epi32(h, shift), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srlv_epi32(h, _mm256_add_epi32(shift, _mm256_set1_epi32(1))), one);
        k->codes[m] = _mm256_or_si256(_mm256_and_si256(t[m], low), _mm256_slli_epi16(h0, 4));
        k->codes[4 + m] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(t[m], 4), low),
                                          _mm256_slli_epi16(h1, 4));
    }
}

/* The types with a scale per 16 columns (Q6_K, Q3_K, Q2_K): their runs' codes (runs[j]:
 * run j's 32 in column order) into kd_order's order, the 16 int8 scales s8 (half-run i's
 * at byte i) as each group's int16 pairs, and the mins' float scales: half-run i's term
 * min_i (dx Q_i) to subtract, min_i = m * s8[i] (ms NULL: Q6_K, Q3_K, whose offset is a
 * multiple m of the scale) or m * ms[i] (Q2_K's own 4-bit mins). */
static INLINE void ISA(kd_by16)(__m256i runs[8], __m128i s8, float d, float m, const __m128i *ms,
                                ISA(kd_block) *k) {
    const __m256i lo8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s8));
    const __m256i hi8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(s8, 8)));
    const __m128i mi = ms ? *ms : s8;
    const __m256 dm = _mm256_set1_ps(m);
    k->d = d;
    k->mins[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(mi)), dm);
    k->mins[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(mi, 8))), dm);
    ISA(kd_order)(1, runs, k->codes);
    /* group p: half-runs 4p, 4p + 2 in the lower 128 bits, 4p + 1, 4p + 3 in the upper */
    for (int g = 0; g < 4; g++) {
        const int w = 4 * (g % 2);
        k->sc[g] = ISA(kd_words4)(g < 2 ? lo8 : hi8, w, w + 2, w + 1, w + 3);
    }
}

static INLINE void ISA(kd_unpack_q6_k)(const uint8_t *p, ISA(kd_block) *k) {
    const __m256i low = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
    __m256i runs[8];
    for (int j = 0; j < 8; j++) {
        const int hh = j / 4, r = j % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(p + 64 * hh + 32 * (r % 2)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * hh));
        const __m256i l4 = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (r / 2)), low);
        const __m256i h2 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), three);
        runs[j] = _mm256_or_si256(l4, _mm256_slli_epi16(h2, 4));
    }
    const float d = HALF(p + 208);
    ISA(kd_by16)(runs, _mm_loadu_si128((const __m128i *)(p + 192)), d, 32.0f * d, NULL, k);
}

/* Q3_K (native_blocks.h's layout): code = low bits | high bit << 2 (0..7), w = d s (code -
 * 4) with s the half-run's six-bit scale less 32. */
static INLINE void ISA(kd_unpack_q3_k)(const uint8_t *p, ISA(kd_block) *k) {
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)p);
    __m256i runs[8];
    for (int j = 0; j < 8; j++) {
        const int h = j / 4, s = j % 4;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * h));
        const __m256i l2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), three);
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + s), one);
        runs[j] = _mm256_or_si256(l2, _mm256_slli_epi16(hb, 2));
    }
    /* scale i: low four bits from byte i % 8's nibble i / 8, high two from byte 8 + i % 4's
     * bits 2 (i / 4) (each 32-bit lane g of a broadcast of bytes 8..11 shifted by 2 g) */
    const __m128i sc = _mm_loadl_epi64((const __m128i *)(p + 96)), nib = _mm_set1_epi8(15);
    const __m128i lo4 = _mm_unpacklo_epi64(_mm_and_si128(sc, nib), _mm_and_si128(_mm_srli_epi16(sc, 4), nib));
    const __m128i hi2 = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)rd32(p + 104)), _mm_setr_epi32(0, 2, 4, 6)),
                                      _mm_set1_epi8(3));
    const __m128i s8 = _mm_sub_epi8(_mm_or_si128(lo4, _mm_slli_epi16(hi2, 4)), _mm_set1_epi8(32));
    const float d = HALF(p + 108);
    ISA(kd_by16)(runs, s8, d, 4.0f * d, NULL, k);
}

/* Q2_K (native_blocks.h's layout): code 0..3, w = d sc code - dmin m per half-run, sc and m
 * its scale byte's low and high nibbles. */
static INLINE void ISA(kd_unpack_q2_k)(const uint8_t *p, ISA(kd_block) *k) {
    const __m256i three = _mm256_set1_epi8(3);
    __m256i runs[8];
    for (int j = 0; j < 8; j++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * (j / 4)));
        runs[j] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (j % 4)), three);
    }
    const __m128i sc = _mm_loadu_si128((const __m128i *)p), low = _mm_set1_epi8(15);
    const __m128i m = _mm_and_si128(_mm_srli_epi16(sc, 4), low);
    ISA(kd_by16)(runs, _mm_and_si128(sc, low), HALF(p + 80), HALF(p + 82), &m, k);
}

/* Row t's int32 sums of block b: each group's byte products added as int16, then times the
 * group's scales into int32 (every step exact, so the order is free). With VNNI (KD_DPBUSD)
 * and Q4_K (DP), a group's products are summed into int32 lanes by vpdpbusd instead: 16
 * products of at most 15 x 127 per lane stay under 2^15, so the two groups' lanes (an even
 * run's and the next odd run's) pack into int16 pairs, and one vpmaddwd by the pairs'
 * scales gives each lane both runs' scaled sums exactly: one multiply for the block and row
 * where one per group was two (Zen 4 issues vpdpbusd, vpmaddwd and FMA on the same two
 * pipes). Q5_K's and Q6_K's codes are too large for it.
 * (A 512-bit form, vpdpbusd then vpmulld per group, measured slower on Zen 4:
 * docs/performance.md.) */
static INLINE __m256i ISA(kd_isum)(const ISA(kd_block) *k, const int8_t *xq, int G, int DP) {
    __m256i is = _mm256_setzero_si256();
#ifdef KD_DPBUSD
    if (DP) {
        __m256i run[2];
        for (int g = 0; g < 2; g++) {
            __m256i s32[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
            for (int v = 4 * g; v < 4 * g + 4; v++) { /* a lone row: two chains (latency) */
                const int c = DP == 2 ? v % 2 : 0;
                s32[c] = I8_DOT_ACC(s32[c], k->codes[v], _mm256_loadu_si256((const __m256i *)(xq + 32 * v)));
            }
            run[g] = _mm256_add_epi32(s32[0], s32[1]);
        }
        /* lane c's even-run and odd-run sums as an int16 pair, times their two scales */
        const __m256i pairs = _mm256_blend_epi16(run[0], _mm256_slli_epi32(run[1], 16), 0xAA);
        return _mm256_madd_epi16(pairs, k->sc[2]);
    }
#else
    (void)DP;
#endif
    for (int g = 0; g < 8 / G; g++) {
        __m256i s16 = _mm256_setzero_si256();
        for (int v = G * g; v < G * g + G; v++)
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(k->codes[v], _mm256_loadu_si256((const __m256i *)(xq + 32 * v))));
        is = _mm256_add_epi32(is, _mm256_madd_epi16(s16, k->sc[g]));
    }
    return is;
}

/* Block b (unpacked in k) times the N rows of a tile of x (xq, xd, xs: the block's first
 * row in tile_x's layout), into each row's sums acc[t]: its int32 sums (kd_isum), converted
 * and times d * dx, the mins' term subtracted (SW sums: one or two multiply-adds), added to
 * acc[t]: the same steps for a row alone or in a tile. G: vectors per group (4:
 * Q4_K, Q5_K; 2: Q6_K). */
static INLINE void ISA(kd_tile_block)(const ISA(kd_block) *k, const int8_t *xq, const float *xd,
                                      const float *xs, int N, int G, int SW, int DP, __m256 *acc,
                                      __m256 *off) {
    float dd[KD_TILE];
    ISA(tile_scales)(k->d, xd, N, dd);
#pragma GCC unroll 8
    for (int t = 0; t < N; t++) {
        const __m256i is = ISA(kd_isum)(k, xq + 256 * t, G, DP && N == 1 ? 2 : DP);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(dd[t]), acc[t]);
        off[t] = _mm256_fmadd_ps(k->mins[0], _mm256_loadu_ps(xs + SW * t), off[t]);
        if (SW == 16) off[t] = _mm256_fmadd_ps(k->mins[1], _mm256_loadu_ps(xs + SW * t + 8), off[t]);
    }
}

/* Row `row` of W (`blocks` blocks of NBYTES, read by UNPACK) times the N rows of the tile
 * (xq, xd, xs: tile_x's layout, N its rows), into yt[t]. (Block column after block
 * column over several rows of W, keeping a block of x in L1 for them, measured no faster.) */
#define KD_TILE_ROW(UNPACK, NBYTES, G, SW, DP, N)                                              \
    {                                                                                          \
        __m256 acc[N], off[N];                                                                 \
        for (int t = 0; t < N; t++) acc[t] = off[t] = _mm256_setzero_ps();                     \
        for (int b = 0; b < blocks; b++) {                                                     \
            const uint8_t *p = row + (size_t)b * NBYTES;                                       \
            for (int l = 0; l < NBYTES; l += 64) __builtin_prefetch(p + PREFETCH_AHEAD + l);   \
            ISA(kd_block) k;                                                                   \
            ISA(UNPACK)(p, &k);                                                                \
            ISA(kd_tile_block)(&k, xq + (size_t)b * N * 256, xd + (size_t)b * N,               \
                               xs + (size_t)b * N * SW, N, G, SW, DP, acc, off);               \
        }                                                                                      \
        for (int t = 0; t < N; t++) yt[t] = ISA(kd_hsum)(acc[t]) - ISA(kd_hsum)(off[t]);       \
    }

/* y[t, r] = x[t] . W[r] for r in [r0, r1), every t < T (y's rows ys apart), for one of the
 * types (UNPACK its block reader, G its vectors per group, SW its sums of q per block,
 * DP whether kd_isum may use vpdpbusd): x in tile_x's tiles, each tile's block unpacked
 * once. */
#define KD_ROWS(UNPACK, NBYTES, G, SW, DP)                                                     \
    for (int t0 = 0; t0 < T; t0 += KD_TILE) {                                                  \
        const int n = T - t0 < KD_TILE ? T - t0 : KD_TILE;                                     \
        const int8_t *xq = x[t0].q;                                                            \
        const float *xd = x[t0].d, *xs = x[t0].dsum;                                           \
        for (size_t r = r0; r < r1; r++) {                                                     \
            const uint8_t *row = w + r * rb;                                                   \
            float yt[KD_TILE];                                                                 \
            if (n == 1) KD_TILE_ROW(UNPACK, NBYTES, G, SW, DP, 1)                              \
            else if (n == 2) KD_TILE_ROW(UNPACK, NBYTES, G, SW, DP, 2)                         \
            else if (n <= 4) KD_TILE_ROW(UNPACK, NBYTES, G, SW, DP, 4)                         \
            else KD_TILE_ROW(UNPACK, NBYTES, G, SW, DP, KD_TILE)                               \
            for (int t = 0; t < n; t++) y[(size_t)(t0 + t) * ys + r] = yt[t];                  \
        }                                                                                      \
    }

static void ISA(kd_rows)(int qt, const uint8_t *w, size_t rb, size_t r0, size_t r1,
                         const q8_row *x, int T, int cols, float *y, size_t ys) {
    const int blocks = cols / 256;
    if (qt == QT_Q4_K) KD_ROWS(kd_unpack_q4_k, 144, 4, 8, 1)
    else if (qt == QT_Q5_K) KD_ROWS(kd_unpack_q5_k, 176, 4, 8, 0)
    else if (qt == QT_Q6_K) KD_ROWS(kd_unpack_q6_k, 210, 2, 16, 0)
    else if (qt == QT_Q3_K) KD_ROWS(kd_unpack_q3_k, 110, 2, 16, 0)
    else if (qt == QT_Q2_K) KD_ROWS(kd_unpack_q2_k, 84, 2, 16, 0)
}

#undef KD_ROWS
#undef KD_TILE_ROW
#undef KD_TILE
