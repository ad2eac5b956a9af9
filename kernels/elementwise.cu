// The small ops between the GEMMs: bias rows, residual adds and the SwiGLU gate. Each is
// one grid-stride loop, so any grid covers any size.

// y[r, c] += b[c] for a [n_rows, n_cols] buffer (QKV / output biases).
extern "C" __global__ void add_bias_f32(float* y, const float* b, long long n_rows, int n_cols) {
    const long long n = n_rows * n_cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        y[i] += b[i % n_cols];
    }
}

// x += a, the residual stream.
extern "C" __global__ void add_f32(float* x, const float* a, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        x[i] += a[i];
    }
}

// h[t, i] = silu(gu[t, i]) * gu[t, n_ff + i]: gate rows first, then up rows, as the
// fused gate_up matrix holds them. silu(g) = g / (1 + exp(-g)), the host body's formula.
extern "C" __global__ void swiglu_f32(const float* gu, float* h, long long n_rows, int n_ff) {
    const long long n = n_rows * n_ff;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / n_ff;
        const int j = (int)(i % n_ff);
        const float g = gu[t * 2 * n_ff + j];
        const float u = gu[t * 2 * n_ff + n_ff + j];
        h[i] = g / (1.0f + expf(-g)) * u;
    }
}
