/* frink_cli.backends.host._rowwise: the host body's row-wise ops in C, each one pass over its rows.
 *
 * Why: a prompt's norms, rotations and gated activations are a dozen NumPy passes each
 * (one per ufunc, every one over megabytes, on one thread): a third of a small model's
 * prefill once the products moved to int8 tiles (docs/performance.md). Here each row is
 * read once and written once, on the same OpenMP threads as the product kernels.
 *
 *   rms_norm(x, w | None, eps, out, threads)  out = x / sqrt(mean(x^2) + eps) * w
 *   rope(x, cos, sin, pos, neox, threads)     the first 2 * cos.shape[1] dims rotated in place
 *   glu(h, act, out, threads)                 out = act(gate) * up over rows [gate | up]
 *   delta_rule(q, k, v, a, beta, state, o,    the gated delta rule (or, delta off, decayed
 *              delta, threads)                linear attention) token by token (rowwise_delta.h)
 *
 * The arithmetic is llama.cpp's where it defines it: RMSNorm sums x^2 in double and scales
 * by 1 / sqrtf(mean + eps), then by the weight (ggml_rms_norm, then ggml_mul); rope is
 * x cos - y sin, y cos + x sin, each product rounded (rope.py's NumPy does the same
 * operations). The activations are written with exp alone: silu(g) = g / (1 + e^-g), and
 * gelu_tanh(g) = 0.5 g (1 + tanh(u)) = g / (1 + e^(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3),
 * which is also well conditioned where tanh(u) is near -1. exp_f32 is Cephes' expf
 * polynomial (within 2 ulp) written so the compiler vectorizes it.
 *
 * A row is made by one thread in a fixed order, so neither the thread count nor the rows
 * beside it change a result; each loop has no reassociation for the vectorizer to do (the
 * RMS sum keeps 8 explicit lanes), so every instruction set gives the same bits.
 *
 * Arrays are NumPy's float32, up to 3 dims, the last one contiguous, any strides before
 * it (a head's view into a fused QKV row): the shapes are checked here before a byte is
 * touched, so a wrong call raises rather than reads astray.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* 8 float lanes and their comparison masks as GCC vector types: lane-wise arithmetic, so
 * each lane's bits are the scalar steps' on every ISA (a clone splits them as it must). */
typedef float lanes8 __attribute__((vector_size(32)));
typedef int32_t mask8 __attribute__((vector_size(32)));
/* (a statement, not a function: a function returning one warns of the AVX ABI in the
 * baseline build) */
#define LOAD_LANES8(v, p) memcpy(&(v), (p), sizeof(lanes8))

/* Below this many elements a call runs on the calling thread (a decode row): waking the
 * pool costs more than the work. */
#define PARALLEL_ELEMS (1 << 15)

/* -- exp ---------------------------------------------------------------------------------- */

static inline float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* e^x within 2 ulp: x = n ln2 + r, |r| <= ln2 / 2, e^r by Cephes' expf polynomial, 2^n
 * put into the exponent. Below -87.3 (where e^x leaves the normal floats) it is 0, above
 * 88.7 infinity; NaN stays NaN. Branch-free, so a loop of it vectorizes. */
static inline float exp_f32(float x) {
    const float hi = 88.3762626647949f, lo = -87.3365478515625f;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float c = x > hi ? hi : x;
    c = c < lo ? lo : c;
    const float z = c * 1.44269504088896341f + magic;
    const float n = z - magic;
    /* ln2 in two parts: n * the first is exact for the n that occur. */
    float r = c - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    /* 2^n: n in [-126, 127] after the clamp, its bits the low ones of z's. */
    const int32_t k = (int32_t)(float_to_bits(z) - float_to_bits(magic));
    const float y = p * bits_to_float((uint32_t)(k + 127) << 23);
    return x > hi ? INFINITY : (x < lo ? 0.0f : (x == x ? y : x));
}

/* -- rows: a float32 array as (a, b) rows of n contiguous floats --------------------------- */

typedef struct {
    char *base;
    Py_ssize_t a, b, sa, sb; /* row (i, j) starts at base + i * sa + j * sb */
    Py_ssize_t n;
    Py_buffer view;
    /* A KV cache's page table (stored_at only; NULL: none): logical row j of a head is the
     * buffer's row table[j / page] * page + j % page, and b counts logical rows. */
    const int32_t *table;
    Py_ssize_t page;
} rows_of;

static void release(rows_of *r) {
    if (r->view.obj) PyBuffer_Release(&r->view);
}

/* obj as rows of `itemsize`-byte elements of one of the buffer formats `formats` (each
 * one character, e.g. "f"; writable when asked): 1-3 dims, the last contiguous. */
