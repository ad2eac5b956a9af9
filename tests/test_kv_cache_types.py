"""KV cache types (-ctk/--cache-type-k, -ctv/--cache-type-v), against llama.cpp's own.

- Stored rows: a slot's rows of each type are exactly gguf-py's round trip of the same f32
  rows (gguf.quants implements ggml's reference rounding; f16 is NumPy's IEEE cast), and
  the q8_0 / q4_0 bytes are exactly gguf-py's blocks.
- Logits: the real SmolLM2 (its all-f32 copy) with an f16 and a q8_0 cache against
  llama-cpp-python with the same type_k / type_v. llama.cpp also rounds its queries and
  probabilities to the cache's dot-product type, so (as for the shipped quantized files in
  test_real_models.py) the tolerance is the argmax and teacher-forced agreement, and the
  typed cache must bring frink closer to llama.cpp's typed cache than an f32 cache does.
- KV memory at -c 8192: about half with f16, about a quarter with q8_0 (the arrays' bytes).
- The default: f16 rows, as llama.cpp's (f32 on cuda, whose mirrors hold only f32);
  FRINK_CACHE_TYPE_K / _V choose others. (The suite pins f32 through them, conftest.py:
  its references are f32; every family with f16 caches: test_conformance.py.)
- Bad input: one line naming the option and what is allowed, non-zero exit.
- metal (MLX's CPU device) with an f16 / bf16 mirror gives the host's greedy tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import CACHE_TYPE_ENV
from frink_subprocess import assert_error, frink

import frink_cli
from frink_cli.backends import cache_type_refusal
from frink_cli.cache.attention import AttentionKv
from frink_cli.cache.kv_types import CACHE_TYPES, F32_CACHE, CacheTypes, Coded, as_f32
from frink_cli.errors import FrinkError

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType as QT  # noqa: E402

GGUF_TYPE = {"bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0}
# llama.cpp's ggml_type numbers, as llama-cpp-python's type_k / type_v take them.
LLAMA_TYPE = {"f32": 0, "f16": 1, "q8_0": 8}


def _rows(seed: int, n: int, heads: int, width: int) -> np.ndarray:
    """[n, heads, width] rows with the edge cases a rounding can get wrong: a zero block,
    halves, a block whose largest magnitude is negative, very small and large values."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, heads, width)) * 3).astype(np.float32)
    x[0, 0, :32] = 0
    x[1, 0, :32] = np.arange(32, dtype=np.float32) * 0.5 - 8
    x[2, 1, 5] = -40.0
    x[3, 1, :32] *= np.float32(1e-6)
    x[4, 0, :8] = np.float32(65504.0)
    return x


def _round_trip(kind: str, x: np.ndarray) -> np.ndarray:
    """gguf-py's (f16: NumPy's) stored-and-read-back rows of x."""
    if kind == "f32":
        return x
    if kind == "f16":
        return x.astype(np.float16).astype(np.float32)
    q = GGUF_TYPE[kind]
    return gguf_quants.dequantize(gguf_quants.quantize(x, q), q).reshape(x.shape)


@pytest.mark.parametrize("kind", CACHE_TYPES)
def test_stored_rows_are_gguf_py_round_trip(kind):
    k, v = _rows(0, 12, 3, 64), _rows(1, 12, 3, 128)
    kv = AttentionKv(3, 64, 128, 40, types=CacheTypes(kind, kind))
    kv.append(k[:7], v[:7])  # a prefill, then decode rows
    kv.commit(7)
    for t in range(7, 12):
        first, K, V = kv.append(k[t : t + 1], v[t : t + 1])
        kv.commit(t + 1)
    assert first == 0
    np.testing.assert_array_equal(as_f32(K), _round_trip(kind, k.transpose(1, 0, 2)))
    np.testing.assert_array_equal(as_f32(V), _round_trip(kind, v.transpose(1, 0, 2)))
    if kind in ("q8_0", "q4_0"):  # the stored bytes are ggml's blocks, byte for byte
        blocks = gguf_quants.quantize(k.transpose(1, 0, 2).copy(), GGUF_TYPE[kind])
        np.testing.assert_array_equal(K.data, blocks)
    if kind == "bf16":
        bits = gguf_quants.quantize(v.transpose(1, 0, 2).copy(), QT.BF16).view(np.uint16)
        np.testing.assert_array_equal(V.data, bits)


