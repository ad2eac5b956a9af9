"""The host body's row-wise ops in C (frink_cli/backends/host/rowwise.c) against float64 math:
RMSNorm, rope in both layouts, the gated activations and the exp they use, on the views
the layer graph hands them (heads inside a fused QKV row, ragged widths); and the NumPy
path beside them, which runs where the C is not built."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from frink_cli.backends.host import ffn, norms, rowwise
from frink_cli.backends.host.rope import Rope
from frink_cli.quant import kernels

needs_c = pytest.mark.skipif(not rowwise.compiled(), reason=rowwise.path())
rng = np.random.default_rng(7)


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the last place of want as a float32."""
    w32 = want.astype(np.float32)
    spacing = np.spacing(np.abs(w32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


@needs_c
def test_exp_is_within_two_ulp_of_float64_over_the_normal_range() -> None:
    x = np.concatenate(
        [np.linspace(-87.3, 88.3, 400_001), rng.uniform(-20, 20, 100_000), [0.0, -0.0, 1e-30]]
    ).astype(np.float32)
    want = np.exp(x.astype(np.float64))
    assert ulps(rowwise.exp(x), want).max() <= 2.0


@needs_c
def test_exp_edges() -> None:
    x = np.array([-np.inf, -1000, -88.0, 89.0, 1000, np.inf, np.nan], np.float32)
    got = rowwise.exp(x)
    assert got[0] == 0 and got[1] == 0 and 0 <= got[2] < 1.2e-38
    assert np.isinf(got[3:6]).all() and (got[3:6] > 0).all()
    assert np.isnan(got[6])


def rms_reference(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


@needs_c
@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 256, 640, 1000])
def test_rms_norm_rows(n: int) -> None:
    x = (rng.standard_normal((5, n)) * 3).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    for weight in (w, None):
        got = rowwise.rms_norm(x, weight, 1e-6, None)
        assert got is not None
        np.testing.assert_allclose(got, rms_reference(x, weight, 1e-6), rtol=1e-6, atol=1e-6)


@needs_c
def test_rms_norm_of_heads_inside_a_fused_row_in_place() -> None:
    """QK norm: [T, H, hk] heads viewed inside [T, q | k | v] rows, normed in place; the
    columns around them are left as they were."""
    T, H, hk = 33, 4, 256
    qkv = rng.standard_normal((T, (H + 2) * hk)).astype(np.float32)
    before = qkv.copy()
    q = qkv[:, : H * hk].reshape(T, H, hk)
    w = rng.standard_normal(hk).astype(np.float32)
    assert norms.rms_norm(q, w, 1e-6, out=q) is q
    want = rms_reference(before[:, : H * hk].reshape(T, H, hk), w, 1e-6)
    np.testing.assert_allclose(q, want, rtol=1e-6, atol=1e-6)
    assert np.array_equal(qkv[:, H * hk :], before[:, H * hk :])


@needs_c
def test_a_rows_result_does_not_depend_on_rows_beside_it_or_threads() -> None:
    x = rng.standard_normal((300, 640)).astype(np.float32)
    h = rng.standard_normal((300, 2 * 1024)).astype(np.float32)
    w = rng.standard_normal(640).astype(np.float32)
    with kernels.threads(1):
        one_norm = rowwise.rms_norm(x, w, 1e-6, None)
        one_glu = rowwise.glu(h, "gelu_tanh")
    with kernels.threads(kernels.current_threads()):
        many_norm = rowwise.rms_norm(x, w, 1e-6, None)
        many_glu = rowwise.glu(h, "gelu_tanh")
        alone_norm = rowwise.rms_norm(x[17:18], w, 1e-6, None)
        alone_glu = rowwise.glu(h[17:18], "gelu_tanh")
    assert np.array_equal(one_norm, many_norm) and np.array_equal(one_glu, many_glu)
    assert np.array_equal(alone_norm, many_norm[17:18])
    assert np.array_equal(alone_glu, many_glu[17:18])


def rope_reference(x: np.ndarray, pos: np.ndarray, dim: int, base: float, neox: bool):
    inv = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    y = x.astype(np.float64)
    if neox:
        a, b = y[..., : dim // 2], y[..., dim // 2 : dim]
    else:
        a, b = y[..., 0:dim:2], y[..., 1:dim:2]
    a2, b2 = a * cos - b * sin, b * cos + a * sin
    out = y.copy()
    if neox:
        out[..., : dim // 2], out[..., dim // 2 : dim] = a2, b2
    else:
        out[..., 0:dim:2], out[..., 1:dim:2] = a2, b2
    return out


@needs_c
@pytest.mark.parametrize("layout", ["neox", "norm"])
@pytest.mark.parametrize("dim", [64, 32])  # whole head, and a partial rotation
def test_rope_rotates_heads_inside_a_fused_row(layout: str, dim: int) -> None:
    T, H, hk = 21, 3, 64
    qkv = rng.standard_normal((T, 2 * H * hk)).astype(np.float32)
    before = qkv.copy()
    q = qkv[:, : H * hk].reshape(T, H, hk)
    pos = np.array([5, 900, 3, 4, 77] + list(range(100, 116)), np.int64)  # not one run
    Rope(dim, 10000.0, 1.0, layout).rotate_(q, pos)
    want = rope_reference(
        before[:, : H * hk].reshape(T, H, hk), pos, dim, 10000.0, layout == "neox"
    )
    np.testing.assert_allclose(q, want, rtol=0, atol=2e-5)
    assert np.array_equal(qkv[:, H * hk :], before[:, H * hk :])


@needs_c
def test_rope_refuses_positions_outside_its_tables() -> None:
    x = np.zeros((2, 1, 8), np.float32)
    cos = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="position"):
        rowwise.rope(x, cos, cos, np.array([0, 4]), True)
    with pytest.raises(ValueError, match="pos must be"):
        rowwise.rope(x, cos, cos, np.array([0]), True)


def glu_reference(h: np.ndarray, act: str) -> np.ndarray:
    g, u = np.split(h.astype(np.float64), 2, axis=-1)
    if act == "silu":
        with np.errstate(over="ignore"):
            a = g / (1 + np.exp(-g))
    else:
        # 0.5 g (1 + tanh(u)) as g sigmoid(2u): the same function, exact in float64 also
        # where tanh(u) rounds to -1.
        with np.errstate(over="ignore"):
            a = g / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    return a * u


@needs_c
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("n_ff", [1, 15, 16, 17, 2048])
def test_glu_against_float64(act: str, n_ff: int) -> None:
    h = (rng.standard_normal((9, 2 * n_ff)) * 4).astype(np.float32)
    h[0, :n_ff] = np.linspace(-120, 120, n_ff)  # where exp over- and underflows
    got = rowwise.glu(h, act)
    assert got is not None and got.flags.c_contiguous and got.shape == (9, n_ff)
    want = glu_reference(h, act)
    # (atol: in the far negative tail, e^-2u magnifies u's own float32 rounding; values
    # there are below 1e-12)
    np.testing.assert_allclose(got, want, rtol=4e-6, atol=1e-12)


@needs_c
def test_wrong_arrays_raise_not_read_astray() -> None:
    C = rowwise._C
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="float32"):
        C.rms_norm(x.astype(np.float64), None, 1e-6, x, 1)
    with pytest.raises(ValueError, match="shape"):
        C.rms_norm(x, None, 1e-6, np.zeros((4, 7), np.float32), 1)
    with pytest.raises(ValueError, match="w must be"):
        C.rms_norm(x, np.zeros(7, np.float32), 1e-6, x, 1)
    with pytest.raises(ValueError, match="half as wide"):
        C.glu(x, 0, np.zeros((4, 8), np.float32), 1)
    with pytest.raises(ValueError, match="activation"):
        C.glu(x, 9, np.zeros((4, 4), np.float32), 1)
    with pytest.raises(ValueError, match="last contiguous"):
        C.rms_norm(x[:, ::2], None, 1e-6, np.zeros((4, 4), np.float32), 1)


ROW_VARIANTS = ("portable", "avx2", "avx512")


def _row_ops(x: np.ndarray, h: np.ndarray, pos: np.ndarray) -> list[np.ndarray]:
    """Every row loop's output on the same inputs: norms with and without a weight, rope
    in both layouts, both activations, exp."""
    w = np.linspace(-2, 2, x.shape[-1], dtype=np.float32)
    out = [rowwise.rms_norm(x, w, 1e-6, None), rowwise.rms_norm(x, None, 1e-5, None)]
    for layout in ("neox", "norm"):
        y = x.copy()
        Rope(x.shape[-1], 10000.0, 1.0, layout).rotate_(y, pos)
        out.append(y)
    out += [rowwise.glu(h, act) for act in ("silu", "gelu_tanh")]
    out.append(rowwise.exp(h))
    assert all(o is not None for o in out)
    return [np.asarray(o) for o in out]


@needs_c
def test_every_variant_runs_its_own_row_loops_with_the_same_bits() -> None:
    """attend_isa's switch (a test's, as FRINK_NATIVE_ISA's is a user's) moves the norms,
    rope, activations and exp to that variant's copy, and every copy gives the portable
    one's bits."""
    C = rowwise._C
    x = (rng.standard_normal((7, 3, 72)) * 3).astype(np.float32)
    h = (rng.standard_normal((9, 2 * 131)) * 6).astype(np.float32)
    pos = np.arange(7, dtype=np.int64) * 37
    before = C.attend_isa()
    got = {}
    try:
        for isa in ROW_VARIANTS:
            try:
                C.attend_isa(isa)
            except ValueError:
                continue
            assert C.row_loops() == isa
            got[isa] = _row_ops(x, h, pos)
    finally:
        C.attend_isa(before)
    from isa_variants import unrunnable_reason

    assert "avx2" in got or unrunnable_reason("avx2") is not None, got.keys()
    for isa, outs in got.items():
        for a, b in zip(outs, got["portable"], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=isa)


@needs_c
@pytest.mark.parametrize("forced", ["avxvnni", "avx2", "base"])
def test_a_forced_variant_runs_its_row_loops_from_the_start(forced: str) -> None:
    """FRINK_NATIVE_ISA, read when the module loads, picks the row loops too: the forced
    variant is what runs on a machine that has only it."""
    import subprocess
    import sys

    from isa_variants import unrunnable_reason

    if (why := unrunnable_reason(forced)) is not None:
        pytest.skip(why)
    code = "from frink_cli.backends.host import rowwise as r; print(r._C.row_loops())"
    env = {**os.environ, "FRINK_NATIVE_ISA": forced}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == {"avxvnni": "avx2", "avx2": "avx2", "base": "portable"}[forced]


def test_the_numpy_path_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the C is not built, norms, rope and glu run NumPy: the same functions."""
    monkeypatch.setattr(rowwise, "_C", None)
    x = rng.standard_normal((6, 3, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    np.testing.assert_allclose(norms.rms_norm(x, w, 1e-6), rms_reference(x, w, 1e-6), rtol=1e-5)
    pos = np.arange(6, dtype=np.int64) + 40
    for layout in ("neox", "norm"):
        y = x.copy()
        Rope(64, 10000.0, 1.0, layout).rotate_(y, pos)
        want = rope_reference(x, pos, 64, 10000.0, layout == "neox")
        np.testing.assert_allclose(y, want, atol=2e-5)
    h = rng.standard_normal((6, 64)).astype(np.float32)
    for act in ("silu", "gelu_tanh"):
        got = ffn.glu_(h.copy(), act)
        np.testing.assert_allclose(got, glu_reference(h, act), rtol=1e-5, atol=1e-7)


def test_the_row_wise_ops_are_compiled_wherever_a_c_compiler_is() -> None:
    """setup.py's build is optional, so a broken build would leave the tests above
    skipped: where a C compiler exists (this project's CI), the module must be built."""
    if os.environ.get("FRINK_NO_NATIVE") or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here, or the compiled kernels are switched off")
    assert rowwise.compiled(), rowwise.path()
