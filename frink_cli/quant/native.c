/* frink_cli.quant._native: the host kernels over GGUF blocks, in C.
 *
 * Why C and not a JIT: a decode step multiplies by every weight once, straight from the
 * file's blocks, and these loops are the whole of its cost. Compiled at install time they
 * cost nothing at run time; numba's LLVM, which this replaced, held ~120 MiB of memory in
 * every process (more than SmolLM2's weights) and compiled for a minute on first use.
 *
 * One source, several instruction sets: native_isa.h is included once per ISA inside a
 * `#pragma GCC target` region (x86-64: AVX-512, AVX2 + FMA with and without AVX-VNNI, and
 * the baseline), and the best one the CPU supports is picked when the module loads
 * (FRINK_NATIVE_ISA=base|avx2|avxvnni|avx512|avx512+amx picks one, for tests). Where the CPU has AMX int8 tiles and Linux
 * grants them, "avx512+amx" is the AVX-512 kernels plus tile products for a prompt's rows
 * (native_amx.h); FRINK_NATIVE_ISA=avx512 leaves the tiles out. Elsewhere (arm64, other
 * compilers) the baseline alone is built, which the compiler vectorizes for its own target.
 *
 * Threads: OpenMP over chunks of W's rows, as many as the caller passes (frink's decoder
 * chooses per step); each output element is made by one thread in a fixed order, so the
 * count never changes a result. The GIL is released while a kernel runs.
 *
 * Python passes every shape; this file checks each buffer is large enough for them (and
 * each row index in range) before touching it, so a wrong call raises, never reads astray.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* ggml's type numbers (gguf-py GGMLQuantizationType); F32 marks a plain f32 matrix. */
enum {
    QT_F32 = 0, QT_F16 = 1, QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q5_1 = 7, QT_Q8_0 = 8,
    QT_Q2_K = 10, QT_Q3_K = 11, QT_Q4_K = 12, QT_Q5_K = 13, QT_Q6_K = 14, QT_IQ4_NL = 20,
    QT_IQ4_XS = 23, QT_BF16 = 30, QT_MXFP4 = 39,
};

/* The per-type steps must fold into each type's loop (a call per run of 32 would cost
 * more than the run), whatever the compiler's size heuristics say. */
#define INLINE inline __attribute__((always_inline))

/* Bytes of W a dot loop asks the cache for ahead of the block it reads: measured on this
 * project's VMs, W streamed from memory ran ~3x slower than from cache without it (the
 * hardware prefetcher alone did not keep up with a row walk of small blocks). */
#define PREFETCH_AHEAD 4096
/* Rows of W per parallel work item. */
#define ROW_CHUNK 16
/* Rows of x the 8-bit dots take at once (a tile): each K-quant block of W is unpacked
 * once per tile (native_kdots.h). */
#define ROW_TILE 8
/* AMX tile products (native_amx.h): rows of x and rows of W per tile, and the bytes of W's
 * codes per tile of one run of 32 columns (16 rows of 32). */
#define AMX_TILE 16
#define AMX_PANEL_UNIT 512

typedef struct {
    int qt, elems, nbytes;
} qtype_geometry;

static const qtype_geometry GEOMETRY[] = {
    {QT_F32, 1, 4},      {QT_F16, 1, 2},      {QT_Q4_0, 32, 18},   {QT_Q4_1, 32, 20},
    {QT_Q5_0, 32, 22},   {QT_Q5_1, 32, 24},   {QT_Q8_0, 32, 34},   {QT_Q2_K, 256, 84},
    {QT_Q3_K, 256, 110}, {QT_Q4_K, 256, 144}, {QT_Q5_K, 256, 176}, {QT_Q6_K, 256, 210},
    {QT_IQ4_NL, 32, 18}, {QT_IQ4_XS, 256, 136}, {QT_BF16, 1, 2},   {QT_MXFP4, 32, 17},
};

/* W's rows in panels of PANEL_ROWS (native_panels.h): the type's number with PANELS set.
 * Which types have a panel layout is panel_perm's to say. */
#define PANELS 0x100
#define PANEL_ROWS 16
/* int32 sums of x per row and block of 256 that the panel dots take (panel_sums) */
#define PANEL_SUMS 4
/* The rows of x a panel kernel takes at once, of `left` rows still to go: tiles of 8, then
 * 4, 2, 1 for the rest (native_panels.h panel_rows; panel_tile_x lays them out). */
#define PANEL_TILE 8
static inline int panel_tile(Py_ssize_t left) {
    return left >= PANEL_TILE ? PANEL_TILE : left >= 4 ? 4 : left >= 2 ? 2 : 1;
}

/* The file type of panel type qt, or -1 where qt is a file type. */
static int panel_base(int qt) { return qt & PANELS ? qt & ~PANELS : -1; }

static const qtype_geometry *geometry(int qt) {
    if (qt & PANELS) qt &= ~PANELS; /* the same blocks, in another order */
    for (size_t i = 0; i < sizeof GEOMETRY / sizeof GEOMETRY[0]; i++)
        if (GEOMETRY[i].qt == qt) return &GEOMETRY[i];
    return NULL;
}

/* The panel layout of file type qt as a permutation of a panel-block's bytes (PANEL_ROWS
 * rows' block b, row after row as the file holds them: perm[i] is the byte that byte i of
 * the panel-block is), into perm; its length (PANEL_ROWS * the block's bytes), or 0 where
 * qt has no panel layout. native_panels.h reads this layout; repanel writes and undoes
 * it, so it is written here once. It moves runs of 2 or 4 bytes from even offsets (perm[i
 * + 1] = perm[i] + 1 for even i), which repanel relies on. */
