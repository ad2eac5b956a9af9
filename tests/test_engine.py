"""The multi-sequence step and the serving engine on tiny models, in process.

What must hold: a sequence stepped beside others computes what it computes alone, which
is what llama.cpp and transformers compute (the fixtures' reference logits and llama.cpp's
greedy runs); the engine's continuous batching (joins, leaves, chunked prefill beside
decode rows) changes no sequence's tokens; the prompt cache resumes from the longest
prefix it can (a recurrent model from a saved state) and answers as a fresh run does; a
cancelled job leaves at the next step; a full queue is refused.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from model_checks import _against_references, _path

import frink_cli
from frink_cli.sampling import SamplingParams
from frink_cli.serve.engine import Engine, Finish, Job, QueueFull
from frink_cli.serve.stops import StopText

# Dense (llama), sliding-window (gemma3) and every recurrent kind of layer.
BATCH_MODELS = ["llama", "gemma3", "granitehybrid", "falcon_h1", "lfm2", "mamba", "qwen35"]
# The fixtures with a llama.cpp greedy run (recurrent models: a prompt crossing a chunk).
GREEDY_MODELS = ["granitehybrid", "falcon_h1", "lfm2", "mamba", "qwen35"]
GREEDY = SamplingParams(temperature=0.0)


def _model(tiny_model: Callable, name: str, backend: str = "numpy") -> frink_cli.Model:
    return frink_cli.load(_path(tiny_model, name, "gguf"), backend=backend)


def _others(n_vocab: int, lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_vocab, n) for n in lengths]


@pytest.mark.parametrize("name", BATCH_MODELS)
def test_batched_steps_match_references(name: str, tiny_model: Callable) -> None:
    """The reference prompt as one sequence of a batch: its first rows prefilled in one
    step beside another sequence's prompt, then the rest one row per step beside two
    sequences decoding (one of them joining late): every row's logits against llama.cpp's
    and transformers'."""
    tm = tiny_model(name)
    m = _model(tiny_model, name)
    dec = m.decoder
    tokens = [int(t) for t in tm.ref["tokens"]]
    n = len(tokens)
    a, b, c = (dec.new_cache(n + 8) for _ in range(3))
    other_b, other_c = _others(m.n_vocab, [n + 4, n + 4])
    k = 7
    first = dec.step_batch([(np.asarray(tokens[:k]), a), (other_b[:5], b)])
    got = [first[0]]
    b_at = 5
    # Logits of the prefix's earlier rows come from a single-sequence run (the batch
    # returns each sequence's last row only); they are checked by the per-arch tests.
    head = dec.step(np.asarray(tokens[: k - 1]), dec.new_cache(n), all_logits=True)
    for i in range(k, n):
        steps = [(np.asarray([tokens[i]]), a), (other_b[b_at : b_at + 1], b)]
        b_at += 1
        if i == k + 3:  # c joins late, with a prompt of its own
            steps.append((other_c[:3], c))
        elif i > k + 3:
            steps.append((other_c[c.n_past : c.n_past + 1], c))
        got.append(dec.step_batch(steps)[0])
    logits = np.concatenate([head, np.stack(got)])
    _against_references(logits, tm.ref, f"{name} batched")


def _run(
    engine: Engine,
    prompts: list[list[int]],
    max_tokens: int,
    params=GREEDY,
    stop: tuple[str, ...] = (),
) -> list[tuple[list[int], Finish]]:
    """Submit every prompt at once to a running engine; each job's (tokens, Finish)."""
    done: queue.Queue = queue.Queue()
    results: dict[int, Finish] = {}

    def emitter(i: int) -> Callable[[str, object], None]:
        def emit(kind: str, payload: object) -> None:
            if kind == "done":
                results[i] = payload  # type: ignore[assignment]
                done.put(i)
            elif kind == "error":
                done.put(("error", payload))

        return emit

    for i, p in enumerate(prompts):
        engine.submit(Job(list(p), params, max_tokens, stop, emitter(i)))
    for _ in prompts:
        item = done.get(timeout=300)
        assert not isinstance(item, tuple), item
    return [(list(results[i].tokens), results[i]) for i in range(len(prompts))]


def _engine(model: frink_cli.Model, **kw) -> tuple[Engine, threading.Thread]:
    e = Engine(model.decoder, model.tokenizer, **kw)
    t = threading.Thread(target=e.run, daemon=True)
    t.start()
    return e, t


