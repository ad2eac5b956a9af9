"""kernels/*.cu run on the CPU: a launcher for KernelOps that needs only g++.

Why: CI has no GPU, and the kernels' launch arithmetic and indexing are where a GPU
backend breaks. tests/kernel_emu/cuda_emu.h maps the few CUDA constructs the kernels use
onto std::thread and std::barrier; this module compiles kernels/*.cu against it once per
session (a few seconds) and launches kernels through ctypes with NumPy arrays, so
KernelOps (the very object the GPU path uses) runs unchanged. What it cannot show is
anything about NVRTC, CuPy or the hardware: those are the gpu-marked tests' job.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parent
SOURCES = [
    _HERE / "kernel_emu" / "kernels_emu.cpp",
    _HERE / "kernel_emu" / "cuda_emu.h",
    *sorted((_REPO / "kernels").glob("*.cu*")),
]


def compiler() -> str | None:
    return shutil.which("g++")


def build(out_dir: Path) -> Path:
    """Compile the emulated kernels into out_dir; raises CalledProcessError with g++'s words."""
    cxx = compiler()
    if cxx is None:
        raise FileNotFoundError("g++")
    lib = out_dir / "kernels_emu.so"
    subprocess.run(
        [
            cxx,
            "-std=c++20",
            "-O1",
            "-pthread",
            "-shared",
            "-fPIC",
            "-I",
            str(_HERE / "kernel_emu"),
            "-I",
            str(_REPO / "kernels"),
            str(_HERE / "kernel_emu" / "kernels_emu.cpp"),
            "-o",
            str(lib),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return lib


class EmulatedLauncher:
    """launch(kernel, grid, block, args) like CuPy's RawKernel call, on the CPU."""

    def __init__(self, lib_path: Path) -> None:
        self.lib = ctypes.CDLL(str(lib_path))
        self.launches: list[str] = []

    @staticmethod
    def _ctype(arg: object) -> tuple[type, object]:
        if isinstance(arg, np.ndarray):
            return ctypes.c_void_p, ctypes.c_void_p(arg.ctypes.data)
        if isinstance(arg, np.int32):
            return ctypes.c_int, ctypes.c_int(int(arg))
        if isinstance(arg, np.int64):
            return ctypes.c_longlong, ctypes.c_longlong(int(arg))
        if isinstance(arg, np.float32):
            return ctypes.c_float, ctypes.c_float(float(arg))
        raise TypeError(f"kernel argument of type {type(arg).__name__}: pass an exact C type")

    @contextlib.contextmanager
    def flushing_subnormals(self) -> Iterator[None]:
        """Launches inside run with subnormals flushed to zero (DAZ and FTZ), as on a GPU
        compiled with -ftz=true; skips the test where the CPU has no such mode."""
        if not self.lib.emu_set_flush_subnormals(1):
            pytest.skip("this CPU has no flush-to-zero mode to emulate a GPU's")
        try:
            yield
        finally:
            self.lib.emu_set_flush_subnormals(0)

    def __call__(self, kernel: str, grid: int, block: int, args: tuple) -> None:
        if not 1 <= block <= 1024 or grid < 1:
            raise ValueError(f"{kernel}: bad launch grid={grid} block={block}")
        fn = getattr(self.lib, f"emu_{kernel}")
        types, values = zip(*(self._ctype(a) for a in args))
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint, *types]
        fn.restype = None
        fn(grid, block, *values)
        self.launches.append(kernel)
