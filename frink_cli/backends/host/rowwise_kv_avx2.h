/* The attention's two loops over a query head's keys, written for AVX2 (+ F16C), giving the
 * bits of rowwise_kv.h's portable dot_key / add_value:
 *
 *   kv_scores_avx2  s[i] = q . K_i: the 8 lanes of dot_lanes are one register, each 8 values
 *                   multiplied then added to it in row order (no FMA: the portable code
 *                   rounds the product first), the lanes then summed by lanes_sum's tree;
 *                   4 keys at a time, for 4 independent chains (a key's own arithmetic does
 *                   not change).
 *   kv_values_avx2  out[d] = sum over keys, in key order, of e_i * V_i[d]: up to 64 columns
 *                   held in registers across the keys.
 *
 * A stored element is widened exactly as kv_types.decode widens it: vcvtph2ps is the exact
 * half to float; bf16 is its bits shifted up; a q8_0 / q4_0 value is (float)q times the
 * block's f16 scale, one rounding. Only for rows whose widths are multiples of 8 (the
 * caller's `kv_avx2_takes`); others run the portable code, which gives the same bits.
 *
 * Included by rowwise.c after rowwise_kv.h. Elsewhere than GCC / clang on x86-64 it
 * defines nothing and kv_avx2_takes is 0. */

#ifndef FRINK_ROWWISE_KV_AVX2_H
#define FRINK_ROWWISE_KV_AVX2_H

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>

#define KV_AVX2 __attribute__((target("avx2,f16c")))
#define KV_HAS_AVX2 1

/* 1 where FRINK_NATIVE_ISA does not ask for the portable code ("base") and the CPU has
 * AVX2 and F16C; kv_use_avx512, where it also does not ask for "avx2" or "avxvnni" (the
 * AVX2 kernels with byte dots of their own: their attention is AVX2's) and the CPU has
 * AVX-512 F and DQ (a prompt's tiles, rowwise_kv_avx512.h): set once when the module loads. */
static int kv_use_avx2 = 0, kv_use_avx512 = 0;

static int kv_cpu_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

static int kv_cpu_avx512(void) {
    return kv_cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}

static void kv_pick_isa(void) {
    const char *want = getenv("FRINK_NATIVE_ISA");
    kv_use_avx2 = !(want && !strcmp(want, "base")) && kv_cpu_avx2();
    kv_use_avx512 = kv_use_avx2 && !(want && (!strcmp(want, "avx2") || !strcmp(want, "avxvnni"))) &&
                    kv_cpu_avx512();
}

/* A block's f16 scale, broadcast (F16C's exact widening). */
KV_AVX2 static inline __m256 kv_scale8(const uint8_t *b) {
    return _mm256_set1_ps(_cvtsh_ss((unsigned short)(b[0] | (b[1] << 8))));
}

/* 8 values of a stored row from value c (a multiple of 8) on, as floats. */
KV_AVX2 static inline __m256 kv_load8(int type, const char *row, Py_ssize_t c) {
    switch (type) {
    case KV_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * c)));
    case KV_BF16: {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * c)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    }
    case KV_Q8_0: {
        const uint8_t *b = (const uint8_t *)row + (c / KV_BLOCK) * (2 + KV_BLOCK);
        const __m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + c % KV_BLOCK));
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        return _mm256_mul_ps(v, kv_scale8(b));
    }
    case KV_Q4_0: {
        const uint8_t *b = (const uint8_t *)row + (c / KV_BLOCK) * (2 + KV_BLOCK / 2);
        const Py_ssize_t j = c % KV_BLOCK;
        __m256i n = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + j % 16)));
        n = j < 16 ? _mm256_and_si256(n, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(n, 4);
        const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(n, _mm256_set1_epi32(8)));
        return _mm256_mul_ps(v, kv_scale8(b));
    }
    default: return _mm256_loadu_ps((const float *)row + c);
    }
}

KV_AVX2 static inline float kv_lanes(__m256 acc) {
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    return lanes_sum(lane);
}