# --- logits against llama.cpp ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_real_logits_follow_llama_cpp_with_the_same_cache_type(smollm2_f32, kind, monkeypatch):
    llama_cpp = pytest.importorskip("llama_cpp")
    from test_real_models import PROMPTS, _teacher_forced

    # llama.cpp rotates K and V (a Hadamard transform) before storing a quantized type;
    # frink stores rows as ggml's quantizers round them, unrotated, as llama.cpp does with
    # the rotation off.
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")

    def llama(cache: str) -> Any:
        return llama_cpp.Llama(
            model_path=str(smollm2_f32),
            n_ctx=256,
            logits_all=True,
            type_k=LLAMA_TYPE[cache],
            type_v=LLAMA_TYPE[cache],
            flash_attn=cache == "q8_0",  # llama.cpp reads a quantized V cache only this way
            n_threads=2,
            verbose=False,
        )

    def scores(llm: Any, toks: list[int]) -> np.ndarray:
        llm.eval(toks)
        return np.array(llm.scores[: len(toks)], dtype=np.float32)

    llm, llm_f32 = llama(kind), llama("f32")
    try:
        toks = llm.tokenize(" ".join(PROMPTS).encode(), add_bos=True, special=True)
        ref, ref_f32 = scores(llm, toks), scores(llm_f32, toks)
        typed = frink_cli.load(smollm2_f32, cache_type_k=kind, cache_type_v=kind)
        plain = frink_cli.load(smollm2_f32)
        # How far llama.cpp's own logits move from its f32 cache to this type: the rows'
        # rounding plus how its attention then computes with them, which depends on the
        # build (an AVX-512 build moves f16 ~0.05, an AVX2 one less). frink's rows are
        # rounded byte for byte as ggml's (tested above); its logits must stay inside
        # that movement, and its f32 cache must match llama.cpp's f32 cache.
        shift = float(np.abs(ref - ref_f32).max())
        assert np.abs(plain.logits(toks) - ref_f32).max() <= 1e-3
        assert shift > 0.0, f"{kind}: llama.cpp's cache type changed nothing"
        for step in (False, True):  # the prompt path and the decode path
            ours = typed.logits(toks, step=step)
            assert (ours.argmax(-1) == ref.argmax(-1)).all()
            diff = float(np.abs(ours - ref).max())
            assert diff <= 2 * shift, f"{kind}: {diff} against llama.cpp, which moved {shift}"
        agree, total = _teacher_forced(llm, typed, step=True)
        assert agree >= 0.95 * total, f"{kind}: {agree}/{total} teacher-forced agreement"
    finally:
        llm.close()
        llm_f32.close()


def test_kv_bytes_at_8192_halve_with_f16_and_quarter_with_q8_0(smollm2_path):
    def kv_bytes(kind: str) -> int:
        m = frink_cli.load(smollm2_path, cache_type_k=kind, cache_type_v=kind)
        cache = m.decoder.new_cache(8192)
        cache.reserve(8192)
        return cache.kv_bytes

    f32 = kv_bytes("f32")
    assert 0.45 <= kv_bytes("f16") / f32 <= 0.55
    assert 0.2 <= kv_bytes("q8_0") / f32 <= 0.3


# --- the default ---------------------------------------------------------------------------------


def _stored_kinds(m: frink_cli.Model) -> set[str]:
    """The types the attention slots of a cache m makes hold their K and V rows in."""
    cache = m.decoder.new_cache(64)
    m.decoder.step(np.arange(1, 6), cache)
    rows = [s.held()[1:] for s in cache.slots if isinstance(s, AttentionKv)]
    assert rows, "no attention slot"
    return {r.kind if isinstance(r, Coded) else "f32" for pair in rows for r in pair}


def test_the_default_is_f16_and_the_variables_choose(tiny_model, monkeypatch):
    """Nothing chosen: f16 rows. FRINK_CACHE_TYPE_K / _V choose (an option beats them); a
    bad value is one line naming the variable, from load() and from the command line."""
    gguf = tiny_model("gemma3_text").gguf
    for env in CACHE_TYPE_ENV:
        monkeypatch.delenv(env)
    assert _stored_kinds(frink_cli.load(gguf)) == {"f16"}
    monkeypatch.setenv("FRINK_CACHE_TYPE_K", "q8_0")
    assert frink_cli.load(gguf).decoder.cache_types == CacheTypes("q8_0", "f16")
    assert frink_cli.load(gguf, cache_type_k="bf16").decoder.cache_types.k == "bf16"
    monkeypatch.setenv("FRINK_CACHE_TYPE_V", "int4")
    with pytest.raises(FrinkError, match=r"\$FRINK_CACHE_TYPE_V: unknown KV cache type 'int4'"):
        frink_cli.load(gguf)
    assert_error(frink("run", gguf, "-p", "hi", "-n", "2"), "FRINK_CACHE_TYPE_V", "int4")


