"""The cuda backend's quantized products (kernels/quant.cu) without a GPU: on the CPU
emulator, against gguf-py.

Why: with weights resident in the file's blocks, every matmul on the device goes through
these kernels, so each type's bit layout and the launch arithmetic (row groups, ragged
tails, column offsets into a fused output, tiles of a prompt's operand) decide what the
model computes. The same weights as the host kernels' tests (tests/quant_weights.py) and
the same bar:
- dequant_<type>_f32 equals gguf-py's dequantize bit for bit, and dequant_<type>_f16 that
  value rounded to f16 as NumPy rounds it (BF16's random bits reach every float class:
  subnormal, overflow to inf, NaN);
- gemv_<type> equals x @ dequantize(W).T to 1e-5 relative for 1..8 rows of x, writes only
  its own columns of the output, and gives a row of x the same product alone or in a batch,
  bit for bit;
- KernelOps' product over a fused weight of two types, in the decode path (gemv) and the
  prompt path (tiles dequantized, then GEMM), against the NumPy references.
The model-level checks (a llama.cpp-quantized model on these kernels against llama.cpp)
are in test_quant_types.py; the GPU runs of the same comparisons in test_cuda_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emulator import EmulatedLauncher
from gguf import GGMLQuantizationType as T
from quant_weights import assert_close, random_weights, reference

from frink_cli.backends.cupy import gemm as cuda_gemm
from frink_cli.backends.cupy import ops as cuda_ops
from frink_cli.backends.cupy.ops import (
    DeviceQuant,
    DeviceQuantPart,
    KernelOps,
    ReferenceOps,
    kernel_names,
)
from frink_cli.quant.blocks import KERNEL_TYPES, QuantMatrix

TYPES = [t.name for t in KERNEL_TYPES]


def _part(w: QuantMatrix) -> DeviceQuantPart:
    return DeviceQuantPart(np.ascontiguousarray(w.data), w.qtype, w.rows, w.cols)


def _block_cols(qtype: T) -> int:
    """Columns of the small matrices here: one super-block for the K / IQ4_XS types, three
    blocks of 32 for the others, and a ragged 70 for the 2-byte floats."""
    if qtype in (T.F16, T.BF16):
        return 70
    return 256 if qtype in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS) else 96


def test_every_host_type_has_its_kernels() -> None:
    """quant.cu carries gemv and both dequantizes for exactly the types the host keeps in
    blocks: every weight the host holds so can stay so on the device."""
    names = set(kernel_names("quant.cu"))
    for t in KERNEL_TYPES:
        k = t.name.lower()
        assert {f"gemv_{k}", f"dequant_{k}_f32", f"dequant_{k}_f16"} <= names, t.name
    assert len(names) == 3 * len(KERNEL_TYPES)


@pytest.mark.parametrize("qtype", TYPES)
def test_emulated_dequantize_is_gguf_py(qtype: str, emulated_launcher: EmulatedLauncher) -> None:
    qt = T[qtype]
    emu = KernelOps(np, emulated_launcher)
    w = random_weights(qt, 11, 2 * _block_cols(qt), seed=5)
    if qt == T.BF16:  # every bit pattern: subnormals, huge values, inf, NaN
        raw = np.random.default_rng(6).integers(0, 1 << 16, w.data.size // 2, dtype=np.uint16)
        w = QuantMatrix(raw.view(np.uint8).reshape(w.data.shape), qt, w.rows, w.cols)
    part = _part(w)
    want = reference(w)
    for start, stop in ((0, 11), (3, 8)):
        got = emu.dequantize(part, start, stop, np.float32)
        assert np.array_equal(got.view(np.uint32), want[start:stop].view(np.uint32)), qtype
        half = emu.dequantize(part, start, stop, np.float16)
        with np.errstate(over="ignore"):
            ref16 = want[start:stop].astype(np.float16)
        nan = np.isnan(ref16)
        assert np.array_equal(np.isnan(half), nan), qtype
        assert np.array_equal(half.view(np.uint16)[~nan], ref16.view(np.uint16)[~nan]), qtype


def test_emulated_mxfp4_subnormal_scales_survive_a_flushing_gpu(
    emulated_launcher: EmulatedLauncher,
) -> None:
    """MXFP4 blocks with e = 0 and 1 have subnormal scales (2^-128, 2^-127): their weights are
    gguf-py's exact subnormals even where the device flushes subnormal arithmetic to zero
    (the H100 did, before the kernel built them from integers). A product with such a weight
    (gemv) may still flush: its terms are below 2^-120 of the activations, far under any
    tolerance."""
    w = random_weights(T.MXFP4, 16, 256, seed=7)
    data = np.array(w.data).reshape(-1, 17)
    data[:, 0] = np.arange(len(data)) % 4  # e = 0, 1 (subnormal scales) and 2, 3
    w = QuantMatrix(data.reshape(w.data.shape), T.MXFP4, w.rows, w.cols)
    want = reference(w)
    assert (want != 0).any() and (np.abs(want[want != 0]) < np.finfo(np.float32).tiny).any()
    emu = KernelOps(np, emulated_launcher)
    with emulated_launcher.flushing_subnormals():
        got = emu.dequantize(_part(w), 0, w.rows, np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES)
def test_emulated_gemv_is_dequantize_then_matmul(
    qtype: str, emulated_launcher: EmulatedLauncher
) -> None:
    qt = T[qtype]
    emu = KernelOps(np, emulated_launcher)
    rng = np.random.default_rng(7)
    rows = 13  # a ragged last group of 8 rows
    w = random_weights(qt, rows, 3 * _block_cols(qt), seed=8)
    part, ref = _part(w), reference(w)
    x = rng.standard_normal((cuda_ops.GEMV_MAX_X, w.cols)).astype(np.float32)
    col, width = 5, rows + 9  # a slice of a wider (fused) output
    alone = {}
    for n in (1, 3, cuda_ops.GEMV_MAX_X):
        y = np.full((n, width), 7.0, np.float32)
        emu.gemv(part, np.ascontiguousarray(x[:n]), y, col)
        assert_close(y[:, col : col + rows], x[:n] @ ref.T)
        outside = np.delete(y, np.s_[col : col + rows], axis=1)
        assert np.all(outside == 7.0), f"{qtype}: gemv wrote outside its columns"
        alone[n] = y[:, col : col + rows]
    for n in (3, cuda_ops.GEMV_MAX_X):  # a row's product is its own, whatever is beside it
        assert np.array_equal(alone[n][:1], alone[1]), qtype
        assert np.array_equal(alone[n][:3], alone[3]), qtype


def _fused(dtype: type) -> tuple[DeviceQuant, np.ndarray]:
    """A fused weight of two types (a Q4_K_M file's Q4_K rows beside its Q6_K ones)."""
    a = random_weights(T.Q4_K, 21, 512, seed=10)
    b = random_weights(T.Q6_K, 14, 512, seed=11)
    w = DeviceQuant((_part(a), _part(b)), np.dtype(dtype))
    return w, np.concatenate([reference(a), reference(b)])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [1, 8, 9, 40])
