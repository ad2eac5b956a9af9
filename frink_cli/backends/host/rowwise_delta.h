/* The gated delta rule, token by token, in one fixed order: included by rowwise.c.
 *
 * Per value head, with S the head's [dk, dv] state (row i: key component i), for each token:
 *
 *     S = a S;   kS = S^T k;   S += k (beta (v - kS))^T;   o = S^T q
 *
 * or, without the delta (decayed linear attention, lightning attention's recurrence):
 *
 *     S = a S;   S += k (beta v)^T;   o = S^T q
 *
 * with the token's decay a (e^g, taken by the caller as its NumPy reference takes it).
 * Why a loop and not the chunked (WY/UT) form NumPy's prefill takes (gdn.py): that form
 * sums in an order set by the chunk, so a prompt cut anywhere else (a prefix resumed from a
 * server's cache, a chunk shared with other sequences) or a decode row gave other bits,
 * and 8-bit activations grow an ulp into a flipped token. Here a token's arithmetic is the
 * same whatever came in the call with it: every sum over i runs in key order, each of the
 * dv columns on its own (the vectorizer only widens over columns, and -ffp-contract=off
 * keeps a multiply and an add two roundings), so a row has the same bits alone, in any
 * chunk, on any ISA clone and thread count (heads are independent).
 * Cost: two passes over S per token and head (4 dk dv flops each), small beside a layer's
 * weight products.
 */


/* A C-contiguous float32 array of `ndim` dims (writable when asked), its shape checked
 * against want (-1: any). */
static int get_dense(PyObject *obj, int writable, int ndim, const Py_ssize_t *want,
                     const char *what, Py_buffer *view) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags)) return -1;
    const char *f = view->format && view->format[0] == '<' ? view->format + 1 : view->format;
    int ok = f && !strcmp(f, "f") && view->itemsize == 4 && view->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = want[d] < 0 || view->shape[d] == want[d];
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous float32 array of the "
                     "rule's shape", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *py_delta_rule(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *obj[7];
    int delta, threads;
    if (!PyArg_ParseTuple(args, "OOOOOOOpi", &obj[0], &obj[1], &obj[2], &obj[3], &obj[4],
                          &obj[5], &obj[6], &delta, &threads))
        return NULL;
    Py_buffer view[7];
    int held = 0;
    /* q [T, H, dk] fixes T, H, dk; v [T, H, dv] fixes dv. */
    const Py_ssize_t any3[3] = {-1, -1, -1};
    if (get_dense(obj[0], 0, 3, any3, "q", &view[0])) return NULL;
    held = 1;
    const Py_ssize_t T = view[0].shape[0], H = view[0].shape[1], dk = view[0].shape[2];
    const Py_ssize_t qk[3] = {T, H, dk}, vany[3] = {T, H, -1}, th[2] = {T, H};
    if (get_dense(obj[1], 0, 3, qk, "k", &view[1])) goto out;
    held = 2;
    if (get_dense(obj[2], 0, 3, vany, "v", &view[2])) goto out;
    held = 3;
    const Py_ssize_t dv = view[2].shape[2];
    const Py_ssize_t st[3] = {H, dk, dv}, ov[3] = {T, H, dv};
    if (get_dense(obj[3], 0, 2, th, "decay", &view[3])) goto out;
    held = 4;
    if (get_dense(obj[4], 0, 2, th, "beta", &view[4])) goto out;
    held = 5;
    if (get_dense(obj[5], 1, 3, st, "state", &view[5])) goto out;
    held = 6;
    if (get_dense(obj[6], 1, 3, ov, "o", &view[6])) goto out;
    held = 7;
    {
        const float *q = view[0].buf, *k = view[1].buf, *v = view[2].buf, *g = view[3].buf,
                    *beta = view[4].buf;
        float *S = view[5].buf, *o = view[6].buf;
        float *scratch = malloc(sizeof(float) * (size_t)(dv > 0 ? dv : 1) * (size_t)H);
        if (!scratch) {
            PyErr_NoMemory();
            goto out;
        }
        /* A decode row stays on the calling thread: its heads take about what waking the
         * pool does (0.2 ms at 32 heads of 128 x 128). */
        const int nt = T > 1 ? threads_for(T * H * dk * dv, threads) : 1;
        Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (Py_ssize_t h = 0; h < H; h++)
            LOOPS->delta_head(q + h * dk, k + h * dk, v + h * dv, g + h, beta + h, H * dk, H * dk,
                       H * dv, H, T, dk, dv, S + h * dk * dv, o + h * dv, H * dv,
                       scratch + h * dv, delta);
        Py_END_ALLOW_THREADS
        free(scratch);
    }
out:
    for (int i = 0; i < held; i++) PyBuffer_Release(&view[i]);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}
