/* A prompt's attention tiles for AVX-512 (F + DQ), giving the bits of the AVX2 loops
 * (rowwise_kv_avx2.h) and so of the portable ones:
 *
 *   kv512_scores  the scores of the query vectors of a block of rows (rows x heads sharing a KV
 *                 head, attend_rows) against widened key rows, vectors two to a zmm (vector
 *                 a's 8 lanes in its low half, b's in the high), each key row's 8 columns
 *                 broadcast to both halves (vbroadcastf32x8): every lane takes the AVX2
 *                 loop's multiply then add in column order, 4 pairs by 4 keys in flight,
 *                 and each score's 8 lanes are summed by lanes_sum's tree (kv512_lanes4).
 *   kv512_values  out_k[d] += sum over keys, in key order, of e_k[i] * V_i[d] for pairs of
 *                 vectors the same way (the pair's two weights in the halves of a register,
 *                 V_i's 8 columns broadcast), 3 pairs by 64 columns in flight.
 *
 * Why: the AVX2 loops share each loaded key among two heads and each value among one; on a
 * machine whose vector units are 512 bits wide these tiles do two lanes' work per
 * instruction and load each key and value once per 8 vectors (values: 6), which a prompt's
 * attention at depth is bound by (docs/performance.md).
 *
 * Included by rowwise.c after rowwise_kv_avx2.h, where KV_HAS_AVX2. */

#ifndef FRINK_ROWWISE_KV_AVX512_H
#define FRINK_ROWWISE_KV_AVX512_H

#define KV_AVX512 __attribute__((target("avx512f,avx512dq,avx2,f16c")))
#define KV_INLINE static inline __attribute__((always_inline))
/* Pairs of vectors a score tile and a value tile hold. */
#define KV512_SCORE_PAIRS 4
#define KV512_VALUE_PAIRS 3

/* _mm256_hadd_ps in each 256-bit half: (a0 + a1, a2 + a3, b0 + b1, b2 + b3) per 128 bits. */
KV_AVX512 KV_INLINE __m512 kv512_hadd(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

/* x0..x3: keys j .. j + 3 of a pair (vector a's lanes low, b's high): their scores by
 * kv_lanes4's tree into sa[0..3] and sb[0..3]. */
KV_AVX512 KV_INLINE void kv512_lanes4(__m512 x0, __m512 x1, __m512 x2, __m512 x3, float *sa,
                                      float *sb) {
    const __m512 h = kv512_hadd(kv512_hadd(x0, x1), kv512_hadd(x2, x3));
    /* 128-bit quarters: a's lanes 0-3 sums, a's 4-7, b's 0-3, b's 4-7: each added to the next */
    const __m512 s = _mm512_add_ps(h, _mm512_shuffle_f32x4(h, h, 0xB1));
    _mm_storeu_ps(sa, _mm512_castps512_ps128(s));
    _mm_storeu_ps(sb, _mm512_extractf32x4_ps(s, 2));
}

/* Vector a's and b's kv_lanes of one key's pair x. */
KV_AVX512 KV_INLINE void kv512_lanes1(__m512 x, float *sa, float *sb) {
    float lane[16];
    _mm512_storeu_ps(lane, x);
    *sa = lanes_sum(lane), *sb = lanes_sum(lane + 8);
}

/* NP pairs' scores (qp: pair p's columns at p * 2 hk, the two vectors' columns c .. c + 7
 * side by side for each c) against n f32 key rows hk apart, into dst[2p] and dst[2p + 1]
 * (key i at i). */
KV_AVX512 KV_INLINE void kv512_score_tile(const float *qp, const int NP, const float *rows,
                                          Py_ssize_t hk, Py_ssize_t n, float *const *dst) {
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *r = rows + i * hk;
        __m512 a[KV512_SCORE_PAIRS][4];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) a[p][j] = _mm512_setzero_ps();
        for (Py_ssize_t c = 0; c < hk; c += 8) {
            __m512 k[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) k[j] = _mm512_broadcast_f32x8(_mm256_loadu_ps(r + j * hk + c));
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                const __m512 x = _mm512_loadu_ps(qp + p * 2 * hk + 2 * c);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) a[p][j] = _mm512_add_ps(a[p][j], _mm512_mul_ps(x, k[j]));
            }
        }
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) kv512_lanes4(a[p][0], a[p][1], a[p][2], a[p][3], dst[2 * p] + i, dst[2 * p + 1] + i);
    }
    for (; i < n; i++) {
        const float *r = rows + i * hk;
        __m512 a[KV512_SCORE_PAIRS];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) a[p] = _mm512_setzero_ps();
        for (Py_ssize_t c = 0; c < hk; c += 8) {
            const __m512 k = _mm512_broadcast_f32x8(_mm256_loadu_ps(r + c));
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++)
                a[p] = _mm512_add_ps(a[p], _mm512_mul_ps(_mm512_loadu_ps(qp + p * 2 * hk + 2 * c), k));
        }
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) kv512_lanes1(a[p], dst[2 * p] + i, dst[2 * p + 1] + i);
    }
}

