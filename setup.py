"""Builds frink's two compiled modules when frink is installed: the host kernels over GGUF
blocks (frink_cli/quant/native.c -> frink_cli.quant._native) and the host body's row-wise
ops (frink_cli/backends/host/rowwise.c -> frink_cli.backends.host._rowwise).

Everything else about the package is in pyproject.toml. The build is optional: without a C
compiler frink still installs and runs its NumPy paths (`frink info` names which runs).
OpenMP is used where the compiler has it (gcc's -fopenmp); without it the kernels run on
one thread.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# -ffp-contract=off: a dequantized weight is d * q + m rounded twice, as gguf-py computes
# it; a fused multiply-add would round once (the dots use FMA explicitly where they want it).
BASE_FLAGS = ["-O3", "-ffp-contract=off", "-fno-strict-aliasing"]
OPENMP = ["-fopenmp"]
# Per module: the row-wise ops' loops select between computed values (exp's range), which
# GCC vectorizes for AVX2 and SSE only when it may assume no FP traps (no value changes).
OWN_FLAGS = {"frink_cli.backends.host._rowwise": ["-fno-trapping-math"]}


class BuildNative(build_ext):
    def build_extension(self, ext: Extension) -> None:
        if self.compiler.compiler_type == "msvc":
            ext.extra_compile_args = ["/O2", "/fp:precise"]
            super().build_extension(ext)
            return
        own = OWN_FLAGS.get(ext.name, [])
        ext.extra_compile_args = BASE_FLAGS + own + OPENMP
        ext.extra_link_args = OPENMP
        try:
            super().build_extension(ext)
        except Exception as e:  # no OpenMP (Apple's clang): one thread, still compiled
            print(f"frink: building the native kernels without OpenMP ({e})", file=sys.stderr)
            ext.extra_compile_args = BASE_FLAGS + own
            ext.extra_link_args = []
            super().build_extension(ext)


setup(
    ext_modules=[
        Extension(
            "frink_cli.quant._native",
            sources=["frink_cli/quant/native.c"],
            depends=[
                "frink_cli/quant/native_isa.h",
                "frink_cli/quant/native_ymm.h",
                "frink_cli/quant/native_blocks.h",
                "frink_cli/quant/native_int8.h",
                "frink_cli/quant/native_kdots.h",
                "frink_cli/quant/native_panels.h",
                "frink_cli/quant/native_amx.h",
            ],
            optional=True,
        ),
        Extension(
            "frink_cli.backends.host._rowwise",
            sources=["frink_cli/backends/host/rowwise.c"],
            depends=[
                "frink_cli/backends/host/rowwise_kv.h",
                "frink_cli/backends/host/rowwise_kv_avx2.h",
                "frink_cli/backends/host/rowwise_kv_avx512.h",
                "frink_cli/backends/host/rowwise_delta.h",
                "frink_cli/backends/host/rowwise_loops.h",
            ],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": BuildNative},
)