static int panel_perm(int qt, uint16_t *perm) {
    if (qt == QT_Q8_0) { /* a unit of two runs (64 columns, 68 bytes a row): 1088 bytes */
        for (int r = 0; r < PANEL_ROWS; r++)
            for (int u = 0; u < 2; u++) {
                const int row = 68 * r + 34 * u;
                for (int k = 0; k < 2; k++) perm[32 * u + 2 * r + k] = (uint16_t)(row + k); /* d */
                for (int g = 0; g < 8; g++) /* qs quad g: columns 4g .. 4g + 3 */
                    for (int k = 0; k < 4; k++)
                        perm[64 + (8 * u + g) * 64 + 4 * r + k] = (uint16_t)(row + 2 + 4 * g + k);
            }
        return PANEL_ROWS * 68;
    }
    if (qt == QT_Q4_1) { /* a unit of two runs (64 columns, 40 bytes a row): 640 bytes */
        for (int r = 0; r < PANEL_ROWS; r++)
            for (int u = 0; u < 2; u++) {
                const int row = 40 * r + 20 * u;
                for (int k = 0; k < 2; k++) perm[32 * u + 2 * r + k] = (uint16_t)(row + k);          /* d */
                for (int k = 0; k < 2; k++) perm[64 + 32 * u + 2 * r + k] = (uint16_t)(row + 2 + k); /* m */
                for (int g = 0; g < 4; g++) /* qs quad g: columns 4g .. (low nibbles), 16 + 4g .. */
                    for (int k = 0; k < 4; k++)
                        perm[128 + (4 * u + g) * 64 + 4 * r + k] = (uint16_t)(row + 4 + 4 * g + k);
            }
        return PANEL_ROWS * 40;
    }
    if (qt == QT_Q4_0 || qt == QT_IQ4_NL) { /* a unit of two runs (64 columns, 36 bytes a row) */
        for (int r = 0; r < PANEL_ROWS; r++)
            for (int u = 0; u < 2; u++) {
                const int row = 36 * r + 18 * u;
                for (int k = 0; k < 2; k++) perm[32 * u + 2 * r + k] = (uint16_t)(row + k); /* d */
                for (int g = 0; g < 4; g++) /* qs quad g: columns 4g .. (low nibbles), 16 + 4g .. */
                    for (int k = 0; k < 4; k++)
                        perm[64 + (4 * u + g) * 64 + 4 * r + k] = (uint16_t)(row + 2 + 4 * g + k);
            }
        return PANEL_ROWS * 36;
    }
    if (qt == QT_Q5_0) { /* a unit of two runs (64 columns, 44 bytes a row): cache-line sized */
        for (int r = 0; r < PANEL_ROWS; r++)
            for (int u = 0; u < 2; u++) {
                const int row = 44 * r + 22 * u;
                for (int k = 0; k < 2; k++) perm[32 * u + 2 * r + k] = (uint16_t)(row + k);        /* d */
                for (int k = 0; k < 4; k++) perm[64 + 64 * u + 4 * r + k] = (uint16_t)(row + 2 + k); /* qh */
                for (int g = 0; g < 4; g++) /* qs quad g: columns 4g .. (low nibbles), 16 + 4g .. */
                    for (int k = 0; k < 4; k++)
                        perm[192 + (4 * u + g) * 64 + 4 * r + k] = (uint16_t)(row + 6 + 4 * g + k);
            }
        return PANEL_ROWS * 44;
    }
    if (qt == QT_Q6_K) { /* a block (256 columns, 210 bytes a row): 3360 bytes */
        for (int r = 0; r < PANEL_ROWS; r++) {
            const int row = 210 * r;
            for (int q = 0; q < 32; q++) /* ql quad q: ql bytes 4q .. 4q + 3 */
                for (int k = 0; k < 4; k++) perm[64 * q + 4 * r + k] = (uint16_t)(row + 4 * q + k);
            for (int q = 0; q < 16; q++) /* qh quad q */
                for (int k = 0; k < 4; k++) perm[2048 + 64 * q + 4 * r + k] = (uint16_t)(row + 128 + 4 * q + k);
            for (int i = 0; i < 4; i++) /* the scales' dword i: scales 4i .. 4i + 3 */
                for (int k = 0; k < 4; k++) perm[3072 + 64 * i + 4 * r + k] = (uint16_t)(row + 192 + 4 * i + k);
            for (int k = 0; k < 2; k++) perm[3328 + 2 * r + k] = (uint16_t)(row + 208 + k); /* d */
        }
        return PANEL_ROWS * 210;
    }
    if (qt == QT_Q2_K) { /* a block (256 columns, 84 bytes a row): 1344 bytes */
        for (int r = 0; r < PANEL_ROWS; r++) {
            const int row = 84 * r;
            for (int q = 0; q < 16; q++) /* qs quad q */
                for (int k = 0; k < 4; k++) perm[64 * q + 4 * r + k] = (uint16_t)(row + 16 + 4 * q + k);
            for (int i = 0; i < 4; i++) /* the scale bytes' dword i */
                for (int k = 0; k < 4; k++) perm[1024 + 64 * i + 4 * r + k] = (uint16_t)(row + 4 * i + k);
            for (int k = 0; k < 2; k++) perm[1280 + 2 * r + k] = (uint16_t)(row + 80 + k); /* d */
            for (int k = 0; k < 2; k++) perm[1312 + 2 * r + k] = (uint16_t)(row + 82 + k); /* dmin */
        }
        return PANEL_ROWS * 84;
    }
    if (qt == QT_Q3_K) { /* a block (256 columns, 110 bytes a row): 1760 bytes */
        for (int r = 0; r < PANEL_ROWS; r++) {
            const int row = 110 * r;
            for (int q = 0; q < 8; q++) /* hmask quad q */
                for (int k = 0; k < 4; k++) perm[64 * q + 4 * r + k] = (uint16_t)(row + 4 * q + k);
            for (int q = 0; q < 16; q++) /* qs quad q */
                for (int k = 0; k < 4; k++) perm[512 + 64 * q + 4 * r + k] = (uint16_t)(row + 32 + 4 * q + k);
            for (int i = 0; i < 3; i++) /* the 12 scale bytes' dword i */
                for (int k = 0; k < 4; k++) perm[1536 + 64 * i + 4 * r + k] = (uint16_t)(row + 96 + 4 * i + k);
            for (int k = 0; k < 2; k++) perm[1728 + 2 * r + k] = (uint16_t)(row + 108 + k); /* d */
        }
        return PANEL_ROWS * 110;
    }
    if (qt == QT_IQ4_XS) { /* a block (256 columns, 136 bytes a row): 2176 bytes */
        for (int r = 0; r < PANEL_ROWS; r++) {
            const int row = 136 * r;
            for (int k = 0; k < 2; k++) perm[2 * r + k] = (uint16_t)(row + k);           /* d */
            for (int k = 0; k < 2; k++) perm[32 + 2 * r + k] = (uint16_t)(row + 2 + k);  /* scales_h */
            for (int k = 0; k < 4; k++) perm[64 + 4 * r + k] = (uint16_t)(row + 4 + k);  /* scales_l */
            for (int q = 0; q < 32; q++) /* qs quad q: qs bytes 4q .. 4q + 3 */
                for (int k = 0; k < 4; k++) perm[128 + 64 * q + 4 * r + k] = (uint16_t)(row + 8 + 4 * q + k);
        }
        return PANEL_ROWS * 136;
    }
    if (qt != QT_Q4_K && qt != QT_Q5_K) return 0;
    /* Q5_K: Q4_K's lines, its codes from row byte 48 (after qh), then qh's quads */
    const int q5 = qt == QT_Q5_K, rbytes = q5 ? 176 : 144, codes = q5 ? 48 : 16;
    for (int r = 0; r < PANEL_ROWS; r++) {
        const int row = rbytes * r;
        for (int k = 0; k < 2; k++) perm[2 * r + k] = (uint16_t)(row + k);            /* d */
        for (int k = 0; k < 2; k++) perm[32 + 2 * r + k] = (uint16_t)(row + 2 + k);   /* dmin */
        for (int i = 0; i < 3; i++) /* the scales' dword i */
            for (int k = 0; k < 4; k++) perm[64 + 64 * i + 4 * r + k] = (uint16_t)(row + 4 + 4 * i + k);
        for (int c = 0; c < 4; c++) /* codes: chunk c, quad g */
            for (int g = 0; g < 8; g++)
                for (int k = 0; k < 4; k++)
                    perm[256 + (c * 8 + g) * 64 + 4 * r + k] = (uint16_t)(row + codes + 32 * c + 4 * g + k);
        for (int g = 0; q5 && g < 8; g++) /* qh quad g: its bits 2c, 2c + 1 are chunk c's fifth */
            for (int k = 0; k < 4; k++) perm[2304 + 64 * g + 4 * r + k] = (uint16_t)(row + 16 + 4 * g + k);
    }
    return PANEL_ROWS * rbytes;
}
#define PANEL_MAX_BYTES (PANEL_ROWS * 210)