/* Every pair's scores: npairs pairs (as kv512_score_tile), KV512_SCORE_PAIRS at a time. */
KV_AVX512 static void kv512_scores(const float *qp, Py_ssize_t npairs, const float *rows,
                                   Py_ssize_t hk, Py_ssize_t n, float *const *dst) {
    for (Py_ssize_t p = 0; p < npairs; p += KV512_SCORE_PAIRS) {
        const float *q = qp + p * 2 * hk;
        float *const *d = dst + 2 * p;
        switch (npairs - p >= KV512_SCORE_PAIRS ? KV512_SCORE_PAIRS : npairs - p) {
        case 4: kv512_score_tile(q, 4, rows, hk, n, d); break;
        case 3: kv512_score_tile(q, 3, rows, hk, n, d); break;
        case 2: kv512_score_tile(q, 2, rows, hk, n, d); break;
        default: kv512_score_tile(q, 1, rows, hk, n, d); break;
        }
    }
}

/* Pair p's vectors' columns side by side, 8 at a time, into qp (2 hk floats a pair) for
 * the nv vectors q[k] (an odd one out paired with itself). */
static void kv512_pair_queries(const float *const *q, Py_ssize_t nv, Py_ssize_t hk, float *qp) {
    for (Py_ssize_t k = 0; k < nv + nv % 2; k++) {
        const float *from = q[k < nv ? k : nv - 1];
        for (Py_ssize_t c = 0; c < hk; c += 8) memcpy(qp + k / 2 * 2 * hk + 2 * c + 8 * (k % 2), from + c, 8 * sizeof(float));
    }
}

/* Columns [d0, d0 + 8 w) of NP pairs' outputs (out[2p], out[2p + 1], their sums so far)
 * plus, over n f32 value rows hv apart in order, e[k][i] times row i. */
KV_AVX512 KV_INLINE void kv512_value_tile(float *const *e, float *const *out, const int NP,
                                          const float *rows, Py_ssize_t n, Py_ssize_t hv,
                                          Py_ssize_t d0, const int w) {
    __m512 o[KV512_VALUE_PAIRS][8];
#pragma GCC unroll 3
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++)
            o[p][u] = u >= w ? _mm512_setzero_ps()
                             : _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(out[2 * p] + d0 + 8 * u)),
                                                  _mm256_loadu_ps(out[2 * p + 1] + d0 + 8 * u), 1);
    for (Py_ssize_t i = 0; i < n; i++) {
        __m512 x[KV512_VALUE_PAIRS];
#pragma GCC unroll 3
        for (int p = 0; p < NP; p++)
            x[p] = _mm512_mask_broadcastss_ps(_mm512_set1_ps(e[2 * p][i]), 0xFF00, _mm_load_ss(e[2 * p + 1] + i));
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++)
            if (u < w) {
                const __m512 v = _mm512_broadcast_f32x8(_mm256_loadu_ps(rows + i * hv + d0 + 8 * u));
#pragma GCC unroll 3
                for (int p = 0; p < NP; p++) o[p][u] = _mm512_add_ps(o[p][u], _mm512_mul_ps(x[p], v));
            }
    }
#pragma GCC unroll 3
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++)
            if (u < w) {
                _mm256_storeu_ps(out[2 * p] + d0 + 8 * u, _mm512_castps512_ps256(o[p][u]));
                _mm256_storeu_ps(out[2 * p + 1] + d0 + 8 * u, _mm512_extractf32x8_ps(o[p][u], 1));
            }
}

KV_AVX512 KV_INLINE void kv512_value_cols(float *const *e, float *const *out, const int NP,
                                          const float *rows, Py_ssize_t n, Py_ssize_t hv) {
    for (Py_ssize_t d0 = 0; d0 < hv; d0 += 64) {
        if (hv - d0 >= 64)
            kv512_value_tile(e, out, NP, rows, n, hv, d0, 8);
        else
            kv512_value_tile(e, out, NP, rows, n, hv, d0, (int)((hv - d0) / 8));
    }
}

/* kv_values_more's sums (continued, never first) for npairs pairs of vectors (weights e[k],
 * outputs out[k]) over the same n value rows, KV512_VALUE_PAIRS pairs at a time. */
KV_AVX512 static void kv512_values(float *const *e, float *const *out, Py_ssize_t npairs,
                                   const float *rows, Py_ssize_t n, Py_ssize_t hv) {
    for (Py_ssize_t p = 0; p < npairs; p += KV512_VALUE_PAIRS) {
        float *const *ep = e + 2 * p, *const *op = out + 2 * p;
        switch (npairs - p >= KV512_VALUE_PAIRS ? KV512_VALUE_PAIRS : npairs - p) {
        case 3: kv512_value_cols(ep, op, 3, rows, n, hv); break;
        case 2: kv512_value_cols(ep, op, 2, rows, n, hv); break;
        default: kv512_value_cols(ep, op, 1, rows, n, hv); break;
        }
    }
}

#endif
