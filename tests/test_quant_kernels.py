"""The host kernels for weights kept in GGUF blocks (frink_cli/quant) against gguf-py.

Why: these kernels decide what every quantized matmul means once the model stops holding
f32 copies, so each type's bit layout is checked against the reference the rest of frink
already trusts, gguf-py's dequantize (gguf/quants.py, itself checked against llama.cpp in
test_quant_types.py): dequantize_rows and take_rows bit for bit; every product against
x @ dequantize(W).T, to 1e-5 relative (||diff|| / ||ref||) and elementwise to 1e-5 of
each value plus a floor of 1e-6 of the largest.

Weights: tests/quant_weights.py (gguf-py's quantizer where it has one, else random valid
blocks). Shapes are ragged on purpose: row counts that
are a multiple of nothing, and a single block per row. Every instruction set the compiled
kernels carry that this CPU runs (AVX-512, AVX2, the baseline) and the NumPy path (no
compiled module) are run through the same checks.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from isa_variants import ISAS
from quant_weights import (
    assert_close,
    random_weights,
    reference,
    shapes_for,
)

from frink_cli.quant import kernels
from frink_cli.quant.blocks import KERNEL_TYPES, QuantMatrix


def _use_isa(name: str) -> Iterator[None]:
    native = kernels._NATIVE
    if native is None:
        pytest.skip(kernels.kernel_path())
    try:
        before = native.use_isa(name)
    except ValueError as e:
        pytest.skip(str(e))
    try:
        yield
    finally:
        native.use_isa(before)


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from (str(request.param) for _ in _use_isa(str(request.param)))


@pytest.fixture(params=[*ISAS, "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Exact activations on every path (the 8-bit ones have checks of their own below)."""
    if request.param == "numpy":
        monkeypatch.setattr(kernels, "_NATIVE", None)
        yield "numpy"
    else:
        with kernels.exact_activations():
            yield from (str(request.param) for _ in _use_isa(str(request.param)))


@pytest.fixture(params=["8-bit", "f32"])
def activations(request: pytest.FixtureRequest) -> Iterator[str]:
    with kernels.exact_activations(request.param == "f32"):
        yield str(request.param)


# The types whose 8-bit dots take x as llama.cpp's Q8_1 (a half of scale * sum beside the
# Q8_0 rounding) and Q8_K (an f32 scale per 256 columns); the rest take Q8_0.
_X_Q8_1 = (T.Q4_1, T.Q5_1)
_X_Q8_K = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)


def q8_rounded(x: np.ndarray, qtype: T) -> np.ndarray:
    """x as the 8-bit dots for qtype see it (native.c quantize_x, llama.cpp's quantize_row_
    q8_0 / q8_1 / q8_K), in float64. Q8_0 and Q8_1, per 32 columns: q = round-half-even(
    x * (127 / max|x|)) scaled by max|x| / 127 rounded to a half. Q8_K, per 256: m the first
    x of largest magnitude, q = min(127, round-half-even(x * (-127 / m))) scaled by 1 / that.
    Q8_1 also keeps half(max|x| / 127 * sum q) per 32, which its types' min term m * sum x
    reads in place of the exact sum: `min_term_error` gives that difference."""
    x = np.asarray(x, np.float32)
    span = 256 if qtype in _X_Q8_K else 32
    blocks = x.reshape(x.shape[0], -1, span)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    nz = amax != 0
    if qtype in _X_Q8_K:
        first = np.abs(blocks).argmax(axis=2)[..., None]
        m = np.take_along_axis(blocks, first, axis=2)
        mul = np.divide(np.float32(-127), m, out=np.zeros_like(m), where=nz)
        dx = np.divide(np.float32(1), mul, out=np.zeros_like(m), where=nz)
    else:
        mul = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=nz)
        dx = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    q = np.minimum(np.rint(blocks * mul), 127)
    assert np.abs(q).max(initial=0) <= 127
    return (q.astype(np.float64) * dx.astype(np.float64)).reshape(x.shape)