/* Whether a row of cols columns of type qt is a whole number of panel units. */
static int panel_unit_fits(int qt, size_t cols, uint16_t *perm) {
    const qtype_geometry *g = geometry(qt);
    const int pbytes = g ? panel_perm(qt, perm) : 0;
    return pbytes && cols / (size_t)g->elems * (size_t)g->nbytes % (size_t)(pbytes / PANEL_ROWS) == 0;
}

/* A panel layout's byte moves for rows rb bytes apart, worked out once a matrix: its runs
 * of 4 bytes (n4) and of 2 (n2), each a byte of the panel-block (to) and the offset of its
 * bytes in the 16 rows' block b (at, rows rb apart). A layout's runs start at even bytes
 * (panel_perm); a 4-byte run starts at a multiple of 4, and copying it whole halves the
 * steps (the load's repacking: docs/performance.md). */
typedef struct {
    int pbytes, n4, n2;
    size_t bb; /* a row's bytes of a panel-block */
    uint16_t to4[PANEL_MAX_BYTES / 4], to2[PANEL_MAX_BYTES / 2];
    size_t at4[PANEL_MAX_BYTES / 4], at2[PANEL_MAX_BYTES / 2];
} panel_moves;

/* The moves of file type qt's layout for rows of rb bytes into m; its pbytes (0: no layout). */
static int panel_moves_make(int qt, size_t rb, panel_moves *m) {
    uint16_t perm[PANEL_MAX_BYTES];
    const int pbytes = panel_perm(qt, perm);
    m->pbytes = pbytes, m->n4 = m->n2 = 0, m->bb = (size_t)pbytes / PANEL_ROWS;
    for (int i = 0; i < pbytes;) {
        const size_t row = perm[i] / m->bb, at = row * rb + perm[i] % m->bb;
        if (i % 4 == 0 && i + 4 <= pbytes && perm[i + 2] == perm[i] + 2 &&
            (perm[i] + 2u) / m->bb == row) {
            m->to4[m->n4] = (uint16_t)i, m->at4[m->n4++] = at, i += 4;
        } else {
            m->to2[m->n2] = (uint16_t)i, m->at2[m->n2++] = at, i += 2;
        }
    }
    return pbytes;
}

/* Rows [16 i, 16 i + 16) of a panel matrix back in the file's order (rb bytes a row, the
 * rb m was made for) into out (16 rb bytes), or the file's rows into panels (to_panels). */
static void repanel(const panel_moves *m, const uint8_t *src, size_t rb, uint8_t *out,
                    int to_panels) {
    const size_t pb = (size_t)m->pbytes, bb = m->bb, nb = rb / bb;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *from = to_panels ? src + b * bb : src + b * pb;
        uint8_t *to = to_panels ? out + b * pb : out + b * bb;
        if (to_panels) {
            for (int k = 0; k < m->n4; k++) memcpy(to + m->to4[k], from + m->at4[k], 4);
            for (int k = 0; k < m->n2; k++) memcpy(to + m->to2[k], from + m->at2[k], 2);
        } else {
            for (int k = 0; k < m->n4; k++) memcpy(to + m->at4[k], from + m->to4[k], 4);
            for (int k = 0; k < m->n2; k++) memcpy(to + m->at2[k], from + m->to2[k], 2);
        }
    }
}

/* A row of x rounded to 8 bits per 32 columns (native_int8.h says how and why). */
typedef struct {
    const int8_t *q;      /* [cols]; for Q2_K .. Q6_K in native_kdots.h's order */
    const float *d;       /* [cols / 32]: each block's scale dx */
    const float *dsum;    /* [cols / 16]: dx * the sum of q over each 16 columns */
    const float *dsum32;  /* [cols / 32]: dx * the sum of q over each 32 */
} q8_row;

/* How the 8-bit dots for W's type wqt read x (native_kdots.h's tile_x): by tiles of rows
 * whose unit is a block of 256 (the K-quants that kd_rows takes), a run of 32 (the types
 * with one scale per run: i8_tile_rows), or row by row (0: the types with neither). */
static int x_tile_unit(int wqt) {
    switch (wqt) {
    case QT_Q2_K: case QT_Q3_K: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: return 256;
    case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: case QT_Q8_0: case QT_IQ4_NL:
    case QT_IQ4_XS: case QT_MXFP4: return 32;
    default: return 0;
    }
}

/* The code offset the 8-bit dots may fold into x (Q4_0's 8, Q5_0's 16: w = d (code -
 * zero)), else 0; an ISA folds it where native_kdots.h's i8_zero says so: tile_x stores, per 4 columns of a run, -zero times the sum of their q, and each
 * run's integer sum starts from it, so that sum is exact sum (code - zero) q and the run
 * needs no k term (native_int8.h tile_unit_i8). */
static int x_zero(int wqt) { return wqt == QT_Q4_0 ? 8 : wqt == QT_Q5_0 ? 16 : 0; }

typedef void (*deq_rows_fn)(int, const uint8_t *, size_t, const int64_t *, size_t, size_t,
                            float *, int);
typedef void (*dot_rows_fn)(int, const uint8_t *, size_t, size_t, size_t, const float *, int,
                            int, float *, size_t);

/* The ISA-neutral helpers, outside every target region so that each ISA's code may inline
 * them. */
#include "native_blocks.h"

typedef void (*dot_rows_i8_fn)(int, const uint8_t *, size_t, size_t, size_t, const q8_row *,
                               int, int, float *, size_t);

typedef void (*quantize_row_fn)(const float *, int, int, int8_t *, float *, float *, float *);
typedef void (*tile_x_fn)(int, q8_row *, int, int, void *);

/* A prompt's products by AMX int8 tiles (native_amx.h): which types they serve, each
 * thread's tile state taken and released, a panel of 16 rows of W unpacked, a panel times
 * every row of x. */
typedef struct {
    int (*serves)(int qt);
    void (*begin)(int qt);
    void (*end)(void);
    void (*panel)(int qt, const uint8_t *w, size_t rb, size_t rows, size_t n0, int cols,
                  int8_t *b, float *sc, float *k);
    void (*panel_rows)(int qt, const int8_t *q, const float *xf, int T, int cols,
                       const int8_t *b, const float *sc, const float *k, size_t n0, size_t rows,
                       float *y);
} amx_kernels;

typedef struct {
    const char *name;
    deq_rows_fn deq_rows;
    dot_rows_fn dot_rows;
    dot_rows_i8_fn dot_rows_i8; /* NULL: this ISA has no 8-bit dots, every dot is f32 */
    quantize_row_fn quantize_row; /* NULL with dot_rows_i8 */
    tile_x_fn tile_x;             /* rounded rows of x into the 8-bit dots' tiles (tile_x) */
    const amx_kernels *amx;       /* NULL: no tile products, prompts go to BLAS */
    int (*panel_serves)(int qt);  /* NULL: no panel dots (a panel matrix is read in file order) */
    void (*panel_rows)(int qt, const uint8_t *w, size_t rb, size_t p0, size_t p1, const int8_t *q,
                       const float *dx, const int32_t *bsp, int T, int cols, float *y, size_t ys);
} isa_kernels;

/* f32 -> f16 -> f32, rounding to nearest even (F16C's and ggml's FP32_TO_FP16): the
 * activation scales llama.cpp stores in its Q8_0 / Q8_1 blocks are halves. */
