// Rotary position embedding, in place, on `heads` heads of `head_dim` at column `offset`
// of every row of a [T, row_stride] buffer (Q or K inside the fused QKV output).
// cos/sin are [T, rope_dim / 2], already gathered for each row's position on the host in
// float64 then rounded, exactly as the host body's tables are. Layout "norm" (neox = 0)
// rotates adjacent pairs (2i, 2i+1), llama's GGUF order; "neox" rotates (i, i + rope_dim/2).
// Dims past rope_dim are left as they are. One thread per (row, head, pair).

extern "C" __global__ void rope_f32(float* x, const float* cos_t, const float* sin_t, int n_rows,
                                    int heads, int head_dim, long long row_stride, int offset,
                                    int rope_dim, int neox) {
    const int half = rope_dim / 2;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n_rows * heads * half) return;
    const int i = (int)(idx % half);
    const int h = (int)((idx / half) % heads);
    const int t = (int)(idx / ((long long)half * heads));
    float* p = x + (long long)t * row_stride + offset + (long long)h * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float c = cos_t[(long long)t * half + i];
    const float s = sin_t[(long long)t * half + i];
    const float xa = p[a];
    const float xb = p[b];
    p[a] = xa * c - xb * s;
    p[b] = xb * c + xa * s;
}