/* s[0..3] = kv_lanes of a0..a3, four at once: horizontal adds pair lanes (0+1, 2+3, ...),
 * pair the pairs, then the halves are added: lanes_sum's tree for each, so the same bits. */
KV_AVX2 static inline void kv_lanes4(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float *s) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_storeu_ps(s, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

/* The kv_lanes of a0..a7 into s[0..7]: two kv_lanes4 trees, their halves paired across the
 * two registers so one add finishes all eight. */
KV_AVX2 static inline void kv_lanes8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4,
                                     __m256 a5, __m256 a6, __m256 a7, float *s) {
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    _mm256_storeu_ps(s, _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20),
                                      _mm256_permute2f128_ps(h0, h1, 0x31)));
}

/* sa[i] = qa . row i and, where qb is not NULL, sb[i] = qb . row i, over n f32 rows hk apart
 * (hk a multiple of 8): KV_SCORES's steps for each score, so its bits, with 8 sums in flight
 * (4 keys for two heads, or 8 keys for one) where KV_SCORES keeps 4: a sum's 8 dependent
 * adds no longer set the pace. */
KV_AVX2 static void kv_scores_rows(const float *qa, const float *qb, const float *rows,
                                   Py_ssize_t hk, Py_ssize_t n, float *sa, float *sb) {
    Py_ssize_t i = 0;
    if (qb)
        for (; i + 4 <= n; i += 4) {
            const float *r = rows + i * hk;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
                   b3 = a0;
            for (Py_ssize_t c = 0; c < hk; c += 8) {
                const __m256 x = _mm256_loadu_ps(qa + c), y = _mm256_loadu_ps(qb + c);
                const __m256 k0 = _mm256_loadu_ps(r + c), k1 = _mm256_loadu_ps(r + hk + c),
                             k2 = _mm256_loadu_ps(r + 2 * hk + c), k3 = _mm256_loadu_ps(r + 3 * hk + c);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(x, k0));
                b0 = _mm256_add_ps(b0, _mm256_mul_ps(y, k0));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(x, k1));
                b1 = _mm256_add_ps(b1, _mm256_mul_ps(y, k1));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(x, k2));
                b2 = _mm256_add_ps(b2, _mm256_mul_ps(y, k2));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(x, k3));
                b3 = _mm256_add_ps(b3, _mm256_mul_ps(y, k3));
            }
            float t[8];
            kv_lanes8(a0, a1, a2, a3, b0, b1, b2, b3, t);
            memcpy(sa + i, t, 4 * sizeof(float));
            memcpy(sb + i, t + 4, 4 * sizeof(float));
        }
    else
        for (; i + 8 <= n; i += 8) {
            const float *r = rows + i * hk;
            __m256 a[8];
            for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
            for (Py_ssize_t c = 0; c < hk; c += 8) {
                const __m256 x = _mm256_loadu_ps(qa + c);
                for (int u = 0; u < 8; u++)
                    a[u] = _mm256_add_ps(a[u], _mm256_mul_ps(x, _mm256_loadu_ps(r + u * hk + c)));
            }
            kv_lanes8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], sa + i);
        }
    for (; i < n; i++) {
        const float *r = rows + i * hk;
        __m256 a = _mm256_setzero_ps(), b = a;
        for (Py_ssize_t c = 0; c < hk; c += 8) {
            const __m256 k = _mm256_loadu_ps(r + c);
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(qa + c), k));
            if (qb) b = _mm256_add_ps(b, _mm256_mul_ps(_mm256_loadu_ps(qb + c), k));
        }
        sa[i] = kv_lanes(a);
        if (qb) sb[i] = kv_lanes(b);
    }
}

