/* Prompt products with AMX int8 tiles: included by native_isa.h in the AVX-512 region only
 * (AMX_TILES defined there), under its own `#pragma GCC target` adding amx-tile, amx-int8.
 * native.c runs it only when the CPU has AMX and Linux granted this process the tile state.
 *
 * Why: a prompt's rows all share each weight, and an AMX tile multiply (tdpbssd) makes a
 * 16 x 16 block of int32 dot products of 32 bytes each in one instruction, ~10x the rate
 * of f32 FMA (which BLAS reaches). The math is the 8-bit dots' (native_int8.h): x rounded
 * per 32 columns as llama.cpp rounds it for W's type, a run of 32 weights = sc * code + k,
 *
 *     y[m, n] = sum_u (sc[n, u] * dx[m, u]) * S[m, n, u] + k[n, u] * dsum32[m, u],
 *
 * S the int32 sum of code * q over run u: one tile product per run (K = 32, the run's
 * scale changing from one run to the next), its 16 x 16 sums scaled and added in f32
 * with AVX-512. So the products equal the 8-bit dots' up to the order of f32 sums.
 *
 * Tiles: A = 16 rows of x's int8 codes, 32 columns (rounded once per call and laid out
 * a tile after another: native.c put_tile_row); B = 16 rows of W's codes for the same 32 columns in the VNNI
 * layout tdpbssd reads (row r holds, for each of the 16 rows n, codes 4r .. 4r + 3),
 * unpacked from the blocks per call into a panel (`amx_panel`): W stays in its blocks.
 * C = A B^T, row m of C a vector of 16 outputs of row m of x.
 *
 * Each output is made by one (16 rows of x, 16 rows of W) tile pair, its runs added in
 * column order, whatever the rows of x beside it (x is padded to 16 rows with zeros) or
 * the threads: a row's product is the same bit for bit alone or in any batch.
 *
 * Rate (a Sapphire Rapids VM, one core): ~450-500 GOPS on 512 rows of x, ~3x OpenBLAS's
 * f32 GEMM, well short of the tiles' peak: each run's 1 KiB of int32 sums goes through a
 * tile store and vector loads to be scaled (3 vector ops per 16 sums), so the scaling,
 * not the tile products, sets the pace; four runs in flight or x's scales laid out per
 * tile changed nothing measurable.
 *
 * Q2_K, Q3_K and Q6_K change scales every 16 columns: their runs of 32 are two tile
 * products of 16 columns each (A tiles of 16 columns, B of 4 rows), each half scaled as its
 * own run: ~0.6x the rate of the others.
 */

/* The offset some types subtract from their codes (native_int8.h's i8_* give it as k =
 * -zero * sc: Q4_0's 8, Q5_0's 16, Q3_K's 4, Q6_K's 32): subtracted from the codes
 * themselves, signed bytes then, so the tile sums need no k term. */
static int ISA(amx_zero)(int qt) {
    switch (qt) {
    case QT_Q4_0: return 8;
    case QT_Q5_0: return 16;
    case QT_Q3_K: return 4;
    case QT_Q6_K: return 32;
    default: return 0;
    }
}

/* Whether W's runs carry a k term (a min) beside the scaled codes. */
static int ISA(amx_has_k)(int qt) {
    return qt == QT_Q4_1 || qt == QT_Q5_1 || qt == QT_Q2_K || qt == QT_Q4_K || qt == QT_Q5_K;
}

/* Whether the type's scales change every 16 columns (two tile products per run of 32). */
static int ISA(amx_split)(int qt) { return qt == QT_Q2_K || qt == QT_Q3_K || qt == QT_Q6_K; }

static int ISA(amx_serves)(int qt) {
    switch (qt) {
    case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: case QT_Q8_0: case QT_Q2_K:
    case QT_Q3_K: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_IQ4_NL: case QT_IQ4_XS:
    case QT_MXFP4: return 1;
    default: return 0;
    }
}

