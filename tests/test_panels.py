"""Weights in panels (`kernels.in_panels`: 16 rows of W interleaved a lane per row, the
compiled kernels' native_panels.h) against gguf-py and against the same weights in the
file's order.

Why: a model's Q2_K, Q3_K, Q4_K, Q4_0, Q5_0, Q4_1, IQ4_NL and IQ4_XS (and, with VNNI, Q5_K,
Q6_K and Q8_0) matrices are repacked at load where the kernels have panel dots, so every decode and
prompt product of such a model goes through them. They must give dequantize(q8(x)) @
dequantize(W).T as the file-order dots do (test_quant_kernels' bar), keep a row's bits
whatever rows share its step, and every other reader of the matrix
(exact activations, dequantization, row lookups, the portable kernels, a backend's upload)
must see the file's weights exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from quant_weights import assert_close, random_weights, reference
from test_quant_kernels import _use_isa, min_term_error, q8_rounded

from frink_cli.quant import kernels
from frink_cli.quant.blocks import PANEL_ROWS, QuantMatrix

PANEL_ISAS = ("avx512", "avxvnni", "avx2")
# The types with a panel layout; the shapes: one panel of one unit, several panels, and a
# real model's width (Q5_0's unit is two runs: 64 columns).
PANEL_TYPES = (
    T.Q4_K,
    T.Q5_K,
    T.Q6_K,
    T.Q3_K,
    T.Q2_K,
    T.Q4_0,
    T.Q4_1,
    T.Q5_0,
    T.Q8_0,
    T.IQ4_NL,
    T.IQ4_XS,
)
SHAPES = {
    T.Q4_K: ((16, 256), (48, 512), (128, 1536)),
    T.Q5_K: ((16, 256), (48, 768), (128, 1536)),
    T.Q6_K: ((16, 256), (48, 768), (128, 1536)),
    T.Q3_K: ((16, 256), (48, 768), (128, 1536)),
    T.Q2_K: ((16, 256), (48, 768), (128, 1536)),
    T.Q4_0: ((16, 64), (48, 512), (128, 896)),
    T.Q4_1: ((16, 64), (48, 512), (128, 576)),
    T.Q5_0: ((16, 64), (48, 512), (128, 896)),
    T.Q8_0: ((16, 64), (48, 512), (128, 896)),
    T.IQ4_NL: ((16, 64), (48, 512), (128, 896)),
    T.IQ4_XS: ((16, 256), (48, 768), (128, 1536)),
}


@pytest.fixture(params=PANEL_ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from (str(request.param) for _ in _use_isa(str(request.param)))


def _serves(qtype: T, cols: int) -> None:
    """Skip where the kernels running now have no panel dots for qtype (the portable
    variant, or a width that is no whole number of units)."""
    if kernels._NATIVE is None or not kernels._NATIVE.panels_for(int(qtype), cols):
        pytest.skip(f"{kernels.kernel_path()}: no panel dots for {qtype.name}")


def _panelled(qtype: T, rows: int, cols: int, seed: int) -> tuple[QuantMatrix, QuantMatrix]:
    """(W in the file's order, the same W in panels)."""
    _serves(qtype, cols)
    w = random_weights(qtype, rows, cols, seed=seed)
    with kernels.exact_activations(False):
        p = kernels.in_panels(w)
    assert p.panels, f"{kernels.kernel_path()}: no panels for {qtype.name}"
    return w, p


@pytest.mark.parametrize("qtype", PANEL_TYPES, ids=lambda t: t.name)
def test_panels_hold_the_files_bytes(qtype: T, isa: str) -> None:
    """A permutation of the bytes: the file's order comes back whole, row by row and by
    index; whole panels slice, a cut through one does not."""
    for rows, cols in SHAPES[qtype]:
        w, p = _panelled(qtype, rows, cols, seed=rows + cols)
        assert p.data.nbytes == w.data.nbytes and not np.array_equal(p.data, w.data)
        assert p.data.ctypes.data % kernels.PANEL_ALIGN == 0
        np.testing.assert_array_equal(kernels.file_order(p).data, w.data)
        idx = np.array([rows - 1, 0, 5, 5, rows // 2])
        np.testing.assert_array_equal(kernels.file_rows(p, idx), w.data[idx])
        np.testing.assert_array_equal(
            kernels.file_order(p.row_slice(0, PANEL_ROWS)).data, w.data[:PANEL_ROWS]
        )
        with pytest.raises(ValueError, match="cut panels"):
            p.row_slice(0, PANEL_ROWS - 1)


def _rounded_product(x: np.ndarray, w: QuantMatrix, ref_w: np.ndarray) -> np.ndarray:
    """dequantize(q8(x)) @ dequantize(W).T, plus what Q8_1's half-rounded sums add to a
    Q4_1 product (test_quant_kernels.min_term_error), as f32."""
    ref = q8_rounded(x, w.qtype) @ ref_w.T
    if w.qtype == T.Q4_1:
        ref += min_term_error(x, w)
    return ref.astype(np.float32)


@pytest.mark.parametrize("qtype", PANEL_TYPES, ids=lambda t: t.name)
def test_panel_8bit_products_equal_rounded_x_at_dequantized(qtype: T, isa: str) -> None:
    """dequantize(q8(x)) @ dequantize(W).T (x rounded as llama.cpp rounds it for W's
    type), for decode rows and a prompt's (matmul: the same dots over blocks of rows, bit
    for bit), and the rounding really happened."""
    rng = np.random.default_rng(3)
    with kernels.exact_activations(False):
        for rows, cols in SHAPES[qtype]:
            w, p = _panelled(qtype, rows, cols, seed=rows * cols)
            ref_w = reference(w).astype(np.float64)
            for t in (1, 2, 3, 5, 8, 16, 21, 40):
                x = rng.standard_normal((t, cols)).astype(np.float32)
                if t > 1:
                    x[-1, : min(256, cols)] = 0  # an all-zero block: dx 0
                got = kernels.dots(x, p)
                assert_close(got, _rounded_product(x, w, ref_w))
                np.testing.assert_array_equal(kernels.matmul(x, p), got)
                np.testing.assert_array_equal(kernels.linear(x, p), got)
                exact = x[:1].astype(np.float64) @ ref_w.T
                rel = np.linalg.norm(got[:1] - exact) / np.linalg.norm(exact)
                # (small: a 16 x 256 Q5_K's one row reaches 2.2%, the rounded reference's
                # own error, its mins' offsets cancelling much of the product)
                assert 1e-4 < rel < 3e-2, rel


@pytest.mark.parametrize("qtype", PANEL_TYPES, ids=lambda t: t.name)
def test_a_panel_rows_product_is_its_own_alone_or_in_any_batch(qtype: T, isa: str) -> None:
    """Every (row of W, row of x) pair is one vector lane's own chain of the same steps: a
    row gets the same bits alone, in batches of every length 1 .. 17 (tiles of 8, 4, 2, 1)
    and in any slice, on one thread or two."""
    rng = np.random.default_rng(5)
    w, p = _panelled(qtype, 48, 512, seed=9)
    x = rng.standard_normal((17, 512)).astype(np.float32)
    with kernels.exact_activations(False):
        alone = np.concatenate([kernels.dots(x[i : i + 1], p) for i in range(len(x))])
        for t in range(2, len(x) + 1):
            np.testing.assert_array_equal(kernels.dots(x[:t], p), alone[:t])
        for t0, t1 in ((3, 5), (2, 9), (5, 8), (1, 14), (6, 17)):
            with kernels.threads(1):
                np.testing.assert_array_equal(kernels.dots(x[t0:t1], p), alone[t0:t1])


@pytest.mark.parametrize("qtype", PANEL_TYPES, ids=lambda t: t.name)
def test_a_panel_product_is_the_same_bits_on_every_isa(qtype: T) -> None:
    """Each ISA's kernel takes the same integer sums and the same f32 steps per lane, so a
    machine's answers do not depend on which variant it picked: the products of every
    variant this CPU runs with panel dots for the type are the same bits."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((11, 512)).astype(np.float32)
    w = random_weights(qtype, 48, 512, seed=13)
    got = {}
    for name in PANEL_ISAS:
        for _ in _use_isa(name):
            if kernels._NATIVE is not None and kernels._NATIVE.panels_for(int(qtype), 512):
                with kernels.exact_activations(False):
                    got[name] = kernels.dots(x, kernels.in_panels(w))
    if len(got) < 2:
        pytest.skip(f"{qtype.name}: panel dots on {len(got)} of the ISAs this CPU runs")
    first, *rest = got.values()
    for other in rest:
        np.testing.assert_array_equal(other, first)


# Per type, the bytes that set every code and scale at its largest magnitude, as (bytes,
# value) pairs: Q4_K 15 with every 6-bit scale and min 63; Q5_K 31 likewise; Q6_K 63, every
# scale -128; Q3_K 7 (its hmask bits set), every scale -32; Q2_K 3, every scale and min 15;
# Q4_0, Q4_1 15; Q5_0 31 (every nibble and fifth bit set); Q8_0 127; IQ4_NL's level -127
# (nibble 0); IQ4_XS's too, every scale -32.
_EXTREMES = {
    T.Q4_K: ((range(4, 144), 0xFF),),
    T.Q5_K: ((range(4, 176), 0xFF),),
    T.Q6_K: ((range(0, 192), 0xFF), (range(192, 208), 0x80)),
    T.Q3_K: ((range(0, 96), 0xFF), (range(96, 108), 0x00)),
    T.Q2_K: ((range(0, 80), 0xFF),),
    T.Q4_0: ((range(2, 18), 0xFF),),
    T.Q4_1: ((range(4, 20), 0xFF),),
    T.Q5_0: ((range(2, 22), 0xFF),),
    T.Q8_0: ((range(2, 34), 0x7F),),
    T.IQ4_NL: ((range(2, 18), 0x00),),
    T.IQ4_XS: ((range(2, 136), 0x00),),
}


@pytest.mark.parametrize("qtype", PANEL_TYPES, ids=lambda t: t.name)
def test_panel_sums_hold_at_their_largest(qtype: T, isa: str) -> None:
    """Every code and scale at its largest, x all one sign (every q at +-127): the integer
    sums at their largest still equal the reference."""
    _serves(qtype, 512)
    w = random_weights(qtype, 32, 512, seed=5)
    blocks = np.asarray(w.data).reshape(-1, GGML_QUANT_SIZES[qtype][1]).copy()
    for at, value in _EXTREMES[qtype]:
        blocks[:, list(at)] = value
    w = QuantMatrix(blocks.reshape(w.rows, -1), qtype, w.rows, w.cols)
    x = np.ones((3, 512), np.float32) * np.array([[1.0], [-2.0], [0.5]], np.float32)
    with kernels.exact_activations(False):
        p = kernels.in_panels(w)
        assert p.panels
        assert_close(kernels.dots(x, p), _rounded_product(x, w, reference(w).astype(np.float64)))


@pytest.mark.parametrize("qtype", PANEL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("reader", ["exact", "base", "dequantize", "take_rows"])
def test_every_other_reader_sees_the_files_weights(qtype: T, isa: str, reader: str) -> None:
    """Exact activations, the portable kernels (an ISA switched after load), dequantization
    and row lookups read a panel matrix's rows back in the file's order: the file-order
    matrix's bits exactly."""
    rng = np.random.default_rng(7)
    w, p = _panelled(qtype, 48, 512, seed=11)
    x = rng.standard_normal((5, 512)).astype(np.float32)
    if reader == "exact":
        with kernels.exact_activations():
            np.testing.assert_array_equal(kernels.dots(x, p), kernels.dots(x, w))
    elif reader == "base":
        for _ in _use_isa("base"):
            np.testing.assert_array_equal(kernels.dots(x, p), kernels.dots(x, w))
    elif reader == "dequantize":
        np.testing.assert_array_equal(kernels.dequantize_rows(p, 3, 40), reference(w)[3:40])
    else:
        idx = np.array([47, 0, 16, 16, 31])
        np.testing.assert_array_equal(kernels.take_rows(p, idx), reference(w)[idx])


def test_only_what_panels_serve_is_repacked(isa: str) -> None:
    """A type without a panel layout, a row count that is no whole number of panels, a row
    that is no whole number of units (Q5_0: 64 columns) and exact activations keep the
    file's order."""
    with kernels.exact_activations(False):
        for qtype, rows, cols in (
            (T.Q5_1, 32, 256),
            (T.Q4_K, 40, 256),
            (T.Q5_0, 32, 352),
        ):
            w = random_weights(qtype, rows, cols, seed=rows)
            assert kernels.in_panels(w) is w
    with kernels.exact_activations():
        w = random_weights(T.Q4_K, 32, 256, seed=1)
        assert kernels.in_panels(w) is w


def test_a_q4_k_m_model_loads_its_matrices_in_panels(gemma3_path) -> None:
    """Gemma 3 270M Q4_K_M (test_real_models checks its products against llama.cpp's):
    each matrix of a type the kernels have panel dots for loads in panels, the rest in the
    file's order, so those checks run the panel dots."""
    import frink_cli

    native = kernels._NATIVE
    with kernels.exact_activations(False):
        if native is None or not native.panels_for(int(T.Q4_K), 256):
            pytest.skip(f"no panel dots here: {kernels.kernel_path()}")
        model = frink_cli.load(gemma3_path)
    parts = [
        p
        for layer in model.decoder.host.w.layers
        for lin in (layer.qkv, layer.wo, layer.gate_up, layer.down)
        for p in lin.w.parts
    ]
    assert any(p.qtype == T.Q4_K and p.panels for p in parts)
    for p in parts:
        serves = p.rows % PANEL_ROWS == 0 and native.panels_for(int(p.qtype), p.cols)
        assert p.panels == bool(serves), (p.qtype, p.rows)
    # `frink info` says which types the host holds in panels: those of the parts that are.
    from frink_cli.report import host_formats

    held = host_formats("gguf", {p.qtype.name for p in parts})
    for p in parts:
        assert ("in panels" in held[p.qtype.name]) == p.panels, (p.qtype, held)


@pytest.mark.parametrize("qtype", PANEL_TYPES, ids=lambda t: t.name)
def test_stacked_parts_repack_as_their_concatenation_on_any_thread_count(
    qtype: T, isa: str
) -> None:
    """A fused matrix's parts (a Q/K/V, a gate/up) repacked each straight into its rows of
    the result (kernels.stacked_in_panels, the load's path) are the bytes in_panels gives
    their concatenation, on one thread and on several, and read back as the file's bytes;
    a part that is no whole number of panels leaves the concatenation to the caller."""
    cols = SHAPES[qtype][1][1]
    _serves(qtype, cols)
    parts = [random_weights(qtype, rows, cols, seed=rows) for rows in (48, 16, 32)]
    joined = QuantMatrix(np.concatenate([p.data for p in parts]), qtype, 96, cols)
    with kernels.exact_activations(False):
        want = kernels.in_panels(joined)
        for n in (1, 2, 3):
            with kernels.threads(n):
                got = kernels.stacked_in_panels(parts)
            assert got is not None and got.panels and got.rows == 96
            np.testing.assert_array_equal(got.data, want.data)
            np.testing.assert_array_equal(kernels.file_order(got).data, joined.data)
        ragged = [random_weights(qtype, 40, cols, seed=1), random_weights(qtype, 24, cols, seed=2)]
        assert kernels.stacked_in_panels(ragged) is None