def test_emulated_fused_product_in_both_paths(
    n: int, dtype: type, emulated_launcher: EmulatedLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to GEMV_MAX_X rows: gemv; more: tiles (forced to several per part here) dequantized
    into one reusable buffer, then GEMM in the operand type; the NumPy references agree."""
    monkeypatch.setattr(cuda_gemm, "QUANT_TILE_ELEMS", 8 * 512)
    w, ref = _fused(dtype)
    x = np.random.default_rng(12).standard_normal((n, 512)).astype(np.float32)
    emu = KernelOps(np, emulated_launcher)
    first = len(emulated_launcher.launches)
    got = emu.matmul(x, w)
    launched = set(emulated_launcher.launches[first:])
    if n <= cuda_ops.GEMV_MAX_X:
        assert launched == {"gemv_q4_k", "gemv_q6_k"}, launched
    else:
        suffix = "f32" if dtype == np.float32 else "f16"
        assert launched == {f"dequant_q4_k_{suffix}", f"dequant_q6_k_{suffix}"}, launched
    want = ReferenceOps().matmul(x, w)
    if dtype == np.float32 or n <= cuda_ops.GEMV_MAX_X:
        assert_close(got, x @ ref.T)
        assert_close(want, x @ ref.T)
    else:  # f16 operands: x and W rounded to f16 on both sides, the same numbers
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        assert np.linalg.norm(got - x @ ref.T) / np.linalg.norm(x @ ref.T) < 1e-2
