"""Weights in GGUF blocks for kernel tests, and the closeness every product is held to.

Shared by the host kernels' tests (test_quant_kernels.py) and the cuda kernels' tests
(test_cuda_quant.py), so both hold their kernels to the same weights and the same bar.

Weights: gguf-py's own quantizer where it has one (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16,
BF16); otherwise random bytes, which are all valid codes and scales, with each f16 field
(d, dmin) replaced by a random finite half and each e8m0 exponent kept in a weight-like
range. The reference is gguf-py's dequantize (itself checked against llama.cpp in
test_quant_types.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from frink_cli.quant.blocks import QuantMatrix, row_bytes

# Byte offsets of each type's f16 fields inside a block (gguf-py's dequantize_blocks).
HALVES = {
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
}
# Byte offsets of each type's e8m0 exponents (MXFP4: 2^(e - 128) scales the block).
EXPONENTS = {T.MXFP4: (0,)}
QUANTIZABLE = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16, T.BF16)


def random_weights(qtype: T, rows: int, cols: int, seed: int) -> QuantMatrix:
    rng = np.random.default_rng(seed)
    if qtype in QUANTIZABLE:
        f = rng.standard_normal((rows, cols)).astype(np.float32)
        data = quantize(f, qtype)
        data = data.view(np.uint8).reshape(rows, row_bytes(qtype, cols))
    else:
        block, size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (rows * (cols // block), size), dtype=np.uint8)
        for off in EXPONENTS.get(qtype, ()):
            # Scales 2^-12 .. 2^2, and the two subnormal ones (e = 0, 1) now and then.
            e = rng.integers(116, 131, len(blocks))
            e[rng.random(len(blocks)) < 0.02] = rng.integers(0, 2)
            blocks[:, off] = e
        for off in HALVES.get(qtype, ()):
            # Finite halves of a weight-like size (~1e-3 .. 1e-1), either sign.
            h = rng.uniform(1e-3, 1e-1, len(blocks)) * rng.choice([-1, 1], len(blocks))
            blocks[:, off : off + 2] = h.astype(np.float16).view(np.uint8).reshape(-1, 2)
        data = blocks.reshape(rows, -1)
    return QuantMatrix(data, qtype, rows, cols)


def shapes_for(qtype: T) -> list[tuple[int, int]]:
    block = GGML_QUANT_SIZES[qtype][0]
    if block == 1:  # F16, BF16: ragged columns too (vector loops with scalar tails)
        return [(37, 1), (37, 200), (129, 512)]
    # 352 columns of a 32-weight type: eleven runs (a group of eight and a short one)
    return [(37, block), (37, 256), (129, 512)] + ([(19, 352)] if block == 32 else [])


def reference(w: QuantMatrix) -> np.ndarray:
    return dequantize(np.asarray(w.data), w.qtype).reshape(w.rows, w.cols)


def assert_close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and got.dtype == np.float32
    rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    assert rel <= 1e-5, rel
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