static int get_rows_of(PyObject *obj, int writable, const char *what, const char *formats,
                       Py_ssize_t itemsize, rows_of *r) {
    memset(r, 0, sizeof *r);
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &r->view, flags)) return -1;
    const Py_buffer *v = &r->view;
    const char *f = v->format && v->format[0] == '<' ? v->format + 1 : v->format;
    if (!f || strlen(f) != 1 || !strchr(formats, f[0]) || v->itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must be %s", what,
                     itemsize == 4 ? "float32" : itemsize == 2 ? "float16 or uint16" : "uint8");
        goto bad;
    }
    if (v->ndim < 1 || v->ndim > 3 || v->strides[v->ndim - 1] != itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must have 1-3 dims, the last contiguous", what);
        goto bad;
    }
    r->base = (char *)v->buf;
    r->n = v->shape[v->ndim - 1];
    r->a = v->ndim >= 2 ? v->shape[0] : 1;
    r->sa = v->ndim >= 2 ? v->strides[0] : 0;
    r->b = v->ndim == 3 ? v->shape[1] : 1;
    r->sb = v->ndim == 3 ? v->strides[1] : 0;
    return 0;
bad:
    release(r);
    return -1;
}

/* obj as rows of floats (writable when asked): 1-3 dims, the last contiguous. */
static int get_rows(PyObject *obj, int writable, const char *what, rows_of *r) {
    return get_rows_of(obj, writable, what, "f", 4, r);
}

static inline float *row_at(const rows_of *r, Py_ssize_t i) {
    return (float *)(r->base + (i / r->b) * r->sa + (i % r->b) * r->sb);
}

static int same_shape(const rows_of *x, const rows_of *y, const char *what) {
    if (x->a != y->a || x->b != y->b || x->n != y->n) {
        PyErr_Format(PyExc_ValueError, "%s must have x's shape", what);
        return -1;
    }
    return 0;
}

static int threads_for(Py_ssize_t elems, int threads) {
    return elems < PARALLEL_ELEMS || threads < 1 ? 1 : threads;
}

/* -- the row loops, one copy per instruction set (rowwise_loops.h) ---------------------------- */

/* Where the attention loops' variant changes (rowwise_kv_avx2.h's kv_set_isa): the row
 * loops follow it (loops_pick, below). */
static void loops_pick(void);

#include "rowwise_kv.h"
#include "rowwise_kv_avx2.h"
#if KV_HAS_AVX2
#include "rowwise_kv_avx512.h"
#endif

typedef struct {
    rows_of q, k, v, out; /* k, v: a cache type's stored rows (k.n, v.n: stored widths) */
    int kt, vt;           /* K's and V's cache types (rowwise_kv.h's KV_*) */
    float softcap;       /* 0: none */
    const float *slopes; /* [H] or NULL */
    const float *sinks;  /* [H] or NULL */
    const float *bias;   /* [H, 2 * center + 1] or NULL: a score bias by key - query position */
    Py_ssize_t center;   /* the bias table's column for key position == query position */
} attend_args;

enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

/* The row loops of one instruction set. */
typedef struct {
    void (*rms_norm_row)(const float *x, const float *w, float eps, Py_ssize_t n, float *out);
    void (*rope_row)(float *x, const float *cos, const float *sin, Py_ssize_t half, int neox);
    void (*glu_row)(const float *gate, const float *up, Py_ssize_t n, int act, float *out);
    float (*attend_weights)(const attend_args *A, Py_ssize_t n, Py_ssize_t d0, Py_ssize_t h,
                            float *s);
    void (*attend_head)(const attend_args *A, const float *q, Py_ssize_t kvh, Py_ssize_t j0,
                        Py_ssize_t n, Py_ssize_t d0, Py_ssize_t h, float *s, float *out);
    void (*exp_rows)(const float *x, Py_ssize_t n, float *out);
    void (*delta_head)(const float *restrict q, const float *restrict k, const float *restrict v,
                       const float *restrict a, const float *restrict beta, Py_ssize_t qs,
                       Py_ssize_t ks, Py_ssize_t vs, Py_ssize_t gs, Py_ssize_t T, Py_ssize_t dk,
                       Py_ssize_t dv, float *restrict S, float *restrict o, Py_ssize_t os,
                       float *restrict kS, int delta);
} row_loops;

#if KV_HAS_AVX2 && defined(__GNUC__) && !defined(__clang__)
#define ROW_LOOPS_X86 1
#pragma GCC push_options
#pragma GCC target("avx512f")
#define RW(name) name##_avx512
#include "rowwise_loops.h"
#undef RW
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2")
#define RW(name) name##_avx2
#include "rowwise_loops.h"
#undef RW
#pragma GCC pop_options
#else
#define ROW_LOOPS_X86 0
#endif
#define RW(name) name##_base
#include "rowwise_loops.h"
#undef RW

