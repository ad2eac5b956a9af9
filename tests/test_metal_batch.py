"""The metal backend runs a multi-sequence step (Decoder.step_batch) as ONE submission.

Why: a server steps many sequences together so each weight is read once per step for all
of them; that only pays if the device takes the whole step, layers and lm head, in one
mx.eval, instead of leaving it to the host body. Each sequence must still come out as if
it had run alone: its own K/V rows, its own recurrent state, its own positions, on every
kind of mixer (attention, a sliding window, MoE, mamba / mamba2, falcon-h1's parallel
layers, LFM2's short conv, the gated delta net).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from model_checks import REF_TOL, _assert_device_ran, _compare, _path, cuda_models

import frink_cli
from frink_cli.backends.base import MULTI_SEQUENCE

pytest.importorskip("mlx.core")

NAMES = ("llama", "gemma3", "qwen3moe", "granitehybrid", "falcon_h1", "lfm2", "qwen35", "mamba")
# A backend against the host body, over the same weights.
TOL = 2e-4
N_CTX = 96

# Per step, the sequences that take it and how many new rows each feeds (a prompt, then
# one token a step): 0-2 start together with prompts of different lengths, 3 joins late
# with its prompt beside the others' decode rows, 1 leaves early (it goes on alone).
SCHEDULE = [
    {0: 7, 1: 3, 2: 12},
    {0: 1, 1: 1, 2: 1},
    {0: 1, 1: 1, 2: 1, 3: 5},
    {0: 1, 1: 1, 2: 1, 3: 1},
    {0: 1, 2: 1, 3: 1},
    {0: 1, 2: 1, 3: 1},
    {0: 1, 2: 1, 3: 1},
]
# Sequence 1's steps after it left the batch: one on the device alone, one on the host body
# (which reads only the host cache: what the device wrote back).
LEFT = 1


def _models(tiny_model: Callable, name: str) -> tuple[frink_cli.Model, frink_cli.Model]:
    path = _path(tiny_model, name, "gguf")
    dev = frink_cli.load(path, backend="metal")
    assert dev.backend_name == "metal"
    return frink_cli.load(path, backend="numpy"), dev


def _tokens(model: frink_cli.Model, seed: int) -> list[list[int]]:
    """Each sequence's token stream in SCHEDULE's order of feeding, plus two more for
    sequence LEFT's steps after the batch."""
    rng = np.random.default_rng(seed)
    fed: dict[int, list[int]] = {}
    for step in SCHEDULE:
        for s, n in step.items():
            fed.setdefault(s, []).extend(rng.integers(1, model.config.n_vocab, n).tolist())
    fed[LEFT] += rng.integers(1, model.config.n_vocab, 2).tolist()
    return [fed[s] for s in sorted(fed)]


def _alone(host: frink_cli.Model, feeds: list[list[int]]) -> np.ndarray:
    """The logits after each feed of one sequence, run alone through the host body."""
    dec = host.decoder
    cache = dec.new_cache(N_CTX)
    return np.stack([dec.step(np.asarray(ids), cache)[-1] for ids in feeds])


