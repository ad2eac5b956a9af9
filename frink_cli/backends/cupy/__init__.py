"""The cuda backend: CuPy's dense prefill stack on NVIDIA GPUs (`--backend cuda`).

Layout: eligibility.py (what it takes: one predicate per kind of work), capabilities.py
(the ops it implements, asked of each layer's trace), stack.py (the run of layers, written
once against an array module and an ops table), gemm.py (the GEMMs over dense or quantized
device weights), geometry.py (what the attention kernel is told besides its buffers),
reference_ops.py (NumPy references), kernel_ops.py (kernel launches), cuda_ops.py (the Ops
interface over either; ops.py gathers them all), backend.py (plan/run for the decoder
loop); kernels in the repository's kernels/*.cu. This module picks the array module: CuPy
on a GPU, or NumPy standing in for it (FRINK_CUDA_ARRAY_MODULE=numpy; tests and CI, which
have no GPU, run the whole backend that way). Importing it never imports CuPy.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np

from ...errors import FrinkError
from ...formats import Checkpoint
from ...model.config import ModelConfig
from .backend import CudaBackend
from .eligibility import layer_refusal, layer_refusals
from .kernel_ops import KERNEL_FILES, KernelOps, kernel_names, kernel_source
from .reference_ops import ReferenceOps

__all__ = [
    "CudaBackend",
    "cuda_available",
    "cupy_kernel_ops",
    "layer_refusal",
    "layer_refusals",
    "make_cuda_backend",
    "tensor_format",
]

ARRAY_MODULE_ENV = "FRINK_CUDA_ARRAY_MODULE"
DTYPE_ENV = "FRINK_CUDA_DTYPE"
_INSTALL_HINT = "pip install 'frink[cuda12]' or 'frink[cuda13]'"


def cuda_available() -> bool:
    """CuPy is importable and sees at least one CUDA device (cheap when CuPy is absent)."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver, no device, broken install: not available
        return False


def _import_cupy() -> Any:
    if importlib.util.find_spec("cupy") is None:
        raise FrinkError(
            f"backend 'cuda' is not available: CuPy is not installed ({_INSTALL_HINT})"
        )
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any CuPy/driver error: named in the message
        raise FrinkError(
            f"backend 'cuda' is not available: CuPy finds no CUDA GPU ({type(e).__name__}: {e})"
        ) from None
    if n < 1:
        raise FrinkError("backend 'cuda' is not available: CuPy finds no CUDA GPU")
    return cupy


class _CupyLauncher:
    """Compiles kernels/*.cu with CuPy's RawModule (NVRTC) on first use, one module per file."""

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self._functions: dict[str, Any] = {}

    def _load(self) -> None:
        for name in KERNEL_FILES:
            # No options: CuPy adds the device's arch; the sources need nothing else
            # (checked with NVRTC 13 itself, and with nvcc in the test suite).
            module = self.cupy.RawModule(code=kernel_source(name))
            for fn in kernel_names(name):
                self._functions[fn] = module.get_function(fn)

    def __call__(self, kernel: str, grid: int, block: int, args: tuple) -> None:
        if not self._functions:
            self._load()
        self._functions[kernel]((grid,), (block,), args)


class _CupyOps(KernelOps):
    def to_device(self, a: np.ndarray, dtype: Any = np.float32) -> Any:
        return self.xp.asarray(np.ascontiguousarray(a, dtype=dtype))

    def to_host(self, a: Any) -> np.ndarray:
        return self.xp.asnumpy(a)


def cupy_kernel_ops() -> KernelOps:
    """The kernels on the GPU through CuPy (FrinkError when CuPy or a GPU is missing)."""
    cupy = _import_cupy()
    return _CupyOps(cupy, _CupyLauncher(cupy))


def weight_dtype_setting(weight_dtype: str | None = None) -> str:
    """The GEMM operand type: the argument, else FRINK_CUDA_DTYPE, else float32."""
    weight_dtype = weight_dtype or os.environ.get(DTYPE_ENV) or "float32"
    if weight_dtype not in ("float32", "float16"):
        raise FrinkError(f"{DTYPE_ENV}={weight_dtype!r}: choose float32 or float16")
    return weight_dtype


def tensor_format(
    gguf_type: str, weight_dtype: str | None = None, host_blocks: bool = False
) -> str:
    """How the backend holds a tensor of this file type on the device (`frink info`).
    host_blocks: the host keeps this type in the file's blocks (report.host_formats' rule),
    and the device then keeps them too, multiplied by kernels/quant.cu (decode rows read the
    blocks, a prompt's tiles are dequantized to GEMM operands of the chosen type). Other
    matrices are GEMM operands of the chosen type (f32 accumulation); vectors f32."""
    dtype = {"float32": "f32", "float16": "f16"}[weight_dtype_setting(weight_dtype)]
    if host_blocks:
        return f"{gguf_type} blocks as stored (dequantized in the kernels)"
    if gguf_type == "F32":
        return "f32 as stored" if dtype == "f32" else f"f32 vectors; matrices to {dtype} at load"
    if gguf_type.lower() == dtype:
        return f"{dtype} as stored"
    how = "dequantized" if gguf_type.startswith(("Q", "I", "T")) else "converted"
    return f"{dtype} ({how} at load)"


def make_cuda_backend(
    cfg: ModelConfig,
    array_module: str | None = None,
    weight_dtype: str | None = None,
    checkpoint: Checkpoint | None = None,
) -> CudaBackend:
    """The cuda backend for a model; FrinkError (one line) when it cannot run here.

    array_module: "cupy" (default) or "numpy" (the stack's orchestration on the CPU with the
    NumPy references: no GPU needed); default from FRINK_CUDA_ARRAY_MODULE.
    weight_dtype: "float32" (default) or "float16" GEMM operands; default from FRINK_CUDA_DTYPE.
    checkpoint: the model's file, which the layers' traces read the tensor shapes from.
    """
    array_module = array_module or os.environ.get(ARRAY_MODULE_ENV) or "cupy"
    weight_dtype = weight_dtype_setting(weight_dtype)
    if array_module == "numpy":
        return CudaBackend(cfg, ReferenceOps(), weight_dtype, source=checkpoint)
    if array_module != "cupy":
        raise FrinkError(f"{ARRAY_MODULE_ENV}={array_module!r}: choose cupy or numpy")
    return CudaBackend(cfg, cupy_kernel_ops(), weight_dtype, source=checkpoint)