/* The copies in use: the attention loops' variant's (kv_isa). */
static const row_loops *LOOPS = &LOOPS_base;

static void loops_pick(void) {
#if ROW_LOOPS_X86
    const char *isa = kv_isa();
    LOOPS = !strcmp(isa, "avx512") ? &LOOPS_avx512 : !strcmp(isa, "avx2") ? &LOOPS_avx2 : &LOOPS_base;
#endif
}

/* row_loops(): which copy of the row loops runs now, read from the table in use. */
static PyObject *py_row_loops(PyObject *self, PyObject *args) {
    (void)self, (void)args;
#if ROW_LOOPS_X86
    if (LOOPS == &LOOPS_avx512) return PyUnicode_FromString("avx512");
    if (LOOPS == &LOOPS_avx2) return PyUnicode_FromString("avx2");
#endif
    return PyUnicode_FromString("portable");
}

/* -- RMSNorm ------------------------------------------------------------------------------- */


static PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *wo, *oo;
    float eps;
    int threads;
    if (!PyArg_ParseTuple(args, "OOfOi", &xo, &wo, &eps, &oo, &threads)) return NULL;
    rows_of x, w = {0}, out;
    if (get_rows(xo, 0, "x", &x)) return NULL;
    if (get_rows(oo, 1, "out", &out)) goto fail_x;
    if (same_shape(&x, &out, "out")) goto fail_out;
    if (wo != Py_None) {
        if (get_rows(wo, 0, "w", &w)) goto fail_out;
        if (w.view.ndim != 1 || w.n != x.n) {
            PyErr_Format(PyExc_ValueError, "w must be [%zd]", x.n);
            goto fail_w;
        }
    }
    {
        const Py_ssize_t rows = x.a * x.b, n = x.n;
        const float *wp = wo != Py_None ? (const float *)w.base : NULL;
        const int nt = threads_for(rows * n, threads);
        Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (Py_ssize_t i = 0; i < rows; i++) LOOPS->rms_norm_row(row_at(&x, i), wp, eps, n, row_at(&out, i));
        Py_END_ALLOW_THREADS
    }
    release(&w);
    release(&out);
    release(&x);
    Py_RETURN_NONE;
fail_w:
    release(&w);
fail_out:
    release(&out);
fail_x:
    release(&x);
    return NULL;
}

/* -- rope ---------------------------------------------------------------------------------- */