static float round_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = x & 0x80000000u, a = x & 0x7fffffffu;
    uint16_t h;
    if (a >= 0x7f800000u) {
        h = (uint16_t)(a > 0x7f800000u ? 0x7e00 : 0x7c00);
    } else if (a >= 0x477ff000u) { /* rounds to 65520 or more: inf */
        h = 0x7c00;
    } else if (a < 0x38800000u) { /* below the smallest normal half: a subnormal or zero */
        const float scaled = fabsf(f) * 16777216.0f; /* 2^24: units of the smallest subnormal */
        h = (uint16_t)nearbyintf(scaled);
    } else {
        const uint32_t mant = a & 0x7fffffu, exp = (a >> 23) - 112;
        uint32_t v = (exp << 10) | (mant >> 13);
        const uint32_t rest = mant & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (v & 1))) v++;
        h = (uint16_t)v;
    }
    return half_to_float((uint16_t)(h | (sign >> 16)));
}

/* How llama.cpp rounds a row of x for the dot products of each weight type (its
 * vec_dot_type): Q8_0 (scale a half) for Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4; Q8_1 (Q8_0 plus
 * a half of scale * sum) for Q4_1, Q5_1; Q8_K (an f32 scale per 256) for the K-quants and
 * IQ4_XS. Rounding as llama.cpp does makes frink's 8-bit products llama.cpp's own. */
enum { X_Q8_0, X_Q8_1, X_Q8_K };

static int x_scheme(int qt) {
    switch (qt) {
    case QT_Q4_1: case QT_Q5_1: return X_Q8_1;
    case QT_Q2_K: case QT_Q3_K: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_IQ4_XS:
        return X_Q8_K;
    default: return X_Q8_0;
    }
}

/* How each ISA's quantize_row (native_int8.h) rounds a row of x to 8 bits (cols a multiple
 * of 32, of 256 for X_Q8_K):
 *  Q8_0/Q8_1, per 32: d = max|x| / 127, q = nearest-even(x * (127 / max|x|)), the products'
 *    scale dx = d rounded to a half; Q8_1's sum term is half(d * sum q).
 *  Q8_K, per 256: m = the first x of largest magnitude, s = -127 / m,
 *    q = min(127, nearest-even(s * x)), dx = 1 / s.
 * An all-zero block gets q = 0, dx = 0. Written so tests can repeat it in NumPy bit for bit. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FRINK_MULTI_ISA 1
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
#define ISA(name) name##_avx512
#define VL 16
typedef float vf512 __attribute__((vector_size(64)));
#define vf vf512
#define VFMA(a, b, c) ((vf512)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define HALF(p) _cvtsh_ss(rd16(p))
#define HALVES(p) ((vf512)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p))))
#define U8F(b, i) ((vf512)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32((__m128i)(b))))
#define S8F(b, i) ((vf512)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32((__m128i)(b))))
#define I8_DOT_ACC(acc, a, b) _mm256_dpbusd_epi32((acc), (a), (b))
#define KD_DPBUSD 1
#define PANEL_ZMM 1 /* native_panels.h's 16 rows of W in a zmm's lanes */
#define I8_MASKS 1 /* AVX-512BW/VL: mask registers, variable word shifts */
#if __GNUC__ >= 11 && defined(__linux__) /* AMX intrinsics; Linux's grant of tile state */
#define AMX_TILES 1
#endif
#include "native_isa.h"
#undef KD_DPBUSD
#undef PANEL_ZMM
#undef I8_MASKS
#ifdef AMX_TILES
#define AMX_TILES_BUILT 1
#undef AMX_TILES
#endif
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define ISA(name) name##_avx2
typedef float vf256 __attribute__((vector_size(32)));
#define I8_DOT_ACC(acc, a, b)                                                                  \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((a), (b)), _mm256_set1_epi16(1)))
#include "native_ymm.h"
#include "native_isa.h"
#pragma GCC pop_options

/* AVX2 plus AVX-VNNI (Intel's client cores since Alder Lake, AMD's since Zen 5): the AVX2
 * kernels with each 4 byte products summed into an int32 lane by one vpdpbusd on a ymm, as
 * the AVX-512 region's 256-bit loops do (KD_DPBUSD), where AVX2 takes vpmaddubsw, an int16
 * add and vpmaddwd, and the codes' offsets folded into x's sums as AVX-512 folds them: the
 * same integers and f32 steps as the AVX-512 variant, so its bits (AVX2 takes those
 * offsets' k terms in f32: its last bits may differ). */
#if __GNUC__ >= 11
#define AVXVNNI_BUILT 1
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#define ISA(name) name##_avxvnni
#define I8_DOT_ACC(acc, a, b) _mm256_dpbusd_avx_epi32((acc), (a), (b))
#define KD_DPBUSD 1
#include "native_ymm.h"
#include "native_isa.h"
#undef KD_DPBUSD
#pragma GCC pop_options
#endif
#endif

#define ISA(name) name##_base
#define VL 4
typedef float vf128 __attribute__((vector_size(16)));
#define vf vf128
#define VFMA(a, b, c) ((a) * (b) + (c))
#define HALF(p) half_to_float(rd16(p))
#define HALVES(p)                                                                        \
    ({                                                                                   \
        vf128 v_;                                                                        \
        for (int i_ = 0; i_ < 4; i_++) v_[i_] = half_to_float(rd16((p) + 2 * i_));      \
        v_;                                                                              \
    })
typedef int32_t vi128 __attribute__((vector_size(16)));
typedef uint8_t vb4 __attribute__((vector_size(4)));
typedef int8_t vsb4 __attribute__((vector_size(4)));
#define WIDEN4(b, i, T4)                                                                 \
    ({                                                                                   \
        T4 p_;                                                                           \
        memcpy(&p_, (const char *)&(b) + 4 * (i), 4);                                    \
        __builtin_convertvector(__builtin_convertvector(p_, vi128), vf128);              \
    })
#define U8F(b, i) WIDEN4(b, i, vb4)
#define S8F(b, i) WIDEN4(b, i, vsb4)
#include "native_isa.h"

static const isa_kernels BASE = {"base", deq_rows_base, dot_rows_base, NULL, NULL, NULL, NULL,
                                 NULL, NULL};
#ifdef FRINK_MULTI_ISA
static const isa_kernels AVX2 = {"avx2", deq_rows_avx2, dot_rows_avx2, dot_rows_i8_avx2,
                                 quantize_row_avx2, tile_x_avx2, NULL,
                                 panel_serves_avx2, panel_rows_avx2};
#ifdef AVXVNNI_BUILT
static const isa_kernels AVXVNNI = {"avxvnni", deq_rows_avxvnni, dot_rows_avxvnni,
                                    dot_rows_i8_avxvnni, quantize_row_avxvnni, tile_x_avxvnni,
                                    NULL, panel_serves_avxvnni, panel_rows_avxvnni};
#endif
static const isa_kernels AVX512 = {"avx512", deq_rows_avx512, dot_rows_avx512, dot_rows_i8_avx512,
                                   quantize_row_avx512, tile_x_avx512, NULL,
                                   panel_serves_avx512, panel_rows_avx512};
#ifdef AMX_TILES_BUILT
static const amx_kernels AMX = {amx_serves_avx512, amx_begin_avx512, amx_end_avx512,
                                amx_panel_avx512, amx_panel_rows_avx512};
static const isa_kernels AVX512_AMX = {"avx512+amx", deq_rows_avx512, dot_rows_avx512,
                                       dot_rows_i8_avx512, quantize_row_avx512,
                                       tile_x_avx512, &AMX, panel_serves_avx512,
                                       panel_rows_avx512};