@pytest.mark.parametrize("name", NAMES)
def test_a_batch_matches_each_sequence_alone(name: str, tiny_model: Callable) -> None:
    """Prefill of three prompts in one step, a late joiner's prompt beside decode rows, a
    sequence leaving: every sequence's logits at every step are its own, alone; each batched
    step is one submission with the head in it; nothing is refused."""
    host, dev = _models(tiny_model, name)
    dec, ledger = dev.decoder, dev.decoder.backend.ledger
    tokens = _tokens(dev, seed=1)
    caches = [dec.new_cache(N_CTX) for _ in tokens]
    fed = [0] * len(tokens)
    feeds: list[list[list[int]]] = [[] for _ in tokens]
    got: list[list[np.ndarray]] = [[] for _ in tokens]

    def feed(s: int, n: int) -> np.ndarray:
        ids = tokens[s][fed[s] : fed[s] + n]
        fed[s] += n
        feeds[s].append(ids)
        return np.asarray(ids)

    for i, step in enumerate(SCHEDULE):
        ledger.reset()
        steps = [(feed(s, n), caches[s]) for s, n in step.items()]
        logits = dec.step_batch(steps)
        assert logits.shape == (len(step), dev.config.n_vocab)
        for s, row in zip(step, logits):
            got[s].append(row)
        assert ledger.total() == 1, f"{name} step {i}: {dict(ledger.submissions)}"
        assert all(k.endswith("+batch+lm-head") for k in ledger.submissions), dict(
            ledger.submissions
        )
        assert not ledger.refusals and not ledger.failures, (
            dict(ledger.refusals),
            dict(ledger.failures),
        )
    # Sequence LEFT, out of the batch: a lone device step from the mirrors the batch left,
    # then a host body step from the host cache the batch wrote back.
    got[LEFT].append(dec.step(feed(LEFT, 1), caches[LEFT])[-1])
    got[LEFT].append(host.decoder.step(feed(LEFT, 1), caches[LEFT])[-1])
    _assert_device_ran(dev, f"{name} metal")
    for s in range(len(tokens)):
        _compare(np.stack(got[s]), _alone(host, feeds[s]), TOL, f"{name} sequence {s}")


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_prompt_beside_others_matches_llamacpp(
    name: str, tiny_model: Callable
) -> None:
    """llama.cpp's logits for the fixture's prompt, from a batch in which the prompt is the
    middle sequence: its first rows in a prefill beside two other prompts, then a token a
    step beside the others' decode rows, one submission a step."""
    _, dev = _models(tiny_model, name)
    dec, ledger = dev.decoder, dev.decoder.backend.ledger
    ref = tiny_model(name).ref
    prompt = [int(t) for t in ref["tokens"]]
    rng = np.random.default_rng(2)
    V, first = dev.config.n_vocab, 8
    caches = [dec.new_cache(len(prompt) + 16) for _ in range(3)]
    logits = dec.step_batch(
        [
            (rng.integers(1, V, 5), caches[0]),
            (np.asarray(prompt[:first]), caches[1]),
            (rng.integers(1, V, 11), caches[2]),
        ]
    )
    got = [logits[1]]
    for t in prompt[first:]:
        ledger.reset()
        logits = dec.step_batch(
            [
                (rng.integers(1, V, 1), caches[0]),
                (np.asarray([t]), caches[1]),
                (rng.integers(1, V, 1), caches[2]),
            ]
        )
        assert ledger.total() == 1, dict(ledger.submissions)
        got.append(logits[1])
    _assert_device_ran(dev, f"{name} metal")
    _compare(np.stack(got), ref["logits_llamacpp"][first - 1 :], REF_TOL, name)


def test_a_batch_past_one_submission_is_refused_by_name(tiny_model: Callable) -> None:
    """A recurrent run's batch over the 64-row chunk is not chunked: it is refused by name
    before anything is touched, and the host body runs it, the same model; the next small
    step runs on the device from the states the host left."""
    from frink_cli.backends.mlx.backend import BATCH_OVER_CHUNK, GDN_CHUNK

    host, dev = _models(tiny_model, "mamba")
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, dev.config.n_vocab, n) for n in (GDN_CHUNK - 20, 30)]
    caches = [dev.decoder.new_cache(N_CTX) for _ in prompts]
    logits = dev.decoder.step_batch(list(zip(prompts, caches)))
    ledger = dev.decoder.backend.ledger
    assert set(ledger.refusals) == {BATCH_OVER_CHUNK} and ledger.total() == 0
    # The next, small step runs on the device again, from the host's caches.
    toks = rng.integers(1, dev.config.n_vocab, len(prompts))
    nxt = dev.decoder.step_batch([(np.asarray([t]), c) for t, c in zip(toks, caches)])
    assert ledger.total() == 1 and not ledger.failures
    for j, p in enumerate(prompts):
        want = _alone(host, [p.tolist(), [int(toks[j])]])
        _compare(np.stack([logits[j], nxt[j]]), want, TOL, f"sequence {j}")


def test_cuda_still_leaves_batches_to_the_host(tiny_model: Callable) -> None:
    host, dev = cuda_models(_path(tiny_model, "llama", "gguf"))
    rng = np.random.default_rng(4)
    prompts = [rng.integers(1, dev.config.n_vocab, n) for n in (4, 9)]
    caches = [dev.decoder.new_cache(N_CTX) for _ in prompts]
    logits = dev.decoder.step_batch(list(zip(prompts, caches)))
    ledger = dev.decoder.backend.ledger
    assert set(ledger.refusals) == {MULTI_SEQUENCE} and not ledger.failures
    for j, p in enumerate(prompts):
        _compare(logits[j : j + 1], _alone(host, [p.tolist()]), TOL, f"sequence {j}")