static PyObject *py_rope(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *co, *so, *po;
    int neox, threads;
    if (!PyArg_ParseTuple(args, "OOOOpi", &xo, &co, &so, &po, &neox, &threads)) return NULL;
    rows_of x, c, s;
    Py_buffer pos = {0};
    if (get_rows(xo, 1, "x", &x)) return NULL;
    if (get_rows(co, 0, "cos", &c)) goto fail_x;
    if (get_rows(so, 0, "sin", &s)) goto fail_c;
    if (PyObject_GetBuffer(po, &pos, PyBUF_ND | PyBUF_FORMAT)) goto fail_s;
    const Py_ssize_t half = c.n, T = x.view.ndim == 3 ? x.a : x.a * x.b;
    const Py_ssize_t per_t = x.view.ndim == 3 ? x.b : 1;
    if (c.view.ndim != 2 || same_shape(&c, &s, "sin") || 2 * half > x.n) {
        PyErr_SetString(PyExc_ValueError, "cos and sin must be [positions, <= head_dim / 2]");
        goto fail_pos;
    }
    /* int64 is "l" or "q" by platform */
    if (pos.ndim != 1 || pos.itemsize != 8 || !pos.format ||
        (strcmp(pos.format, "q") && strcmp(pos.format, "l")) || pos.shape[0] != T) {
        PyErr_Format(PyExc_ValueError, "pos must be int64 [%zd]", T);
        goto fail_pos;
    }
    const int64_t *p = (const int64_t *)pos.buf;
    for (Py_ssize_t t = 0; t < T; t++)
        if (p[t] < 0 || p[t] >= c.a) {
            PyErr_Format(PyExc_ValueError, "position %lld outside the %zd-row tables",
                         (long long)p[t], c.a);
            goto fail_pos;
        }
    {
        const Py_ssize_t rows = T * per_t;
        const int nt = threads_for(rows * half * 2, threads);
        Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (Py_ssize_t i = 0; i < rows; i++) {
            const Py_ssize_t t = i / per_t;
            LOOPS->rope_row(row_at(&x, i), row_at(&c, p[t]), row_at(&s, p[t]), half, neox);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&pos);
    release(&s);
    release(&c);
    release(&x);
    Py_RETURN_NONE;
fail_pos:
    PyBuffer_Release(&pos);
fail_s:
    release(&s);
fail_c:
    release(&c);
fail_x:
    release(&x);
    return NULL;
}

/* -- gated activations --------------------------------------------------------------------- */


static PyObject *py_glu(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ho, *oo;
    int act, threads;
    if (!PyArg_ParseTuple(args, "OiOi", &ho, &act, &oo, &threads)) return NULL;
    rows_of h, out;
    if (get_rows(ho, 0, "h", &h)) return NULL;
    if (get_rows(oo, 1, "out", &out)) goto fail_h;
    if (act != ACT_SILU && act != ACT_GELU_TANH) {
        PyErr_Format(PyExc_ValueError, "unknown activation %d", act);
        goto fail_out;
    }
    if (h.n % 2 || out.a * out.b != h.a * h.b || out.n != h.n / 2) {
        PyErr_SetString(PyExc_ValueError, "out must be h's rows, half as wide");
        goto fail_out;
    }
    {
        const Py_ssize_t rows = h.a * h.b, n = out.n;
        const int nt = threads_for(rows * n, threads);
        Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (Py_ssize_t i = 0; i < rows; i++) {
            const float *g = row_at(&h, i);
            LOOPS->glu_row(g, g + n, n, act, row_at(&out, i));
        }
        Py_END_ALLOW_THREADS
    }
    release(&out);
    release(&h);
    Py_RETURN_NONE;
fail_out:
    release(&out);
fail_h:
    release(&h);
    return NULL;
}

/* -- attention ----------------------------------------------------------------------------- */




/* Keys attend_rows widens at a time, and the query vectors (rows x heads) it aims to share
 * each widened key among (ROWS_SHARE / g rows, at most ROWS_MOST). */
#define GROUP_WIDEN 64
#define ROWS_SHARE 24
#define ROWS_MOST 8
#ifdef _OPENMP
#define THREAD_NUM omp_get_thread_num()
#else
#define THREAD_NUM 0
#endif

#if KV_HAS_AVX2
/* The union [*ulo, *uhi) of rows t0 .. t0 + R - 1's keys [lo[t], hi[t]). */
static void rows_union(const int64_t *lo, const int64_t *hi, Py_ssize_t t0, Py_ssize_t R,
                       Py_ssize_t *ulo, Py_ssize_t *uhi) {
    *ulo = lo[t0], *uhi = hi[t0];
    for (Py_ssize_t u = 1; u < R; u++) {
        *ulo = lo[t0 + u] < *ulo ? lo[t0 + u] : *ulo;
        *uhi = hi[t0 + u] > *uhi ? hi[t0 + u] : *uhi;
    }
}

/* Row t's keys among [i0, i0 + m): [*a, *b), and whether there are any. */
static inline int row_keys_in(const int64_t *lo, const int64_t *hi, Py_ssize_t t, Py_ssize_t i0,
                              Py_ssize_t m, Py_ssize_t *a, Py_ssize_t *b) {
    *a = lo[t] > i0 ? lo[t] : i0;
    *b = hi[t] < i0 + m ? hi[t] : i0 + m;
    return *a < *b;
}

/* The weighted values of keys [i0, i0 + m) (widened in vb) for rows t0 .. t0 + R - 1's
 * vectors (k = u g + v: weights vs[k] from key ulo, output vo[k]) where every row has keys
 * there: each vector's keys before the rows' common ones alone (kv_values_more), the
 * common ones in pairs (kv512_values), the rest alone, so each output element's adds stay
 * in key order. 0 (nothing done) where the rows share no key in the chunk. */
static int attend_values512(const attend_args *A, Py_ssize_t t0, Py_ssize_t R, const int64_t *lo,
                            const int64_t *hi, Py_ssize_t i0, Py_ssize_t m, Py_ssize_t ulo,
                            float *const *vs, float *const *vo, const float *vb) {
    const Py_ssize_t g = A->q.b / A->k.a, hv = A->out.n, nv = R * g;
    Py_ssize_t ca = i0, cb = i0 + m, a, b;
    for (Py_ssize_t u = 0; u < R; u++) {
        if (!row_keys_in(lo, hi, t0 + u, i0, m, &a, &b)) return 0;
        ca = a > ca ? a : ca, cb = b < cb ? b : cb;
    }
    if (ca >= cb) return 0;
    for (Py_ssize_t k = 0; k < nv; k++) {
        const Py_ssize_t t = t0 + k / g;
        row_keys_in(lo, hi, t, i0, m, &a, &b);
        if (a < ca)
            kv_values_more(vs[k] + (a - ulo), vb + (a - i0) * hv, ca - a, hv, vo[k], a == lo[t]);
        else if (ca == lo[t])
            memset(vo[k], 0, (size_t)hv * sizeof(float)); /* what kv_values_more's first starts from */
    }
    float *e[nv + 1];
    for (Py_ssize_t k = 0; k <= nv; k++) e[k] = vs[k] + (ca - ulo);
    kv512_values(e, vo, nv / 2, vb + (ca - i0) * hv, cb - ca, hv);
    if (nv % 2) kv_values_more(e[nv - 1], vb + (ca - i0) * hv, cb - ca, hv, vo[nv - 1], 0);
    for (Py_ssize_t k = 0; k < nv; k++) {
        row_keys_in(lo, hi, t0 + k / g, i0, m, &a, &b);
        if (b > cb) kv_values_more(vs[k] + (cb - ulo), vb + (cb - i0) * hv, b - cb, hv, vo[k], 0);
    }
    return 1;
}

/* attend_head for query rows t0 .. t0 + R - 1 and their g heads h0 .. h0 + g - 1, which share
 * KV head kvh: each key and value row of the rows' keys is widened to f32 once for all R * g
 * of them, GROUP_WIDEN rows at a time (into kb, vb), where attend_head widens it once per
 * row and head; two heads of a row share each key's loads (kv_scores_rows; with AVX-512,
 * every vector of the block in rowwise_kv_avx512.h's tiles, qp holding the paired queries,
 * (R g + 1) hk floats). Row t's keys
 * are [lo[t], hi[t]) of the cache's rows from `first` on, its position p[t]; their union
 * must fit `span` (scores: s, R * g * span floats). Every score, weight and output element
 * takes attend_head's AVX2 steps in its order, so its bits. */
static void attend_rows(const attend_args *A, Py_ssize_t t0, Py_ssize_t R, Py_ssize_t kvh,
                        const int64_t *lo, const int64_t *hi, const int64_t *p, Py_ssize_t first,
                        Py_ssize_t span, float *s, float *kb, float *vb, float *qp) {
    const Py_ssize_t H = A->q.b, g = H / A->k.a, h0 = kvh * g, hk = A->q.n, hv = A->out.n;
    const Py_ssize_t base = kvh * A->k.b;
    Py_ssize_t ulo, uhi, a, b;
    rows_union(lo, hi, t0, R, &ulo, &uhi);
    /* the scores of row u, head v: key ulo + i at i */
#define ROW_SCORES(u, v) (s + ((u) * g + (v)) * span)
    const Py_ssize_t ldq = A->q.sb / (Py_ssize_t)sizeof(float), ldo = A->out.sb / (Py_ssize_t)sizeof(float);
    const Py_ssize_t nv = R * g, pairs = (nv + 1) / 2;
    float *vs[nv + 1], *vo[nv + 1]; /* vector k = u g + v: its scores (key ulo at 0), output */
    const float *vq[nv];
    for (Py_ssize_t k = 0; k < nv; k++) {
        vs[k] = s + k * span;
        vq[k] = row_at(&A->q, (t0 + k / g) * H + h0) + k % g * ldq;
        vo[k] = row_at(&A->out, (t0 + k / g) * H + h0) + k % g * ldo;
    }
    vs[nv] = vs[nv - 1], vo[nv] = vo[nv - 1]; /* an odd one out's pair: itself */
    if (kv_use_avx512) kv512_pair_queries(vq, nv, hk, qp);
    for (Py_ssize_t i0 = ulo; i0 < uhi; i0 += GROUP_WIDEN) {
        const Py_ssize_t m = uhi - i0 < GROUP_WIDEN ? uhi - i0 : GROUP_WIDEN;
        kv_widen(A->kt, &A->k, base + i0 - first, m, hk, kb);
        if (kv_use_avx512) { /* every vector over all m keys: a score outside a row's keys is never read */
            float *at[nv + 1];
            for (Py_ssize_t k = 0; k <= nv; k++) at[k] = vs[k] + (i0 - ulo);
            kv512_scores(qp, pairs, kb, hk, m, at);
            continue;
        }
        for (Py_ssize_t u = 0; u < R; u++) {
            if (!row_keys_in(lo, hi, t0 + u, i0, m, &a, &b)) continue;
            const float *q = row_at(&A->q, (t0 + u) * H + h0);
            for (Py_ssize_t v = 0; v < g; v += 2)
                kv_scores_rows(q + v * ldq, v + 1 < g ? q + (v + 1) * ldq : NULL,
                               kb + (a - i0) * hk, hk, b - a, ROW_SCORES(u, v) + (a - ulo),
                               v + 1 < g ? ROW_SCORES(u, v + 1) + (a - ulo) : NULL);
        }
    }
    float total[R * g];
    for (Py_ssize_t u = 0; u < R; u++)
        for (Py_ssize_t v = 0; v < g; v++)
            total[u * g + v] = LOOPS->attend_weights(A, hi[t0 + u] - lo[t0 + u], p[t0 + u] - lo[t0 + u],
                                              h0 + v, ROW_SCORES(u, v) + (lo[t0 + u] - ulo));
    for (Py_ssize_t i0 = ulo; i0 < uhi; i0 += GROUP_WIDEN) {
        const Py_ssize_t m = uhi - i0 < GROUP_WIDEN ? uhi - i0 : GROUP_WIDEN;
        kv_widen(A->vt, &A->v, base + i0 - first, m, hv, vb);
        if (kv_use_avx512 && attend_values512(A, t0, R, lo, hi, i0, m, ulo, vs, vo, vb)) continue;
        for (Py_ssize_t u = 0; u < R; u++) {
            if (!row_keys_in(lo, hi, t0 + u, i0, m, &a, &b)) continue;
            float *out = row_at(&A->out, (t0 + u) * H + h0);
            for (Py_ssize_t v = 0; v < g; v++)
                kv_values_more(ROW_SCORES(u, v) + (a - ulo), vb + (a - i0) * hv, b - a, hv, out + v * ldo,
                               a == lo[t0 + u]);
        }
    }
#undef ROW_SCORES
    for (Py_ssize_t u = 0; u < R; u++) {
        float *out = row_at(&A->out, (t0 + u) * H + h0);
        for (Py_ssize_t v = 0; v < g; v++)
            for (Py_ssize_t d = 0; d < hv; d++) out[v * ldo + d] /= total[u * g + v];
    }
}
#endif

/* An optional float32 [n] argument (None: NULL), held in view. */
static int optional_vector(PyObject *o, Py_ssize_t n, const char *what, Py_buffer *view,
                           const float **p) {
    *p = NULL;
    if (o == Py_None) return 0;
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) return -1;
    if (!view->format || strcmp(view->format, "f") || view->ndim != 1 || view->shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "%s must be float32 [%zd]", what, n);
        PyBuffer_Release(view);
        view->obj = NULL;
        return -1;
    }
    *p = (const float *)view->buf;
    return 0;
}