/* Whether this process may run AMX tile instructions: the CPU has them and Linux grants
 * the tile state (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: a process asks once, before
 * its first tile instruction, and every thread then has it). Asked once. */
static int amx_runs(void) {
    static int runs = -1;
    if (runs < 0)
        runs = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
               syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                       18 /* XFEATURE_XTILEDATA */) == 0;
    return runs;
}
#endif
#endif

static const isa_kernels *K = &BASE;

/* The kernels for ISA `name` (NULL: the best this CPU runs); NULL if it cannot run them. */
static const isa_kernels *find_isa(const char *name) {
#ifdef FRINK_MULTI_ISA
    __builtin_cpu_init();
    int has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
                 __builtin_cpu_supports("f16c");
    int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
#ifdef AVXVNNI_BUILT
    const isa_kernels *vnni = has2 && __builtin_cpu_supports("avxvnni") ? &AVXVNNI : NULL;
#else
    const isa_kernels *vnni = NULL;
#endif
#ifdef AMX_TILES_BUILT
    const isa_kernels *best512 = has512 && amx_runs() ? &AVX512_AMX : &AVX512;
    if (!strcmp(name ? name : "", "avx512+amx")) return best512 == &AVX512_AMX ? best512 : NULL;
#else
    const isa_kernels *best512 = &AVX512;
#endif
    if (!name) return has512 ? best512 : vnni ? vnni : has2 ? &AVX2 : &BASE;
    if (!strcmp(name, "avx512")) return has512 ? &AVX512 : NULL;
    if (!strcmp(name, "avxvnni")) return vnni;
    if (!strcmp(name, "avx2")) return has2 ? &AVX2 : NULL;
#else
    if (!name) return &BASE;
#endif
    return strcmp(name, "base") ? NULL : &BASE;
}

/* The variants this CPU runs, best first, comma-separated into buf. */
static const char *runnable_isas(char *buf, size_t n) {
    static const char *const names[] = {"avx512+amx", "avx512", "avxvnni", "avx2", "base"};
    buf[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (find_isa(names[i]))
            snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", buf[0] ? ", " : "", names[i]);
    return buf;
}

static int pick_isa(void) {
    const char *want = getenv("FRINK_NATIVE_ISA");
    const isa_kernels *k = find_isa(want && *want ? want : NULL);
    if (!k) {
        char runs[64];
        PyErr_Format(PyExc_ImportError,
                     "FRINK_NATIVE_ISA=%s: not runnable on this CPU, which runs %s (unset: "
                     "the best of them)", want, runnable_isas(runs, sizeof runs));
        return -1;
    }
    K = k;
    return 0;
}

/* -- argument checks: every buffer against the shapes it is said to have --------------- */

static int check_len(const Py_buffer *b, size_t need, const char *what) {
    if ((size_t)b->len < need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zu needed", what, b->len, need);
        return -1;
    }
    return 0;
}

static int check_matrix(int qt, Py_ssize_t rows, Py_ssize_t cols, size_t *rb) {
    const qtype_geometry *g = geometry(qt);
    if (!g) {
        PyErr_Format(PyExc_ValueError, "no native kernel for type %d", qt);
        return -1;
    }
    uint16_t perm[PANEL_MAX_BYTES];
    if (rows < 0 || cols <= 0 || cols % g->elems || cols > (1 << 30) ||
        (qt & PANELS && (rows % PANEL_ROWS || !panel_unit_fits(panel_base(qt), (size_t)cols, perm)))) {
        PyErr_Format(PyExc_ValueError, "bad shape [%zd, %zd] for type %d", rows, cols, qt);
        return -1;
    }
    *rb = (size_t)cols / g->elems * g->nbytes;
    return 0;
}

/* -- the drivers ------------------------------------------------------------------------ */

/* Bytes the tiles of T rounded rows of x take (tile_x; 0 where x is read row by row): q, and
 * per 32 columns at most 3 floats (a K-quant block's dx and 16 sums, a run's dx and sum) or,
 * where the codes' offset may be folded (x_zero), a run's dx and 8 int32 sums. */
static size_t tiles_bytes(int wqt, size_t T, size_t cols) {
    if (!x_tile_unit(wqt)) return 0;
    return (T + ROW_TILE) * (cols + cols / 32 * (x_zero(wqt) ? 9 : 3) * sizeof(float));
}

/* Each row of x rounded for W's type wqt, then laid out as its dots read it (tile_x: the
 * K-quants' tiles, in `tiles`). */
static void quantize_x(const float *x, Py_ssize_t T, int cols, int wqt, int8_t *q, float *d,
                       float *sum, q8_row *rows, void *tiles) {
    const int scheme = x_scheme(wqt);
    const int nb = cols / 32;
    for (Py_ssize_t t = 0; t < T; t++) {
        int8_t *qt = q + (size_t)t * cols;
        float *dt = d + (size_t)t * nb, *st = sum + (size_t)t * 3 * nb, *s32 = st + 2 * nb;
        K->quantize_row(x + (size_t)t * cols, cols, scheme, qt, dt, st, s32);
        rows[t] = (q8_row){qt, dt, st, s32};
    }
    if (x_tile_unit(wqt)) K->tile_x(wqt, rows, (int)T, cols, tiles);
}

static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    (void)self;
    int qt, nthreads;
    Py_ssize_t rows, cols;
    Py_buffer w, index, out;
    if (!PyArg_ParseTuple(args, "iy*nny*w*i", &qt, &w, &rows, &cols, &index, &out, &nthreads))
        return NULL;
    PyObject *ret = NULL;
    size_t rb, n = (size_t)index.len / sizeof(int64_t);
    if (check_matrix(qt, rows, cols, &rb) || check_len(&w, rb * (size_t)rows, "w") ||
        check_len(&out, n * (size_t)cols * sizeof(float), "out"))
        goto done;
    const int64_t *idx = (const int64_t *)index.buf;
    for (size_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= rows) {
            PyErr_Format(PyExc_IndexError, "row %lld of a %zd-row matrix", (long long)idx[i], rows);
            goto done;
        }
    if (qt & PANELS) { /* each row's panel read back in file order, the row dequantized */
        uint8_t *tmp = malloc(PANEL_ROWS * rb);
        if (!tmp) {
            PyErr_NoMemory();
            goto done;
        }
        panel_moves *moves = malloc(sizeof *moves);
        if (!moves) {
            free(tmp);
            PyErr_NoMemory();
            goto done;
        }
        panel_moves_make(panel_base(qt), rb, moves);
        const int64_t at = 0;
        size_t have = (size_t)-1; /* the panel in tmp: rows in order read each panel once */
        for (size_t i = 0; i < n; i++) {
            const size_t P = (size_t)idx[i] / PANEL_ROWS;
            if (P != have)
                repanel(moves, (const uint8_t *)w.buf + P * PANEL_ROWS * rb, rb, tmp, 0);
            have = P;
            K->deq_rows(panel_base(qt), tmp + (size_t)idx[i] % PANEL_ROWS * rb, rb, &at, 0, 1,
                        (float *)out.buf + i * (size_t)cols, (int)cols);
        }
        free(tmp);
        free(moves);
        ret = Py_NewRef(Py_None);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    const long chunks = (long)((n + ROW_CHUNK - 1) / ROW_CHUNK);
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && chunks > 1)
    for (long c = 0; c < chunks; c++) {
        size_t i0 = (size_t)c * ROW_CHUNK, i1 = i0 + ROW_CHUNK < n ? i0 + ROW_CHUNK : n;
        K->deq_rows(qt, (const uint8_t *)w.buf, rb, idx, i0, i1,
                    (float *)out.buf + i0 * (size_t)cols, (int)cols);
    }
    Py_END_ALLOW_THREADS;
    ret = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&w);
    PyBuffer_Release(&index);
    PyBuffer_Release(&out);
    return ret;
}

