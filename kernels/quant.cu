// Weights kept on the device in the GGUF file's own blocks, and the two products over them:
// gemv_<type> (a few rows of x, decode) reads only the blocks and dequantizes in registers;
// dequant_<type>_f32 / _f16 (a prompt) writes a tile of rows as a GEMM operand for cuBLAS,
// into one reusable buffer, so no matrix is ever held on the device as f32 or f16.
//
// Why: an f32 copy is 4 bytes a weight where Q4_0 is 0.56 (a 7B model: 28 GB against 4), and
// decode streams every weight once per token, so the bytes a token reads shrink with them.
//
// Each type is one function, frink_run_<type>(row, run, valid, w): the 32 weights of a row's
// `run`-th run of 32 (a 32-weight block, or one eighth of a 256-weight super-block), in
// column order. Every weight equals gguf-py's dequantize (gguf/quants.py, ggml's
// dequantize_row_*) bit for bit: the same float operations in the same order, one rounding
// each (the __f*_rn intrinsics are never contracted into a fused multiply-add). The host's
// C kernels hold the same layouts (frink_cli/quant/native_blocks.h, with vectors); the test
// suite holds both to gguf-py. `valid` is how many of the 32 columns exist (F16 / BF16 rows
// need not be whole runs); every other type's rows are whole blocks.
#include "common.cuh"

// Little-endian reads from a block (blocks are 1-byte aligned: 18, 20, 22 ... bytes).
__device__ __forceinline__ unsigned int frink_u16(const unsigned char* p) {
    return (unsigned int)p[0] | ((unsigned int)p[1] << 8);
}
__device__ __forceinline__ unsigned int frink_u32(const unsigned char* p) {
    return frink_u16(p) | (frink_u16(p + 2) << 16);
}

// IEEE half -> float, exact for every input (subnormals, inf, NaN).
__device__ __forceinline__ float frink_half(unsigned int h) {
    const unsigned int sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0) {
        const float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
        return sign ? -v : v;
    }
    const unsigned int bits = e == 31 ? (0x7f800000u | (m << 13)) : (((e + 112u) << 23) | (m << 13));
    return __uint_as_float(sign | bits);
}

__device__ __forceinline__ float frink_bf16(unsigned int h) { return __uint_as_float(h << 16); }

// float -> IEEE half bits, round to nearest even (the f16 GEMM operand of a prompt's tile).
__device__ __forceinline__ unsigned short frink_to_half(float f) {
    const unsigned int x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);  // NaN
    if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520: inf
    if (ax < 0x38800000u) {  // below 2^-14: a half subnormal, m * 2^-24
        const float v = __uint_as_float(ax) * 16777216.0f;  // exact: a power of two
        return (unsigned short)(sign | (unsigned int)rintf(v));  // rintf: ties to even
    }
    unsigned int h = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 1023u);
    const unsigned int rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (unsigned short)(sign | h);
}

// IQ4_NL / IQ4_XS levels (ggml kvalues_iq4nl) and MXFP4's e2m1 values doubled (ggml
// kvalues_mxfp4, scaled by 2^(e - 128)).
__device__ const signed char FRINK_IQ4_LEVEL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                   1,    13,   25,  38,  53,  69,  89,  113};
__device__ const signed char FRINK_MXFP4_LEVEL[16] = {0,  1,  2,  3,  4,  6,  8,  12,
                                                     0, -1, -2, -3, -4, -6, -8, -12};

// -- the 32-weight types: a run is one block --------------------------------------------

// Q4_0 [d][qs 16]: w[l] = d * ((qs[l] & 15) - 8), w[l + 16] = d * ((qs[l] >> 4) - 8).
__device__ void frink_run_q4_0(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 18LL * run;
    const float d = frink_half(frink_u16(p));
    for (int l = 0; l < 16; l++) {
        w[l] = __fmul_rn(d, (float)((p[2 + l] & 15) - 8));
        w[l + 16] = __fmul_rn(d, (float)((p[2 + l] >> 4) - 8));
    }
}

// Q4_1 [d][m][qs 16]: w = d * nibble + m.
__device__ void frink_run_q4_1(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 20LL * run;
    const float d = frink_half(frink_u16(p)), m = frink_half(frink_u16(p + 2));
    for (int l = 0; l < 16; l++) {
        w[l] = __fadd_rn(__fmul_rn(d, (float)(p[4 + l] & 15)), m);
        w[l + 16] = __fadd_rn(__fmul_rn(d, (float)(p[4 + l] >> 4)), m);
    }
}

