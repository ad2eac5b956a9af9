// Shared device helpers for frink's kernels. Each kernel file includes this one by a
// plain textual include (CuPy's RawModule compiles one source string, so the backend
// inlines it; nvcc and the CPU emulator in the tests resolve the #include themselves).
//
// Every reduction here is a shared-memory tree over the whole block, with no warp
// shuffles: it is what lets the test suite run these exact sources on the CPU (one thread
// per CUDA thread, __syncthreads as a barrier) on machines without a GPU.
#pragma once

// Block-wide sum or max of one float per thread; blockDim.x must be a power of two no
// larger than FRINK_MAX_THREADS. Every thread of the block must call it (it syncs).
#define FRINK_MAX_THREADS 256

__device__ __forceinline__ float frink_block_reduce(float v, float* red, bool is_max) {
    const int tid = threadIdx.x;
    red[tid] = v;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (tid < stride) {
            red[tid] = is_max ? fmaxf(red[tid], red[tid + stride]) : red[tid] + red[tid + stride];
        }
        __syncthreads();
    }
    const float out = red[0];
    // Nobody may overwrite red[0] (the next reduction) before every thread has read it.
    __syncthreads();
    return out;
}
