"""Every architecture's tiny fixtures through the same checks, driven by tests/conformance_table.py.

Why: frink's numbers are trusted only where they match someone else's. The references come
from third parties running the same weights (scripts/make_tiny_models.py): transformers and
llama.cpp agree with each other to ~1e-5 on these models, and the weights are drawn wide
enough that a dropped feature moves the logits by O(0.1). So 2e-3 against a reference
leaves room for summation order, not for a missing decoration; frink against itself
(stepped vs batched, GGUF vs HF dir) allows only reduction-order noise (1e-4).

The checks, per table entry: the references agree; frink from the GGUF and from the HF dir,
batched and stepped, matches both; llama.cpp's greedy run is reproduced; the HF reader gives
the converter's tensors and metadata; metal takes every layer, submits once per decode token
and hands back the host body's state; cuda (NumPy standing in for CuPy, and the kernels on
the CPU emulator of tests/cuda_emulator.py) runs or refuses with the stated reason; a cache
holding recurrent state refuses truncation and survives a failed step, any other truncates;
each listed decoration switched off moves the logits far from both references. A model is
loaded once per (fixture, source, backend) and its logits computed once per run kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest
from conformance_table import TABLE, TINY_SPECS, Arch, Off, switched_off
from conftest import CACHE_TYPE_ENV, TINY_MODEL_NAMES
from model_checks import (
    FAR,
    REF_TOL,
    REFERENCES,
    SELF_TOL,
    SOURCES,
    _against_references,
    _assert_greedy_matches_llamacpp,
    _assert_one_submission_per_token,
    _compare,
    _decode_after_prefill,
    _max_diff,
    _path,
    cuda_models,
    prefill_prefix_decode,
)
from script_loader import load_script

import frink_cli
from frink_cli.archs import open_checkpoint
from frink_cli.backends.cupy.eligibility import layer_reasons
from frink_cli.backends.cupy.ops import KernelOps
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError

STEPS = pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
ALL_SOURCES = pytest.mark.parametrize("source", SOURCES)


def _cases(pick: Callable[[Arch], tuple[str, ...]]) -> list[Any]:
    """pytest params (entry, fixture) for the fixtures pick(entry) lists, id'd by fixture."""
    return [pytest.param(a, f, id=f) for a in TABLE for f in pick(a)]


def _metal(a: Arch) -> tuple[str, ...]:
    return a.metal.fixtures if a.metal else ()


def _converter(a: Arch) -> tuple[str, ...]:
    if a.converter is None:
        return ()
    return a.converter.fixtures or a.fixtures


EVERY = _cases(lambda a: a.fixtures)
GREEDY = [
    pytest.param(a, f, s, id=f"{f}-{s}")
    for a in TABLE
    for f in a.greedy_fixtures()
    for s in a.greedy_sources
]
CONVERTED = _cases(_converter)
METAL = _cases(_metal)
METAL_DECODE = _cases(lambda a: a.metal.decode if a.metal else ())
METAL_PER_TOKEN = _cases(lambda a: a.metal.per_token if a.metal else ())
METAL_STATE = _cases(lambda a: a.metal.state_fixtures if a.metal else ())
CUDA = _cases(lambda a: a.cuda.fixtures if a.cuda else ())
CUDA_EMULATED = _cases(lambda a: a.cuda.emulated if a.cuda else ())
CUDA_STACK = _cases(lambda a: a.cuda.stack if a.cuda else ())
FIRST = _cases(lambda a: a.fixtures[:1])
RECURRENT = _cases(lambda a: a.fixtures[:1] if a.refuses_truncation else ())
DECORATIONS = [
    pytest.param(a, off, id=f"{off.fixture}-{off.name}") for a in TABLE for off in a.decorations
]


_NO_LOGITS = np.empty(0, np.float32)


class Run(NamedTuple):
    """One run's logits over the fixture tokens and what the backend's ledger recorded."""

    logits: np.ndarray
    total: int
    submissions: dict[str, int]
    refusals: dict[str, Any]
    failures: dict[str, Any]