// Q5_0 [d][qh u32][qs 16]: w[l] = d * ((nibble | (bit l of qh) << 4) - 16), the high
// nibbles taking bits 16..31.
__device__ void frink_run_q5_0(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 22LL * run;
    const float d = frink_half(frink_u16(p));
    const unsigned int qh = frink_u32(p + 2);
    for (int l = 0; l < 16; l++) {
        const int lo = (int)((p[6 + l] & 15) | (((qh >> l) & 1u) << 4)) - 16;
        const int hi = (int)((p[6 + l] >> 4) | (((qh >> (l + 16)) & 1u) << 4)) - 16;
        w[l] = __fmul_rn(d, (float)lo);
        w[l + 16] = __fmul_rn(d, (float)hi);
    }
}

// Q5_1 [d][m][qh u32][qs 16]: w = d * code + m, codes as Q5_0's without the offset.
__device__ void frink_run_q5_1(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 24LL * run;
    const float d = frink_half(frink_u16(p)), m = frink_half(frink_u16(p + 2));
    const unsigned int qh = frink_u32(p + 4);
    for (int l = 0; l < 16; l++) {
        const unsigned int lo = (p[8 + l] & 15) | (((qh >> l) & 1u) << 4);
        const unsigned int hi = (p[8 + l] >> 4) | (((qh >> (l + 16)) & 1u) << 4);
        w[l] = __fadd_rn(__fmul_rn(d, (float)lo), m);
        w[l + 16] = __fadd_rn(__fmul_rn(d, (float)hi), m);
    }
}

// Q8_0 [d][qs int8 32]: w = qs * d.
__device__ void frink_run_q8_0(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 34LL * run;
    const float d = frink_half(frink_u16(p));
    for (int l = 0; l < 32; l++) w[l] = __fmul_rn((float)(signed char)p[2 + l], d);
}

// IQ4_NL [d][qs 16]: Q4_0's nibble order, w = d * level[nibble].
__device__ void frink_run_iq4_nl(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 18LL * run;
    const float d = frink_half(frink_u16(p));
    for (int l = 0; l < 16; l++) {
        w[l] = __fmul_rn(d, (float)FRINK_IQ4_LEVEL[p[2 + l] & 15]);
        w[l + 16] = __fmul_rn(d, (float)FRINK_IQ4_LEVEL[p[2 + l] >> 4]);
    }
}

// level * 2^(e - 128), exactly as gguf-py gives it, without subnormal arithmetic: a GPU may
// flush subnormal operands and results to zero, and e = 0, 1 scales are subnormal. A subnormal
// result's bits are its value in units of 2^-149; a normal one is a product of normal
// operands 2^32 too large, then its exponent field lowered by 32.
__device__ float frink_mxfp4_weight(int level, unsigned int e) {
    if (e >= 2) return __fmul_rn((float)level, __uint_as_float((e - 1u) << 23));
    const unsigned int mag = (unsigned int)(level < 0 ? -level : level);
    unsigned int bits = mag << (e + 21u);
    if (bits >= 0x800000u)
        bits = __float_as_uint(__fmul_rn((float)mag, __uint_as_float((e + 31u) << 23))) - (32u << 23);
    return __uint_as_float(bits | (level < 0 ? 0x80000000u : 0u));
}

// MXFP4 [e][qs 16]: Q4_0's nibble order, w = level[nibble] * 2^(e - 128).
__device__ void frink_run_mxfp4(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 17LL * run;
    const unsigned int e = p[0];
    for (int l = 0; l < 16; l++) {
        w[l] = frink_mxfp4_weight(FRINK_MXFP4_LEVEL[p[1 + l] & 15], e);
        w[l + 16] = frink_mxfp4_weight(FRINK_MXFP4_LEVEL[p[1 + l] >> 4], e);
    }
}

// -- the 256-weight types: run j of a super-block is its weights 32 j .. 32 j + 31 -------

