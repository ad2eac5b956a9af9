// Just enough of CUDA C++ to run frink's kernels on the CPU, for machines with no GPU.
//
// Why: the kernels' indexing, strides, reductions and online softmax are where a GPU
// backend goes wrong, and CI has no GPU. Here each CUDA thread is a std::thread, one
// block runs at a time with its threads truly concurrent, __syncthreads() is a barrier of
// the block, and __shared__ arrays are function statics (shared by the block's threads,
// reused by the next block, as on a GPU). A thread that skips a barrier its block-mates
// reach hangs here as it would misbehave there. Warp shuffles are deliberately absent:
// the kernels use none.
#pragma once

#include <barrier>
#include <cmath>
#include <cstring>
#include <math.h>
#include <thread>
#include <vector>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;
inline std::barrier<>* emu_block_barrier = nullptr;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
// Bit casts and the round-to-nearest float operations (never contracted into an FMA on the
// device; plain operations here, where the build enables no FMA).
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// When set, every emulated thread runs with subnormal operands and results flushed to zero
// (x86's DAZ and FTZ), as a GPU does under -ftz=true: a kernel must not depend on
// subnormal arithmetic where the host gives exact subnormals.
inline bool emu_flush_subnormals = false;

// One std::thread per thread of a block, made once per launch: each runs its thread of every
// block in turn, the blocks one after another, a barrier between them so that no block's
// shared memory is touched by the next before all its threads are done.
template <typename... P, typename... A>
void emu_launch(void (*kernel)(P...), unsigned grid, unsigned block, A... args) {
    gridDim = dim3{grid, 1, 1};
    blockDim = dim3{block, 1, 1};
    std::barrier<> bar(block);
    emu_block_barrier = &bar;
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (unsigned i = 0; i < block; ++i) {
        threads.emplace_back([=, &bar] {
            threadIdx = dim3{i, 1, 1};
#if defined(__SSE__)
            if (emu_flush_subnormals) _mm_setcsr(_mm_getcsr() | 0x8040u);
#endif
            for (unsigned b = 0; b < grid; ++b) {
                blockIdx = dim3{b, 1, 1};
                kernel(args...);
                bar.arrive_and_wait();
            }
        });
    }
    for (auto& t : threads) t.join();
}
