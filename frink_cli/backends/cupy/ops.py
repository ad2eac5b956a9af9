"""The CUDA stack's op tables, gathered: the stack (stack.py) is written once against an
`ops` table and its array module `xp`.

- geometry.py: AttentionGeometry, what the attention kernel is told besides its buffers;
- gemm.py: the GEMMs over dense or quantized device weights (DeviceQuant, DeviceQuantPart);
- reference_ops.py: `ReferenceOps`, the NumPy reference of every kernel;
- kernel_ops.py: `KernelOps`, launches of kernels/*.cu (CuPy or the CPU emulator);
- cuda_ops.py: `CudaOps`, the Ops interface over either table.

This module only re-exports them, so `backends.cupy.ops` stays the one import point.
"""

from __future__ import annotations

from .cuda_ops import CudaOps, CudaStep, KvRows
from .gemm import (
    F32,
    GEMV_LANES,
    GEMV_MAX_X,
    GEMV_ROWS,
    QUANT_TILE_ELEMS,
    DeviceQuant,
    DeviceQuantPart,
    GemmOps,
)
from .geometry import AttentionGeometry
from .kernel_ops import (
    ACT_CODES,
    ATTN_THREADS,
    ELEMENTWISE_THREADS,
    KERNEL_FILES,
    MAX_BLOCKS,
    ROW_THREADS,
    KernelOps,
    Launch,
    kernel_names,
    kernel_source,
)
from .reference_ops import ReferenceOps

__all__ = [
    "ACT_CODES",
    "ATTN_THREADS",
    "ELEMENTWISE_THREADS",
    "F32",
    "GEMV_LANES",
    "GEMV_MAX_X",
    "GEMV_ROWS",
    "KERNEL_FILES",
    "MAX_BLOCKS",
    "QUANT_TILE_ELEMS",
    "ROW_THREADS",
    "AttentionGeometry",
    "CudaOps",
    "CudaStep",
    "DeviceQuant",
    "DeviceQuantPart",
    "GemmOps",
    "KernelOps",
    "KvRows",
    "Launch",
    "ReferenceOps",
    "kernel_names",
    "kernel_source",
]