/* Checks every shape and each query's key range [lo, hi) against the cache; the longest
 * range, or -1. */
static Py_ssize_t attend_check(const attend_args *A, const int64_t *lo, const int64_t *hi,
                               Py_ssize_t first) {
    const Py_ssize_t T = A->q.a, H = A->q.b, Hkv = A->k.a, S = A->k.b;
    if (A->q.view.ndim != 3 || A->k.view.ndim != 3 || A->v.view.ndim != 3 ||
        A->out.view.ndim != 3 || Hkv < 1 || H % Hkv || A->v.a != Hkv || A->v.b != S ||
        A->out.a != T || A->out.b != H || kv_widths_differ(A->kt, A->q.n, A->k.n) ||
        kv_widths_differ(A->vt, A->out.n, A->v.n)) {
        PyErr_SetString(PyExc_ValueError,
                        "attend takes q [T, H, hk], K [Hkv, S, hk], V [Hkv, S, hv], out [T, H, hv] "
                        "(K and V as their cache types store them)");
        return -1;
    }
    Py_ssize_t most = 0;
    for (Py_ssize_t t = 0; t < T; t++) {
        if (lo[t] < first || hi[t] <= lo[t] || hi[t] - first > S) {
            PyErr_Format(PyExc_ValueError, "the cache's rows [%zd, %zd) miss keys [%lld, %lld)",
                         first, first + S, (long long)lo[t], (long long)hi[t]);
            return -1;
        }
        most = hi[t] - lo[t] > most ? hi[t] - lo[t] : most;
    }
    return most;
}

