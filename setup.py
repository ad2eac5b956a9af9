"""Builds frink's one compiled module, the host kernels over GGUF blocks
(frink_cli/quant/native.c -> frink_cli.quant._native), when frink is installed.

Everything else about the package is in pyproject.toml. The build is optional: without a C
compiler frink still installs and runs its NumPy path (`frink info` names which runs).
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


class BuildNative(build_ext):
    def build_extension(self, ext: Extension) -> None:
        if self.compiler.compiler_type == "msvc":
            ext.extra_compile_args = ["/O2", "/fp:precise"]
            super().build_extension(ext)
            return
        ext.extra_compile_args = BASE_FLAGS + OPENMP
        ext.extra_link_args = OPENMP
        try:
            super().build_extension(ext)
        except Exception as e:  # no OpenMP (Apple's clang): one thread, still compiled
            print(f"frink: building the native kernels without OpenMP ({e})", file=sys.stderr)
            ext.extra_compile_args = BASE_FLAGS
            ext.extra_link_args = []
            super().build_extension(ext)


setup(
    ext_modules=[
        Extension(
            "frink_cli.quant._native",
            sources=["frink_cli/quant/native.c"],
            depends=[
                "frink_cli/quant/native_isa.h",
                "frink_cli/quant/native_blocks.h",
                "frink_cli/quant/native_int8.h",
                "frink_cli/quant/native_amx.h",
            ],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildNative},
)
