"""The serve engine on its paged KV cache (serve/paging.py), in process, on the tiny llama
and the tiny gemma3 (sliding windows of 6).

What must hold: 8 concurrent jobs sharing a long system prompt hold it once (the pool's
pages in use are at most 1.2x one sequence's plus the 8 suffixes, as /metrics' gauges
report them) and answer as each does alone on the slot engine, while llama.cpp's greedy
prompt, served beside them, gets llama.cpp's first token; a pool too small for the load
preempts jobs and still completes every one with its solo answer (a sliding-window model
too); a sliding-window pool ends a long answer holding only its prompt's and its last
window's pages; a prompt larger than the pool is refused by name; an MLA model (tiny
DeepSeek-V2-Lite: latent rows) preempts and answers alone too, and its jobs sharing a
system prompt start from its indexed pages.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from test_engine import _engine, _model, _others, _run, _stop

from frink_cli.cache.paged import PAGE
from frink_cli.serve.metrics import Metrics

SYSTEM = 1500  # the shared prompt's tokens


def _pages(n_tokens: int) -> int:
    return -(-n_tokens // PAGE)


def _alone(m, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's answer on a fresh slot engine (whole-context caches, no paging)."""
    e, t = _engine(m, n_parallel=1, n_ctx=2048, paged=False)
    try:
        assert e.pages is None
        return [_run(e, [p], max_tokens)[0][0] for p in prompts]
    finally:
        _stop(e, t)


def test_shared_system_prompt_is_held_once(tiny_model: Callable) -> None:
    ref = tiny_model("llama").ref
    m = _model(tiny_model, "llama")
    system = _others(m.n_vocab, [SYSTEM], seed=5)[0].tolist()
    suffixes = [s.tolist() for s in _others(m.n_vocab, [3, 9, 17, 5, 30, 12, 7, 21], seed=6)]
    prompts = [system + s for s in suffixes]
    greedy = [int(t) for t in ref["tokens"]]
    n_new = 6
    e, t = _engine(m, n_parallel=9, n_ctx=2048, prefill_chunk=128)
    metrics = Metrics(e)
    try:
        got = _run(e, [*prompts, greedy], n_new)
    finally:
        _stop(e, t)
    # The reference prompt served beside them: its first token is llama.cpp's argmax.
    assert got[-1][0][0] == int(np.argmax(ref["logits_llamacpp"][-1]))
    assert [tokens for tokens, _ in got[:-1]] == _alone(m, prompts, n_new)
    # Every job after the first found at least the system prompt's full pages indexed.
    cached = sorted(f.cached_tokens for _, f in got[:-1])
    assert cached[0] == 0 and all(SYSTEM // PAGE * PAGE <= c <= SYSTEM for c in cached[1:]), cached
    gauges = _gauges(metrics)
    one = _pages(SYSTEM + max(len(s) for s in suffixes) + n_new)
    tails = sum(_pages(len(s) + n_new) + 1 for s in suffixes) + _pages(len(greedy) + n_new)
    assert gauges["frink_kv_pages_used"] <= 1.2 * one + tails
    assert gauges["frink_prefix_hits"] >= 7
    assert gauges["frink_prefix_hit_tokens"] >= 7 * (SYSTEM // PAGE * PAGE)
    assert gauges["frink_kv_pages"] == _pages(9 * 2048)


@pytest.mark.parametrize("name", ["llama", "gemma3", "deepseek_v2_lite"])
def test_small_pool_preempts_and_answers_every_job(name: str, tiny_model: Callable) -> None:
    """A pool of 12 pages for 4 jobs that want 4-5 pages each at their ends: jobs are
    preempted, recomputed, and every one answers as it does alone (gemma3: its
    sliding-window layers' pool too, whose jobs hold a page or two each; deepseek: its
    latent rows' pages)."""
    m = _model(tiny_model, name)
    prompts = [p.tolist() for p in _others(m.n_vocab, [30, 41, 22, 35], seed=7)]
    e, t = _engine(m, n_parallel=4, n_ctx=128, prefill_chunk=16, kv_pool=12 * PAGE)
    try:
        got = [tokens for tokens, _ in _run(e, prompts, 36)]
    finally:
        _stop(e, t)
    assert e.preemptions > 0
    assert got == _alone(m, prompts, 36)


def _gauges(metrics: Metrics) -> dict[str, float]:
    text = metrics.exposition().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("frink_") and " " in line
    }


def test_window_pool_keeps_the_prompt_and_the_last_window(tiny_model: Callable) -> None:
    """gemma3 (window 6): a job of a 20-token prompt and a 100-token answer ends with its
    full-attention pool holding every page (indexed) and its sliding-window pool only the
    prompt's full pages and the answer's last window (indexed for a next turn), as
    /metrics reports them: the window pages the answer moved past were given back."""
    m = _model(tiny_model, "gemma3")
    e, t = _engine(m, n_parallel=1, n_ctx=160, prefill_chunk=16)
    metrics = Metrics(e)
    prompt = _others(m.n_vocab, [20], seed=8)[0].tolist()
    try:
        _run(e, [prompt], 100)
    finally:
        _stop(e, t)
    gauges = _gauges(metrics)
    assert gauges['frink_kv_pages_used_by_kind{kind="full_attention"}'] == _pages(20 + 99)
    window = gauges['frink_kv_pages_used_by_kind{kind="sliding_window_6"}']
    assert window <= 20 // PAGE + -(-6 // PAGE) + 1
    assert gauges["frink_kv_pages_used"] == _pages(20 + 99) + window


def test_prompt_larger_than_the_pool_is_refused_by_name(tiny_model: Callable) -> None:
    m = _model(tiny_model, "llama")
    e, t = _engine(m, n_parallel=2, n_ctx=128, kv_pool=2 * PAGE)
    try:
        with pytest.raises(AssertionError, match=r"the KV pool \(32 tokens, --kv-pool\) cannot"):
            _run(e, [list(range(1, 60))], 4)
    finally:
        _stop(e, t)


def test_latent_rows_share_a_system_prompt(tiny_model: Callable) -> None:
    """Three MLA jobs after a first one with the same 40-token system prompt start from its
    indexed pages (/metrics' prefix hits) and answer as each does alone."""
    m = _model(tiny_model, "deepseek_v2_lite")
    system = _others(m.n_vocab, [40], seed=10)[0].tolist()
    prompts = [system + s.tolist() for s in _others(m.n_vocab, [3, 11, 6, 20], seed=11)]
    e, t = _engine(m, n_parallel=2, n_ctx=128, prefill_chunk=16)
    metrics = Metrics(e)
    try:
        got = _run(e, prompts[:1], 8) + _run(e, prompts[1:], 8)
    finally:
        _stop(e, t)
    assert [tokens for tokens, _ in got] == _alone(m, prompts, 8)
    gauges = _gauges(metrics)
    assert gauges["frink_prefix_hits"] >= 3
    assert gauges["frink_prefix_hit_tokens"] >= 3 * (40 // PAGE * PAGE)
