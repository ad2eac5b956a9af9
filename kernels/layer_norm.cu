// LayerNorm as llama.cpp computes it (ggml_norm, then its weight and bias):
// y = (x - mean) / sqrt(mean((x - mean)^2) + eps) * w (+ b), over contiguous rows of `dim`
// (starcoder2, bloom and mpt norm every hidden row this way). Two block reductions, the
// mean and then the variance of the centered row, as the host body computes them (a single
// pass of sum and sum of squares loses digits when the mean is large against the spread).
// b is read only when has_bias: CuPy needs an array for every pointer argument, so callers
// without a bias pass any array there rather than a null pointer.
// One block per row; x and y may be the same buffer (each element is read, then written,
// by the same thread).
#include "common.cuh"

extern "C" __global__ void layer_norm_f32(const float* x, float* y, const float* w,
                                          const float* b, int has_bias, int n_rows, int dim,
                                          float eps) {
    __shared__ float red[FRINK_MAX_THREADS];
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // whole block: the grid is exactly n_rows in practice
    const float* xr = x + (long long)row * dim;
    float* yr = y + (long long)row * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
    const float mean = frink_block_reduce(s, red, false) / (float)dim;
    float v = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float c = xr[i] - mean;
        v += c * c;
    }
    const float inv = 1.0f / sqrtf(frink_block_reduce(v, red, false) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float out = (xr[i] - mean) * inv * w[i];
        yr[i] = has_bias ? out + b[i] : out;
    }
}