def test_the_default_falls_back_to_f32_where_only_f32_is_carried(tiny_model, monkeypatch):
    """cuda's mirrors hold f32 only: left to the default, its model runs with f32 rows
    (NumPy standing in for CuPy); chosen, f16 is refused by name (below)."""
    for env in CACHE_TYPE_ENV:
        monkeypatch.delenv(env)
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    m = frink_cli.load(tiny_model("llama").gguf, backend="cuda")
    assert m.backend_name == "cuda"
    assert m.decoder.cache_types == F32_CACHE


# --- bad input ---------------------------------------------------------------------------------


def test_unknown_cache_type_is_one_line(tiny_model):
    gguf = tiny_model("llama").gguf
    line = assert_error(frink("run", gguf, "-p", "hi", "-ctk", "q5_1"), "-ctk", "f16, bf16")
    assert "q5_1" in line
    assert_error(frink("bench", gguf, "-ctv", "f8"), "--cache-type-v", "q4_0")
    with pytest.raises(FrinkError, match="cache-type-v"):
        frink_cli.load(gguf, cache_type_v="int4")


def test_a_backend_refuses_what_it_cannot_carry_by_name(tiny_model):
    gguf = tiny_model("gemma3_text").gguf  # head width 32: q8_0 rows fit
    # cuda: f32 only, refused before CuPy is imported.
    line = cache_type_refusal("cuda", CacheTypes("f16", "f32"))
    assert line is not None and "-ctk/--cache-type-k f16" in line and "f32" in line
    assert cache_type_refusal("cuda", CacheTypes()) is None
    assert_error(frink("run", gguf, "-p", "hi", "--backend", "cuda", "-ctk", "f16"), "cuda", "-ctk")
    # metal: f16 and bf16 mirrors, no quantized rows.
    assert cache_type_refusal("metal", CacheTypes("bf16", "f16")) is None
    assert_error(
        frink("run", gguf, "-p", "hi", "--backend", "metal", "-ctv", "q4_0"),
        "-ctv/--cache-type-v q4_0",
        "f32, f16, bf16",
    )
    # A head width q8_0 blocks cannot tile (the tiny llama's 16), named with its remedy.
    assert_error(frink("run", tiny_model("llama").gguf, "-p", "hi", "-ctk", "q8_0"), "-ctk", "32")


# --- metal ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_metal_half_mirror_gives_the_host_greedy_tokens(tiny_model, kind):
    pytest.importorskip("mlx.core")
    tm = tiny_model("llama")
    host = frink_cli.load(tm.gguf, cache_type_k=kind, cache_type_v=kind)
    dev = frink_cli.load(tm.gguf, backend="metal", cache_type_k=kind, cache_type_v=kind)
    ids = [int(t) for t in tm.ref["tokens"][:12]]
    hc, dc = host.decoder.new_cache(64), dev.decoder.new_cache(64)
    lh = host.decoder.step(np.asarray(ids), hc, all_logits=True)
    ld = dev.decoder.step(np.asarray(ids), dc, all_logits=True)
    assert (lh.argmax(-1) == ld.argmax(-1)).all()
    assert np.abs(lh - ld).max() <= 1e-3
    token = int(lh[-1].argmax())
    for _ in range(24):
        a = host.decoder.step(np.asarray([token]), hc)[-1]
        b = dev.decoder.step(np.asarray([token]), dc)[-1]
        assert a.argmax() == b.argmax()
        token = int(a.argmax())
    # The device wrote its rows back through the host slot: the same rows, to rounding.
    for layer in range(host.config.n_layer):
        np.testing.assert_allclose(hc.v[layer], dc.v[layer], rtol=2e-2, atol=1e-3)


# --- the serve prompt cache ----------------------------------------------------------------------


def test_serve_prompt_cache_keeps_the_cache_type(tiny_model):
    """The engine's slots are caches of the model's type, and a resumed prompt (its prefix
    kept in f16 rows) answers as a fresh engine of the same type does."""
    from test_engine import _engine, _others, _run, _stop

    m = frink_cli.load(tiny_model("llama").gguf, cache_type_k="f16", cache_type_v="f16")
    first, more = (p.tolist() for p in _others(m.n_vocab, [20, 6], seed=2))
    e, t = _engine(m, n_parallel=1, n_ctx=96)
    try:
        assert e.slots[0].cache.types == CacheTypes("f16", "f16")
        answer = _run(e, [first], 8)[0][0]
        got, finished = _run(e, [first + answer + more], 8)[0]
    finally:
        _stop(e, t)
    assert finished.cached_tokens == len(first) + len(answer) - 1
    fresh = _engine(m, n_parallel=1, n_ctx=96)
    try:
        assert _run(fresh[0], [first + answer + more], 8)[0][0] == got
    finally:
        _stop(*fresh)
