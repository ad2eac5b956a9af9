"""`frink bench`: tokens per second, measured the way llama-bench measures them.

People pick a runner by its numbers, and our goals are ratios against llama.cpp taken side
by side, so the method copies llama-bench's: synthetic token ids (tokenization and sampling
excluded), one warm-up, r repetitions; a prompt test (pp N) feeds N tokens to an empty
context as one batch, a generation test (tg N) feeds N tokens one at a time to an empty
context; both include the logits of the last row and nothing else. With -d D ("pp512 @
d4096") the context already holds D tokens, fed untimed before each run: speed at depth,
where attention over the cache is part of every token's cost. With a llama.cpp
comparison the two runners alternate repetition by repetition on the same GGUF and the same
ids, so a noisy shared machine slows both alike and the ratio stays meaningful.
"""

from __future__ import annotations

from .cases import BenchTest, Sample, bench_tests, peak_memory_mib
from .llamacpp import PLAIN_CPU_ENV, LlamaCppRunner, llama_cpp_plain_cpu_buffers
from .output import format_csv, format_json, format_md
from .rows import BenchRow
from .run import COMPARE_TARGETS, run_bench

__all__ = [
    "COMPARE_TARGETS",
    "PLAIN_CPU_ENV",
    "BenchRow",
    "BenchTest",
    "LlamaCppRunner",
    "Sample",
    "bench_tests",
    "format_csv",
    "format_json",
    "format_md",
    "llama_cpp_plain_cpu_buffers",
    "peak_memory_mib",
    "run_bench",
]