/* An int64 [n] argument, held in view. */
static int int64_vector(PyObject *o, Py_ssize_t n, const char *what, Py_buffer *view) {
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) return -1;
    if (view->ndim != 1 || view->itemsize != 8 || !view->format ||
        (strcmp(view->format, "q") && strcmp(view->format, "l")) || view->shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "%s must be int64 [%zd]", what, n);
        return -1;
    }
    return 0;
}

/* The bias table: None, or float32 [H, 2 * center + 1]. */
static int bias_table(PyObject *o, Py_ssize_t H, Py_buffer *view, attend_args *A) {
    A->bias = NULL;
    if (o == Py_None) return 0;
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) return -1;
    if (!view->format || strcmp(view->format, "f") || view->ndim != 2 || view->shape[0] != H ||
        view->shape[1] != 2 * A->center + 1 || A->center < 0) {
        PyErr_Format(PyExc_ValueError, "bias must be float32 [%zd, 2 * center + 1]", H);
        return -1;
    }
    A->bias = (const float *)view->buf;
    return 0;
}

/* The page table: None (K and V rows as they lie), or int32 [pages] of K's and V's buffer
 * pages of `page` rows, the keys' logical rows n_rows (<= pages * page); every page index
 * is checked against both buffers, so a bad table is an error, never a stray read. */