/* Palette 1: tiles 0-3 are C (16 x 16 int32), 4, 5 A (16 rows of x's codes: 32 bytes, 16
 * for the split types), 6, 7 B (8 rows of 64 bytes, 4 for the split types). Four runs in
 * flight, as the tiles are not renamed and a run's sums take a while to come. Tile state
 * is per thread: each thread loads it for W's type before its first tile and releases it
 * after its last. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) ISA(amx_config);

static void ISA(amx_begin)(int qt) {
    const int split = ISA(amx_split)(qt);
    ISA(amx_config) cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t < 6 ? AMX_TILE : split ? 4 : 8;
        cfg.colsb[t] = t < 4 || t >= 6 ? 64 : split ? 16 : 32;
    }
    /* GCC 12 does not count ldtilecfg as reading its operand and drops the stores above
     * without this barrier (the tiles then fault as unconfigured). */
    __asm__ __volatile__("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

static void ISA(amx_end)(void) { _tile_release(); }

/* Rows [n0, n0 + 16) of W (those past `rows` zero) unpacked for the B tiles: per run u of
 * 32 columns bt[u] = the codes in VNNI layout (AMX_PANEL_UNIT bytes; its first half the
 * first 16 columns'); sc[16 v + n], k[16 v + n] per scaled run v (u, or 2 u and 2 u + 1
 * for the split types). */
#define PANEL_BODY(HEAD, UNIT, ELEMS, NBYTES)                                                  \
    for (int n = 0; n < AMX_TILE && n0 + (size_t)n < rows; n++) {                              \
        const uint8_t *row = w + (n0 + n) * rb;                                                \
        EACH_RUN(HEAD, ELEMS, NBYTES, {                                                        \
            ISA(icodes) cd;                                                                    \
            ISA(UNIT)(p, j, &h, &cd);                                                          \
            const __m256i codes = _mm256_sub_epi8(cd.codes, zero);                             \
            _mm256_i32scatter_epi32(bt + (size_t)u * AMX_PANEL_UNIT + 4 * n, at, codes, 1);     \
            for (int half = 0; half <= cd.split; half++) {                                     \
                const int v = (cd.split + 1) * u + half;                                       \
                sc[AMX_TILE * v + n] = cd.sc[half];                                            \
                k[AMX_TILE * v + n] = cd.has_k && !folded ? cd.k[half] : 0.0f;                 \
            }                                                                                  \
        })                                                                                     \
    }

static void ISA(amx_panel)(int qt, const uint8_t *w, size_t rb, size_t rows, size_t n0, int cols,
                           int8_t *bt, float *sc, float *k) {
    const int nu = cols / 32, folded = ISA(amx_zero)(qt), split = ISA(amx_split)(qt);
    const __m256i zero = _mm256_set1_epi8((char)folded);
    /* dword r of a row's 32 codes goes to B's row r: 64 bytes on */
    const __m256i at = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
    if (n0 + AMX_TILE > rows) { /* a short panel: the missing rows multiply as zeros */
        const size_t runs = (size_t)nu * (split + 1);
        memset(bt, 0, (size_t)nu * AMX_PANEL_UNIT);
        memset(sc, 0, runs * AMX_TILE * sizeof(float));
        memset(k, 0, runs * AMX_TILE * sizeof(float));
    }
    EACH_I8_TYPE(PANEL_BODY)
}
#undef PANEL_BODY

/* A scaled run's 16 x 16 int32 sums c (row m: x row m's sums with the panel's 16 rows)
 * added into acc[m] in f32: scaled by sc * dx[m], plus the k term k * dsum[m]. */
static INLINE void ISA(amx_add_run)(const int32_t *c, const float *sc, const float *k,
                                    const float *dx, const float *dsum, int has_k, __m512 *acc) {
    const __m512 scv = _mm512_loadu_ps(sc);
    const __m512 kv = has_k ? _mm512_loadu_ps(k) : _mm512_setzero_ps();
    for (int m = 0; m < AMX_TILE; m++) {
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(dx[m]), scv);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + AMX_TILE * m)), s, acc[m]);
        if (has_k) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(dsum[m]), kv, acc[m]);
    }
}

/* Scaled runs multiplied before their sums are scaled: the sums go through memory (a
 * tile's int32 reach vectors only by a tile store and loads), and a chunk's stores are
 * long done when its loads come, where a load straight after its store would wait. */
#define AMX_CHUNK 8

/* Scaled run v's tile product into c, in tiles A, B, C: v a run of 32 columns or, split,
 * half a run (x's columns 16 on in its tile, W's rows 4 on). */
