// The small ops between the GEMMs: bias rows, residual adds, the activations (gated and
// plain) and the QKV clamp. Each is one grid-stride loop, so any grid covers any size.

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

// The activations, by code (ops.py's ACT_CODES): 0 is SiLU, g / (1 + exp(-g)); 1 is GELU's
// tanh form, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) -- the host body's formulas
// (graph/ffn.py). One definition for the gated FFN (glu_f32) and the plain one (act_f32).
#define FRINK_ACT_SILU 0
#define FRINK_ACT_GELU_TANH 1

__device__ __forceinline__ float frink_act(float g, int act) {
    if (act == FRINK_ACT_GELU_TANH) {
        const float c = 0.7978845608028654f;  // sqrt(2 / pi)
        return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g)));
    }
    return g / (1.0f + expf(-g));
}

// h[t, i] = act(gu[t, i]) * gu[t, n_ff + i]: gate columns first, then up columns, as the
// fused gate_up matrix holds them, so llama / qwen (SwiGLU) and gemma (GeGLU) share one
// kernel.
extern "C" __global__ void glu_f32(const float* gu, float* h, long long n_rows, int n_ff, int act) {
    const long long n = n_rows * n_ff;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / n_ff;
        const int j = (int)(i % n_ff);
        h[i] = frink_act(gu[t * 2 * n_ff + j], act) * gu[t * 2 * n_ff + n_ff + j];
    }
}

// y = act(x) elementwise: the plain (non-gated) FFN's activation, down(act(up(h)))
// (starcoder2, bloom, mpt).
extern "C" __global__ void act_f32(const float* x, float* y, long long n, int act) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        y[i] = frink_act(x[i], act);
    }
}

// x clipped to [-c, c] in place: mpt's clamp_kqv on the fused QKV rows. fminf/fmaxf, as
// np.clip, for every finite value.
extern "C" __global__ void clamp_f32(float* x, long long n, float c) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        x[i] = fminf(fmaxf(x[i], -c), c);
    }
}
