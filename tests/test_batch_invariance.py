"""A row's logits are the same bits whatever else is in its step, on every kernel ISA.

Why: a server steps many sequences together, feeds a prompt in chunks beside other
sequences' decode rows, and resumes a prompt from a slot's cached prefix. Each of those
puts a sequence's rows through the host in other company and other cuts than it gets alone.
Any sum whose order depends on that company (a GEMM over a block's shape, a softmax over
the block's keys) moves the row's last bits; with 8-bit activations such an ulp rounds a
code the other way in the next layer and grows into logits 0.6 apart, and a near-tie
greedy token flips: 2 of 8 concurrent SmolLM2 answers differed from their solo runs.

So each check runs one sequence alone (its prompt whole, then greedy decode rows) and the
same sequence in mixed steps, and asks for the same bytes at every row:
  - beside other sequences' prompts, then beside their decode rows;
  - its decode rows beside another sequence's prompt chunk;
  - its prompt cut in two (a resumed prefix), the second part beside others' decode rows;
on dense fixtures (f32, f16 and q8_0 KV caches), a MoE, three hybrid (recurrent) tiny
fixtures (short conv, gated delta net, lightning attention) and the real SmolLM2, in a
child process per forced ISA (FRINK_NATIVE_ISA is read at import), each variant this CPU
lacks skipped by name. And `frink serve` answers 8
concurrent greedy requests (prompts resumed from the slots' caches as a server does by
default) with exactly the tokens and log probabilities it gives each alone.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from concurrency import all_at_once
from frink_subprocess import child_env
from isa_variants import ISAS, child_json, unrunnable_reason
from model_checks import _path, q8_0_requant

import frink_cli

# The AMX variant multiplies a prompt's rows on int8 tiles, in another f32 order than the
# decode rows' dots: its rows keep their bits beside other sequences, not across a prompt's
# cut (docs/performance.md); the checks that cut a prompt leave it out.
CUTS_KEEP_BITS = ("avx512", "avxvnni", "avx2", "base")

_CHILD = r"""
import json, sys
import numpy as np
from frink_cli.api import load
from frink_cli.quant import kernels

path, lo, hi, cut_checks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
dec = load(path, cache_type_k=sys.argv[5], cache_type_v=sys.argv[5]).decoder
rng = np.random.default_rng(7)
A, B, C = (rng.integers(lo, hi, n) for n in (40, 33, 5))
N = 3  # greedy decode rows after the prompt


def row(lg):
    return lg[-1]


def greedy(lg):
    return np.array([int(lg.argmax())])


def alone():
    c = dec.new_cache(128)
    out = [row(dec.step(A, c))]
    for _ in range(N):
        out.append(row(dec.step(greedy(out[-1]), c)))
    return out


def beside_sequences():
    cA, cB, cC = (dec.new_cache(128) for _ in range(3))
    lg = dec.step_batch([(A, cA), (B, cB), (C, cC)])
    out = [lg[0]]
    for _ in range(N):
        lg = dec.step_batch(
            [(greedy(out[-1]), cA), (greedy(lg[1]), cB), (greedy(lg[2]), cC)]
        )
        out.append(lg[0])
    return out


def beside_a_prompt_chunk():
    cA = dec.new_cache(128)
    out = [row(dec.step(A, cA))]
    for i in range(N):
        chunk = B[: 5 + 12 * i]  # 5, 17, 29 rows: the decode kernel's and the prompt's
        out.append(dec.step_batch([(greedy(out[-1]), cA), (chunk, dec.new_cache(128))])[0])
    return out


def cut_prompt(cut):
    cA, cB = dec.new_cache(128), dec.new_cache(128)
    dec.step(A[:cut], cA)
    lg = dec.step_batch([(A[cut:], cA), (B, cB)])
    out = [lg[0]]
    tb = greedy(lg[1])
    for _ in range(N):
        lg = dec.step_batch([(greedy(out[-1]), cA), (tb, cB)])
        out.append(lg[0])
        tb = greedy(lg[1])
    return out


ref = alone()
checks = {"beside other sequences": beside_sequences()}
checks["beside a prompt chunk"] = beside_a_prompt_chunk()
if cut_checks:
    for cut in (3, 17, 30):
        checks[f"prompt cut at {cut}"] = cut_prompt(cut)
report = {}
for name, rows in checks.items():
    report[name] = [
        None if np.array_equal(a, b) else float(np.abs(a - b).max()) for a, b in zip(ref, rows)
    ]