/* s[i] = q . K row (base + i) of k, i in [0, n), K of cache type `type`, hk values a row. */
#define KV_SCORES(name, TYPE)                                                                  \
    KV_AVX2 static void name(const float *q, Py_ssize_t hk, const rows_of *k, Py_ssize_t base, \
                             Py_ssize_t n, float *s) {                                         \
        const kv_rows rows = kv_rows_from(k, base);                                            \
        Py_ssize_t i = 0;                                                                      \
        for (; i + 4 <= n; i += 4) {                                                           \
            const char *r0 = kv_row(&rows, i), *r1 = kv_row(&rows, i + 1),                     \
                       *r2 = kv_row(&rows, i + 2), *r3 = kv_row(&rows, i + 3);                 \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                        \
            for (Py_ssize_t c = 0; c < hk; c += 8) {                                           \
                const __m256 x = _mm256_loadu_ps(q + c);                                       \
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(x, kv_load8(TYPE, r0, c)));               \
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(x, kv_load8(TYPE, r1, c)));               \
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(x, kv_load8(TYPE, r2, c)));               \
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(x, kv_load8(TYPE, r3, c)));               \
            }                                                                                  \
            kv_lanes4(a0, a1, a2, a3, s + i);                                                  \
        }                                                                                      \
        for (; i < n; i++) {                                                                   \
            const char *r = kv_row(&rows, i);                                                  \
            __m256 a = _mm256_setzero_ps();                                                    \
            for (Py_ssize_t c = 0; c < hk; c += 8)                                             \
                a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(q + c), kv_load8(TYPE, r, c))); \
            s[i] = kv_lanes(a);                                                                \
        }                                                                                      \
    }

/* out[d] = sum over i in [0, n), in order, of e[i] * V row (base + i)[d], d in [0, hv). */
#define KV_VALUES(name, TYPE)                                                                  \
    KV_AVX2 static void name(const float *e, const rows_of *v, Py_ssize_t base, Py_ssize_t n,  \
                             Py_ssize_t hv, float *out) {                                      \
        const kv_rows rows = kv_rows_from(v, base);                                            \
        for (Py_ssize_t d0 = 0; d0 < hv; d0 += 64) {                                           \
            const int w = (int)((hv - d0 < 64 ? hv - d0 : 64) / 8);                            \
            __m256 o[8];                                                                       \
            for (int u = 0; u < 8; u++) o[u] = _mm256_setzero_ps();                            \
            for (Py_ssize_t i = 0; i < n; i++) {                                               \
                const char *r = kv_row(&rows, i);                                              \
                const __m256 x = _mm256_set1_ps(e[i]);                                         \
                for (int u = 0; u < 8; u++)                                                    \
                    if (u < w)                                                                 \
                        o[u] = _mm256_add_ps(o[u], _mm256_mul_ps(x, kv_load8(TYPE, r, d0 + 8 * u))); \
            }                                                                                  \
            for (int u = 0; u < w; u++) _mm256_storeu_ps(out + d0 + 8 * u, o[u]);              \
        }                                                                                      \
    }

KV_SCORES(kv_scores_f32, KV_F32)
KV_SCORES(kv_scores_f16, KV_F16)
KV_SCORES(kv_scores_bf16, KV_BF16)
KV_SCORES(kv_scores_q8_0, KV_Q8_0)
KV_SCORES(kv_scores_q4_0, KV_Q4_0)
KV_VALUES(kv_values_f32, KV_F32)
KV_VALUES(kv_values_f16, KV_F16)
KV_VALUES(kv_values_bf16, KV_BF16)
KV_VALUES(kv_values_q8_0, KV_Q8_0)
KV_VALUES(kv_values_q4_0, KV_Q4_0)

/* Rows [base, base + n) of r (cache type `type`, w values a row, w a multiple of 8) as f32
 * into out, w apart: kv_load8's values, so the loops below read what the typed loops read. */
KV_AVX2 static void kv_widen(int type, const rows_of *r, Py_ssize_t base, Py_ssize_t n,
                             Py_ssize_t w, float *out) {
    const kv_rows rows = kv_rows_from(r, base);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *row = kv_row(&rows, i);
        for (Py_ssize_t c = 0; c < w; c += 8) _mm256_storeu_ps(out + i * w + c, kv_load8(type, row, c));
    }
}

/* kv_values_more's columns [d0, d0 + 8 w) (w <= 8), the sums held in registers across the
 * keys; inlined with w a constant where it is 8, so the loop over registers unrolls. */