// Q2_K [scales 16][qs 64][d][dmin]: weight n = 128 h + 32 s + l is (qs[32 h + l] >> 2 s) & 3
// in scale group n / 16 (scale d * (scales & 15), min dmin * (scales >> 4)): w = dl * q - ml.
// Run j = 4 h + s.
__device__ void frink_run_q2_k(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 84LL * (run / 8);
    const int j = run % 8, s = 2 * (j % 4);
    const unsigned char* q = p + 16 + 32 * (j / 4);
    const float d = frink_half(frink_u16(p + 80)), dmin = frink_half(frink_u16(p + 82));
    for (int half = 0; half < 2; half++) {
        const unsigned int sc = p[2 * j + half];
        const float dl = __fmul_rn(d, (float)(sc & 15)), ml = __fmul_rn(dmin, (float)(sc >> 4));
        for (int l = 0; l < 16; l++) {
            w[16 * half + l] = __fsub_rn(__fmul_rn(dl, (float)((q[16 * half + l] >> s) & 3)), ml);
        }
    }
}

// Q3_K [hmask 32][qs 64][scales 12][d]: weight n = 128 h + 32 s + l has low bits
// (qs[32 h + l] >> 2 s) & 3 and high bit (hmask[l] >> (4 h + s)) & 1, code = low - 4 when
// the high bit is clear; group i = n / 16 has scale d * (six bits - 32), the low four from
// scales[i % 8] (nibble i / 8), the high two from scales[8 + i % 4] (bits 2 (i / 4)).
__device__ void frink_run_q3_k(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 110LL * (run / 8);
    const int j = run % 8, s = j % 4, hb = 4 * (j / 4) + s;
    const unsigned char* q = p + 32 + 32 * (j / 4);
    const unsigned char* sc = p + 96;
    const float d = frink_half(frink_u16(p + 108));
    for (int half = 0; half < 2; half++) {
        const int i = 2 * j + half;
        const int six = ((sc[i % 8] >> (4 * (i / 8))) & 15) | (((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4);
        const float dl = __fmul_rn(d, (float)(six - 32));
        for (int l = 0; l < 16; l++) {
            const int k = 16 * half + l;
            const int code = (int)(((q[k] >> (2 * s)) & 3) | (((p[k] >> hb) & 1) << 2)) - 4;
            w[k] = __fmul_rn(dl, (float)code);
        }
    }
}

// Q4_K / Q5_K: run k's 6-bit scale and min (ggml get_scale_min_k4), scaled by d and dmin.
__device__ __forceinline__ void frink_k_scale_min(const unsigned char* p, int k, float* dl,
                                                  float* ml) {
    const unsigned char* s = p + 4;
    int sc, m;
    if (k < 4) {
        sc = s[k] & 63;
        m = s[k + 4] & 63;
    } else {
        sc = (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4);
        m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
    }
    *dl = __fmul_rn(frink_half(frink_u16(p)), (float)sc);
    *ml = __fmul_rn(frink_half(frink_u16(p + 2)), (float)m);
}

// Q4_K [d][dmin][scales 12][qs 128]: weight n = 64 c + 32 k + l is (qs[32 c + l] >> 4 k) & 15
// in run 2 c + k: w = (d * sc) * q - dmin * m.
__device__ void frink_run_q4_k(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 144LL * (run / 8);
    const int j = run % 8, s = 4 * (j % 2);
    const unsigned char* q = p + 16 + 32 * (j / 2);
    float dl, ml;
    frink_k_scale_min(p, j, &dl, &ml);
    for (int l = 0; l < 32; l++) w[l] = __fsub_rn(__fmul_rn(dl, (float)((q[l] >> s) & 15)), ml);
}

// Q5_K [d][dmin][scales 12][qh 32][qs 128]: Q4_K plus a fifth bit, weight n = 32 k + l
// taking bit k of qh[l].
__device__ void frink_run_q5_k(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 176LL * (run / 8);
    const int j = run % 8, s = 4 * (j % 2);
    const unsigned char* q = p + 48 + 32 * (j / 2);
    float dl, ml;
    frink_k_scale_min(p, j, &dl, &ml);
    for (int l = 0; l < 32; l++) {
        const unsigned int code = ((q[l] >> s) & 15) | (((p[16 + l] >> j) & 1) << 4);
        w[l] = __fsub_rn(__fmul_rn(dl, (float)code), ml);
    }
}

// Q6_K [ql 128][qh 64][scales int8 16][d]: weight n = 128 h + r has low four bits
// (ql[64 h + r % 64] >> 4 (r / 64)) & 15 and high two (qh[32 h + r % 32] >> 2 (r / 32)) & 3,
// minus 32; group n / 16 has scale d * scales[n / 16]: w = (d * scale) * code. Run j =
// 4 h + r / 32.
__device__ void frink_run_q6_k(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 210LL * (run / 8);
    const int j = run % 8, hh = j / 4, r = j % 4;
    const unsigned char* ql = p + 64 * hh + 32 * (r % 2);
    const unsigned char* qh = p + 128 + 32 * hh;
    const int sl = 4 * (r / 2), sh = 2 * r;
    const float d = frink_half(frink_u16(p + 208));
    for (int half = 0; half < 2; half++) {
        const float dl = __fmul_rn(d, (float)(signed char)p[192 + 2 * j + half]);
        for (int l = 0; l < 16; l++) {
            const int k = 16 * half + l;
            const int code = (int)(((ql[k] >> sl) & 15) | (((qh[k] >> sh) & 3) << 4)) - 32;
            w[k] = __fmul_rn(dl, (float)code);
        }
    }
}

// IQ4_XS [d][scales_h u16][scales_l 4][qs 128]: run k has scale d * (six bits - 32), the low
// four from scales_l[k / 2] (nibble k % 2), the high two from scales_h (bits 2 k); its 32
// weights are levels of qs[16 k ..] in IQ4_NL's order.
__device__ void frink_run_iq4_xs(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 136LL * (run / 8);
    const int k = run % 8;
    const unsigned int sh = frink_u16(p + 2);
    const int six = ((p[4 + k / 2] >> (4 * (k % 2))) & 15) | (((sh >> (2 * k)) & 3) << 4);
    const float dl = __fmul_rn(frink_half(frink_u16(p)), (float)(six - 32));
    const unsigned char* q = p + 8 + 16 * k;
    for (int l = 0; l < 16; l++) {
        w[l] = __fmul_rn(dl, (float)FRINK_IQ4_LEVEL[q[l] & 15]);
        w[l + 16] = __fmul_rn(dl, (float)FRINK_IQ4_LEVEL[q[l] >> 4]);
    }
}

// -- 2-byte floats: a run is 32 weights; the columns past a row's last whole run are read
// one by one (`valid`), the rest of w zeroed so a dot over all 32 adds nothing.
__device__ void frink_run_f16(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 64LL * run;
    for (int l = 0; l < 32; l++) w[l] = l < valid ? frink_half(frink_u16(p + 2 * l)) : 0.0f;
}
__device__ void frink_run_bf16(const unsigned char* row, int run, int valid, float* w) {
    const unsigned char* p = row + 64LL * run;
    for (int l = 0; l < 32; l++) w[l] = l < valid ? frink_bf16(frink_u16(p + 2 * l)) : 0.0f;
}

// -- the products --------------------------------------------------------------------------

// gemv: y[t, y_off + r] = sum_c x[t, c] * W[r, c] for t < n_x (at most FRINK_GEMV_MAX_X rows
// of x) and the `rows` rows of W. A block of FRINK_GEMV_ROWS * FRINK_GEMV_LANES threads
// takes FRINK_GEMV_ROWS rows; a row's lanes take its runs in turn (lane l: runs l, l + 32,
// ...; neighbouring lanes read neighbouring blocks), each run dequantized in registers and
// dotted with every row of x, then the lanes' sums are added in shared memory. Each output
// is summed in one fixed order whatever n_x is, so a row of x gets the same product alone
// or beside others, bit for bit.
#define FRINK_GEMV_ROWS 8
#define FRINK_GEMV_LANES 32
#define FRINK_GEMV_MAX_X 8

typedef void (*frink_run_fn)(const unsigned char*, int, int, float*);

template <frink_run_fn RUN>
__device__ void frink_gemv(const unsigned char* w, long long row_bytes, int rows, int cols,
                           const float* x, long long x_stride, int n_x, float* y,
                           long long y_stride, int y_off) {
    __shared__ float red[FRINK_GEMV_MAX_X][FRINK_GEMV_ROWS * FRINK_GEMV_LANES];
    const int tid = threadIdx.x, lane = tid % FRINK_GEMV_LANES;
    const int r = blockIdx.x * FRINK_GEMV_ROWS + tid / FRINK_GEMV_LANES;
    float acc[FRINK_GEMV_MAX_X];
    for (int t = 0; t < FRINK_GEMV_MAX_X; t++) acc[t] = 0.0f;
    if (r < rows) {  // a row past the end still takes part in the reduction's barriers
        const unsigned char* wr = w + (long long)r * row_bytes;
        const int n_runs = (cols + 31) / 32;
        for (int run = lane; run < n_runs; run += FRINK_GEMV_LANES) {
            const int valid = min(32, cols - 32 * run);
            float wv[32];
            RUN(wr, run, valid, wv);
            for (int t = 0; t < FRINK_GEMV_MAX_X; t++) {
                if (t >= n_x) break;
                const float* xr = x + t * x_stride + 32LL * run;
                float s = 0.0f;
                if (valid == 32) {  // every run but an F16 / BF16 row's last: unrolled
                    for (int l = 0; l < 32; l++) s += wv[l] * xr[l];
                } else {
                    for (int l = 0; l < valid; l++) s += wv[l] * xr[l];
                }
                acc[t] += s;
            }
        }
    }
    for (int t = 0; t < FRINK_GEMV_MAX_X; t++) red[t][tid] = acc[t];
    __syncthreads();
    for (int stride = FRINK_GEMV_LANES / 2; stride > 0; stride >>= 1) {
        if (lane < stride) {
            for (int t = 0; t < n_x; t++) red[t][tid] += red[t][tid + stride];
        }
        __syncthreads();
    }
    if (lane == 0 && r < rows) {
        for (int t = 0; t < n_x; t++) y[t * y_stride + y_off + r] = red[t][tid];
    }
}

// dequant: rows [0, rows) of W as a dense [rows, cols] operand, f32 or f16 bits. One run per
// thread, grid-stride, so any grid covers any matrix.
template <frink_run_fn RUN>
__device__ void frink_dequant(const unsigned char* w, long long row_bytes, int rows, int cols,
                              float* out_f32, unsigned short* out_f16) {
    const int n_runs = (cols + 31) / 32;
    const long long n = (long long)rows * n_runs;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(i / n_runs), run = (int)(i % n_runs);
        const int valid = min(32, cols - 32 * run);
        float wv[32];
        RUN(w + r * row_bytes, run, valid, wv);
        const long long o = (long long)r * cols + 32LL * run;
        for (int l = 0; l < valid; l++) {
            if (out_f32) {
                out_f32[o + l] = wv[l];
            } else {
                out_f16[o + l] = frink_to_half(wv[l]);
            }
        }
    }
}

// One gemv_<t>, dequant_<t>_f32 and dequant_<t>_f16 per type (ops.py names them so).
#define FRINK_QUANT_KERNELS(t)                                                                 \
    extern "C" __global__ void gemv_##t(const unsigned char* w, long long row_bytes, int rows, \
                                        int cols, const float* x, long long x_stride, int n_x, \
                                        float* y, long long y_stride, int y_off) {            \
        frink_gemv<frink_run_##t>(w, row_bytes, rows, cols, x, x_stride, n_x, y, y_stride,    \
                                  y_off);                                                     \
    }                                                                                          \
    extern "C" __global__ void dequant_##t##_f32(const unsigned char* w, long long row_bytes,  \
                                                 int rows, int cols, float* out) {            \
        frink_dequant<frink_run_##t>(w, row_bytes, rows, cols, out, 0);                        \
    }                                                                                          \
    extern "C" __global__ void dequant_##t##_f16(const unsigned char* w, long long row_bytes,  \
                                                 int rows, int cols, unsigned short* out) {   \
        frink_dequant<frink_run_##t>(w, row_bytes, rows, cols, 0, out);                        \
    }

FRINK_QUANT_KERNELS(f16)
FRINK_QUANT_KERNELS(q4_0)
FRINK_QUANT_KERNELS(q4_1)
FRINK_QUANT_KERNELS(q5_0)
FRINK_QUANT_KERNELS(q5_1)
FRINK_QUANT_KERNELS(q8_0)
FRINK_QUANT_KERNELS(q2_k)
FRINK_QUANT_KERNELS(q3_k)
FRINK_QUANT_KERNELS(q4_k)
FRINK_QUANT_KERNELS(q5_k)
FRINK_QUANT_KERNELS(q6_k)
FRINK_QUANT_KERNELS(iq4_nl)
FRINK_QUANT_KERNELS(iq4_xs)
FRINK_QUANT_KERNELS(bf16)
FRINK_QUANT_KERNELS(mxfp4)
