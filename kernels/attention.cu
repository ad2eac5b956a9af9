// Causal GQA attention of a batch of new rows over the cache rows before them and
// themselves, read from the device KV cache.
//
// The new rows' K and V have already been written into the cache (the stack copies them
// there right after rope), so every key comes from one place: k_cache / v_cache hold
// [n_head_kv, cache_rows, head_dim] -- the host cache's own layout -- and row j of a head
// is position j. Q is read where the fused QKV GEMM left it: row t of a [T, q_stride]
// buffer at column q_off, heads side by side. New row t sits at position n_prefix + t and
// sees positions lo..n_prefix + t, where lo = 0, or with a sliding window of w positions
// lo = max(0, n_prefix + t - w + 1) (the host body's mask: p - j < w). Query head h reads
// KV head h / (n_head / n_head_kv), as llama.cpp maps GQA.
//
// One block per (new row, query head). Keys are taken blockDim.x at a time: each thread
// scores one key, the block takes the chunk's max and sum (online softmax: earlier sums
// are rescaled when the max grows), then each thread accumulates one or two output dims
// over the chunk's keys. q is pre-scaled by `scale`, as the host body scales q.
//
// ALiBi (bloom, mpt; when `alibi` is non-zero): query head h's score against the key at
// position j gets -slopes[h] * (pos - j) added after the dot product, as the host body and
// llama.cpp's soft_max_ext with max_bias add it; nothing has rotated Q or K. The slopes are
// the model's (ModelConfig.alibi_slopes), one per query head. Without ALiBi `slopes` is
// never read (CuPy needs an array for every pointer argument: callers pass any array).
#include "common.cuh"

#define FRINK_MAX_HEAD_DIM 256

extern "C" __global__ void causal_gqa_attention_f32(
    const float* q_buf, long long q_stride, int q_off, const float* k_cache,
    const float* v_cache, long long cache_rows, int n_prefix, float* out, long long out_stride,
    int n_rows, int n_head, int n_head_kv, int head_dim, int head_dim_v, float scale,
    int window, const float* slopes, int alibi) {
    __shared__ float qs[FRINK_MAX_HEAD_DIM];
    __shared__ float ps[FRINK_MAX_THREADS];
    __shared__ float red[FRINK_MAX_THREADS];
    const int tid = threadIdx.x;
    const int nt = blockDim.x;
    const int t = blockIdx.x / n_head;
    const int h = blockIdx.x % n_head;
    if (t >= n_rows) return;  // whole block
    const int kvh = h / (n_head / n_head_kv);
    const float* k_head = k_cache + (long long)kvh * cache_rows * head_dim;
    const float* v_head = v_cache + (long long)kvh * cache_rows * head_dim_v;

    const float* qrow = q_buf + (long long)t * q_stride + q_off + (long long)h * head_dim;
    for (int d = tid; d < head_dim; d += nt) qs[d] = qrow[d] * scale;
    __syncthreads();

    // A finite "minus infinity": exp(NEG - m) is 0 for every real m, and NEG - NEG is 0,
    // never NaN, whatever the chunk holds.
    const float NEG = -3.0e38f;
    float m = NEG;
    float l = 0.0f;
    float acc0 = 0.0f;
    float acc1 = 0.0f;
    const int pos = n_prefix + t;
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    const float slope = alibi ? slopes[h] : 0.0f;
    for (int base = lo; base <= pos; base += nt) {
        const int j = base + tid;
        float s = NEG;
        if (j <= pos) {
            const float* krow = k_head + (long long)j * head_dim;
            s = 0.0f;
            for (int d = 0; d < head_dim; ++d) s += qs[d] * krow[d];
            if (alibi) s -= slope * (float)(pos - j);
        }
        const float m_new = fmaxf(m, frink_block_reduce(s, red, true));
        const float p = j <= pos ? expf(s - m_new) : 0.0f;
        ps[tid] = p;
        const float chunk_sum = frink_block_reduce(p, red, false);  // its syncs publish ps
        const float corr = expf(m - m_new);
        l = l * corr + chunk_sum;
        acc0 *= corr;
        acc1 *= corr;
        const int n_chunk = min(nt, pos + 1 - base);
        for (int jj = 0; jj < n_chunk; ++jj) {
            const float* vrow = v_head + (long long)(base + jj) * head_dim_v;
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
