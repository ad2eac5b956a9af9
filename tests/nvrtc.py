"""NVRTC without a GPU: compile a CUDA source to PTX the way CuPy's RawModule does.

Why: RawModule hands each kernel file to NVRTC at first use on the GPU machine; a source
that g++ (the CPU emulator) and even nvcc accept can still fail there (NVRTC has no host
headers and its own defaults). NVRTC is a plain shared library that needs no device and
no driver, and the test extra installs it (nvidia-cuda-nvrtc), so CI compiles the exact
sources CuPy will. This calls its C API through ctypes.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path


def library() -> Path | None:
    """libnvrtc from the nvidia-cuda-nvrtc wheel, if installed."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        hits = sorted(Path(root).glob("cu*/lib/libnvrtc.so*")) + sorted(
            Path(root).glob("cuda_nvrtc/lib/libnvrtc.so*")
        )
        hits = [h for h in hits if "builtins" not in h.name]
        if hits:
            return hits[0]
    return None


def compile_ptx(source: str, name: str, options: list[str]) -> tuple[bool, str, str]:
    """(ok, log, ptx) for `source` compiled with `options`."""
    lib = ctypes.CDLL(str(library()))
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if rc != 0:
        raise RuntimeError(f"nvrtcCreateProgram: error {rc}")
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        rc = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        ptx = ""
        if rc == 0:
            lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetPTX(prog, buf)
            ptx = buf.value.decode()
        return rc == 0, log.value.decode(errors="replace"), ptx
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
