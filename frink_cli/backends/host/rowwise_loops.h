/* The host body's row loops, one copy per instruction set: included by rowwise.c once for
 * each (RW(name) names that copy: name_avx512, name_avx2, name_base), each copy compiled
 * for its target (rowwise.c's `#pragma GCC target`), and ends with its table of the copies
 * (RW(LOOPS)), which rowwise.c picks from as FRINK_NATIVE_ISA and attend_isa say.
 *
 * Why copies picked by hand rather than GCC's target_clones: the clones were picked by the
 * CPU alone, so a forced variant (FRINK_NATIVE_ISA=avx2 or base, or a test's attend_isa)
 * still ran the AVX-512 norms, activations and softmax weights: the AVX2 and portable
 * variants were never run whole on a machine with AVX-512. Each loop has no reassociation
 * for the vectorizer to do, so every copy gives the same bits.
 *
 * Not include-guarded: it is meant to be read three times. */

static void RW(rms_norm_row)(const float *x, const float *w, float eps, Py_ssize_t n, float *out) {
    double lane[8] = {0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += (double)(x[i + l] * x[i + l]);
    double sum = ((lane[0] + lane[4]) + (lane[2] + lane[6])) +
                 ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    if (w)
        for (Py_ssize_t j = 0; j < n; j++) out[j] = x[j] * scale * w[j];
    else
        for (Py_ssize_t j = 0; j < n; j++) out[j] = x[j] * scale;
}

/* Pairs (x[i], x[i + half]) (neox) or (x[2i], x[2i + 1]) rotated by cos[i], sin[i]. */
static void RW(rope_row)(float *x, const float *cos, const float *sin, Py_ssize_t half, int neox) {
    if (neox) {
        float *a = x, *b = x + half;
        for (Py_ssize_t i = 0; i < half; i++) {
            const float u = a[i], v = b[i];
            a[i] = u * cos[i] - v * sin[i];
            b[i] = v * cos[i] + u * sin[i];
        }
    } else {
        for (Py_ssize_t i = 0; i < half; i++) {
            const float u = x[2 * i], v = x[2 * i + 1];
            x[2 * i] = u * cos[i] - v * sin[i];
            x[2 * i + 1] = v * cos[i] + u * sin[i];
        }
    }
}

static void RW(glu_row)(const float *gate, const float *up, Py_ssize_t n, int act, float *out) {
    if (act == ACT_SILU) {
        for (Py_ssize_t i = 0; i < n; i++) {
            const float g = gate[i];
            out[i] = g / (1.0f + exp_f32(-g)) * up[i];
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            const float g = gate[i];
            const float u = 0.7978845608028654f * (g + 0.044715f * g * g * g);
            out[i] = g / (1.0f + exp_f32(-2.0f * u)) * up[i];
        }
    }
}

/* A query head's scores s [n] (key i at distance d0 - i) into softmax weights, unnormalized:
 * softcap, ALiBi slopes and the bias table applied, exp(s - max) in place; returns their
 * total (the sink's term included), a sum of 8 lanes in key order. The bias column of key i is
 * center - d0 + i, clipped to the table (its edge columns stand for every farther distance). */
static float RW(attend_weights)(const attend_args *A, Py_ssize_t n, Py_ssize_t d0, Py_ssize_t h,
                            float *s) {
    if (A->softcap != 0.0f)
        for (Py_ssize_t i = 0; i < n; i++) s[i] = A->softcap * tanhf(s[i] / A->softcap);
    if (A->slopes)
        for (Py_ssize_t i = 0; i < n; i++) s[i] -= A->slopes[h] * (float)(d0 - i);
    if (A->bias) {
        const Py_ssize_t last = 2 * A->center;
        const float *row = A->bias + h * (last + 1);
        for (Py_ssize_t i = 0; i < n; i++) {
            const Py_ssize_t c = A->center - d0 + i;
            s[i] += row[c < 0 ? 0 : c > last ? last : c];
        }
    }
    /* The largest score in 8 lanes: the same maximum, whatever order. The lanes are a
     * vector type, not an array GCC may vectorize: it left the array's loops scalar (8
     * vmaxss, 8 vaddss per 8 scores), a third of a prompt's weights time. */
    float m = A->sinks ? A->sinks[h] : -INFINITY;
    lanes8 top = m + (lanes8){0};
    Py_ssize_t k = 0;
    for (; k + 8 <= n; k += 8) {
        lanes8 v;
        LOAD_LANES8(v, s + k);
        const mask8 more = v > top; /* s > top ? s : top, lane by lane */
        top = (lanes8)(((mask8)v & more) | ((mask8)top & ~more));
    }
    for (; k < n; k++) m = s[k] > m ? s[k] : m;
    for (int l = 0; l < 8; l++) m = top[l] > m ? top[l] : m;
    for (Py_ssize_t i = 0; i < n; i++) s[i] = exp_f32(s[i] - m);
    lanes8 lane = {0}; /* lane l: the weights of keys l, l + 8, ... summed in key order */
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        lanes8 v;
        LOAD_LANES8(v, s + i);
        lane += v;
    }
    float total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; i < n; i++) total += s[i];
    if (A->sinks) total += exp_f32(A->sinks[h] - m);
    return total;
}