static int page_table(PyObject *o, Py_ssize_t page, Py_ssize_t n_rows, Py_buffer *view,
                      attend_args *A) {
    if (o == Py_None) return 0;
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) return -1;
    const Py_ssize_t n = view->ndim == 1 ? view->shape[0] : -1;
    if (!view->format || strcmp(view->format, "i") || n < 0 || page < 1 || n_rows < 0 ||
        n_rows > n * page || A->k.b % page || A->v.b != A->k.b) {
        PyErr_SetString(PyExc_ValueError, "page table must be int32 [pages] over K and V "
                                          "buffers of whole pages, its rows <= pages * page");
        return -1;
    }
    const int32_t *t = (const int32_t *)view->buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (t[i] < 0 || (Py_ssize_t)t[i] >= A->k.b / page) {
            PyErr_Format(PyExc_ValueError, "page table entry %zd: page %d is not in the cache",
                         i, (int)t[i]);
            return -1;
        }
    A->k.table = A->v.table = t;
    A->k.page = A->v.page = page;
    A->k.b = A->v.b = n_rows;
    return 0;
}

static PyObject *py_attend(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *qo, *ko, *vo, *po, *loo, *hio, *so, *sko, *bo, *oo, *to;
    Py_ssize_t first, page, n_rows;
    int threads;
    attend_args A;
    memset(&A, 0, sizeof A);
    if (!PyArg_ParseTuple(args, "OOiOinOOOfOOOnOiOnn", &qo, &ko, &A.kt, &vo, &A.vt, &first, &po,
                          &loo, &hio, &A.softcap, &so, &sko, &bo, &A.center, &oo, &threads, &to,
                          &page, &n_rows))
        return NULL;
    Py_buffer pos = {0}, lov = {0}, hiv = {0}, slopes = {0}, sinks = {0}, bias = {0}, tab = {0};
    PyObject *ret = NULL;
    float *scratch = NULL;
    if (get_rows(qo, 0, "q", &A.q) || get_stored_rows(ko, A.kt, "K", &A.k) ||
        get_stored_rows(vo, A.vt, "V", &A.v) ||
        get_rows(oo, 1, "out", &A.out) || int64_vector(po, A.q.a, "positions", &pos) ||
        int64_vector(loo, A.q.a, "lo", &lov) || int64_vector(hio, A.q.a, "hi", &hiv) ||
        optional_vector(so, A.q.b, "slopes", &slopes, &A.slopes) ||
        optional_vector(sko, A.q.b, "sinks", &sinks, &A.sinks) || bias_table(bo, A.q.b, &bias, &A) ||
        page_table(to, page, n_rows, &tab, &A))
        goto done;
    const int64_t *p = (const int64_t *)pos.buf, *lo = (const int64_t *)lov.buf,
                  *hi = (const int64_t *)hiv.buf;
    const Py_ssize_t most = attend_check(&A, lo, hi, first);
    if (most < 0) goto done;
    const Py_ssize_t T = A.q.a, H = A.q.b, g = H / A.k.a, items = T * H;
    const int nt = threads_for(items * most * (A.q.n + A.v.n), threads);
    /* Rows and heads sharing a KV head go together (attend_rows: the same bits as a head at
     * a time) where that shares the work evenly among the threads: a whole number of blocks
     * each, or enough to even out (a decode row's 3 KV heads on 2 threads would leave one
     * idle half the time: its 9 heads go a head at a time). R rows a block, or one at a
     * time where the rows' keys lie apart (other sequences). */
    Py_ssize_t R = (ROWS_SHARE + g - 1) / g;
    R = R > ROWS_MOST ? ROWS_MOST : R;
    const Py_ssize_t blocks = (T + R - 1) / R, span = most + R, work = blocks * A.k.a;
    const int grouped = KV_HAS_AVX2 && kv_avx2_takes(A.q.n, A.out.n) &&
                        (work >= 4 * (Py_ssize_t)nt || work % nt == 0);
    /* a thread's scores, widened keys and values, and paired queries (rowwise_kv_avx512.h) */
    const Py_ssize_t per = grouped ? R * g * span + GROUP_WIDEN * (A.q.n + A.out.n) + (R * g + 1) * A.q.n : most;
    scratch = PyMem_RawMalloc((size_t)nt * (size_t)(per > 0 ? per : 1) * sizeof(float));
    if (!scratch) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
#if KV_HAS_AVX2
    if (grouped) {
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
        for (Py_ssize_t it = 0; it < work; it++) {
            float *s = scratch + (size_t)THREAD_NUM * (size_t)per;
            float *kb = s + R * g * span, *vb = kb + GROUP_WIDEN * A.q.n, *qp = vb + GROUP_WIDEN * A.out.n;
            const Py_ssize_t t0 = it / A.k.a * R, kvh = it % A.k.a;
            const Py_ssize_t n = T - t0 < R ? T - t0 : R;
            Py_ssize_t ulo, uhi;
            rows_union(lo, hi, t0, n, &ulo, &uhi);
            if (uhi - ulo <= span)
                attend_rows(&A, t0, n, kvh, lo, hi, p, first, span, s, kb, vb, qp);
            else
                for (Py_ssize_t u = 0; u < n; u++)
                    attend_rows(&A, t0 + u, 1, kvh, lo, hi, p, first, span, s, kb, vb, qp);
        }
    } else
#endif
    {
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
        for (Py_ssize_t it = 0; it < items; it++) {
            float *s = scratch + (size_t)THREAD_NUM * (size_t)per;
            const Py_ssize_t t = it / H, h = it % H;
            LOOPS->attend_head(&A, row_at(&A.q, it), h / g, lo[t] - first, hi[t] - lo[t], p[t] - lo[t],
                        h, s, row_at(&A.out, it));
        }
    }
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    PyMem_RawFree(scratch);
    Py_buffer *views[] = {&tab, &bias, &sinks, &slopes, &hiv, &lov, &pos};
    for (size_t i = 0; i < sizeof views / sizeof *views; i++)
        if (views[i]->obj) PyBuffer_Release(views[i]);
    release(&A.out);
    release(&A.v);
    release(&A.k);
    release(&A.q);
    return ret;
}

