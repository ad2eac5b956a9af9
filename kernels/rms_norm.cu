// RMSNorm as llama.cpp computes it, y = x / sqrt(mean(x^2) + eps) * w, over rows that may
// sit inside a wider buffer: row r starts at (r / group) * stride + (r % group) * dim.
// With group = 1, stride = dim it normalizes hidden rows; with group = n_heads and the
// fused QKV row stride it normalizes Q or K heads in place (QK norm) without a copy.
// One block per row; x and y may be the same buffer (each element is read, then written,
// by the same thread).
#include "common.cuh"

extern "C" __global__ void rms_norm_f32(const float* x, float* y, const float* w, int n_rows,
                                        int dim, int group, long long x_stride,
                                        long long y_stride, float eps) {
    __shared__ float red[FRINK_MAX_THREADS];
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // whole block: the grid is exactly n_rows in practice
    const long long xo = (long long)(row / group) * x_stride + (long long)(row % group) * dim;
    const long long yo = (long long)(row / group) * y_stride + (long long)(row % group) * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = x[xo + i];
        s += v * v;
    }
    s = frink_block_reduce(s, red, false);
    const float scale = 1.0f / sqrtf(s / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        y[yo + i] = x[xo + i] * scale * w[i];
    }
}