/* One query row's head against keys [j0, j0 + n) of its KV head kvh, key i at distance
 * d0 - i from the query (query position minus key position): softmax(q k^T) v into out, the
 * scores in s [n]. Each key's score is dot_lanes, the denominator a sum of 8 lanes in key
 * order, each output element a sum in key order normalized last: the same bits whatever rows
 * or chunk the query came in. */
static void RW(attend_head)(const attend_args *A, const float *q, Py_ssize_t kvh, Py_ssize_t j0,
                        Py_ssize_t n, Py_ssize_t d0, Py_ssize_t h, float *s, float *out) {
    const Py_ssize_t hk = A->q.n, hv = A->out.n, base = kvh * A->k.b + j0;
    const int avx2 = kv_avx2_takes(hk, hv);
#if KV_HAS_AVX2
    if (avx2)
        KV_SCORES_AVX2[A->kt](q, hk, &A->k, base, n, s);
    else
#endif
    {
        const kv_rows keys = kv_rows_from(&A->k, base);
        for (Py_ssize_t i = 0; i < n; i++) s[i] = dot_key(A->kt, q, kv_row(&keys, i), hk);
    }
    const float total = RW(attend_weights)(A, n, d0, h, s);
#if KV_HAS_AVX2
    if (avx2)
        KV_VALUES_AVX2[A->vt](s, &A->v, base, n, hv, out);
    else
#endif
    {
        for (Py_ssize_t d = 0; d < hv; d++) out[d] = 0.0f;
        const kv_rows values = kv_rows_from(&A->v, base);
        for (Py_ssize_t j = 0; j < n; j++) add_value(A->vt, out, s[j], kv_row(&values, j), hv);
    }
    for (Py_ssize_t d = 0; d < hv; d++) out[d] /= total;
}

static void RW(exp_rows)(const float *x, Py_ssize_t n, float *out) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = exp_f32(x[i]);
}

/* One head: T tokens of q, k (dk each), v (dv each), decay a and beta (one each) at strides
 * (floats between tokens) qs, ks, vs, gs; o's rows os apart; S [dk, dv] updated in place;
 * kS one dv-wide scratch row. */
static void RW(delta_head)(const float *restrict q, const float *restrict k,
                       const float *restrict v, const float *restrict a,
                       const float *restrict beta, Py_ssize_t qs, Py_ssize_t ks, Py_ssize_t vs,
                       Py_ssize_t gs, Py_ssize_t T, Py_ssize_t dk, Py_ssize_t dv,
                       float *restrict S, float *restrict o, Py_ssize_t os,
                       float *restrict kS, int delta) {
    for (Py_ssize_t t = 0; t < T; t++) {
        const float *qt = q + t * qs, *kt = k + t * ks, *vt = v + t * vs;
        const float decay = a[t * gs], b = beta[t * gs];
        float *restrict ot = o + t * os;
        for (Py_ssize_t j = 0; j < dv; j++) kS[j] = 0.0f;
        for (Py_ssize_t i = 0; i < dk; i++) {
            float *restrict Si = S + i * dv;
            const float ki = kt[i];
            if (delta)
                for (Py_ssize_t j = 0; j < dv; j++) {
                    Si[j] = Si[j] * decay;
                    kS[j] = kS[j] + ki * Si[j];
                }
            else
                for (Py_ssize_t j = 0; j < dv; j++) Si[j] = Si[j] * decay;
        }
        for (Py_ssize_t j = 0; j < dv; j++) kS[j] = (vt[j] - kS[j]) * b; /* now the update */
        for (Py_ssize_t j = 0; j < dv; j++) ot[j] = 0.0f;
        for (Py_ssize_t i = 0; i < dk; i++) {
            float *restrict Si = S + i * dv;
            const float ki = kt[i], qi = qt[i];
            for (Py_ssize_t j = 0; j < dv; j++) {
                Si[j] = Si[j] + ki * kS[j];
                ot[j] = ot[j] + qi * Si[j];
            }
        }
    }
}

static const row_loops RW(LOOPS) = {RW(rms_norm_row), RW(rope_row),       RW(glu_row),
                                   RW(attend_weights), RW(attend_head), RW(exp_rows),
                                   RW(delta_head)};
