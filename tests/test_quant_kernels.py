"""The host kernels for weights kept in GGUF blocks (frink_cli/quant) against gguf-py.

Why: these kernels decide what every quantized matmul means once the model stops holding
f32 copies, so each type's bit layout is checked against the reference the rest of frink
already trusts, gguf-py's dequantize (gguf/quants.py, itself checked against llama.cpp in
test_quant_types.py): dequantize_rows and take_rows bit for bit; every product against
x @ dequantize(W).T, to 1e-5 relative (||diff|| / ||ref||) and elementwise to 1e-5 of
each value plus a floor of 1e-6 of the largest.

Weights: gguf-py's own quantizer where it has one (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16,
BF16); otherwise random bytes, which are all valid codes and scales, with each f16 field
(d, dmin) replaced by a random finite half. Shapes are ragged on purpose: row counts that
are a multiple of nothing, and a single block per row. The NumPy path (numba missing) is
run through the same checks.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from frink_cli.quant import kernels
from frink_cli.quant.blocks import KERNEL_TYPES, QuantMatrix, row_bytes

# Byte offsets of each type's f16 fields inside a block (gguf-py's dequantize_blocks).
_HALVES = {
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
}
# Byte offsets of each type's e8m0 exponents (MXFP4: 2^(e - 128) scales the block).
_EXPONENTS = {T.MXFP4: (0,)}
_QUANTIZABLE = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16, T.BF16)


def _weights(qtype: T, rows: int, cols: int, seed: int) -> QuantMatrix:
    rng = np.random.default_rng(seed)
    if qtype in _QUANTIZABLE:
        f = rng.standard_normal((rows, cols)).astype(np.float32)
        data = quantize(f, qtype)
        data = data.view(np.uint8).reshape(rows, row_bytes(qtype, cols))
    else:
        block, size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (rows * (cols // block), size), dtype=np.uint8)
        for off in _EXPONENTS.get(qtype, ()):
            # Scales 2^-12 .. 2^2, and the two subnormal ones (e = 0, 1) now and then.
            e = rng.integers(116, 131, len(blocks))
            e[rng.random(len(blocks)) < 0.02] = rng.integers(0, 2)
            blocks[:, off] = e
        for off in _HALVES.get(qtype, ()):
            # Finite halves of a weight-like size (~1e-3 .. 1e-1), either sign.
            h = rng.uniform(1e-3, 1e-1, len(blocks)) * rng.choice([-1, 1], len(blocks))
            blocks[:, off : off + 2] = h.astype(np.float16).view(np.uint8).reshape(-1, 2)
        data = blocks.reshape(rows, -1)
    return QuantMatrix(data, qtype, rows, cols)


def _shapes(qtype: T) -> list[tuple[int, int]]:
    block = GGML_QUANT_SIZES[qtype][0]
    if block == 1:  # F16, BF16: ragged columns too (vector loops with scalar tails)
        return [(37, 1), (37, 200), (129, 512)]
    return [(37, block), (37, 256), (129, 512)]


def _reference(w: QuantMatrix) -> np.ndarray:
    return dequantize(np.asarray(w.data), w.qtype).reshape(w.rows, w.cols)


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and got.dtype == np.float32
    rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    assert rel <= 1e-5, rel
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


@pytest.fixture(params=["numba", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "numba":
        if kernels._jit() is None:
            pytest.skip(kernels.kernel_path())
    else:
        monkeypatch.setattr(kernels, "_JIT", None)
    return str(request.param)


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_dequantize_rows_equal_gguf_py(qtype: T, path: str) -> None:
    for rows, cols in _shapes(qtype):
        w = _weights(qtype, rows, cols, seed=rows + cols)
        ref = _reference(w)
        np.testing.assert_array_equal(kernels.dequantize_rows(w), ref)
        buf = np.full((rows, cols), np.nan, np.float32)
        got = kernels.dequantize_rows(w, 5, rows - 3, out=buf[: rows - 8])
        assert got.base is buf or got is buf[: rows - 8].base or np.shares_memory(got, buf)
        np.testing.assert_array_equal(got, ref[5 : rows - 3])
        idx = np.array([rows - 1, 0, 7, 7, rows // 2])
        np.testing.assert_array_equal(kernels.take_rows(w, idx), ref[idx])


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_products_equal_x_at_dequantized(qtype: T, path: str) -> None:
    rng = np.random.default_rng(int(qtype))
    for rows, cols in _shapes(qtype):
        w = _weights(qtype, rows, cols, seed=rows * cols)
        ref_w = _reference(w).astype(np.float64)
        for t in (1, 2, 3, 8, 33, 200):
            x = rng.standard_normal((t, cols)).astype(np.float32)
            ref = (x.astype(np.float64) @ ref_w.T).astype(np.float32)
            _close(kernels.matvec(x, w), ref)
            _close(kernels.matmul_small(x, w), ref)
            if t <= kernels.SMALL_T:
                _close(kernels.few_rows(x, w), ref)
            _close(kernels.matmul(x, w, tile_rows=16), ref)
            _close(kernels.linear(x, w), ref)


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(qtype: T) -> None:
    """The fused dots step four rows of x through each block together (and a short group
    repeats its last row): each row's product is still its own sums in its own order, so
    a row computed alone, in a group of four or in a ragged batch is the same bit for bit
    (a server's batches rely on it). few_rows keeps that for every T with any_batch."""
    if kernels._jit() is None:
        pytest.skip(kernels.kernel_path())
    rng = np.random.default_rng(int(qtype) + 100)
    for rows, cols in _shapes(qtype):
        w = _weights(qtype, rows, cols, seed=rows + 2 * cols)
        x = rng.standard_normal((kernels.SMALL_T, cols)).astype(np.float32)
        alone = np.concatenate([kernels.matvec(x[i : i + 1], w) for i in range(len(x))])
        small = np.concatenate(
            [kernels.few_rows(x[i : i + 1], w, any_batch=True) for i in range(len(x))]
        )
        for t0, t1 in ((0, 16), (0, 4), (3, 5), (2, 9), (5, 8), (1, 14)):
            np.testing.assert_array_equal(kernels.matvec(x[t0:t1], w), alone[t0:t1])
            got = kernels.few_rows(x[t0:t1], w, any_batch=True)
            np.testing.assert_array_equal(got, small[t0:t1])


def test_thread_count_changes_nothing() -> None:
    """Each output is one row's sum made by one thread, so 1 and 2 threads agree bit for
    bit (the decoder may change the count between steps)."""
    if kernels._jit() is None:
        pytest.skip(kernels.kernel_path())
    rng = np.random.default_rng(7)
    for qtype in (T.Q4_0, T.Q4_K, T.Q6_K):
        w = _weights(qtype, 257, 512, seed=3)
        x = rng.standard_normal((5, 512)).astype(np.float32)
        with kernels.threads(1):
            one = (kernels.matvec(x[:1], w), kernels.matmul_small(x, w), kernels.dequantize_rows(w))
        with kernels.threads(2):
            two = (kernels.matvec(x[:1], w), kernels.matmul_small(x, w), kernels.dequantize_rows(w))
        for a, b in zip(one, two):
            np.testing.assert_array_equal(a, b)


def test_results_land_in_the_callers_buffers() -> None:
    w = _weights(T.Q8_0, 40, 64, seed=1)
    x = np.ones((1, 64), np.float32)
    y = np.empty((1, 40), np.float32)
    assert kernels.matvec(x, w, out=y) is y
    buf = np.empty((10, 64), np.float32)
    assert kernels.take_rows(w, np.arange(10), out=buf) is buf
    with pytest.raises(ValueError, match="out must be"):
        kernels.matvec(x, w, out=np.empty((1, 41), np.float32))


def test_bad_arguments_are_refused() -> None:
    w = _weights(T.Q4_0, 8, 64, seed=2)
    with pytest.raises(ValueError, match=r"x must be \[T, 64\]"):
        kernels.matvec(np.ones((1, 32), np.float32), w)
    with pytest.raises(IndexError):
        kernels.take_rows(w, np.array([0, 8]))
    with pytest.raises(ValueError, match="rows"):
        kernels.dequantize_rows(w, 3, 9)
    with pytest.raises(ValueError, match="whole blocks"):
        QuantMatrix(np.zeros((8, 18), np.uint8), T.Q4_0, 8, 48)
    with pytest.raises(ValueError, match="uint8"):
        QuantMatrix(np.zeros((8, 36), np.uint8), T.Q4_0, 8, 32)
    with pytest.raises(ValueError, match="no host kernels"):
        QuantMatrix(np.zeros((8, 66), np.uint8), T.IQ2_XXS, 8, 256)


def test_quant_matrix_is_a_read_only_view() -> None:
    data = _weights(T.Q4_1, 6, 64, seed=4).data.copy()
    w = QuantMatrix(data, T.Q4_1, 6, 64)
    assert np.shares_memory(w.data, data) and not w.data.flags.writeable
    part = w.row_slice(2, 5)
    assert part.rows == 3 and np.shares_memory(part.data, data)
    np.testing.assert_array_equal(kernels.dequantize_rows(part), kernels.dequantize_rows(w, 2, 5))
    flat = QuantMatrix.from_buffer(data.reshape(-1), T.Q4_1, 6, 64)
    assert flat.nbytes == 6 * 40


def test_kernel_path_names_what_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    if kernels._jit() is not None:
        assert kernels.kernel_path().startswith("numba ")
        # numba keys a cached kernel on its own file: simd.py's hash must be recorded in
        # jit.py, or a change to simd.py alone would run stale compiled kernels.
        assert kernels._jit()._CACHE, "update _SIMD_SHA256 in frink_cli/quant/jit.py"
    monkeypatch.setattr(kernels, "_JIT", None)
    assert kernels.kernel_path().startswith("numpy (")
    code = "from frink_cli.quant import kernels; print(kernels.kernel_path())"
    env = {**__import__("os").environ, "FRINK_NO_NUMBA": "1"}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert got.stdout.strip() == "numpy (FRINK_NO_NUMBA is set)", got.stderr