/* Per row of x, the sums of q the panel dots take and each unit's dx: Q4_K, per block of
 * 256, PANEL_SUMS int32s (the int16 pairs of its runs' sums (Q0, Q2), (Q1, Q3), (Q4, Q6),
 * (Q5, Q7)); IQ4_XS, per run, -128 times its sum, and dx per block; Q6_K, Q3_K and Q2_K, per block, 2 PANEL_SUMS int32s (its 16 half-runs' sums as the same pairs,
 * (Q0, Q2), (Q1, Q3), (Q4, Q6), ... (Q13, Q15)); Q4_1, per run, the bits of its k term's x part (s32, the f32 half(d sum q));
 * Q4_0, Q5_0, Q8_0 and IQ4_NL, per run of 32, minus the codes' offset times its sum
 * (native_panels.h). */
static void panel_sums(int qt, const int8_t *q, const float *d, const float *s32, int cols,
                       int32_t *bsp, float *dx) {
    if (qt == QT_Q4_1) { /* its k term's x part: quantize_row's half(d sum q), as f32 bits */
        for (int r = 0; r < cols / 32; r++) memcpy(&bsp[r], &s32[r], 4), dx[r] = d[r];
        return;
    }
    if (qt == QT_IQ4_XS) { /* per run of 32, -128 times its sum (AVX-512's biased levels); dx per block */
        for (int r = 0; r < cols / 32; r++) {
            int32_t Q = 0;
            for (int i = 0; i < 32; i++) Q += q[32 * r + i];
            bsp[r] = -128 * Q;
        }
        for (int b = 0; b < cols / 256; b++) dx[b] = d[8 * b];
        return;
    }
    if (qt == QT_Q4_0 || qt == QT_Q5_0 || qt == QT_Q8_0 || qt == QT_IQ4_NL) {
        /* the codes' offset: Q4_0's 8, Q5_0's 16, Q8_0's and IQ4_NL's 128 */
        const int32_t zero = qt == QT_Q4_0 ? 8 : qt == QT_Q5_0 ? 16 : 128;
        for (int r = 0; r < cols / 32; r++) {
            int32_t Q = 0;
            for (int i = 0; i < 32; i++) Q += q[32 * r + i];
            bsp[r] = -zero * Q, dx[r] = d[r];
        }
        return;
    }
    if (qt == QT_Q6_K || qt == QT_Q3_K || qt == QT_Q2_K) { /* per block, its 16 half-runs' sums paired, 8 int32s */
        for (int b = 0; b < cols / 256; b++) {
            int32_t Q[16];
            for (int j = 0; j < 16; j++) {
                Q[j] = 0;
                for (int i = 0; i < 16; i++) Q[j] += q[256 * b + 16 * j + i];
            }
            for (int i = 0; i < 4; i++)
                for (int k = 0; k < 2; k++)
                    bsp[2 * PANEL_SUMS * b + 2 * i + k] = (int32_t)((uint32_t)(uint16_t)Q[4 * i + k] |
                                                                    (uint32_t)(uint16_t)Q[4 * i + k + 2] << 16);
            dx[b] = d[8 * b];
        }
        return;
    }
    for (int b = 0; b < cols / 256; b++) {
        int32_t Q[8];
        for (int j = 0; j < 8; j++) {
            Q[j] = 0;
            for (int i = 0; i < 32; i++) Q[j] += q[256 * b + 32 * j + i];
        }
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 2; k++)
                bsp[PANEL_SUMS * b + 2 * h + k] = (int32_t)((uint32_t)(uint16_t)Q[4 * h + k] |
                                                            (uint32_t)(uint16_t)Q[4 * h + k + 2] << 16);
        dx[b] = d[8 * b];
    }
}

/* x's T rounded rows q (cols apart) as the panel kernels read them, into qi: each tile of n
 * rows (panel_tile) at qi + t0 cols, its rows' 4-column quads interleaved (quad c of row t
 * at 4 (c n + t)), so a kernel reaches the tile's rows from one pointer (PANEL_X). */
static void panel_tile_x(const int8_t *q, Py_ssize_t T, Py_ssize_t cols, int8_t *qi) {
    for (Py_ssize_t t0 = 0, n; t0 < T; t0 += n) {
        n = panel_tile(T - t0);
        int8_t *tile = qi + (size_t)t0 * cols;
        for (Py_ssize_t t = 0; t < n; t++) {
            const int8_t *row = q + (size_t)(t0 + t) * cols;
            for (Py_ssize_t c = 0; c < cols / 4; c++) memcpy(tile + 4 * (c * n + t), row + 4 * c, 4);
        }
    }
}

/* dots for W in panels on an ISA with panel dots (x rounded to 8 bits): x rounded per
 * row (its type's scheme), its sums per block (panel_sums), then each panel times every
 * row of x (native_panels.h). 0, or -1 with an exception set. */
static int panel_dots(int qt, const uint8_t *w, size_t rb, Py_ssize_t rows, Py_ssize_t cols,
                      const float *x, Py_ssize_t T, float *y, int nthreads) {
    /* per row: q, quantize_row's floats, then a dx and a sum per 32 columns at most */
    const size_t nb = (size_t)cols / 32, nbk = nb;
    const size_t bytes = (size_t)T * (2 * cols + 4 * nb * sizeof(float) + nbk * 2 * sizeof(int32_t));
    void *scratch = malloc(bytes);
    if (!scratch) {
        PyErr_NoMemory();
        return -1;
    }
    float *d = scratch, *sum = d + (size_t)T * nb, *dx = sum + (size_t)T * 3 * nb;
    int32_t *bsp = (int32_t *)(dx + (size_t)T * nbk);
    int8_t *q = (int8_t *)(bsp + (size_t)T * nbk), *qi = q + (size_t)T * cols;
    const int base = panel_base(qt), scheme = x_scheme(base);
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t t = 0; t < T; t++) {
        int8_t *qt_ = q + (size_t)t * cols;
        float *dt = d + (size_t)t * nb, *st = sum + (size_t)t * 3 * nb;
        K->quantize_row(x + (size_t)t * cols, (int)cols, scheme, qt_, dt, st, st + 2 * nb);
        panel_sums(base, qt_, dt, st + 2 * nb, (int)cols, bsp + (size_t)t * nbk, dx + (size_t)t * nbk);
    }
    if (T > 1) panel_tile_x(q, T, cols, qi); /* (one row's tile is the row itself) */
    else qi = q;
    const long panels = (long)(rows / PANEL_ROWS);
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && panels > 1)
    for (long P = 0; P < panels; P++)
        K->panel_rows(base, w, rb, (size_t)P, (size_t)P + 1, qi, dx, bsp, (int)T, (int)cols, y,
                      (size_t)rows);
    Py_END_ALLOW_THREADS;
    free(scratch);
    return 0;
}