#define AMX_RUN(C, A, B, v, c)                                                                 \
    do {                                                                                       \
        const size_t tile_ = (size_t)(split ? (v) / 2 : (v)) * AMX_PANEL_UNIT;                 \
        const int half_ = split ? (v) % 2 : 0;                                                 \
        _tile_loadd(A, qm + tile_ + 16 * half_, 32);                                           \
        _tile_loadd(B, b + tile_ + 256 * half_, 64);                                           \
        _tile_zero(C);                                                                         \
        _tile_dpbssd(C, A, B);                                                                 \
        _tile_stored(C, c, 64);                                                                \
    } while (0)

/* y[m, n0 + n] for rows m of x in [m0, m0 + 16) (those below T stored) and the panel's
 * rows n < nr. x as native.c put_tile_row lays it out: its codes q, its floats xf, per row
 * quantize_row's dx per 32 columns, dx * sum q per 16, per 32 (16 rows side by side);
 * dsum the k terms' (per 16 columns for the split types). Runs in column order, a chunk
 * at a time, in alternate tiles. */
static INLINE void ISA(amx_tile_body)(const int8_t *q, const float *xf, int cols,
                                      const int8_t *b, const float *sc, const float *k,
                                      int has_k, int split, int m0, int T, size_t n0, int nr,
                                      float *y, size_t ys) {
    const int runs = cols / (split ? 16 : 32), nb = cols / 32;
    const int8_t *qm = q + (size_t)m0 * cols;
    const float *dm = xf + (size_t)m0 * 4 * nb;
    const float *sm = dm + (size_t)(split ? nb : 3 * nb) * AMX_TILE;
    int32_t c[AMX_CHUNK][AMX_TILE * AMX_TILE] __attribute__((aligned(64)));
    __m512 acc[AMX_TILE];
    for (int m = 0; m < AMX_TILE; m++) acc[m] = _mm512_setzero_ps();
    for (int v0 = 0; v0 < runs; v0 += AMX_CHUNK) {
        const int n = runs - v0 < AMX_CHUNK ? runs - v0 : AMX_CHUNK;
        int i = 0;
        for (; i + 3 < n; i += 4) {
            AMX_RUN(0, 4, 6, v0 + i, c[i]);
            AMX_RUN(1, 5, 7, v0 + i + 1, c[i + 1]);
            AMX_RUN(2, 4, 6, v0 + i + 2, c[i + 2]);
            AMX_RUN(3, 5, 7, v0 + i + 3, c[i + 3]);
        }
        for (; i < n; i++) AMX_RUN(0, 4, 6, v0 + i, c[i]);
        for (i = 0; i < n; i++) {
            const int v = v0 + i;
            ISA(amx_add_run)(c[i], sc + AMX_TILE * v, k + AMX_TILE * v,
                             dm + AMX_TILE * (split ? v / 2 : v), sm + AMX_TILE * v, has_k, acc);
        }
    }
    const __mmask16 cols_in = (__mmask16)((1u << nr) - 1);
    for (int m = 0; m < AMX_TILE && m0 + m < T; m++)
        _mm512_mask_storeu_ps(y + (size_t)(m0 + m) * ys + n0, cols_in, acc[m]);
}
#undef AMX_RUN
#undef AMX_CHUNK

/* One panel of W (rows [n0, n0 + 16)) times every row of x: y's columns [n0, n0 + 16). */
static void ISA(amx_panel_rows)(int qt, const int8_t *q, const float *xf, int T, int cols,
                                const int8_t *b, const float *sc, const float *k, size_t n0,
                                size_t rows, float *y) {
    const int nr = rows - n0 < AMX_TILE ? (int)(rows - n0) : AMX_TILE;
    const int has_k = ISA(amx_has_k)(qt), split = ISA(amx_split)(qt);
    for (int m0 = 0; m0 < T; m0 += AMX_TILE) {
        /* each case its own copy of the body, the flags constant in it */
        if (split && has_k)
            ISA(amx_tile_body)(q, xf, cols, b, sc, k, 1, 1, m0, T, n0, nr, y, rows);
        else if (split)
            ISA(amx_tile_body)(q, xf, cols, b, sc, k, 0, 1, m0, T, n0, nr, y, rows);
        else if (has_k)
            ISA(amx_tile_body)(q, xf, cols, b, sc, k, 1, 0, m0, T, n0, nr, y, rows);
        else
            ISA(amx_tile_body)(q, xf, cols, b, sc, k, 0, 0, m0, T, n0, nr, y, rows);
    }
}