@pytest.fixture(scope="module")
def loaded(tiny_model: Callable) -> Callable[[str, str, str], frink_cli.Model]:
    """loaded(fixture, source, backend) -> the model, loaded once per module."""
    models: dict[tuple[str, str, str], frink_cli.Model] = {}

    def get(name: str, source: str, backend: str) -> frink_cli.Model:
        key = (name, source, backend)
        if key not in models:
            path = _path(tiny_model, name, source)
            if backend == "numpy":
                models[key] = frink_cli.load(path)
            else:
                if backend == "metal":
                    pytest.importorskip("mlx.core")
                with pytest.MonkeyPatch.context() as mp:
                    mp.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
                    models[key] = frink_cli.load(path, backend=backend)
                assert models[key].backend_name == backend
        return models[key]

    return get


@pytest.fixture(scope="module")
def run(tiny_model: Callable, loaded: Callable) -> Callable[..., Run]:
    """run(fixture, source, backend, step) -> Run over the fixture tokens, computed once."""
    runs: dict[tuple[str, str, str, bool], Run] = {}

    def get(name: str, source: str, backend: str = "numpy", step: bool = False) -> Run:
        key = (name, source, backend, step)
        if key not in runs:
            m = loaded(name, source, backend)
            ledger = m.decoder.backend.ledger if backend != "numpy" else None
            if ledger is not None:
                ledger.reset()
            tokens = [int(t) for t in tiny_model(name).ref["tokens"]]
            got = np.asarray(m.logits(tokens, step=step), dtype=np.float32)
            runs[key] = _recorded(ledger, got)
        return runs[key]

    return get


def _recorded(ledger: Any, logits: np.ndarray = _NO_LOGITS) -> Run:
    """The run's logits with what the ledger (None: the host body's, nothing) recorded."""
    if ledger is None:
        return Run(logits, 0, {}, {}, {})
    subs, refusals, failures = (
        dict(ledger.submissions),
        dict(ledger.refusals),
        dict(ledger.failures),
    )
    return Run(logits, ledger.total(), subs, refusals, failures)


def _assert_ran_everything(r: Run, what: str) -> None:
    assert r.total > 0, f"{what}: the device ran nothing ({r.refusals})"
    assert not r.failures, f"{what}: launches failed: {r.failures}"
    assert not r.refusals, f"{what}: layers refused: {r.refusals}"


# --- the table itself -----------------------------------------------------------------------------


def test_every_fixture_is_in_exactly_one_entry() -> None:
    listed = [f for a in TABLE for f in (*a.fixtures, *a.transformers_only)]
    assert sorted(listed) == sorted(TINY_MODEL_NAMES)
    assert len({a.arch for a in TABLE}) == len(TABLE)


# --- the references, and frink on the host body against them --------------------------------------


@pytest.mark.parametrize(("entry", "name"), EVERY)
def test_references_agree(entry: Arch, name: str, tiny_model: Callable) -> None:
    """transformers and llama.cpp compute the same model (else neither can judge frink);
    the greedy run and the sequence are as long as the entry needs."""
    ref = tiny_model(name).ref
    assert "logits_llamacpp" in ref, f"{name}: llama.cpp's converter made no GGUF"
    _compare(ref["logits_llamacpp"], ref["logits_hf"], REF_TOL, "llama.cpp vs transformers")
    assert len(ref["tokens"]) >= entry.tokens_min
    if name in entry.greedy_fixtures():
        steps = ref["greedy_llamacpp"].shape[0]
        assert ref["greedy_logits_llamacpp"].shape[0] == steps == TINY_SPECS[name].greedy
        assert steps >= entry.greedy_min
        assert len(ref["greedy_prompt"]) >= entry.greedy_prompt_min


@STEPS
@ALL_SOURCES
@pytest.mark.parametrize(("entry", "name"), EVERY)
def test_numpy_matches_references(
    entry: Arch,
    name: str,
    source: str,
    step: bool,
    tiny_model: Callable,
    loaded: Callable,
    run: Callable,
) -> None:
    got = run(name, source, step=step).logits
    if entry.past_window:
        assert got.shape[0] > 6 * loaded(name, source, "numpy").config.sliding_window
    _against_references(got, tiny_model(name).ref, f"{name} numpy({source}, {step=})")