def min_term_error(x: np.ndarray, w: QuantMatrix) -> np.ndarray:
    """[T, rows]: what Q8_1's half-rounded sums add to a Q4_1 / Q5_1 product beyond
    dequantize(q8(x)) @ dequantize(W).T: sum over blocks of m * (half(d * sum q) - dx *
    sum q), m each block's f16 min (bytes 2..3)."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=2)
    mul = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    qsum = np.rint(blocks * mul[..., None]).sum(axis=2).astype(np.float32)
    d = amax / np.float32(127)
    s_half = (d * qsum).astype(np.float16).astype(np.float64)
    exact = d.astype(np.float16).astype(np.float64) * qsum
    size = GGML_QUANT_SIZES[w.qtype][1]
    m = np.asarray(w.data).reshape(w.rows, -1, size)[:, :, 2:4].copy().view(np.float16)[..., 0]
    return (s_half - exact) @ m.astype(np.float64).T


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_dequantize_rows_equal_gguf_py(qtype: T, path: str) -> None:
    for rows, cols in shapes_for(qtype):
        w = random_weights(qtype, rows, cols, seed=rows + cols)
        ref = reference(w)
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
    for rows, cols in shapes_for(qtype):
        w = random_weights(qtype, rows, cols, seed=rows * cols)
        ref_w = reference(w).astype(np.float64)
        for t in (1, 2, 3, 8, 33, 200):
            x = rng.standard_normal((t, cols)).astype(np.float32)
            ref = (x.astype(np.float64) @ ref_w.T).astype(np.float32)
            assert_close(kernels.dots(x, w), ref)
            assert_close(kernels.matmul(x, w, tile_rows=16), ref)
            assert_close(kernels.linear(x, w), ref)


@pytest.mark.parametrize(
    "qtype", [t for t in KERNEL_TYPES if t not in (T.F16, T.BF16)], ids=lambda t: t.name
)
def test_8bit_products_equal_rounded_x_at_dequantized(qtype: T, isa: str) -> None:
    with kernels.exact_activations(False):
        _check_8bit_products(qtype, isa)


def _check_8bit_products(qtype: T, isa: str) -> None:
    """Where the ISA has byte dot products, dots rounds x to 8 bits as llama.cpp does for
    W's type and must then equal dequantize(q8(x)) @ dequantize(W).T, with the rounding
    repeated here in NumPy (the rounding itself moves a product by ~5e-3); a prompt's
    rows (matmul: tiles into BLAS) are rounded the same way."""
    if not kernels._NATIVE.has_int8():
        pytest.skip(f"{isa}: no 8-bit dots")
    rng = np.random.default_rng(int(qtype) + 7)
    for rows, cols in shapes_for(qtype):
        w = random_weights(qtype, rows, cols, seed=rows * cols + 1)
        ref_w = reference(w).astype(np.float64)
        for t in (1, 2, 5, 16, 21):
            x = rng.standard_normal((t, cols)).astype(np.float32)
            if t > 1:
                x[-1, :32] = 0  # an all-zero block: scale 0, no division by it
            assert kernels.activations() == "8-bit"
            got = kernels.dots(x, w)
            ref = q8_rounded(x, qtype) @ ref_w.T
            # Without AMX tiles a prompt's rows are the decode rows' own dots, bit for bit
            if not kernels.prompt_tiles():
                np.testing.assert_array_equal(kernels.matmul(x, w), got)
            if qtype in _X_Q8_1:
                ref += min_term_error(x, w)
            assert_close(got, ref.astype(np.float32))
            if kernels.prompt_tiles():
                assert_close(kernels.matmul(x, w, tile_rows=16), ref.astype(np.float32))
            exact = x[:1].astype(np.float64) @ ref_w.T
            rel = np.linalg.norm(got[:1] - exact) / np.linalg.norm(exact)
            assert 1e-4 < rel < 2e-2, rel  # the rounding did happen, and is small


@pytest.mark.parametrize(
    "qtype", [t for t in KERNEL_TYPES if t not in (T.F16, T.BF16)], ids=lambda t: t.name
)
def test_the_vnni_variants_give_the_same_bits(qtype: T) -> None:
    """avxvnni is AVX2's loops with AVX-512's byte dot (vpdpbusd, on a ymm) and AVX-512's
    integers (the codes' offsets folded into x's sums, each run's sum times its scale): a
    CPU with either gives the same 8-bit products, in the file's order and in panels.
    (avx2 takes the offsets' k terms in f32, so its last bits may differ from theirs.)"""
    rng = np.random.default_rng(int(qtype) + 17)
    for rows, cols in shapes_for(qtype):
        w = random_weights(qtype, rows, cols, seed=rows + cols)
        x = rng.standard_normal((11, cols)).astype(np.float32)
        got = {}
        for name in ("avx512", "avxvnni"):
            for _ in _use_isa(name):
                with kernels.exact_activations(False):
                    got[name] = [kernels.dots(x, w), kernels.dots(x, kernels.in_panels(w))]
        np.testing.assert_array_equal(got["avxvnni"][0], got["avx512"][0])
        np.testing.assert_array_equal(got["avxvnni"][1], got["avx512"][1])


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(
    qtype: T, isa: str, activations: str
) -> None:
    """dots unpacks each run of W once for a tile of up to eight rows of x (run as 1, 4 or
    8), yet each row's product is its own sums in its own order (its own 8-bit rounding
    too): a row computed alone or in any ragged batch (tiles whole, short and split, more
    rows than SMALL_T) is the same bit for bit (a server's batches rely on it)."""
    rng = np.random.default_rng(int(qtype) + 100)
    for rows, cols in shapes_for(qtype):
        w = random_weights(qtype, rows, cols, seed=rows + 2 * cols)
        x = rng.standard_normal((kernels.SMALL_T + 5, cols)).astype(np.float32)
        alone = np.concatenate([kernels.dots(x[i : i + 1], w) for i in range(len(x))])
        for t0, t1 in ((0, 16), (0, 21), (0, 4), (3, 5), (2, 9), (5, 8), (1, 14), (0, 8), (6, 21)):
            np.testing.assert_array_equal(kernels.dots(x[t0:t1], w), alone[t0:t1])


@pytest.mark.parametrize(
    "qtype", [t for t in KERNEL_TYPES if t not in (T.F16, T.BF16)], ids=lambda t: t.name
)
def test_every_batch_length_gives_a_row_its_own_bits(qtype: T, isa: str) -> None:
    """Batches of every length 1 .. 17 (tiles of 1, 4 and 8, whole, short and more than
    two), over a row count that is no multiple of a work chunk: each row the bits it gets
    alone."""
    rng = np.random.default_rng(int(qtype) + 300)
    w = random_weights(qtype, 37, 512, seed=int(qtype))
    x = rng.standard_normal((17, 512)).astype(np.float32)
    alone = np.concatenate([kernels.dots(x[i : i + 1], w) for i in range(len(x))])
    for t in range(2, len(x) + 1):
        np.testing.assert_array_equal(kernels.dots(x[:t], w), alone[:t])


# Per K-quant type: every code byte's value that makes the largest codes (Q4_K 15, Q5_K
# 31, Q6_K 63), and the bytes of its 6- or 8-bit scales set to their largest.
_K_EXTREMES = {
    T.Q4_K: (range(16, 144), range(4, 16)),
    T.Q5_K: (range(16, 176), range(4, 16)),
    T.Q6_K: (range(0, 192), range(192, 208)),
}


@pytest.mark.parametrize("qtype", list(_K_EXTREMES), ids=lambda t: t.name)
def test_k_quant_sums_hold_at_their_largest(qtype: T, isa: str) -> None:
    """The K-quant dots add a group's byte products as int16 before scaling them: with
    every code at its largest, every scale too, and x all one sign (every 8-bit q at
    +-127), the sums are at their largest and must still equal dequantize(q8(x)) @
    dequantize(W).T (a group twice as wide would wrap around for Q5_K and Q6_K)."""
    w = random_weights(qtype, 19, 512, seed=5)
    blocks = np.asarray(w.data).reshape(-1, GGML_QUANT_SIZES[qtype][1]).copy()
    codes, scales = _K_EXTREMES[qtype]
    blocks[:, list(codes)] = 0xFF
    blocks[:, list(scales)] = 0x7F if qtype == T.Q6_K else 0xFF
    w = QuantMatrix(blocks.reshape(w.rows, -1), qtype, w.rows, w.cols)
    x = np.ones((3, 512), np.float32) * np.array([[1.0], [-2.0], [0.5]], np.float32)
    with kernels.exact_activations(False):
        if kernels.activations() != "8-bit":
            pytest.skip(f"{isa}: no 8-bit dots")
        ref = q8_rounded(x, qtype) @ reference(w).astype(np.float64).T
        assert_close(kernels.dots(x, w), ref.astype(np.float32))


def test_f32_products_do_not_depend_on_the_rows_beside_them(isa: str) -> None:
    """matmul_f32 (the host's f32 decode rows) under the same rule, ragged columns too."""
    rng = np.random.default_rng(11)
    for rows, cols in ((37, 1), (37, 200), (129, 576)):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        x = rng.standard_normal((kernels.SMALL_T + 3, cols)).astype(np.float32)
        assert_close(kernels.matmul_f32(x, w), (x.astype(np.float64) @ w.T).astype(np.float32))
        alone = np.concatenate([kernels.matmul_f32(x[i : i + 1], w) for i in range(len(x))])
        for t0, t1 in ((0, 19), (0, 4), (3, 5), (2, 9)):
            np.testing.assert_array_equal(kernels.matmul_f32(x[t0:t1], w), alone[t0:t1])


def test_thread_count_changes_nothing(isa: str, activations: str) -> None:
    """Each output is one row's sum made by one thread, so 1 and 2 threads agree bit for
    bit (the decoder may change the count between steps)."""
    rng = np.random.default_rng(7)
    for qtype in (T.Q4_0, T.Q4_K, T.Q6_K):
        w = random_weights(qtype, 257, 512, seed=3)
        x = rng.standard_normal((5, 512)).astype(np.float32)
        with kernels.threads(1):
            one = (kernels.dots(x[:1], w), kernels.dots(x, w), kernels.dequantize_rows(w))
        with kernels.threads(2):
            two = (kernels.dots(x[:1], w), kernels.dots(x, w), kernels.dequantize_rows(w))
        for a, b in zip(one, two):
            np.testing.assert_array_equal(a, b)


# The types whose prompt products run on AMX tiles (every type with 8-bit dots).
_TILE_TYPES = [t for t in KERNEL_TYPES if t not in (T.F16, T.BF16)]


@pytest.fixture
def tiles() -> Iterator[None]:
    """The AMX tile products, 8-bit activations (skipped where the CPU or OS lacks AMX)."""
    for _ in _use_isa("avx512+amx"):
        with kernels.exact_activations(False):
            assert kernels.prompt_tiles()
            yield


@pytest.mark.parametrize("qtype", _TILE_TYPES, ids=lambda t: t.name)
def test_tile_products_equal_the_8bit_dots(qtype: T, tiles: None) -> None:
    """A prompt's products on AMX tiles are the 8-bit dots' math (the same rounded x, the
    same codes and scales), summed in another order: equal to 1e-5, on ragged shapes (rows
    and T multiples of no tile, runs of 32 odd in number, a single block per row)."""
    rng = np.random.default_rng(int(qtype) + 300)
    block = GGML_QUANT_SIZES[qtype][0]
    for rows, cols in ((37, block), (129, 3 * block if block == 32 else 512), (16, 256)):
        w = random_weights(qtype, rows, cols, seed=rows + cols)
        for t in (1, 17, 45, 600):
            x = rng.standard_normal((t, cols)).astype(np.float32)
            x[-1, :32] = 0  # an all-zero block: scale 0
            assert_close(kernels.matmul(x, w), kernels.dots(x, w))


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_a_tile_rows_product_does_not_depend_on_the_rows_or_threads_beside_it(
    qtype: T, tiles: None
) -> None:
    """Each output of the tile products is made by one tile pair in one order, x padded
    with zero rows to a whole tile: a row alone, in any batch, on 1 or 2 threads, is the
    same bit for bit (a server's batches, a prompt fed in chunks, rely on it)."""
    rng = np.random.default_rng(int(qtype) + 400)
    w = random_weights(qtype, 70, 512, seed=5)
    x = rng.standard_normal((40, 512)).astype(np.float32)
    with kernels.threads(2):
        whole = kernels.matmul(x, w)
    with kernels.threads(1):
        np.testing.assert_array_equal(kernels.matmul(x, w), whole)
        alone = np.concatenate([kernels.matmul(x[i : i + 1], w) for i in range(len(x))])
    np.testing.assert_array_equal(alone, whole)
    for t0, t1 in ((0, 17), (3, 40), (15, 33), (1, 2)):
        np.testing.assert_array_equal(kernels.matmul(x[t0:t1], w), whole[t0:t1])


def test_tile_products_refuse_what_they_do_not_serve(tiles: None) -> None:
    native = kernels._NATIVE
    w = random_weights(T.F16, 8, 64, seed=2)
    x, y = np.ones((2, 64), np.float32), np.empty((2, 8), np.float32)
    assert not native.tiles_for(int(T.F16)) and native.tiles_for(int(T.Q4_0))
    with pytest.raises(ValueError, match="no tile products"):
        native.tiles(int(T.F16), w.data, 8, 64, x, 2, y, 1)
    q = random_weights(T.Q4_0, 8, 64, seed=2)
    with pytest.raises(ValueError, match="w holds"):
        native.tiles(int(T.Q4_0), q.data, 9, 64, x, 2, y, 1)
    with pytest.raises(ValueError, match="y holds"):
        native.tiles(int(T.Q4_0), q.data, 8, 64, x, 2, y[:1], 1)
    with kernels.exact_activations():  # exact activations: BLAS's f32 tiles, no rounding
        assert not kernels.prompt_tiles()


def test_results_land_in_the_callers_buffers() -> None:
    w = random_weights(T.Q8_0, 40, 64, seed=1)
    x = np.ones((1, 64), np.float32)
    y = np.empty((1, 40), np.float32)
    assert kernels.dots(x, w, out=y) is y
    buf = np.empty((10, 64), np.float32)
    assert kernels.take_rows(w, np.arange(10), out=buf) is buf
    with pytest.raises(ValueError, match="out must be"):
        kernels.dots(x, w, out=np.empty((1, 41), np.float32))


def test_bad_arguments_are_refused() -> None:
    w = random_weights(T.Q4_0, 8, 64, seed=2)
    with pytest.raises(ValueError, match=r"x must be \[T, 64\]"):
        kernels.dots(np.ones((1, 32), np.float32), w)
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
    data = random_weights(T.Q4_1, 6, 64, seed=4).data.copy()
    w = QuantMatrix(data, T.Q4_1, 6, 64)
    assert np.shares_memory(w.data, data) and not w.data.flags.writeable
    part = w.row_slice(2, 5)
    assert part.rows == 3 and np.shares_memory(part.data, data)
    np.testing.assert_array_equal(kernels.dequantize_rows(part), kernels.dequantize_rows(w, 2, 5))
    flat = QuantMatrix.from_buffer(data.reshape(-1), T.Q4_1, 6, 64)
    assert flat.nbytes == 6 * 40


def test_the_compiled_module_checks_what_it_is_given() -> None:
    """The C kernels trust no shape from Python: a buffer shorter than the shape it is said
    to have, a row index out of range, or a type without kernels raise, never read."""
    native = kernels._NATIVE
    if native is None:
        pytest.skip(kernels.kernel_path())
    w = random_weights(T.Q4_0, 8, 64, seed=2)
    x, y = np.ones((2, 64), np.float32), np.empty((2, 8), np.float32)
    q = int(T.Q4_0)
    with pytest.raises(ValueError, match="w holds"):
        native.dots(q, w.data, 9, 64, x, 2, y, 1, False)
    with pytest.raises(ValueError, match="x holds"):
        native.dots(q, w.data, 8, 64, x, 3, y, 1, False)
    with pytest.raises(ValueError, match="y holds"):
        native.dots(q, w.data, 8, 64, x, 2, y[:1], 1, False)
    with pytest.raises(ValueError, match="bad shape"):
        native.dots(q, w.data, 8, 48, x, 2, y, 1, False)
    with pytest.raises(ValueError, match="no native kernel"):
        native.dots(int(T.IQ2_XXS), w.data, 8, 64, x, 2, y, 1, False)
    with pytest.raises(IndexError):
        native.dequantize(q, w.data, 8, 64, np.array([0, 8]), np.empty((2, 64), np.float32), 1)
    with pytest.raises(ValueError, match="not runnable"):
        native.use_isa("sse9")


def test_kernel_path_names_what_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess
    import sys

    code = "from frink_cli.quant import kernels; print(kernels.kernel_path())"

    def path_with(**env: str) -> str:
        got = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True
        )
        return got.stdout.strip() or got.stderr

    if kernels.compiled():
        assert kernels.kernel_path().startswith("native C (")
        assert path_with(FRINK_NATIVE_ISA="base") == "native C (base, f32 activations)"
        for isa in ISAS[:-1]:  # every variant with 8-bit activations (all but base)
            got = path_with(FRINK_NATIVE_ISA=isa, FRINK_EXACT_ACTIVATIONS="")
            assert got == f"native C ({isa}, 8-bit activations)" or "not runnable" in got
            got = path_with(FRINK_NATIVE_ISA=isa, FRINK_EXACT_ACTIVATIONS="1")
            assert got == f"native C ({isa}, f32 activations)" or "not runnable" in got
        assert "not runnable" in path_with(FRINK_NATIVE_ISA="sse9")
    monkeypatch.setattr(kernels, "_NATIVE", None)
    monkeypatch.setattr(kernels, "_WHY", "numpy (FRINK_NO_NATIVE is set)")
    assert kernels.kernel_path().startswith("numpy (")
    assert path_with(FRINK_NO_NATIVE="1") == "numpy (FRINK_NO_NATIVE is set)"


def test_the_kernels_are_compiled_wherever_a_c_compiler_is() -> None:
    """setup.py's build is optional (frink installs without a compiler), so a broken
    build would leave every test above on the NumPy path and still passing: where a C
    compiler exists (this project's CI), the compiled module must have been built."""
    import os
    import shutil

    if os.environ.get("FRINK_NO_NATIVE") or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here, or the compiled kernels are switched off")
    assert kernels.compiled(), kernels.kernel_path()
