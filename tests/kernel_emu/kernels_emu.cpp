// The kernels of kernels/*.cu compiled for the CPU emulator, one C entry point each
// (emu_<kernel>(grid, block, kernel args...)) for ctypes. Built by tests/kernel_emu/emu.py.
#include "cuda_emu.h"

#include "attention.cu"
#include "elementwise.cu"
#include "layer_norm.cu"
#include "quant.cu"
#include "rms_norm.cu"
#include "rope.cu"

#define EMU_ENTRY(name, params, args)                                        \
    extern "C" void emu_##name(unsigned grid, unsigned block, EMU_UNPACK params) { \
        emu_launch(name, grid, block, EMU_UNPACK args);                      \
    }
#define EMU_UNPACK(...) __VA_ARGS__

extern "C" int emu_set_flush_subnormals(int on) {
#if defined(__SSE__)
    emu_flush_subnormals = on != 0;
    return 1;
#else
    return 0;
#endif
}

EMU_ENTRY(rms_norm_f32,
          (const float* x, float* y, const float* w, int n_rows, int dim, int group,
           long long x_stride, long long y_stride, float eps),
          (x, y, w, n_rows, dim, group, x_stride, y_stride, eps))
EMU_ENTRY(rope_f32,
          (float* x, const float* c, const float* s, int n_rows, int heads, int head_dim,
           long long row_stride, int offset, int rope_dim, int neox),
          (x, c, s, n_rows, heads, head_dim, row_stride, offset, rope_dim, neox))
EMU_ENTRY(add_bias_f32, (float* y, const float* b, long long n_rows, int n_cols),
          (y, b, n_rows, n_cols))
EMU_ENTRY(add_f32, (float* x, const float* a, long long n), (x, a, n))
EMU_ENTRY(glu_f32, (const float* gu, float* h, long long n_rows, int n_ff, int act),
          (gu, h, n_rows, n_ff, act))
EMU_ENTRY(act_f32, (const float* x, float* y, long long n, int act), (x, y, n, act))
EMU_ENTRY(clamp_f32, (float* x, long long n, float c), (x, n, c))
EMU_ENTRY(layer_norm_f32,
          (const float* x, float* y, const float* w, const float* b, int has_bias, int n_rows,
           int dim, float eps),
          (x, y, w, b, has_bias, n_rows, dim, eps))
EMU_ENTRY(causal_gqa_attention_f32,
          (const float* q, long long q_stride, int q_off, const float* kc, const float* vc,
           long long cache_rows, int n_prefix, float* out, long long out_stride, int n_rows,
           int n_head, int n_head_kv, int head_dim, int head_dim_v, float scale, int window,
           const float* slopes, int alibi),
          (q, q_stride, q_off, kc, vc, cache_rows, n_prefix, out, out_stride, n_rows, n_head,
           n_head_kv, head_dim, head_dim_v, scale, window, slopes, alibi))

// The quantized products, three kernels per type (kernels/quant.cu's FRINK_QUANT_KERNELS).
#define EMU_QUANT(t)                                                                          \
    EMU_ENTRY(gemv_##t,                                                                       \
              (const unsigned char* w, long long row_bytes, int rows, int cols, const float* x, \
               long long x_stride, int n_x, float* y, long long y_stride, int y_off),          \
              (w, row_bytes, rows, cols, x, x_stride, n_x, y, y_stride, y_off))               \
    EMU_ENTRY(dequant_##t##_f32,                                                              \
              (const unsigned char* w, long long row_bytes, int rows, int cols, float* out),    \
              (w, row_bytes, rows, cols, out))                                                \
    EMU_ENTRY(dequant_##t##_f16,                                                              \
              (const unsigned char* w, long long row_bytes, int rows, int cols,                 \
               unsigned short* out),                                                          \
              (w, row_bytes, rows, cols, out))

EMU_QUANT(f16)
EMU_QUANT(q4_0)
EMU_QUANT(q4_1)
EMU_QUANT(q5_0)
EMU_QUANT(q5_1)
EMU_QUANT(q8_0)
EMU_QUANT(q2_k)
EMU_QUANT(q3_k)
EMU_QUANT(q4_k)
EMU_QUANT(q5_k)
EMU_QUANT(q6_k)
EMU_QUANT(iq4_nl)
EMU_QUANT(iq4_xs)
EMU_QUANT(bf16)
EMU_QUANT(mxfp4)