print(json.dumps({"path": kernels.kernel_path(), "rows": report}))
"""


def _check(model: Path, isa: str, ids: tuple[int, int] = (5, 200), cache_type: str = "f32") -> None:
    reason = unrunnable_reason(isa)
    if reason:
        pytest.skip(reason)
    env = child_env()
    env["FRINK_NATIVE_ISA"] = isa
    for key in ("FRINK_EXACT_ACTIVATIONS", "FRINK_NO_NATIVE", "FRINK_THREADS"):
        env.pop(key, None)
    cuts = "1" if isa in CUTS_KEEP_BITS else "0"
    out = child_json(_CHILD, [str(model), str(ids[0]), str(ids[1]), cuts, cache_type], env, 900)
    assert f"({isa}," in out["path"], out["path"]
    differ = {k: v for k, v in out["rows"].items() if any(d is not None for d in v)}
    # Each entry: per row (the prompt's last, then the decode rows) None where the bytes are
    # the row's alone, else the largest difference.
    assert not differ, f"{out['path']}: rows differ from the sequence alone: {differ}"


@pytest.mark.parametrize("isa", ISAS)
def test_dense_f32_fixture(tiny_model: Callable, isa: str) -> None:
    """The tiny llama (f32 weights: the f32 product kernel, prompt rows and decode rows)."""
    _check(_path(tiny_model, "llama", "gguf"), isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cache_type,family", [("f16", "llama"), ("q8_0", "gemma3")])
def test_dense_fixture_with_a_typed_cache(
    tiny_model: Callable, isa: str, cache_type: str, family: str
) -> None:
    """A tiny dense model with its K/V rows stored as f16 (the llama) or q8_0 (gemma3: heads
    of 32, whole q8_0 blocks; window layers too) by -ctk/-ctv: the attention reads the
    stored rows in the f32 kernel's order."""
    _check(_path(tiny_model, family, "gguf"), isa, cache_type=cache_type)


@pytest.mark.parametrize("isa", ISAS)
def test_moe_fixture(tiny_model: Callable, isa: str) -> None:
    """The tiny LFM2-MoE in Q8_0 (8-bit activations; experts grouped by row; conv state)."""
    _check(q8_0_requant(tiny_model, "lfm2moe")[0], isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("family", ["lfm2", "qwen35", "minimax"])
def test_hybrid_fixture(tiny_model: Callable, isa: str, family: str) -> None:
    """Tiny hybrids in Q8_0, recurrent layers beside attention: LFM2's short convs (a
    recurrent tail), Qwen3.5's gated delta net and MiniMax's lightning attention (a state
    each token updates: a prompt's rows and a decode row run the same recurrence)."""
    _check(q8_0_requant(tiny_model, family)[0], isa)


@pytest.mark.parametrize("isa", ISAS)
def test_smollm2(smollm2_path: Path, isa: str) -> None:
    """The real SmolLM2-135M Q4_1, the model the symptom was seen on."""
    _check(smollm2_path, isa, (200, 20000))


PROMPTS = [
    "Name a fruit.",
    "What is the capital of Spain?",
    "Write one sentence about dogs.",
    "Count from six to nine.",
    "What is 7 plus 5?",
    "Say goodbye in German.",
    "Name an ocean.",
    "What do cows drink?",
]


@pytest.mark.parametrize("isa", ISAS)
def test_serve_concurrent_greedy_is_alone(
    smollm2_path: Path, isa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 greedy chat requests to `frink serve` (16 tokens): sent one at a time with their
    prompts computed afresh, then one at a time again (each prompt resumed from the slot
    that answered it), then all 8 at once: the same tokens and log probabilities each time."""
    reason = unrunnable_reason(isa)
    if reason:
        pytest.skip(reason)
    if isa not in CUTS_KEEP_BITS:
        pytest.skip(f"{isa}: a prompt's rows on AMX tiles differ from its decode rows' dots")
    openai = pytest.importorskip("openai")
    from serve_process import Server

    monkeypatch.setenv("FRINK_NATIVE_ISA", isa)
    monkeypatch.delenv("FRINK_EXACT_ACTIVATIONS", raising=False)
    server = Server(smollm2_path, "-np", "8", "-c", "2048", "--backend", "numpy")

    def answer(prompt: str, cache_prompt: bool = True) -> list[tuple[str, float]]:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1",
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=16,
            logprobs=True,
            extra_body={"cache_prompt": cache_prompt},
        )
        return [(c.token, c.logprob) for c in r.choices[0].logprobs.content]

    try:
        fresh = [answer(p, cache_prompt=False) for p in PROMPTS]
        resumed = [answer(p) for p in PROMPTS]
        together = all_at_once(lambda i: answer(PROMPTS[i]), len(PROMPTS))
        for name, got in (("resumed", resumed), ("concurrent", together)):
            differ = [(PROMPTS[i], fresh[i], got[i]) for i in range(8) if got[i] != fresh[i]]
            assert not differ, f"{name} answers differ from the fresh ones alone: {differ}"
    finally:
        server.stop()
        server.close()


@pytest.mark.parametrize("family", ["llama_q", "qwen35"])
def test_a_long_prompt_is_fed_in_bounded_steps(
    tiny_model: Callable, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoder.prefill feeds a prompt PREFILL_ROWS rows at a time (llama.cpp's ubatch, here
    16): the last row's logits are one step's, bit for bit (a dense Q8_0 model and a gated
    delta net hybrid), and the activations held at once, tracemalloc's peak, are under half
    of one step's."""
    from frink_cli import decoder as decoder_module

    monkeypatch.setattr(decoder_module, "PREFILL_ROWS", 16)
    dec = frink_cli.load(_path(tiny_model, family, "gguf")).decoder
    ids = np.random.default_rng(1).integers(5, 200, 200)
    got = {}
    for how in ("step", "prefill"):
        cache = dec.new_cache(256)
        cache.reserve(256)
        tracemalloc.start()
        try:
            logits = dec.step(ids, cache) if how == "step" else dec.prefill(ids, cache)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert cache.n_past == len(ids)
        got[how] = (logits, peak)
    assert np.array_equal(got["prefill"][0], got["step"][0])
    assert got["prefill"][1] < got["step"][1] / 2, (got["prefill"][1], got["step"][1])
