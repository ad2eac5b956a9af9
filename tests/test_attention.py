"""The host body's attention core (backends/host/attention.py) against softmax attention written
out in float64: a decode row over short and long caches (its scores taken in chunks of
keys past ROW_KEY_CHUNK), with grouped KV heads, a window, a soft cap, ALiBi slopes and
sinks; and a prompt's blocked rows, whose last row must be the decode row's answer. Each
on both paths: the compiled row-wise ops' (rowwise.attend) and NumPy's. The compiled one
also gives a row the same bits alone, in a prompt, or in a prompt cut anywhere, and reads a
16-bit or quantized cache's stored rows as the f32 rows they decode to, bit for bit."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from frink_cli.backends.host import attention as A
from frink_cli.backends.host import rowwise
from frink_cli.cache.kv_types import Coded, as_f32, encode


@pytest.fixture(autouse=True, params=["native", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on the compiled attention (where built) and on NumPy's."""
    if request.param == "numpy":
        monkeypatch.setattr(rowwise, "_C", None)
    elif not rowwise.compiled():
        pytest.skip(f"no compiled row-wise ops: {rowwise.path()}")
    return str(request.param)


def reference(
    q,
    K,
    V,
    positions,
    first,
    window=None,
    softcap=None,
    sinks=None,
    slopes=None,
    causal=True,
    bias=None,
):
    """softmax(q K^T) V per query row and head in float64, key j at position first + j
    (causal False: every key, or |p - k| < window; bias [H, 2c + 1] by k - p + c, clipped)."""
    T, H, hk = q.shape
    Hkv, S, hv = V.shape
    g = H // Hkv
    out = np.zeros((T, H, hv))
    for t, p in enumerate(positions):
        keys = np.arange(S) + first
        seen = keys <= p if causal else np.ones(S, bool)
        if window is not None:
            seen &= (p - keys < window) if causal else (np.abs(p - keys) < window)
        for h in range(H):
            s = K[h // g].astype(np.float64) @ q[t, h].astype(np.float64)
            if softcap:
                s = np.tanh(s / softcap) * softcap
            if slopes is not None:
                s = s - slopes[h] * (p - keys)
            if bias is not None:
                c = (bias.shape[1] - 1) // 2
                s = s + bias[h, np.clip(keys - p + c, 0, 2 * c)]
            s = np.where(seen, s, -np.inf)
            m = s.max() if sinks is None else max(s.max(), sinks[h])
            w = np.exp(s - m)
            total = w.sum() + (0.0 if sinks is None else np.exp(sinks[h] - m))
            out[t, h] = w @ V[h // g].astype(np.float64) / total
    return out.reshape(T, H * hv)


@pytest.mark.parametrize("n", [1, 5, A.ROW_KEY_CHUNK, A.ROW_KEY_CHUNK + 1, 700, 2100])
@pytest.mark.parametrize("heads", [(3, 3, 64), (1, 4, 256), (2, 1, 16)])
def test_a_decode_row_is_softmax_attention(n: int, heads: tuple[int, int, int]) -> None:
    Hkv, g, hk = heads
    rng = np.random.default_rng(n + hk)
    K = rng.standard_normal((Hkv, n + 3, hk)).astype(np.float32)[:, :n]  # a cache's view
    V = rng.standard_normal((Hkv, n + 3, hk)).astype(np.float32)[:, :n]
    q = (rng.standard_normal((1, Hkv * g, hk)) * hk**-0.5).astype(np.float32)
    got = A.attend(q, K, V, 0, np.array([n - 1]), None, None)
    np.testing.assert_allclose(got, reference(q, K, V, [n - 1], 0), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("decoration", ["window", "softcap", "sinks", "slopes"])
def test_a_long_decode_row_keeps_its_decorations(decoration: str) -> None:
    rng = np.random.default_rng(3)
    # (a cache without a window holds every key from position 0)
    Hkv, g, hk, n = 2, 2, 32, 900
    first = 40 if decoration == "window" else 0
    K = rng.standard_normal((Hkv, n, hk)).astype(np.float32)
    V = rng.standard_normal((Hkv, n, hk)).astype(np.float32)
    q = (rng.standard_normal((1, Hkv * g, hk)) * 0.3).astype(np.float32)
    pos = first + n - 1
    kw: dict = {"window": 600} if decoration == "window" else {}
    if decoration == "softcap":
        kw["softcap"] = 5.0
    if decoration == "sinks":
        kw["sinks"] = rng.standard_normal(Hkv * g).astype(np.float32)
    if decoration == "slopes":
        kw["slopes"] = (0.5 ** np.arange(1, Hkv * g + 1)).astype(np.float32)
    w, c, sk, sl = kw.get("window"), kw.get("softcap"), kw.get("sinks"), kw.get("slopes")
    got = A.attend(q, K, V, first, np.array([pos]), w, c, sl, sk)
    want = reference(q, K, V, [pos], first, w, c, sk, sl)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_prompts_last_row_is_the_decode_rows_answer() -> None:
    """The blocked prompt path and the decode row compute the same attention."""
    rng = np.random.default_rng(9)
    Hkv, g, hk, T = 2, 3, 64, 2 * A.QUERY_BLOCK + 300
    K = rng.standard_normal((Hkv, T, hk)).astype(np.float32)
    V = rng.standard_normal((Hkv, T, hk)).astype(np.float32)
    q = (rng.standard_normal((T, Hkv * g, hk)) * 0.125).astype(np.float32)
    prompt = A.attend(q, K, V, 0, np.arange(T), None, None)
    row = A.attend(q[-1:], K, V, 0, np.array([T - 1]), None, None)
    want = reference(q[-4:], K, V, np.arange(T - 4, T), 0)
    np.testing.assert_allclose(prompt[-4:], want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(row, want[-1:], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("decoration", ["none", "window", "softcap", "sinks", "slopes"])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(path: str, decoration: str) -> None:
    """Compiled: each row of a prompt is the same bits as the row alone (a decode row) and as
    the row in any cut of the prompt (a prompt resumed from a cache, fed in chunks)."""
    if path != "native":
        pytest.skip("NumPy's sums follow the block's shape")
    rng = np.random.default_rng(11)
    Hkv, g, hk, T = 2, 3, 64, 150
    K = rng.standard_normal((Hkv, T, hk)).astype(np.float32)
    V = rng.standard_normal((Hkv, T, hk)).astype(np.float32)
    q = (rng.standard_normal((T, Hkv * g, hk)) * 0.125).astype(np.float32)
    args = {
        "window": (70, None, None, None),
        "softcap": (None, 3.0, None, None),
        "sinks": (None, None, None, rng.standard_normal(Hkv * g).astype(np.float32)),
        "slopes": (None, None, (0.5 ** np.arange(1, 7)).astype(np.float32), None),
    }.get(decoration, (None, None, None, None))
    whole = A.attend(q, K, V, 0, np.arange(T), *args)
    for t0, t1 in ((0, 1), (3, 4), (0, 17), (17, 90), (149, 150), (64, 150)):
        np.testing.assert_array_equal(
            A.attend(q[t0:t1], K, V, 0, np.arange(t0, t1), *args), whole[t0:t1]
        )


def _encoder_case(rng: np.random.Generator, T: int) -> tuple[np.ndarray, ...]:
    Hkv, g, hk = 2, 2, 32
    K = rng.standard_normal((Hkv, T, hk)).astype(np.float32)
    V = rng.standard_normal((Hkv, T, hk)).astype(np.float32)
    q = (rng.standard_normal((T, Hkv * g, hk)) * 0.2).astype(np.float32)
    bias = rng.standard_normal((Hkv * g, 2 * 9 + 1)).astype(np.float32)
    return q, K, V, bias


@pytest.mark.parametrize("window", [None, 1, 7, 500])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bidirectional_rows_with_a_symmetric_window_and_a_relative_bias(
    window: int | None, with_bias: bool
) -> None:
    """causal False: each query sees keys on both sides (|p - k| < window with a window);
    a relative bias table [H, 2c + 1] joins the scores by key - query position, its edge
    columns for every farther key (T = 150 > 2 * 9 + 1 crosses them)."""
    rng = np.random.default_rng(5)
    T = 150
    q, K, V, table = _encoder_case(rng, T)
    bias = table if with_bias else None
    got = A.attend(q, K, V, 0, np.arange(T), window, None, causal=False, bias=bias)
    want = reference(q, K, V, np.arange(T), 0, window, causal=False, bias=bias)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_causal_row_takes_a_relative_bias() -> None:
    rng = np.random.default_rng(6)
    q, K, V, bias = _encoder_case(rng, 90)
    got = A.attend(q, K, V, 0, np.arange(90), 30, None, bias=bias)
    want = reference(q, K, V, np.arange(90), 0, 30, bias=bias)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_bidirectional_rows_bits_do_not_depend_on_the_rows_beside_it(path: str) -> None:
    """Compiled: a query row over the whole sequence (window, bias) is the same bits asked
    alone or among any other rows."""
    if path != "native":
        pytest.skip("NumPy's sums follow the block's shape")
    rng = np.random.default_rng(12)
    T = 120
    q, K, V, bias = _encoder_case(rng, T)
    kw: dict = {"causal": False, "bias": bias}
    whole = A.attend(q, K, V, 0, np.arange(T), 20, None, **kw)
    for t0, t1 in ((0, 1), (3, 4), (0, 17), (17, 90), (119, 120)):
        got = A.attend(q[t0:t1], K, V, 0, np.arange(t0, t1), 20, None, **kw)
        np.testing.assert_array_equal(got, whole[t0:t1])


def test_a_bias_of_even_width_is_refused() -> None:
    rng = np.random.default_rng(7)
    q, K, V, bias = _encoder_case(rng, 10)
    with pytest.raises(ValueError, match="attention bias"):
        A.attend(q, K, V, 0, np.arange(10), None, None, causal=False, bias=bias[:, 1:])


@pytest.mark.parametrize("kind", ["f16", "bf16", "q8_0", "q4_0"])
def test_stored_rows_attend_as_the_rows_they_decode_to(path: str, kind: str) -> None:
    """K and V kept as a cache type stores them (`Coded`): softmax attention over the rows
    they decode to; compiled, the same bits as the f32 kernel on those rows (each element
    decoded exactly as it is read: f16 subnormals, -0 and 65504 included; a half row's
    width not a multiple of 8 takes the dot's tail), in a prompt and in any cut of it."""
    rng = np.random.default_rng(13)
    Hkv, g, T = 2, 3, 150
    hk, hv = (64, 32) if kind.startswith("q") else (68, 36)
    K = rng.standard_normal((Hkv, T, hk)).astype(np.float32)
    V = rng.standard_normal((Hkv, T, hv)).astype(np.float32)
    K[0, :40, :4] = np.float32(3e-6) * np.arange(-2, 2)  # f16 subnormals and zeros
    K[1, 7, 0], V[0, 9, :2] = np.float32(-0.0), np.float32(65504.0)
    q = (rng.standard_normal((T, Hkv * g, hk)) * 0.125).astype(np.float32)
    Kc, Vc = (Coded(encode(kind, x), kind, x.shape[2]) for x in (K, V))
    Kd, Vd = as_f32(Kc), as_f32(Vc)
    whole = A.attend(q, Kc, Vc, 0, np.arange(T), None, None)
    np.testing.assert_allclose(whole, reference(q, Kd, Vd, np.arange(T), 0), rtol=5e-5, atol=5e-6)
    if path != "native":
        return
    np.testing.assert_array_equal(whole, A.attend(q, Kd, Vd, 0, np.arange(T), None, None))
    windowed = A.attend(q, Kc, Vc, 0, np.arange(T), 70, None)
    for t0, t1 in ((0, 1), (3, 4), (17, 90), (149, 150)):
        got = A.attend(q[t0:t1], Kc, Vc, 0, np.arange(t0, t1), 70, None)
        np.testing.assert_array_equal(got, windowed[t0:t1])


def _coded_case(
    rng: np.random.Generator, Hkv: int, g: int, T: int, S: int, hk: int, hv: int, kind: str
) -> tuple[np.ndarray, np.ndarray | Coded, np.ndarray | Coded]:
    """Scaled queries [T, Hkv * g, hk] and keys / values [Hkv, S, hk / hv], K and V as cache
    type `kind` stores them (f32: the arrays themselves)."""
    K = rng.standard_normal((Hkv, S, hk)).astype(np.float32)
    V = rng.standard_normal((Hkv, S, hv)).astype(np.float32)
    q = (rng.standard_normal((T, Hkv * g, hk)) * 0.125).astype(np.float32)
    Kc, Vc = (x if kind == "f32" else Coded(encode(kind, x), kind, x.shape[2]) for x in (K, V))
    return q, Kc, Vc


def _each_variant(run: Callable[[], np.ndarray]) -> dict[str, np.ndarray]:
    """run() on the compiled attention's portable loops, its AVX2 ones (skipped where the
    CPU lacks them) and its AVX-512 prompt tiles where the CPU has them, the variant in use
    restored after: {variant: its result}."""
    C = rowwise._C
    got = {}
    before = C.attend_isa()
    try:
        for isa in ("portable", "avx2", "avx512"):
            try:
                C.attend_isa(isa)
            except ValueError:
                if isa == "avx512":
                    break
                pytest.skip(f"this CPU does not run the {isa} attention")
            got[isa] = run()
    finally:
        C.attend_isa(before)
    return got


def _all_equal(got: dict[str, np.ndarray]) -> None:
    """Every variant's result the same bits as the portable loops'."""
    for isa, result in got.items():
        np.testing.assert_array_equal(result, got["portable"], err_msg=isa)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_every_attention_variant_gives_the_same_bits(path: str, kind: str) -> None:
    """The compiled attention's AVX2 loops (rowwise_kv_avx2.h), its AVX-512 prompt tiles
    (rowwise_kv_avx512.h) and its portable loops (FRINK_NATIVE_ISA=base) give each row the
    same bits, over every cache type, odd key
    counts (the 4-key blocks' remainder), a V wider than 64 (two column passes) and more
    keys than the vector loops widen at once for the rows and query heads sharing a KV head
    (attend_rows, which a prompt's rows take: 64)."""
    if path != "native":
        pytest.skip("the compiled attention's variants")
    T = 150
    q, Kc, Vc = _coded_case(np.random.default_rng(14), 2, 3, T, T, 64, 96, kind)
    got = _each_variant(lambda: A.attend(q, Kc, Vc, 0, np.arange(T), None, None))
    _all_equal(got)


@pytest.mark.parametrize("layout", ["causal", "windows"])
@pytest.mark.parametrize("g", [1, 2, 7])
@pytest.mark.parametrize("kind", ["f32", "f16", "q8_0"])
def test_rows_sharing_widened_keys_give_each_rows_bits(
    path: str, g: int, kind: str, layout: str
) -> None:
    """Compiled: a prompt's rows share each widened key and value row among rows and heads
    (attend_rows: blocks of 24 / g rows, two heads a key's loads), and a block whose rows'
    keys lie far apart (rows of other sequences in one cache) goes a row at a time; every
    row is the same bits as asked alone, on the AVX2 loops, the AVX-512 tiles (rows' own
    first and last keys alone, the keys they share in pairs of vectors) and the portable
    ones, for a group of 1, 2 or 7 heads (one left over from the pairs), against float64's
    softmax."""
    if path != "native":
        pytest.skip("the compiled attention's blocks")
    Hkv, T, S, hv = 2, 40, 300, 32
    q, Kc, Vc = _coded_case(np.random.default_rng(15), Hkv, g, T, S, 64, hv, kind)
    if layout == "causal":  # every row's keys from 0: blocks of neighbours
        pos = np.arange(S - T, S)
        lo = np.zeros(T, np.int64)
    else:  # windows of 26 keys: 20 neighbours, then 20 rows 8 positions apart
        pos = np.concatenate([np.arange(100, 120), 130 + 8 * np.arange(20)])
        lo = pos - 25
    hi = pos + 1
    lo[3] = hi[3] - 3  # fewer keys than a 4-key step
    keys = (lo.astype(np.int64), hi.astype(np.int64))
    extra = (None, None, None, None)

    def rows_and_each_alone() -> np.ndarray:
        rows = rowwise.attend(q, Kc, Vc, 0, pos, keys, extra)
        assert rows is not None
        for t in range(T):
            one = (keys[0][t : t + 1], keys[1][t : t + 1])
            alone = rowwise.attend(q[t : t + 1], Kc, Vc, 0, pos[t : t + 1], one, extra)
            np.testing.assert_array_equal(rows[t : t + 1], alone)
        return rows

    got = _each_variant(rows_and_each_alone)
    _all_equal(got)
    Kd, Vd = as_f32(Kc).astype(np.float64), as_f32(Vc).astype(np.float64)
    for t in (0, 3, 25, T - 1):
        for h in range(Hkv * g):
            s = Kd[h // g, lo[t] : hi[t]] @ q[t, h]
            w = np.exp(s - s.max())
            want = w @ Vd[h // g, lo[t] : hi[t]] / w.sum()
            got_h = got["avx2"][t, h * hv : (h + 1) * hv]
            np.testing.assert_allclose(got_h, want, rtol=5e-5, atol=5e-6)


def test_the_forced_isa_picks_the_attentions_variant() -> None:
    """FRINK_NATIVE_ISA (read at import, so in a child process) picks the attention's loops
    as it picks the kernels': base the portable ones, avx2 and avxvnni the AVX2 loops, avx512 (and
    avx512+amx) the AVX-512 tiles where the CPU has AVX-512 F and DQ; `frink info` prints
    rowwise.path(), which names the variant."""
    import os

    from isa_variants import child_json, runnable_isas

    if not rowwise.compiled():
        pytest.skip(f"no compiled row-wise ops: {rowwise.path()}")
    C = rowwise._C
    assert C is not None
    before = C.attend_isa()
    try:
        C.attend_isa("avx512")
        wide = "avx512"
    except ValueError:
        wide = "avx2"
    finally:
        C.attend_isa(before)
    narrow = {"base": "portable", "avx2": "avx2", "avxvnni": "avx2"}
    want = {**narrow, "avx512": wide, "avx512+amx": wide}
    code = (
        "import json; from frink_cli.backends.host import rowwise; "
        "print(json.dumps({'path': rowwise.path()}))"
    )
    isas = runnable_isas()
    if not isas:
        pytest.skip("no compiled kernels")
    for isa in isas:
        got = child_json(code, [], {**os.environ, "FRINK_NATIVE_ISA": isa}, 120)
        assert got["path"] == f"native C (attention {want[isa]})", isa