/* -- exp, for tests ------------------------------------------------------------------------ */


static PyObject *py_exp(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *oo;
    if (!PyArg_ParseTuple(args, "OO", &xo, &oo)) return NULL;
    rows_of x, out;
    if (get_rows(xo, 0, "x", &x)) return NULL;
    if (get_rows(oo, 1, "out", &out)) {
        release(&x);
        return NULL;
    }
    if (same_shape(&x, &out, "out")) {
        release(&out);
        release(&x);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < x.a * x.b; i++) LOOPS->exp_rows(row_at(&x, i), x.n, row_at(&out, i));
    release(&out);
    release(&x);
    Py_RETURN_NONE;
}

#include "rowwise_delta.h"

static PyMethodDef METHODS[] = {
    {"rms_norm", py_rms_norm, METH_VARARGS,
     "rms_norm(x, w | None, eps, out, threads): out = x / sqrt(mean(x^2) + eps) * w per row"},
    {"rope", py_rope, METH_VARARGS,
     "rope(x, cos, sin, pos int64, neox, threads): x's rows at pos[t] rotated in place"},
    {"glu", py_glu, METH_VARARGS,
     "glu(h, act (0 silu, 1 gelu_tanh), out, threads): out = act(gate) * up, h = [gate | up]"},
    {"attend", py_attend, METH_VARARGS,
     "attend(q, K, K type, V, V type, first, pos int64, lo int64, hi int64, softcap (0 none), "
     "slopes | None, sinks | None, bias | None, center, out, threads, table | None, page, rows): "
     "softmax(q K^T + bias) V per query row and head over its keys [lo, hi), each row alone; K "
     "and V stored as cache types (0 f32, 1 f16, 2 bf16, 3 q8_0, 4 q4_0), read through the "
     "int32 page table (pages of `page` rows, `rows` logical rows) where one is given"},
    {"exp", py_exp, METH_VARARGS, "exp(x, out): the e^x the activations use"},
    {"delta_rule", py_delta_rule, METH_VARARGS,
     "delta_rule(q [T,H,dk], k, v [T,H,dv], decay [T,H], beta, state [H,dk,dv] (updated), o "
     "[T,H,dv], delta, threads): the gated delta rule (delta false: decayed linear "
     "attention) token by token, in one fixed order"},
    {"row_loops", py_row_loops, METH_NOARGS,
     "row_loops() -> the row loops' copy in use (avx512, avx2 or portable): attend_isa's"},
    {"attend_isa", py_attend_isa, METH_VARARGS,
     "attend_isa(name=None) -> the attention loops' variant (avx512, avx2, or portable under "
     "FRINK_NATIVE_ISA=base) before `name` (for tests) is made the one used"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_rowwise", NULL, -1, METHODS, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rowwise(void) {
    kv_pick_isa();
    loops_pick();
    return PyModule_Create(&MODULE);
}