GGML_F16 = 1  # ggml_type GGML_TYPE_F16, as llama.cpp's context takes its type_k / type_v


@pytest.mark.parametrize(("entry", "name"), EVERY)
def test_default_f16_cache_matches_llamacpps(
    entry: Arch, name: str, tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache a user gets by default (f16 K/V rows, llama.cpp's default too): frink's
    logits from the GGUF against llama.cpp's with f16 caches, on the fixture's tokens. Both
    round the same rows; llama.cpp's attention then computes with them in its own order, so
    the bar is twice what f16 moves llama.cpp's own logits from its f32 cache (at least
    REF_TOL), and the argmax agrees wherever llama.cpp's top two are further apart than
    that bar."""
    gguf = _path(tiny_model, name, "gguf")
    ref = tiny_model(name).ref
    for env in CACHE_TYPE_ENV:
        monkeypatch.delenv(env)
    m = frink_cli.load(gguf)
    assert m.decoder.cache_types.k == "f16", m.decoder.cache_types
    tokens = [int(t) for t in ref["tokens"]]
    got = np.asarray(m.logits(tokens), dtype=np.float64)
    want = load_script("make_tiny_models").llama_cpp_logits(
        gguf, np.asarray(tokens), cache_type=GGML_F16
    )
    want = want.astype(np.float64)
    bar = max(REF_TOL, 2 * _max_diff(want, ref["logits_llamacpp"]))
    diff = _max_diff(got, want)
    assert diff <= bar, f"{name}: f16 caches: max |d| vs llama.cpp's = {diff:.3g} > {bar:.3g}"
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > bar
    flips = np.nonzero(clear & (got.argmax(-1) != want.argmax(-1)))[0]
    assert flips.size == 0, f"{name}: f16 caches: argmax differs at positions {flips.tolist()}"


@ALL_SOURCES
@pytest.mark.parametrize(("entry", "name"), EVERY)
def test_step_equals_batched(entry: Arch, name: str, source: str, run: Callable) -> None:
    """The decode path (one token at a time through the cache) is the same model."""
    stepped, batched = run(name, source, step=True), run(name, source, step=False)
    _compare(stepped.logits, batched.logits, SELF_TOL, f"{name}({source}) step vs batched")


@pytest.mark.parametrize(("entry", "name"), EVERY)
def test_gguf_and_hf_dir_agree(entry: Arch, name: str, run: Callable) -> None:
    """Both formats land in one canonical form, so the same weights give the same logits."""
    hf, gguf = run(name, "hf").logits, run(name, "gguf").logits
    _compare(hf, gguf, SELF_TOL, f"{name}: frink(hf dir) vs frink(gguf)")


@pytest.mark.parametrize(("entry", "name", "source"), GREEDY)
def test_numpy_greedy_matches_llamacpp(
    entry: Arch, name: str, source: str, tiny_model: Callable, loaded: Callable
) -> None:
    """llama.cpp's decode steps after a batched prefill, and its greedy tokens."""
    m = loaded(name, source, "numpy")
    _assert_greedy_matches_llamacpp(
        m,
        tiny_model(name).ref,
        f"{name}({source}) decode",
        min_steps=entry.greedy_min,
        min_prompt=entry.greedy_prompt_min,
    )


# --- the HF reader against llama.cpp's converter --------------------------------------------------


@pytest.mark.parametrize(("entry", "name"), CONVERTED)
def test_hf_dir_tensors_equal_the_converters(entry: Arch, name: str, tiny_model: Callable) -> None:
    """Every canonical tensor read from the HF dir is the one the converter wrote: same
    names, shapes and values (within the entry's allowances)."""
    conv = entry.converter
    assert conv is not None
    hf = open_checkpoint(_path(tiny_model, name, "hf"))
    gg = open_checkpoint(_path(tiny_model, name, "gguf"))
    assert sorted(hf.tensors.names()) == sorted(gg.tensors.names())
    for n in gg.tensors.names():
        a, b = hf.tensors.load(n), gg.tensors.load(n)
        assert a.shape == b.shape, n
        if n.endswith(conv.ulp_suffixes):
            np.testing.assert_allclose(a, b, rtol=2.5e-7, atol=0, err_msg=n)
        elif conv.rel_tol:
            assert np.array_equal(a, b) or np.abs(a - b).max() <= conv.rel_tol * max(
                1.0, np.abs(b).max()
            ), n
        else:
            assert np.array_equal(a, b), n


@pytest.mark.parametrize(("entry", "name"), CONVERTED)
def test_hf_dir_metadata_matches_the_converters(
    entry: Arch, name: str, tiny_model: Callable
) -> None:
    conv = entry.converter
    assert conv is not None
    hf = open_checkpoint(_path(tiny_model, name, "hf")).metadata
    gg = open_checkpoint(_path(tiny_model, name, "gguf")).metadata
    assert hf["general.architecture"] == gg["general.architecture"] == entry.arch
    prefix = f"{entry.arch}."
    keys = [prefix + k for k in conv.only_keys] or [k for k in gg if k.startswith(prefix)]
    for key in keys:
        if key.endswith(conv.skip_suffixes):
            continue
        assert key in hf, f"{key} missing from the HF dir's metadata"
        want = gg[key]
        if isinstance(want, float):
            assert hf[key] == pytest.approx(want), key
        else:
            assert list(np.atleast_1d(hf[key])) == list(np.atleast_1d(want)), key


# --- metal (MLX; its CPU device on Linux) ---------------------------------------------------------


@STEPS
@ALL_SOURCES
@pytest.mark.parametrize(("entry", "name"), METAL)
def test_metal_matches_references(
    entry: Arch, name: str, source: str, step: bool, tiny_model: Callable, run: Callable
) -> None:
    """Both references, with the device having run every layer (and, where the entry says,
    only the submission kinds it lists, one per prefill chunk or decode token)."""
    assert entry.metal is not None
    r = run(name, source, "metal", step)
    _against_references(r.logits, tiny_model(name).ref, f"{name} metal({source}, {step=})")
    _assert_ran_everything(r, f"{name} metal")
    if entry.metal.kinds:
        assert set(r.submissions) == entry.metal.kinds
    if entry.metal.chunked:
        n = len(tiny_model(name).ref["tokens"])
        assert r.total == (n if step else -(-n // 64))


@pytest.mark.parametrize(("entry", "name"), METAL_DECODE)
def test_metal_decode_after_prefill_matches_llamacpp(
    entry: Arch, name: str, tiny_model: Callable, loaded: Callable
) -> None:
    """llama.cpp's decode steps after a batched prefill (and, `generate`, its greedy tokens)."""
    assert entry.metal is not None
    ref = tiny_model(name).ref
    m = loaded(name, "gguf", "metal")
    ledger = m.decoder.backend.ledger
    ledger.reset()
    if entry.metal.generate:
        _assert_greedy_matches_llamacpp(
            m, ref, f"{name} metal decode", min_prompt=entry.greedy_prompt_min
        )
    else:
        got = _decode_after_prefill(m, ref)
        _compare(got, ref["greedy_logits_llamacpp"], REF_TOL, f"{name} metal decode")
    _assert_ran_everything(_recorded(ledger), f"{name} metal")


@pytest.mark.parametrize(("entry", "name"), METAL_PER_TOKEN)
def test_metal_one_submission_per_token(entry: Arch, name: str, loaded: Callable) -> None:
    m = loaded(name, "gguf", "metal")
    m.decoder.backend.ledger.reset()
    _assert_one_submission_per_token(m)


@pytest.mark.parametrize(("entry", "name"), METAL_STATE)
def test_metal_state_equals_the_host_bodys(
    entry: Arch, name: str, tiny_model: Callable, loaded: Callable
) -> None:
    """After a prompt (past metal's 64-row chunk where the run is long) and decode steps,
    the state the device hands back to the host cache at commit is the host body's, and so
    are the last logits."""
    metal = entry.metal
    assert metal is not None
    n, split, n_ctx = metal.state_run
    tokens = [int(t) for t in tiny_model(name).ref["tokens"][:n]]
    dev = loaded(name, "gguf", "metal")
    dev.decoder.backend.ledger.reset()
    caches, last = [], []
    for m in (loaded(name, "gguf", "numpy"), dev):
        cache = m.decoder.new_cache(n_ctx)
        out = m.decoder.step(np.asarray(tokens[:split]), cache)
        for t in tokens[split:]:
            out = m.decoder.step(np.asarray([t]), cache)
        caches.append(cache)
        last.append(out)
    for field in metal.state:
        host, device = getattr(caches[0], field), getattr(caches[1], field)
        assert [a is None for a in host] == [b is None for b in device], field
        held = [a is not None for a in host]
        assert all(held) if metal.state_in_every_layer else any(held), field
        for a, b in zip(host, device):
            if a is not None:
                assert a.shape == b.shape, field
                # Reduction-order noise: a state sums every token's update, in another order
                # on each side (the host token by token, the device by blocks of a prompt).
                np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-5, err_msg=field)
    assert _max_diff(last[0], last[1]) <= SELF_TOL
    _assert_ran_everything(_recorded(dev.decoder.backend.ledger), f"{name} metal")


# --- cuda: NumPy standing in for CuPy -------------------------------------------------------------


@STEPS
@pytest.mark.parametrize(("entry", "name"), CUDA)
def test_cuda_standing_in_matches_references(
    entry: Arch, name: str, step: bool, tiny_model: Callable, loaded: Callable, run: Callable
) -> None:
    """`load(path, backend="cuda")`: both references; every layer on the stack, or every
    refusal for the entry's stated reason (the host body ran those layers), or every layer
    refused by that reason and nothing run on the device."""
    assert entry.cuda is not None
    r = run(name, "gguf", "cuda", step)
    _against_references(r.logits, tiny_model(name).ref, f"{name} cuda-numpy({step=})")
    if entry.cuda.every_layer:
        cfg = loaded(name, "gguf", "cuda").config
        for i in range(cfg.n_layer):
            assert entry.cuda.every_layer in layer_reasons(cfg, i), i
        assert r.total == 0 and not r.failures, (r.submissions, r.failures)
    elif entry.cuda.refused is None:
        _assert_ran_everything(r, f"{name} cuda-numpy")
    else:
        assert not r.failures, r.failures
        assert set(r.refusals) == {entry.cuda.refused}, r.refusals


def _assert_stack_equals_host(
    host: frink_cli.Model, dev: frink_cli.Model, tokens: list[int], split: int
) -> np.ndarray:
    """The cuda stack's logits over a prefill, a prefill over the cached prefix and four
    decode steps are the host body's, each run one submission with the lm head in it."""
    want = prefill_prefix_decode(host, tokens, split=split)
    got = prefill_prefix_decode(dev, tokens, split=split)
    assert _max_diff(got, want) <= SELF_TOL
    ledger = dev.decoder.backend.ledger
    assert ledger.submissions == {"prefill-stack+lm-head": 2, "decode-stack+lm-head": 4}
    assert not ledger.refusals and not ledger.failures
    return got


@pytest.mark.parametrize(("entry", "name"), CUDA_STACK)
def test_cuda_numpy_stack_equals_host_body(entry: Arch, name: str, tiny_model: Callable) -> None:
    host, dev = cuda_models(_path(tiny_model, name, "gguf"))
    _assert_stack_equals_host(host, dev, [int(t) for t in tiny_model(name).ref["tokens"]], 17)


@pytest.mark.parametrize(("entry", "name"), CUDA_EMULATED)
def test_cuda_emulated_kernel_stack_equals_host_body(
    entry: Arch, name: str, tiny_model: Callable, emulated_launcher: Any
) -> None:
    """kernels/*.cu on the CPU emulator: the host body's logits, and (its rows being the
    fixture tokens' first positions, in order) both references'."""
    assert entry.cuda is not None
    n, split = entry.cuda.emulated_run
    host, dev = cuda_models(
        _path(tiny_model, name, "gguf"), lambda: KernelOps(np, emulated_launcher)
    )
    ref = tiny_model(name).ref
    n = n or len(ref["tokens"])
    got = _assert_stack_equals_host(host, dev, [int(t) for t in ref["tokens"][:n]], split)
    _against_references(got, {k: ref[k][:n] for k in REFERENCES}, f"{name} emulated")


# --- the cache: truncation ------------------------------------------------------------------------


@pytest.mark.parametrize(("entry", "name"), FIRST)
def test_truncation_is_refused_or_works(
    entry: Arch, name: str, tiny_model: Callable, loaded: Callable
) -> None:
    """A cache holding recurrent state refuses to roll back (before anything changed),
    truncates to where it is and back to the start (the state zero again, as in a new
    context); a cache without truncates anywhere."""
    m = loaded(name, "gguf", "numpy")
    if not entry.refuses_truncation:
        cache = m.decoder.new_cache(16)
        m.decoder.step(np.arange(6), cache)  # within any sliding window: nothing evicted
        assert not cache.has_recurrent_state
        cache.truncate(3)
        assert cache.n_past == 3
        return
    tokens = np.asarray(tiny_model(name).ref["tokens"][:12])
    cache = m.decoder.new_cache(32)
    first = m.decoder.step(tokens, cache)
    assert cache.has_recurrent_state
    with pytest.raises(FrinkError, match=entry.refuses_truncation):
        cache.truncate(len(tokens) - 1)
    assert cache.n_past == len(tokens)
    cache.truncate(len(tokens))
    cache.truncate(0)
    assert all(not s.any() for s in cache.delta_state if s is not None)
    assert all(not s.any() for s in cache.conv_state if s is not None)
    np.testing.assert_array_equal(m.decoder.step(tokens, cache), first)


@pytest.mark.parametrize(("entry", "name"), RECURRENT)
def test_a_failed_step_leaves_the_recurrent_state_untouched(
    entry: Arch, name: str, tiny_model: Callable, loaded: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New state is staged and committed only with the step: a step that dies in the last
    layer, after the others ran, leaves every layer's conv tail and recurrent state as they
    were, and the step then runs as if it had never been tried."""
    m = loaded(name, "gguf", "numpy")
    tokens = [int(t) for t in tiny_model(name).ref["tokens"][:10]]
    clean = m.decoder.new_cache(32)
    m.decoder.step(np.asarray(tokens[:8]), clean)
    want = m.decoder.step(np.asarray(tokens[8:]), clean)

    cache = m.decoder.new_cache(32)
    m.decoder.step(np.asarray(tokens[:8]), cache)
    states = (cache.conv_state, cache.delta_state)
    before = [[None if s is None else s.copy() for s in kind] for kind in states]
    host = m.decoder.host
    real_layer = host.layer

    def failing(layer, *args, **kwargs):  # type: ignore[no-untyped-def]
        if layer == m.config.n_layer - 1:
            raise RuntimeError("simulated failure in the last layer")
        return real_layer(layer, *args, **kwargs)

    monkeypatch.setattr(host, "layer", failing)
    with pytest.raises(RuntimeError):
        m.decoder.step(np.asarray(tokens[8:]), cache)
    monkeypatch.setattr(host, "layer", real_layer)
    for was, now in zip(before, (cache.conv_state, cache.delta_state)):
        for s0, s1 in zip(was, now):
            assert (s0 is None and s1 is None) or np.array_equal(s0, s1)
    assert cache.n_past == 8
    np.testing.assert_array_equal(m.decoder.step(np.asarray(tokens[8:]), cache), want)


# --- every listed decoration matters --------------------------------------------------------------


@pytest.mark.parametrize(("entry", "off"), DECORATIONS)
def test_each_decoration_moves_the_logits(
    entry: Arch, off: Off, tiny_model: Callable, loaded: Callable
) -> None:
    """The graph honours each decoration: switched off (or replaced by its neighbour), the
    logits land far from both references, so parity cannot pass without it."""
    m = loaded(off.fixture, "gguf", "numpy")
    dec = Decoder(*switched_off(m.config, m.decoder.host.w, off))
    ref = tiny_model(off.fixture).ref
    tokens = np.asarray(ref["tokens"])
    got = dec.step(tokens, dec.new_cache(len(tokens)), all_logits=True)
    for key in REFERENCES:
        assert _max_diff(got, ref[key]) > FAR, f"{off.name} still matches {key}"