static PyObject *py_dots(PyObject *self, PyObject *args) {
    (void)self;
    int qt, nthreads, exact;
    Py_ssize_t rows, cols, T;
    Py_buffer w, x, y;
    if (!PyArg_ParseTuple(args, "iy*nny*nw*ip", &qt, &w, &rows, &cols, &x, &T, &y, &nthreads,
                          &exact))
        return NULL;
    PyObject *ret = NULL;
    size_t rb;
    void *scratch = NULL;
    panel_moves *moves = NULL;
    if (check_matrix(qt, rows, cols, &rb) || check_len(&w, rb * (size_t)rows, "w") ||
        T < 0 || check_len(&x, (size_t)T * (size_t)cols * sizeof(float), "x") ||
        check_len(&y, (size_t)T * (size_t)rows * sizeof(float), "y"))
        goto done;
    /* W in panels: the panel dots where this ISA has them; else each panel read back in
     * the file's order into a thread's buffer and multiplied as the file's rows are */
    const int base = panel_base(qt), wqt = base >= 0 ? base : qt;
    const int i8 = !exact && K->dot_rows_i8 && geometry(qt)->elems >= 32;
    if (base >= 0 && i8 && T > 0 && K->panel_serves && K->panel_serves(base)) {
        if (!panel_dots(qt, (const uint8_t *)w.buf, rb, rows, cols, (const float *)x.buf, T,
                        (float *)y.buf, nthreads))
            ret = Py_NewRef(Py_None);
        goto done;
    }
    if (base >= 0 && !(moves = malloc(sizeof *moves))) {
        PyErr_NoMemory();
        goto done;
    }
    const int pbytes = moves ? panel_moves_make(base, rb, moves) : 0;
    q8_row *xr = NULL;
    if (i8 && T > 0) {
        /* 8-bit activations: x rounded once, then every row of W dotted with it. */
        const size_t nb = (size_t)cols / 32;
        const size_t rounded = (size_t)T * (cols + 4 * nb * sizeof(float) + sizeof(q8_row));
        scratch = malloc(rounded + tiles_bytes(wqt, (size_t)T, (size_t)cols));
        if (!scratch) {
            PyErr_NoMemory();
            goto done;
        }
        xr = scratch;
        float *d = (float *)(xr + T), *sum = d + (size_t)T * nb;
        int8_t *q = (int8_t *)(sum + (size_t)T * 3 * nb);
        Py_BEGIN_ALLOW_THREADS;
        quantize_x((const float *)x.buf, T, (int)cols, wqt, q, d, sum, xr, (char *)scratch + rounded);
        Py_END_ALLOW_THREADS;
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS;
    const long chunks = (long)((rows + ROW_CHUNK - 1) / ROW_CHUNK);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && chunks > 1)
    {
        uint8_t *mine = pbytes ? malloc(PANEL_ROWS * rb) : NULL;
        if (pbytes && !mine) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (long c = 0; c < chunks; c++) {
            size_t r0 = (size_t)c * ROW_CHUNK;
            size_t r1 = r0 + ROW_CHUNK < (size_t)rows ? r0 + ROW_CHUNK : (size_t)rows;
            const uint8_t *wc = (const uint8_t *)w.buf;
            float *yc = (float *)y.buf;
            if (pbytes) { /* ROW_CHUNK == PANEL_ROWS: chunk c is panel c */
                if (!mine) continue;
                repanel(moves, wc + r0 * rb, rb, mine, 0);
                wc = mine, yc += r0, r1 -= r0, r0 = 0;
            }
            if (xr)
                K->dot_rows_i8(wqt, wc, rb, r0, r1, xr, (int)T, (int)cols, yc, (size_t)rows);
            else
                K->dot_rows(wqt, wc, rb, r0, r1, (const float *)x.buf, (int)T, (int)cols, yc,
                            (size_t)rows);
        }
        free(mine);
    }
    Py_END_ALLOW_THREADS;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    free(scratch);
    free(moves);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    return ret;
}

/* panel(qtype, src, dst, rows, cols, to_panels): dst = W (rows x cols of file type qtype)
 * with its rows in panels of 16 (to_panels), or back in the file's order. */
static PyObject *py_panel(PyObject *self, PyObject *args) {
    (void)self;
    int qt, to_panels, nthreads = 1;
    Py_ssize_t rows, cols;
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "iy*w*nnp|i", &qt, &src, &dst, &rows, &cols, &to_panels, &nthreads))
        return NULL;
    PyObject *ret = NULL;
    size_t rb;
    uint16_t perm[PANEL_MAX_BYTES];
    panel_moves *moves = NULL;
    if (!panel_perm(qt, perm)) {
        PyErr_Format(PyExc_ValueError, "no panel layout for type %d", qt);
        goto done;
    }
    if (check_matrix(qt | PANELS, rows, cols, &rb) || check_len(&src, rb * (size_t)rows, "src") ||
        check_len(&dst, rb * (size_t)rows, "dst"))
        goto done;
    if (src.buf == dst.buf) {
        PyErr_SetString(PyExc_ValueError, "panel: src and dst must not be one buffer");
        goto done;
    }
    if (!(moves = malloc(sizeof *moves))) {
        PyErr_NoMemory();
        goto done;
    }
    panel_moves_make(qt, rb, moves);
    Py_BEGIN_ALLOW_THREADS;
    const long panels = (long)(rows / PANEL_ROWS);
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && panels > 1)
    for (long P = 0; P < panels; P++)
        repanel(moves, (const uint8_t *)src.buf + (size_t)P * PANEL_ROWS * rb, rb,
                (uint8_t *)dst.buf + (size_t)P * PANEL_ROWS * rb, to_panels);
    Py_END_ALLOW_THREADS;
    ret = Py_NewRef(Py_None);
done:
    free(moves);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return ret;
}

static PyObject *py_panels_for(PyObject *self, PyObject *args) {
    (void)self;
    int qt;
    Py_ssize_t cols;
    if (!PyArg_ParseTuple(args, "in", &qt, &cols)) return NULL;
    uint16_t perm[PANEL_MAX_BYTES];
    const qtype_geometry *g = geometry(qt);
    return PyBool_FromLong(K->panel_serves && K->panel_serves(qt) && g && cols > 0 &&
                           cols % g->elems == 0 && panel_unit_fits(qt, (size_t)cols, perm));
}

/* Row t of x, rounded (its cols codes, its nf floats: quantize_row's scales and sums), put
 * where the tile products read it. Codes: tiles of 16 rows by 32 columns (AMX_PANEL_UNIT
 * bytes, row after row), the tiles of rows [16 i, 16 i + 16) run after run, then those of
 * the next 16 rows: one tile is 512 bytes in a row, which a tile load reads best. Floats:
 * float j of the 16 rows side by side (16 floats), j after j, then the next 16 rows: a
 * run's scales for a tile's rows are then one vector's worth in a row. */
static void put_tile_row(const int8_t *row, const float *f, int cols, int nf, size_t t,
                         int8_t *q, float *ft) {
    int8_t *at = q + t / AMX_TILE * (size_t)AMX_TILE * cols + t % AMX_TILE * 32;
    for (int u = 0; u < cols / 32; u++) memcpy(at + (size_t)u * AMX_PANEL_UNIT, row + 32 * u, 32);
    float *fat = ft + t / AMX_TILE * (size_t)AMX_TILE * nf + t % AMX_TILE;
    for (int j = 0; j < nf; j++) fat[(size_t)j * AMX_TILE] = f[j];
}

