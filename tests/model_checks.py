"""Checks every tiny-model test file runs the same way: paths to a fixture's GGUF or HF
directory, logits against the transformers and llama.cpp references, "the device ran", one
submission per decode token, the cuda stand-in models, replayed decode steps.

Written once here (they were born in test_granite.py), so a model's tests cannot drift
from another's in how they judge parity. Tests import these; scripts never do.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import fixture_cache_root
from llama_quantize import quantized_with_references
from script_loader import load_script

import frink_cli
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError
from frink_cli.model.config import ModelConfig

SOURCES = ("gguf", "hf")
REFERENCES = ("logits_hf", "logits_llamacpp")
# Against an external reference (as test_conformance.py).
REF_TOL = 2e-3
# frink against itself (a backend against the host body).
SELF_TOL = 1e-4
# A decoration that matters moves the logits by at least this much (50x the parity bar).
FAR = 0.1


def configured(cfg: ModelConfig, **changes: Any) -> ModelConfig:
    """cfg with fields changed, each where it lives: the core's on ModelConfig, the rest
    on its architecture config (a decoration switched off, a block config replaced)."""
    core = {f.name for f in dataclasses.fields(ModelConfig)}
    ext = {k: v for k, v in changes.items() if k not in core}
    if ext:
        changes = {k: v for k, v in changes.items() if k in core}
        changes["ext"] = dataclasses.replace(cfg.ext, **ext)
    return dataclasses.replace(cfg, **changes)


def _path(tiny_model: Callable, name: str, source: str) -> Path:
    tm = tiny_model(name)
    path = tm.gguf if source == "gguf" else tm.hf_dir
    if path is None:
        pytest.skip(f"{name}: llama.cpp's converter made no GGUF of it")
    return path


def _compare(actual: np.ndarray, expected: np.ndarray, tol: float, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)), f"{what}: non-finite logits"
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    pos, tok = np.unravel_index(int(np.argmax(diff)), diff.shape)
    assert diff[pos, tok] <= tol, (
        f"{what}: max |d| = {diff[pos, tok]:.3g} > {tol:g} at position {pos}, token {tok} "
        f"(got {actual[pos, tok]:.6f}, want {expected[pos, tok]:.6f})"
    )
    bad = np.nonzero(actual.argmax(-1) != expected.argmax(-1))[0]
    assert bad.size == 0, f"{what}: argmax differs at positions {bad.tolist()}"


def _against_references(got: np.ndarray, ref: dict[str, np.ndarray], what: str) -> None:
    for key in REFERENCES:
        _compare(got, ref[key], REF_TOL, f"{what} vs {key.removeprefix('logits_')}")


def _tokens(tiny_model: Callable, name: str) -> list[int]:
    return [int(t) for t in tiny_model(name).ref["tokens"]]


def _decode_after_prefill(model: frink_cli.Model, ref: dict[str, np.ndarray]) -> np.ndarray:
    """llama.cpp's greedy run replayed: the prompt as one batch, then its chosen tokens one
    at a time; the logits each of its choices was made from."""
    prompt = [int(t) for t in ref["greedy_prompt"]]
    chosen = ref["greedy_llamacpp"].tolist()
    dec = model.decoder
    cache = dec.new_cache(len(prompt) + len(chosen))
    got = [dec.step(np.asarray(prompt), cache)[-1]]
    for t in chosen[:-1]:
        got.append(dec.step(np.asarray([t]), cache)[-1])
    return np.stack(got)


# The recurrent prefill chunk (the host scan's and metal's): a recurrent model's greedy
# prompt is longer, so its decode starts from a state carried across a chunk boundary.
PREFILL_CHUNK = 64


def _assert_greedy_matches_llamacpp(
    model: frink_cli.Model,
    ref: dict[str, np.ndarray],
    what: str,
    min_steps: int = 1,
    min_prompt: int = 1,
) -> None:
    """llama.cpp's greedy run, checked twice: the logits each of its choices was made from
    (the prompt as one batch, then its tokens one decode step at a time), and frink's own
    greedy generation from the same prompt, token for token."""
    _compare(_decode_after_prefill(model, ref), ref["greedy_logits_llamacpp"], REF_TOL, what)
    prompt = [int(t) for t in ref["greedy_prompt"]]
    want = ref["greedy_llamacpp"].tolist()
    assert len(want) >= min_steps, f"{what}: the reference has {len(want)} greedy steps"
    assert len(prompt) >= min_prompt, f"{what}: the greedy prompt has {len(prompt)} tokens"
    assert list(model.generate_ids(prompt, max_tokens=len(want), temperature=0.0)) == want


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def _assert_device_ran(model: frink_cli.Model, what: str) -> None:
    ledger = model.decoder.backend.ledger
    assert ledger.total() > 0, f"{what}: the device ran nothing ({dict(ledger.refusals)})"
    assert not ledger.failures, f"{what}: launches failed: {dict(ledger.failures)}"
    assert not ledger.refusals, f"{what}: layers refused: {dict(ledger.refusals)}"


def _assert_one_submission_per_token(model: frink_cli.Model) -> None:
    """A prompt is one submission and each decode token one more, with nothing refused or
    failed (a backend that carries every layer and the head)."""
    ledger = model.decoder.backend.ledger
    cache = model.decoder.new_cache(32)
    model.decoder.step(np.arange(1, 9), cache)
    assert ledger.total() == 1, dict(ledger.submissions)
    for t in range(6):
        ledger.reset()
        model.decoder.step(np.asarray([t + 3]), cache)
        assert ledger.total() == 1, dict(ledger.submissions)
    assert not ledger.refusals and not ledger.failures


def cuda_models(
    path: Path, ops_factory: Callable[[], object] | None = None
) -> tuple[frink_cli.Model, frink_cli.Model]:
    """(host-only model, cuda-backend model with NumPy arrays) over the same file; the
    backend's ops from ops_factory (default: the NumPy references)."""
    from frink_cli.backends.cupy import make_cuda_backend

    host = frink_cli.load(path, backend="numpy")
    dev = frink_cli.load(path, backend="numpy")
    backend = make_cuda_backend(dev.config, array_module="numpy")
    if ops_factory is not None:
        backend.ops = ops_factory()
    dev.decoder = Decoder(dev.config, dev.decoder.host.w, backend)
    dev.backend_name = backend.name
    return host, dev