def _stop(e: Engine, t: threading.Thread) -> None:
    e.stop()
    t.join(30)
    assert not t.is_alive()


@pytest.mark.parametrize("name", GREEDY_MODELS)
def test_concurrent_greedy_jobs_match_llamacpp_and_alone(name: str, tiny_model: Callable) -> None:
    """llama.cpp's greedy run as one of 8 concurrent jobs (prompts fed in chunks of 16 rows
    beside the others' decode rows): its tokens are llama.cpp's; every other job's tokens
    are what it gets alone."""
    ref = tiny_model(name).ref
    m = _model(tiny_model, name)
    prompt = [int(t) for t in ref["greedy_prompt"]]
    want = ref["greedy_llamacpp"].tolist()
    prompts = [prompt] + [p.tolist() for p in _others(m.n_vocab, [3, 9, 17, 30, 41, 5, 70])]
    e, t = _engine(m, n_parallel=8, n_ctx=128, prefill_chunk=16)
    try:
        alone = [_run(e, [p], len(want))[0][0] for p in prompts]
        together = [tokens for tokens, _ in _run(e, prompts, len(want))]
    finally:
        _stop(e, t)
    assert alone[0] == want, f"{name}: alone {alone[0]} != llama.cpp {want}"
    assert together == alone
    assert e.steps > 0


@pytest.mark.parametrize("name", ["llama", "granitehybrid", "lfm2"])
def test_more_jobs_than_slots_queue_and_finish(name: str, tiny_model: Callable) -> None:
    m = _model(tiny_model, name)
    prompts = [p.tolist() for p in _others(m.n_vocab, [4, 8, 12, 6, 10, 3], seed=1)]
    e, t = _engine(m, n_parallel=2, n_ctx=64, prefill_chunk=8)
    try:
        alone = [_run(e, [p], 6)[0][0] for p in prompts]
        together = [tokens for tokens, _ in _run(e, prompts, 6)]
    finally:
        _stop(e, t)
    assert together == alone


@pytest.mark.parametrize("name", ["llama", "gemma3", "granitehybrid", "falcon_h1", "mamba"])
def test_prompt_cache_resumes_and_answers_as_fresh(name: str, tiny_model: Callable) -> None:
    """A second turn (first prompt + its answer + more) and a branch (first prompt + other
    ids) reuse the cache (indexed pages; recurrent models: the state saved at the end of
    the prompt or of the answer), and answer exactly as a fresh engine does."""
    m = _model(tiny_model, name)
    first, more, branch = (p.tolist() for p in _others(m.n_vocab, [20, 6, 9], seed=2))
    e, t = _engine(m, n_parallel=1, n_ctx=96)
    try:
        answer, f1 = _run(e, [first], 8)[0]
        assert f1.cached_tokens == 0
        turn2 = first + answer + more
        got2, f2 = _run(e, [turn2], 8)[0]
        got3, f3 = _run(e, [first + branch], 8)[0]
    finally:
        _stop(e, t)
    # The answer's last token was sampled, never fed: the cache holds all the rest.
    assert f2.cached_tokens == len(first) + len(answer) - 1
    # gemma3 (windows of 6) too: the paged engine's index kept the window pages it needs.
    assert f3.cached_tokens == len(first)
    fresh = _engine(m, n_parallel=1, n_ctx=96)
    try:
        assert _run(fresh[0], [turn2], 8)[0][0] == got2
        assert _run(fresh[0], [first + branch], 8)[0][0] == got3
    finally:
        _stop(*fresh)


def test_cancelled_job_leaves_and_others_continue(tiny_model: Callable) -> None:
    m = _model(tiny_model, "llama")
    prompts = [p.tolist() for p in _others(m.n_vocab, [5, 7], seed=3)]
    e, t = _engine(m, n_parallel=2, n_ctx=256)
    try:
        alone = _run(e, [prompts[1]], 40)[0][0]
        seen: list[str] = []
        steps = e.steps
        doomed = Job(prompts[0], GREEDY, 200, (), lambda kind, payload: seen.append(kind))
        e.submit(doomed)
        deadline = time.monotonic() + 60
        while e.steps < steps + 3 and time.monotonic() < deadline:  # a few tokens in
            time.sleep(0.001)
        doomed.cancel()
        survivor = _run(e, [prompts[1]], 40)[0][0]
        assert e.busy == 0
    finally:
        _stop(e, t)
    assert "done" not in seen and "error" not in seen  # a cancelled job is told nothing
    assert survivor == alone


