// Causal GQA attention for a batch of new rows over the cache's prefix plus themselves.
//
// Q, K and V of the new rows are read where the fused QKV GEMM left them: row t of a
// [T, row_stride] buffer, at column offsets q_off / k_off / v_off, heads side by side.
// The prefix (rows at positions 0..P-1, already in the host cache) comes as
// [n_head_kv, P, head_dim] buffers, the host cache's own layout, so it uploads with no
// transpose. New row t sits at position P + t and sees prefix rows 0..P-1 and new rows
// 0..t. Query head h reads KV head h / (n_head / n_head_kv), as llama.cpp maps GQA.
//
// One block per (new row, query head). Keys are taken blockDim.x at a time: each thread
// scores one key, the block takes the chunk's max and sum (online softmax: earlier sums
// are rescaled when the max grows), then each thread accumulates one or two output dims
// over the chunk's keys. q is pre-scaled by `scale`, as the host body scales q.
#include "common.cuh"

#define FRINK_MAX_HEAD_DIM 256

extern "C" __global__ void causal_gqa_attention_f32(
    const float* qkv, long long row_stride, int q_off, int k_off, int v_off,
    const float* k_prefix, const float* v_prefix, int n_prefix, float* out,
    long long out_stride, int n_rows, int n_head, int n_head_kv, int head_dim, int head_dim_v,
    float scale) {
    __shared__ float qs[FRINK_MAX_HEAD_DIM];
    __shared__ float ps[FRINK_MAX_THREADS];
    __shared__ float red[FRINK_MAX_THREADS];
    const int tid = threadIdx.x;
    const int nt = blockDim.x;
    const int t = blockIdx.x / n_head;
    const int h = blockIdx.x % n_head;
    if (t >= n_rows) return;  // whole block
    const int kvh = h / (n_head / n_head_kv);

    const float* qrow = qkv + (long long)t * row_stride + q_off + (long long)h * head_dim;
    for (int d = tid; d < head_dim; d += nt) qs[d] = qrow[d] * scale;
    __syncthreads();

    // A finite "minus infinity": exp(NEG - m) is 0 for every real m, and NEG - NEG is 0,
    // never NaN, whatever the chunk holds.
    const float NEG = -3.0e38f;
    float m = NEG;
    float l = 0.0f;
    float acc0 = 0.0f;
    float acc1 = 0.0f;
    const int n_keys = n_prefix + t + 1;
    for (int base = 0; base < n_keys; base += nt) {
        const int j = base + tid;
        float s = NEG;
        if (j < n_keys) {
            const float* krow = j < n_prefix
                ? k_prefix + ((long long)kvh * n_prefix + j) * head_dim
                : qkv + (long long)(j - n_prefix) * row_stride + k_off + (long long)kvh * head_dim;
            s = 0.0f;
            for (int d = 0; d < head_dim; ++d) s += qs[d] * krow[d];
        }
        const float m_new = fmaxf(m, frink_block_reduce(s, red, true));
        const float p = j < n_keys ? expf(s - m_new) : 0.0f;
        ps[tid] = p;
        const float chunk_sum = frink_block_reduce(p, red, false);  // its syncs publish ps
        const float corr = expf(m - m_new);
        l = l * corr + chunk_sum;
        acc0 *= corr;
        acc1 *= corr;
        const int n_chunk = min(nt, n_keys - base);
        for (int jj = 0; jj < n_chunk; ++jj) {
            const int k = base + jj;
            const float* vrow = k < n_prefix
                ? v_prefix + ((long long)kvh * n_prefix + k) * head_dim_v
                : qkv + (long long)(k - n_prefix) * row_stride + v_off + (long long)kvh * head_dim_v;
            const float pk = ps[jj];
            if (tid < head_dim_v) acc0 += pk * vrow[tid];
            if (tid + nt < head_dim_v) acc1 += pk * vrow[tid + nt];
        }
        m = m_new;
        __syncthreads();  // ps is rewritten by the next chunk
    }
    float* orow = out + (long long)t * out_stride + (long long)h * head_dim_v;
    const float inv = 1.0f / l;
    if (tid < head_dim_v) orow[tid] = acc0 * inv;
    if (tid + nt < head_dim_v) orow[tid + nt] = acc1 * inv;
}
