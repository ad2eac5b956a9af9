/* The host kernels for one instruction set: included by native.c once per ISA, with ISA(),
 * VL (float lanes per vector), vf (that vector type), VFMA, HALF and HALVES defined for it.
 *
 * A row of W is walked a block at a time: its head (scales, mins) read once, then each
 * run of 32 weights dequantized exactly into NV vectors in registers (native_blocks.h)
 * and multiplied into VL-lane chains: vector i of each run goes to chain i % NC (NC =
 * min(4, 32 / VL)). The chains are added as (0 + 1) + (2 + 3), summed across
 * lanes as a tree, then the last cols % 32 columns (F16, BF16 and F32 rows only) added one
 * by one. So every product element y[t, r] = x[t] . W[r] is made the same way whatever
 * the number of rows of x beside it: a run is unpacked once for all rows of x (a server's
 * batch shares the unpacking), yet a row's product is the same bit for bit alone or in any
 * batch, which the server's batches rely on.
 */

#include "native_blocks.h"

static INLINE float ISA(hsum)(vf v) {
    float a[VL];
    memcpy(a, &v, sizeof a);
    for (int w = VL / 2; w; w /= 2)
        for (int i = 0; i < w; i++) a[i] += a[i + w];
    return a[0];
}

static INLINE vf ISA(vload)(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The rows of one type: ELEMS weights of NBYTES per block, units of 32. */
#define ROWS_OF_TYPE(HEAD, UNIT, ELEMS, NBYTES, BODY)                                          \
    {                                                                                          \
        const int units = ELEMS / 32, blocks = cols / ELEMS;                                   \
        (void)units, (void)blocks;                                                             \
        BODY(HEAD, UNIT, ELEMS, NBYTES)                                                        \
    }

/* The runs of a row of W (`row`, `blocks` blocks of NBYTES): for each block b its head h
 * read once (p the block, W asked for PREFETCH_AHEAD bytes ahead), then for each run j of
 * it, c its first column and u its index in the row, the statement given. */
#define EACH_RUN(HEAD, ELEMS, NBYTES, ...)                                                     \
    for (int b = 0; b < blocks; b++) {                                                         \
        const uint8_t *p = row + (size_t)b * NBYTES;                                           \
        __builtin_prefetch(p + PREFETCH_AHEAD);                                                \
        block_head h;                                                                          \
        ISA(HEAD)(p, &h);                                                                      \
        _Pragma("GCC unroll 8")                                                                \
        for (int j = 0; j < units; j++) {                                                      \
            const int c = ELEMS * b + 32 * j, u = b * units + j;                               \
            (void)c, (void)u;                                                                  \
            __VA_ARGS__                                                                        \
        }                                                                                      \
    }

/* The block types with an int8 form (native_int8.h): X(type, head, name, block elements,
 * block bytes, BODY) for each; the type's units are unit_<name> and i8_<name>. */
#define I8_TYPES(X, BODY)                                                                      \
    X(QT_Q4_0, head_q4_0, q4_0, 32, 18, BODY)                                                  \
    X(QT_Q4_1, head_q4_1, q4_1, 32, 20, BODY)                                                  \
    X(QT_Q5_0, head_q5_0, q5_0, 32, 22, BODY)                                                  \
    X(QT_Q5_1, head_q5_1, q5_1, 32, 24, BODY)                                                  \
    X(QT_Q8_0, head_q8_0, q8_0, 32, 34, BODY)                                                  \
    X(QT_Q2_K, head_q2_k, q2_k, 256, 84, BODY)                                                 \
    X(QT_Q3_K, head_q3_k, q3_k, 256, 110, BODY)                                                \
    X(QT_Q4_K, head_k, q4_k, 256, 144, BODY)                                                   \
    X(QT_Q5_K, head_k, q5_k, 256, 176, BODY)                                                   \
    X(QT_Q6_K, head_q6_k, q6_k, 256, 210, BODY)                                                \
    X(QT_IQ4_NL, head_iq4_nl, iq4_nl, 32, 18, BODY)                                            \
    X(QT_IQ4_XS, head_iq4_xs, iq4_xs, 256, 136, BODY)                                          \
    X(QT_MXFP4, head_mxfp4, mxfp4, 32, 17, BODY)

#define UNIT_CASE(QT, HEAD, NAME, ELEMS, NBYTES, BODY)                                         \
    case QT: ROWS_OF_TYPE(HEAD, unit_##NAME, ELEMS, NBYTES, BODY) break;

/* Every type: BODY given its head, f32 unit, block elements and bytes. */
#define EACH_TYPE(BODY)                                                                        \
    switch (qt) {                                                                              \
    I8_TYPES(UNIT_CASE, BODY)                                                                  \
    case QT_F16: ROWS_OF_TYPE(head_none, unit_f16, 32, 64, BODY) break;                        \
    case QT_BF16: ROWS_OF_TYPE(head_none, unit_bf16, 32, 64, BODY) break;                      \
    case QT_F32: ROWS_OF_TYPE(head_none, unit_f32, 32, 128, BODY) break;                       \
    default: break;                                                                            \
    }

/* out[i - i0] = W[index[i]] for i in [i0, i1): gguf-py's values exactly. */
#define DEQ_BODY(HEAD, UNIT, ELEMS, NBYTES)                                                    \
    for (size_t i = i0; i < i1; i++) {                                                         \
        const uint8_t *row = w + (size_t)index[i] * rb;                                        \
        float *o = out + (i - i0) * (size_t)cols;                                              \
        EACH_RUN(HEAD, ELEMS, NBYTES, {                                                        \
            vf v[NV];                                                                          \
            ISA(UNIT)(p, j, &h, v);                                                            \
            memcpy(o + c, v, sizeof v);                                                        \
        })                                                                                     \
        for (int k = blocks * ELEMS; k < cols; k++) o[k] = tail_weight(qt, row, k);            \
    }

static void ISA(deq_rows)(int qt, const uint8_t *w, size_t rb, const int64_t *index,
                          size_t i0, size_t i1, float *out, int cols) {
    EACH_TYPE(DEQ_BODY)
}

/* Chains per row of x: vector i of a unit goes to chain i % NC. */
#define NC (NV < 4 ? NV : 4)

static INLINE float ISA(finish)(const vf *a) {
    return ISA(hsum)(NC == 2 ? a[0] + a[1] : (a[0] + a[1]) + (a[2] + a[3]));
}

/* y[t, r] = x[t] . W[r] for r in [r0, r1), every t < T; y's rows ys apart. One row of x
 * alone, or four at a time (a group short of four repeats its last row, whose sums are
 * dropped): each block is unpacked once per group, each row's sums kept in its own chains
 * in the same order either way. */
#define DOT_BODY(HEAD, UNIT, ELEMS, NBYTES)                                                    \
    for (size_t r = r0; r < r1; r++) {                                                         \
        const uint8_t *row = w + r * rb;                                                       \
        if (T == 1) {                                                                          \
            vf a[NC];                                                                          \
            for (int i = 0; i < NC; i++) a[i] = zero;                                          \
            EACH_RUN(HEAD, ELEMS, NBYTES, {                                                    \
                vf v[NV];                                                                      \
                ISA(UNIT)(p, j, &h, v);                                                        \
                for (int i = 0; i < NV; i++)                                                   \
                    a[i % NC] = VFMA(v[i], ISA(vload)(x + c + VL * i), a[i % NC]);             \
            })                                                                                 \
            float s = ISA(finish)(a);                                                          \
            for (int q = blocks * ELEMS; q < cols; q++) s += tail_weight(qt, row, q) * x[q];   \
            y[r] = s;                                                                          \
            continue;                                                                          \
        }                                                                                      \
        for (int t0 = 0; t0 < T; t0 += 4) {                                                    \
            const float *x0 = x + (size_t)t0 * cols;                                           \
            const float *x1 = x + (size_t)(t0 + 1 < T ? t0 + 1 : T - 1) * cols;                \
            const float *x2 = x + (size_t)(t0 + 2 < T ? t0 + 2 : T - 1) * cols;                \
            const float *x3 = x + (size_t)(t0 + 3 < T ? t0 + 3 : T - 1) * cols;                \
            vf a0[NC], a1[NC], a2[NC], a3[NC];                                                 \
            for (int i = 0; i < NC; i++) a0[i] = a1[i] = a2[i] = a3[i] = zero;                 \
            EACH_RUN(HEAD, ELEMS, NBYTES, {                                                    \
                vf v[NV];                                                                      \
                ISA(UNIT)(p, j, &h, v);                                                        \
                for (int i = 0; i < NV; i++) {                                                 \
                    a0[i % NC] = VFMA(v[i], ISA(vload)(x0 + c + VL * i), a0[i % NC]);          \
                    a1[i % NC] = VFMA(v[i], ISA(vload)(x1 + c + VL * i), a1[i % NC]);          \
                    a2[i % NC] = VFMA(v[i], ISA(vload)(x2 + c + VL * i), a2[i % NC]);          \
                    a3[i % NC] = VFMA(v[i], ISA(vload)(x3 + c + VL * i), a3[i % NC]);          \
                }                                                                              \
            })                                                                                 \
            const vf *acc[4] = {a0, a1, a2, a3};                                               \
            const float *xs[4] = {x0, x1, x2, x3};                                             \
            for (int k = (T - t0 < 4 ? T - t0 : 4) - 1; k >= 0; k--) {                         \
                float s = ISA(finish)(acc[k]);                                                 \
                for (int q = blocks * ELEMS; q < cols; q++) s += tail_weight(qt, row, q) * xs[k][q]; \
                y[(size_t)(t0 + k) * ys + r] = s;                                              \
            }                                                                                  \
        }                                                                                      \
    }

static void ISA(dot_rows)(int qt, const uint8_t *w, size_t rb, size_t r0, size_t r1,
                          const float *x, int T, int cols, float *y, size_t ys) {
    const vf zero = {0};
    EACH_TYPE(DOT_BODY)
}

#ifdef I8_DOT_ACC
#include "native_kdots.h"
#include "native_int8.h"
#include "native_panels.h"
#endif

#ifdef AMX_TILES
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8")
#include "native_amx.h"
#pragma GCC pop_options
#endif

#undef EACH_RUN
#undef ROWS_OF_TYPE
#undef EACH_I8_TYPE
#undef I8_CASE
#undef EACH_TYPE
#undef UNIT_CASE
#undef I8_TYPES
#undef DEQ_BODY
#undef DOT_BODY
#undef NC
#undef NV

/* This ISA's parameters, undefined for the next one to define its own. */
#undef ISA
#undef VL
#undef vf
#undef VFMA
#undef HALF
#undef HALVES
#undef U8F
#undef S8F
#ifdef HALF_OF
#undef HALF_OF
#endif
#ifdef I8_DOT_ACC
#undef I8_DOT_ACC
#endif