def test_full_queue_is_refused(tiny_model: Callable) -> None:
    """Free slots plus the queue's limit is what waits; one more is QueueFull (the engine
    is not running here, so nothing is admitted meanwhile)."""
    m = _model(tiny_model, "llama")
    e = Engine(m.decoder, m.tokenizer, n_parallel=2, n_ctx=32, max_queue=1)
    for _ in range(3):
        e.submit(Job([1, 2, 3], GREEDY, 4, (), lambda k, p: None))
    with pytest.raises(QueueFull):
        e.submit(Job([1, 2, 3], GREEDY, 4, (), lambda k, p: None))


class _Bytes:
    """A tokenizer stand-in: token i is the i-th byte string."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def stream(self):
        import codecs

        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces = self.pieces

        class S:
            def push(self, t: int) -> str:
                return dec.decode(pieces[t])

            def flush(self) -> str:
                return dec.decode(b"", final=True)

        return S()


@pytest.mark.parametrize(
    ("pieces", "stops", "sent", "stopped"),
    [
        ([b"Hello", b" wor", b"ld", b"\n\n", b"User", b":"], ("\n\nUser",), "Hello world", True),
        ([b"ab", b"c", b"d"], ("cx",), "abcd", False),  # a partial match is released
        ([b"x", b"\xc3", b"\xa9", b"END", b"z"], ("END",), "x\u00e9", True),  # split UTF-8
        ([b"one", b" two"], (), "one two", False),
        ([b"aSTO", b"Pb"], ("STOP", "Pb"), "a", True),  # the earliest stop wins
    ],
)
def test_stop_text(pieces: list[bytes], stops, sent: str, stopped: bool) -> None:
    s = StopText(_Bytes(pieces), stops)  # type: ignore[arg-type]
    out = []
    hit = False
    for i in range(len(pieces)):
        text, hit = s.push(i)
        out.append(text)
        if hit:
            break
    if not hit:
        out.append(s.flush())
    assert "".join(out) == sent
    assert hit == stopped


def test_stop_text_spells_the_control_tokens_it_is_given() -> None:
    """A tool-call marker that is a control token (no bytes of its own) is written by its
    name, so the tool-call parser sees it; other control tokens stay silent."""

    class Named(_Bytes):
        def token_text(self, t: int) -> str:
            return "[TOOL_CALLS]" if t == 1 else "</s>"

    pieces = [b"Sure.", b"", b'[{"name": "f"}]', b""]
    s = StopText(Named(pieces), (), frozenset({1}))  # type: ignore[arg-type]
    out = "".join(s.push(i)[0] for i in range(len(pieces))) + s.flush()
    assert out == 'Sure.[TOOL_CALLS][{"name": "f"}]'


@pytest.mark.parametrize("name", ["granitehybrid", "lfm2", "falcon_h1", "minimax"])
def test_metal_engine_steps_are_one_submission_each(name: str, tiny_model: Callable) -> None:
    """On metal the engine's every step (a batch of decode rows and prompt chunks, or one
    sequence's) is ONE device submission, nothing refused, and llama.cpp's greedy run is
    what the job beside seven others gets."""
    pytest.importorskip("mlx.core")
    ref = tiny_model(name).ref
    m = _model(tiny_model, name, backend="metal")
    assert m.backend_name == "metal"
    prompt = [int(t) for t in ref["greedy_prompt"]]
    want = ref["greedy_llamacpp"].tolist()
    prompts = [prompt] + [p.tolist() for p in _others(m.n_vocab, [3, 9, 17, 30, 41, 5, 70])]
    ledger = m.decoder.backend.ledger
    ledger.reset()
    e, t = _engine(m, n_parallel=8, n_ctx=128, prefill_chunk=16)
    try:
        together = [tokens for tokens, _ in _run(e, prompts, len(want))]
    finally:
        _stop(e, t)
    assert together[0] == want
    assert not ledger.refusals and not ledger.failures, (ledger.refusals, ledger.failures)
    assert ledger.total() == e.steps > len(want)


def test_metal_smollm2_concurrent_greedy_is_alone(smollm2_path) -> None:
    """SmolLM2 on metal (its Q4_1 weights as MLX quantized blocks): 4 concurrent greedy
    chats each get their alone tokens, every engine step one submission."""
    pytest.importorskip("mlx.core")
    from frink_cli.chat import chat_ids

    m = frink_cli.load(smollm2_path, backend="metal")
    questions = ["Name a colour.", "What is 3 times 4?", "Say hello in French.", "Name a planet."]
    prompts = [chat_ids(m.tokenizer, [{"role": "user", "content": q}]) for q in questions]
    e, t = _engine(m, n_parallel=4, n_ctx=256)
    try:
        alone = [_run(e, [p], 8)[0][0] for p in prompts]
        ledger = m.decoder.backend.ledger
        ledger.reset()
        steps = e.steps
        together = [tokens for tokens, _ in _run(e, prompts, 8)]
    finally:
        _stop(e, t)
    assert together == alone
    assert not ledger.refusals and not ledger.failures
    assert ledger.total() == e.steps - steps


@pytest.mark.parametrize("name", ["llama", "gemma3", "qwen3moe", "granitehybrid"])
def test_batch_rows_equal_alone_bit_for_bit(name: str, tiny_model: Callable) -> None:
    """A sequence's logits are the same floats whatever is stepped beside it: its prompt
    chunk beside a longer chunk and decode rows, then its decode rows beside 1..6 others
    (MoE experts included, whose row groups mix sequences). What a server relies on to
    answer a request as it would answer it alone."""
    from frink_cli.backends.host.linear import SMALL_ROWS
    from frink_cli.quant.kernels import compiled

    if not compiled():
        pytest.skip("batch invariance needs the compiled kernels (native C)")
    m = _model(tiny_model, name)
    dec = m.decoder
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, m.n_vocab, 12)
    steps = rng.integers(0, m.n_vocab, 10)
    cache = dec.new_cache(64)
    alone = [dec.step_batch([(prompt, cache)])[0]]
    alone += [dec.step_batch([(steps[i : i + 1], cache)])[0] for i in range(len(steps))]

    cache = dec.new_cache(64)
    others = [dec.new_cache(64) for _ in range(6)]
    for o in others[:2]:  # two sequences already decoding
        dec.step_batch([(rng.integers(0, m.n_vocab, 5), o)])
    long = rng.integers(0, m.n_vocab, SMALL_ROWS + 9)  # a prompt chunk BLAS multiplies
    got = [
        dec.step_batch(
            [
                (rng.integers(0, m.n_vocab, 1), others[0]),
                (prompt, cache),
                (long, others[2]),
                (rng.integers(0, m.n_vocab, 1), others[1]),
            ]
        )[1]
    ]
    for i in range(len(steps)):
        company = others[: 1 + i % len(others)]
        feeds = [(rng.integers(0, m.n_vocab, 1), o) for o in company]
        feeds.insert(i % (len(feeds) + 1), (steps[i : i + 1], cache))
        pos = next(j for j, (_, c) in enumerate(feeds) if c is cache)
        got.append(dec.step_batch(feeds)[pos])
    for i, (a, b) in enumerate(zip(alone, got)):
        assert np.array_equal(a, b), (i, float(np.abs(a - b).max()))


@pytest.mark.parametrize("layout", ["norm", "neox"])
def test_rope_of_a_batchs_rows_is_each_rows_own(layout: str) -> None:
    """A batched step's positions are one per sequence, not one run, even when the first
    and last are T - 1 apart ([44, 46, 45, 47, 48]: a table slice there rotated the second
    row by position 45, and a served answer drifted from its alone answer)."""
    from frink_cli.backends.host.rope import Rope

    rope = Rope(64, 10000.0, 1.0, layout)
    x = np.random.default_rng(0).standard_normal((5, 4, 64)).astype(np.float32)
    for positions in ([44, 46, 45, 47, 48], [3, 9, 5, 4, 7], [10, 11, 12, 13, 14]):
        pos = np.asarray(positions)
        got = rope.apply(x, pos)
        one = np.concatenate([rope.apply(x[i : i + 1], pos[i : i + 1]) for i in range(5)])
        assert np.array_equal(got, one), positions