/* tiles(qtype, w, rows, cols, x f32, T, y f32, threads): y[T, rows] = x @ W.T by AMX int8
 * tiles, x rounded to 8 bits as dots round it: dots' products up to the order of f32 sums,
 * for a prompt's many rows (native_amx.h). x's rows are rounded once (padded with zero
 * rows to a whole tile), then each thread unpacks 16 rows of W at a time into its panel
 * and multiplies it by every row of x. */
static PyObject *py_tiles(PyObject *self, PyObject *args) {
    (void)self;
    int qt, nthreads;
    Py_ssize_t rows, cols, T;
    Py_buffer w, x, y;
    if (!PyArg_ParseTuple(args, "iy*nny*nw*i", &qt, &w, &rows, &cols, &x, &T, &y, &nthreads))
        return NULL;
    PyObject *ret = NULL;
    size_t rb;
    void *scratch = NULL;
    const amx_kernels *a = K->amx;
    if (!a || !a->serves(qt)) {
        PyErr_Format(PyExc_ValueError, "no tile products for type %d with the %s kernels", qt,
                     K->name);
        goto done;
    }
    if (check_matrix(qt, rows, cols, &rb) || check_len(&w, rb * (size_t)rows, "w") ||
        T < 0 || check_len(&x, (size_t)T * (size_t)cols * sizeof(float), "x") ||
        check_len(&y, (size_t)T * (size_t)rows * sizeof(float), "y"))
        goto done;
    if (T && rows) {
        /* Per row of x: dx per 32 columns, dx * sum q per 16 and per 32 (quantize_row),
         * xs floats in all; per thread a panel of W: sc, k, then the codes. */
        const size_t nb = (size_t)cols / 32, xs = 4 * nb, tpad = ((size_t)T + 15) / 16 * 16;
        const int nt = nthreads > 1 ? nthreads : 1;
        const size_t panel = 4 * nb * AMX_TILE * sizeof(float) + nb * AMX_PANEL_UNIT;
        scratch = calloc(1, tpad * (xs * sizeof(float) + (size_t)cols) + (size_t)nt * panel);
        if (!scratch) {
            PyErr_NoMemory();
            goto done;
        }
        float *xd = scratch;
        uint8_t *panels = (uint8_t *)(xd + tpad * xs);
        int8_t *q = (int8_t *)(panels + (size_t)nt * panel);
        /* a thread's panel holds a rounded row of x before it holds W (cols + xs floats <=
         * panel bytes) */
        const int scheme = x_scheme(qt);
        const long nx = (long)T, npanels = (long)((rows + AMX_TILE - 1) / AMX_TILE);
        Py_BEGIN_ALLOW_THREADS;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && nx > 1)
        for (long t = 0; t < nx; t++) {
#ifdef _OPENMP
            int8_t *row = (int8_t *)panels + (size_t)omp_get_thread_num() * panel;
#else
            int8_t *row = (int8_t *)panels;
#endif
            float *dt = (float *)(row + cols);
            K->quantize_row((const float *)x.buf + (size_t)t * cols, (int)cols, scheme, row, dt,
                            dt + nb, dt + 3 * nb);
            put_tile_row(row, dt, (int)cols, (int)xs, (size_t)t, q, xd);
        }
#pragma omp parallel num_threads(nt) if (nt > 1 && npanels > 1)
        {
#ifdef _OPENMP
            uint8_t *mine = panels + (size_t)omp_get_thread_num() * panel;
#else
            uint8_t *mine = panels;
#endif
            float *sc = (float *)mine, *k = sc + 2 * nb * AMX_TILE; /* per 16 columns at most */
            int8_t *b = (int8_t *)(k + 2 * nb * AMX_TILE);
            a->begin(qt);
#pragma omp for schedule(static)
            for (long i = 0; i < npanels; i++) {
                const size_t n0 = (size_t)i * AMX_TILE;
                a->panel(qt, (const uint8_t *)w.buf, rb, (size_t)rows, n0, (int)cols, b, sc, k);
                a->panel_rows(qt, q, xd, (int)T, (int)cols, b, sc, k, n0, (size_t)rows,
                              (float *)y.buf);
            }
            a->end();
        }
        Py_END_ALLOW_THREADS;
    }
    ret = Py_NewRef(Py_None);
done:
    free(scratch);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    return ret;
}

static PyObject *py_tiles_for(PyObject *self, PyObject *args) {
    (void)self;
    int qt;
    if (!PyArg_ParseTuple(args, "i", &qt)) return NULL;
    return PyBool_FromLong(K->amx && K->amx->serves(qt));
}

static PyObject *py_has_tiles(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    return PyBool_FromLong(K->amx != NULL);
}

static PyObject *py_isa(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    return PyUnicode_FromString(K->name);
}

static PyObject *py_has_int8(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    return PyBool_FromLong(K->dot_rows_i8 != NULL);
}

static PyObject *py_use_isa(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    const isa_kernels *k = find_isa(name);
    if (!k) {
        PyErr_Format(PyExc_ValueError, "ISA %s: not runnable on this CPU", name);
        return NULL;
    }
    PyObject *before = PyUnicode_FromString(K->name);
    K = k;
    return before;
}

static PyObject *py_max_threads(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
#ifdef _OPENMP
    return PyLong_FromLong(omp_get_num_procs());
#else
    return PyLong_FromLong(1);
#endif
}

static PyMethodDef METHODS[] = {
    {"dequantize", py_dequantize, METH_VARARGS,
     "dequantize(qtype, w, rows, cols, index int64, out f32, threads): out[i] = W[index[i]]"},
    {"dots", py_dots, METH_VARARGS,
     "dots(qtype, w, rows, cols, x f32, T, y f32, threads, exact): y[T, rows] = x @ W.T, "
     "x rounded to 8 bits per 32 columns unless exact (or the ISA has no 8-bit dots)"},
    {"tiles", py_tiles, METH_VARARGS,
     "tiles(qtype, w, rows, cols, x f32, T, y f32, threads): y[T, rows] = x @ W.T by AMX "
     "int8 tiles, x rounded to 8 bits as dots round it"},
    {"panel", py_panel, METH_VARARGS,
     "panel(qtype, src, dst, rows, cols, to_panels, nthreads=1): dst = W's rows in panels "
     "of 16, or back in the file's order"},
    {"panels_for", py_panels_for, METH_VARARGS,
     "panels_for(qtype, cols): whether the picked ISA has panel dots for the type, and rows "
     "of cols columns are whole panel units"},
    {"tiles_for", py_tiles_for, METH_VARARGS,
     "tiles_for(qtype): whether the picked ISA has tile products for the type"},
    {"has_tiles", py_has_tiles, METH_NOARGS, "whether the picked ISA has AMX tile products"},
    {"has_int8", py_has_int8, METH_NOARGS, "whether the picked ISA has 8-bit-activation dots"},
    {"isa", py_isa, METH_NOARGS, "the instruction set the kernels were picked for"},
    {"use_isa", py_use_isa, METH_VARARGS, "use_isa(name) -> the one used before (for tests)"},
    {"max_threads", py_max_threads, METH_NOARGS, "threads available (1 without OpenMP)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_native", NULL, -1, METHODS, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (pick_isa()) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (m && (PyModule_AddIntConstant(m, "PANELS", PANELS) ||
              PyModule_AddIntConstant(m, "PANEL_ROWS", PANEL_ROWS))) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