KV_AVX2 static inline __attribute__((always_inline)) void
kv_values_cols(const float *e, const float *rows, Py_ssize_t n, Py_ssize_t hv, float *out,
               int first, int w) {
    __m256 o[8];
    for (int u = 0; u < 8; u++)
        o[u] = first || u >= w ? _mm256_setzero_ps() : _mm256_loadu_ps(out + 8 * u);
    for (Py_ssize_t i = 0; i < n; i++) {
        const __m256 x = _mm256_set1_ps(e[i]);
        for (int u = 0; u < 8; u++)
            if (u < w) o[u] = _mm256_add_ps(o[u], _mm256_mul_ps(x, _mm256_loadu_ps(rows + i * hv + 8 * u)));
    }
    for (int u = 0; u < w; u++) _mm256_storeu_ps(out + 8 * u, o[u]);
}

/* KV_VALUES's steps over f32 rows (hv apart) for keys [0, n), continuing the sums in out
 * (first: from zero): each element's adds in key order, as one call over all keys makes. */
KV_AVX2 static void kv_values_more(const float *e, const float *rows, Py_ssize_t n, Py_ssize_t hv,
                                   float *out, int first) {
    for (Py_ssize_t d0 = 0; d0 < hv; d0 += 64) {
        if (hv - d0 >= 64)
            kv_values_cols(e, rows + d0, n, hv, out + d0, first, 8);
        else
            kv_values_cols(e, rows + d0, n, hv, out + d0, first, (int)((hv - d0) / 8));
    }
}

typedef void (*kv_scores_fn)(const float *, Py_ssize_t, const rows_of *, Py_ssize_t, Py_ssize_t,
                             float *);
typedef void (*kv_values_fn)(const float *, const rows_of *, Py_ssize_t, Py_ssize_t, Py_ssize_t,
                             float *);
static const kv_scores_fn KV_SCORES_AVX2[] = {kv_scores_f32, kv_scores_f16, kv_scores_bf16,
                                              kv_scores_q8_0, kv_scores_q4_0};
static const kv_values_fn KV_VALUES_AVX2[] = {kv_values_f32, kv_values_f16, kv_values_bf16,
                                              kv_values_q8_0, kv_values_q4_0};

/* Whether the AVX2 loops run for these widths (each a multiple of 8). */
static inline int kv_avx2_takes(Py_ssize_t hk, Py_ssize_t hv) {
    return kv_use_avx2 && hk % 8 == 0 && hv % 8 == 0;
}

#else
#define KV_HAS_AVX2 0
static int kv_cpu_avx2(void) { return 0; }
static int kv_cpu_avx512(void) { return 0; }
static void kv_pick_isa(void) {}
static inline int kv_avx2_takes(Py_ssize_t hk, Py_ssize_t hv) {
    (void)hk, (void)hv;
    return 0;
}
#endif

/* The attention loops' variant, for `frink info`. */
static const char *kv_isa(void) {
#if KV_HAS_AVX2
    if (kv_use_avx512) return "avx512";
    if (kv_use_avx2) return "avx2";
#endif
    return "portable";
}

/* Use variant `name` ("avx512", "avx2" or "portable"); -1 where this build or CPU cannot. */
static int kv_set_isa(const char *name) {
    const int level = !strcmp(name, "portable") ? 0 : !strcmp(name, "avx2") ? 1 : !strcmp(name, "avx512") ? 2 : -1;
    if (level < 0 || (level == 1 && !kv_cpu_avx2()) || (level == 2 && !kv_cpu_avx512())) return -1;
#if KV_HAS_AVX2
    kv_use_avx2 = level >= 1, kv_use_avx512 = level == 2;
#endif
    return 0;
}

/* attend_isa(name=None): the variant used, before `name` is made the one used. */
static PyObject *py_attend_isa(PyObject *self, PyObject *args) {
    (void)self;
    const char *name = NULL, *before = kv_isa();
    if (!PyArg_ParseTuple(args, "|s", &name)) return NULL;
    if (name && kv_set_isa(name)) {
        PyErr_Format(PyExc_ValueError, "attention variant %s: not runnable here", name);
        return NULL;
    }
    loops_pick(); /* the row loops (rowwise.c) follow */
    return PyUnicode_FromString(before);
}

#endif
