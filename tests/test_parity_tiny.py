"""frink against transformers and llama.cpp on tiny random models of every architecture.

Why: the references come from third parties running the same weights (see
scripts/make_tiny_models.py), so these tests catch a misread layout, a dropped decoration
(bias, QK norm, post norm, sliding window, second rope theta) or a wrong transform in the
safetensors path. transformers and llama.cpp agree with each other to ~1e-5 on these
models; 2e-3 leaves room for summation order, not for a missing feature (the weights are
drawn wide enough that a dropped feature moves logits by O(0.1) or more).

Each frink result is computed once per (model, source, step) and shared between tests.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import frink_cli

# Against an external reference: generous for f32 summation-order noise.
REF_TOL = 2e-3
# frink against itself (decode path vs batched, GGUF vs HF dir of the same weights): the
# same arithmetic on the same numbers, so only reduction-order noise is allowed.
SELF_TOL = 1e-4

SOURCES = ("gguf", "hf")
REFERENCES = ("llamacpp", "hf")


def _compare(actual: np.ndarray, expected: np.ndarray, tol: float, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)), f"{what}: non-finite logits"
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    pos, tok = np.unravel_index(int(np.argmax(diff)), diff.shape)
    worst = float(diff[pos, tok])
    assert worst <= tol, (
        f"{what}: max |d| = {worst:.3g} > {tol:g} at position {pos}, token {tok} "
        f"(got {actual[pos, tok]:.6f}, want {expected[pos, tok]:.6f}); "
        f"first position over tol: {int(np.nonzero((diff > tol).any(axis=1))[0][0])}"
    )
    got, want = actual.argmax(axis=-1), expected.argmax(axis=-1)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"{what}: argmax differs at positions {bad.tolist()}"


@pytest.fixture(scope="module")
def frink_logits(tiny_model: Callable) -> Callable[[str, str, bool], np.ndarray]:
    """frink_logits(name, source, step) -> [T, vocab] logits of frink on the fixture tokens."""
    cache: dict[tuple[str, str, bool], np.ndarray] = {}
    models: dict[tuple[str, str], object] = {}

    def get(name: str, source: str, step: bool = False) -> np.ndarray:
        key = (name, source, step)
        if key not in cache:
            tm = tiny_model(name)
            if source == "gguf" and tm.gguf is None:
                pytest.skip(f"{name}: llama.cpp's converter made no text GGUF of it")
            if (name, source) not in models:
                path = tm.gguf if source == "gguf" else tm.hf_dir
                models[(name, source)] = frink_cli.load(path)
            tokens = [int(t) for t in tm.ref["tokens"]]
            out = models[(name, source)].logits(tokens, step=step)  # type: ignore[attr-defined]
            cache[key] = np.asarray(out, dtype=np.float32)
        return cache[key]

    return get


def test_references_agree(tiny_name: str, tiny_model: Callable) -> None:
    """The two references agree with each other, else neither can judge frink."""
    tm = tiny_model(tiny_name)
    if "logits_llamacpp" not in tm.ref:
        pytest.skip(f"{tiny_name}: no llama.cpp reference (no text GGUF)")
    _compare(tm.ref["logits_llamacpp"], tm.ref["logits_hf"], REF_TOL, "llama.cpp vs transformers")


@pytest.mark.parametrize("reference", REFERENCES)
@pytest.mark.parametrize("source", SOURCES)
def test_logits_match_reference(
    tiny_name: str, source: str, reference: str, tiny_model: Callable, frink_logits: Callable
) -> None:
    tm = tiny_model(tiny_name)
    key = f"logits_{reference}"
    if key not in tm.ref:
        pytest.skip(f"{tiny_name}: no {reference} reference")
    got = frink_logits(tiny_name, source)
    _compare(got, tm.ref[key], REF_TOL, f"frink({source}) vs {reference}")


@pytest.mark.parametrize("source", SOURCES)
def test_step_equals_batched(tiny_name: str, source: str, frink_logits: Callable) -> None:
    """The decode path (one token at a time through the cache) is the same model."""
    batched = frink_logits(tiny_name, source, step=False)
    stepped = frink_logits(tiny_name, source, step=True)
    _compare(stepped, batched, SELF_TOL, f"frink({source}) step vs batched")


def test_gguf_and_hf_dir_agree(tiny_name: str, frink_logits: Callable) -> None:
    """Both formats land in one canonical form, so the same weights give the same logits."""
    _compare(
        frink_logits(tiny_name, "hf"),
        frink_logits(tiny_name, "gguf"),
        SELF_TOL,
        "frink(hf dir) vs frink(gguf)",
    )