def prefill_prefix_decode(
    model: frink_cli.Model, tokens: list[int], split: int, n_decode: int = 4
) -> np.ndarray:
    """Logits of a prefill of tokens[:split], a second prefill over that cached prefix, then
    n_decode single-token steps -- every row of every step."""
    dec = model.decoder
    cache = dec.new_cache(len(tokens) + 8)
    second = len(tokens) - n_decode
    out = [dec.step(np.asarray(tokens[:split]), cache, all_logits=True)]
    out.append(dec.step(np.asarray(tokens[split:second]), cache, all_logits=True))
    for t in tokens[second:]:
        out.append(dec.step(np.asarray([t]), cache))
    return np.concatenate(out)


_Q8_0 = 8  # ggml's Q8_0 type


def q8_0_requant(tiny_model: Callable, name: str) -> tuple[Path, dict[str, np.ndarray]]:
    """(the fixture quantized to Q8_0 by llama.cpp, llama.cpp's logits over the fixture
    tokens on it ("quantized") and on its own F32 requant of it ("f32")), cached beside the
    tiny models and rebuilt when the fixture changes."""
    make_tiny = load_script("make_tiny_models")
    path, _, ref = quantized_with_references(
        _path(tiny_model, name, "gguf"),
        fixture_cache_root() / "quant" / f"{name}.q8_0",
        "Q8_0",
        _Q8_0,
        False,
        tiny_model(name).ref["tokens"],
        make_tiny.llama_cpp_logits,
    )
    return path, ref


def _last_logits(
    model: frink_cli.Model, tokens: list[int], n_ctx: int, step: bool
) -> tuple[np.ndarray, Any]:
    """(the last row's logits of `tokens` run as one batch, or one token at a time with
    `step`, through a new cache of n_ctx rows; that cache)."""
    cache = model.decoder.new_cache(n_ctx)
    if step:
        for tok in tokens:
            last = model.decoder.step(np.asarray([tok]), cache)[-1]
    else:
        last = model.decoder.step(np.asarray(tokens), cache)[-1]
    return last, cache


def _split_against_stepped(
    model: frink_cli.Model, tokens: list[int], cuts: tuple[int, ...], n_ctx: int = 0
) -> tuple[np.ndarray, np.ndarray, Any, Any]:
    """(logits of `tokens` prefilled in parts cut at `cuts`, the rest one token at a time;
    logits of the same tokens stepped one at a time; the split run's cache; the stepped
    run's cache), both caches `n_ctx` rows (default: the tokens)."""
    dec = model.decoder
    n_ctx = n_ctx or len(tokens)
    stepped = dec.new_cache(n_ctx)
    want = np.concatenate([dec.step(np.asarray([t]), stepped) for t in tokens])
    split = dec.new_cache(n_ctx)
    bounds = (0, *cuts)
    parts = [
        dec.step(np.asarray(tokens[a:b]), split, all_logits=True)
        for a, b in zip(bounds, bounds[1:])
    ]
    parts += [dec.step(np.asarray([t]), split) for t in tokens[cuts[-1] :]]
    return np.concatenate(parts), want, split, stepped


def assert_split_states_equal_stepped(
    model: frink_cli.Model, tokens: list[int], layers: Any, cuts: tuple[int, ...] = (13, 75)
) -> tuple[Any, Any]:
    """A prefill split at `cuts` (across the 64-token chunk boundary), then decode rows, gives
    the logits and the recurrent states of `layers` that the same tokens stepped give; the
    states are not trivially zero. Returns (split cache, stepped cache)."""
    got, want, split, stepped = _split_against_stepped(model, tokens, cuts, 96)
    assert _max_diff(got, want) <= 1e-4
    for i in layers:
        a, b = split.delta_state[i], stepped.delta_state[i]
        assert a is not None and b is not None and np.abs(a).max() > 1e-2
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    return split, stepped


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [n, dim] arrays, in float64 (embeddings against
    their reference)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(1) / np.linalg.norm(a64, axis=1) / np.linalg.norm(b64, axis=1)


def assert_refused_by_name(
    tmp_path: Path, good: bytes, cases: dict[str, tuple[bytes, str]], limit: int = 64 * 2**20
) -> None:
    """The valid file `good` runs; each hostile file of `cases` (name -> (bytes, the name
    the refusal must carry)) is one FrinkError matching that name, refused before `limit`
    bytes are allocated (tracemalloc's peak)."""
    fuzz = load_script("fuzz_inputs")
    path = tmp_path / "good.gguf"
    path.write_bytes(good)
    fuzz._run_model(path)
    for name, (data, why) in cases.items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(data)
        tracemalloc.start()
        try:
            with pytest.raises(FrinkError, match=why):
                frink_cli.load(path)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < limit, (name, peak)
