"""The same forward gives the same logits, bit for bit, on any thread count.

Why: with 8-bit activations (llama.cpp's rounding of x before a quantized dot) an ulp of
difference in one layer's output flips the rounding of some of the next layer's codes,
and the flips grow into different logits and a different greedy token. A multithreaded
GEMM may round by its thread count (OpenBLAS's Haswell kernels do: 1 and 2 threads differ
in the last bits), and frink's steps pick their thread count by timing, so a prompt fed
twice in one process gave logits up to 0.95 apart. Each check here runs the same work on
1, 2, 3 and 4 threads, on every instruction set the compiled kernels carry that this CPU
runs (forced as a user would, FRINK_NATIVE_ISA) and on the NumPy path, and asks for the
same bytes: the products of every kernel type, the real SmolLM2's and Gemma 3's prompt
and decode logits over prompt lengths from 1 to 512, and a long-running server's greedy
answer to the same request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from frink_subprocess import child_env
from gguf import GGMLQuantizationType as T
from isa_variants import ISAS, child_json
from isa_variants import runnable_isas as _runnable_isas
from quant_weights import random_weights

from frink_cli.backends.host import linear
from frink_cli.quant import kernels
from frink_cli.quant.blocks import KERNEL_TYPES, QuantRows

THREADS = (1, 2, 3, 4)
# Row counts across every path a product takes: a decode row, the compiled kernel's batch
# (up to SMALL_T), a prompt's blocks of dots, BLAS's tiles as tile @ x.T (under
# FEW_ROWS_TILE) and as x @ tile.T.
ROWS = (1, 3, 16, 17, 40, 63, 64, 65, 200)


@pytest.fixture(params=[*ISAS, "numpy"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each compiled ISA this CPU runs, and the NumPy path; up to 4 kernel threads even on
    a machine with fewer cores (a user's machine may have more)."""
    monkeypatch.setattr(kernels, "_MAX_THREADS", max(THREADS))
    if request.param == "numpy":
        monkeypatch.setattr(kernels, "_NATIVE", None)
        yield "numpy"
        return
    if request.param not in _runnable_isas():
        pytest.skip(f"{request.param}: not runnable here ({kernels.kernel_path()})")
    native = kernels._NATIVE
    assert native is not None
    before = native.use_isa(str(request.param))
    try:
        yield str(request.param)
    finally:
        native.use_isa(before)


def _on_each_thread_count(x: np.ndarray, w) -> list[np.ndarray]:
    """x @ w.T as a step of the decoder computes it, on each of THREADS threads."""
    out = []
    for n in THREADS:
        with linear.step_threads(n, linear.few_rows([len(x)])):
            out.append(linear.product(x, w))
    return out


def _assert_identical(outs: list[np.ndarray], what: str) -> None:
    for n, y in zip(THREADS[1:], outs[1:]):
        diff = np.abs(y - outs[0])
        assert np.array_equal(y, outs[0]), (
            f"{what}: {n} threads differ from 1 thread at {int((diff > 0).sum())} of "
            f"{y.size} values (max {float(diff.max()):.3g})"
        )


@pytest.mark.parametrize("activations", ["8-bit", "f32"])
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_quantized_products_do_not_depend_on_threads(
    kernel_path: str, qtype: T, activations: str
) -> None:
    block = 256 if qtype.name.endswith("_K") or qtype == T.IQ4_XS else 32
    w = QuantRows((random_weights(qtype, 320, 2 * max(block, 256), seed=1),))
    rng = np.random.default_rng(2)
    with kernels.exact_activations(activations == "f32"):
        for t in ROWS:
            x = rng.standard_normal((t, w.shape[1])).astype(np.float32)
            _assert_identical(_on_each_thread_count(x, w), f"{qtype.name} T={t}")


def test_f32_products_do_not_depend_on_threads(kernel_path: str) -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((1536, 576)).astype(np.float32)
    for t in ROWS:
        x = rng.standard_normal((t, 576)).astype(np.float32)
        _assert_identical(_on_each_thread_count(x, w), f"f32 T={t}")


def test_tiles_are_cut_from_the_weights_shape_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a prompt product's tiles of W fall (without the compiled kernels: BLAS over
    dequantized tiles) is a function of W's shape: the thread count, which decides only
    who multiplies a tile, never moves an edge."""
    seen = []
    real = kernels.dequantize_rows

    def spy(w, r0=0, r1=None, out=None):
        seen.append((r0, r1))
        return real(w, r0, r1, out=out)

    monkeypatch.setattr(kernels, "dequantize_rows", spy)
    monkeypatch.setattr(kernels, "_MAX_THREADS", 4)
    monkeypatch.setattr(kernels, "_NATIVE", None)
    w = random_weights(T.Q4_0, 1000, 256, seed=4)
    x = np.ones((80, 256), np.float32)
    edges = []
    for n in (1, 2, 4):
        seen.clear()
        with kernels.threads(n), kernels.exact_activations():
            kernels.matmul(x, w)
        edges.append(sorted(seen))
    assert edges[0] == edges[1] == edges[2]
    assert len(edges[0]) > 1 and edges[0][-1][1] == 1000


# -- real models, in child processes: FRINK_NATIVE_ISA and FRINK_THREADS are read at import,
# as a user sets them ----------------------------------------------------------------------

_CHILD = r"""
import hashlib, json, sys
import numpy as np
from frink_cli.api import load
from frink_cli.quant import kernels

path, lengths, reps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
m = load(path)
dec = m.decoder
text = ("The three primary colors are red, yellow and blue. Mixing them gives secondary "
        "colors: orange, green and purple. Painters have argued for centuries about which "
        "pigments make the purest hues, and ") * 40
ids = np.asarray(m.tokenize(text), np.int64)
digests = {}
for n in lengths:
    prompt = ids[:n]
    # Repeated on a fresh cache in one process: the bug's own shape.
    seen = {dec.step_batch([(prompt, dec.new_cache(n + 8))])[0].tobytes() for _ in range(reps)}
    if len(seen) != 1:
        sys.exit(f"prompt of {n}: {len(seen)} different logits over {reps} runs")
    cache = dec.new_cache(n + 8)
    rows = [dec.step(prompt, cache)]
    tok = int(rows[0][-1].argmax())
    for _ in range(4):  # greedy decode rows after the prompt
        rows.append(dec.step(np.array([tok]), cache))
        tok = int(rows[-1][-1].argmax())
    digests[n] = hashlib.sha256(seen.pop() + b"".join(r.tobytes() for r in rows)).hexdigest()
print(json.dumps({"path": kernels.kernel_path(), "digests": digests}))
"""


def _digests(model: Path, isa: str, threads: int, lengths: list[int], reps: int) -> dict:
    env = child_env()
    env["FRINK_THREADS"] = str(threads)
    env.pop("FRINK_EXACT_ACTIVATIONS", None)
    if isa == "numpy":
        env["FRINK_NO_NATIVE"] = "1"
    else:
        env["FRINK_NATIVE_ISA"] = isa
    out = child_json(_CHILD, [str(model), json.dumps(lengths), str(reps)], env, 600)
    assert (isa == "numpy") == out["path"].startswith("numpy"), out["path"]
    return dict(out["digests"])


def _model_isas() -> list[str]:
    return [*_runnable_isas(), "numpy"]


@pytest.mark.parametrize("isa", _model_isas())
def test_smollm2_logits_do_not_depend_on_threads(smollm2_path: Path, isa: str) -> None:
    """SmolLM2 Q4_1: prompts of 1 to 512 tokens, each fed twice on a fresh cache and
    then decoded for four tokens, the same bytes on 1 to 4 threads."""
    lengths = [1, 17, 100, 512] if isa not in ("base", "numpy") else [1, 40]
    by_threads = {n: _digests(smollm2_path, isa, n, lengths, 2) for n in (1, 2, 4)}
    assert by_threads[1] == by_threads[2] == by_threads[4], by_threads


def test_gemma3_logits_do_not_depend_on_threads(gemma3_path: Path) -> None:
    """Gemma 3 270M Q4_K_M (Q4_K, Q6_K, Q8_0 beside each other): the CPU's own kernels."""
    lengths = [1, 120]
    by_threads = {n: _digests(gemma3_path, _runnable_isas()[0], n, lengths, 2) for n in (1, 2)}
    assert by_threads[1] == by_threads[2], by_threads


LONG_PROMPT = (
    "The three primary colors are red, yellow and blue. Mixing them gives secondary colors: "
    "orange, green and purple. Painters have argued for centuries about which pigments make "
    "the purest hues. Write two sentences about that argument."
)


@pytest.mark.parametrize("cache_prompt", [False, True], ids=["fresh", "cached"])
def test_a_long_running_server_answers_a_request_the_same_each_time(
    smollm2_path: Path, cache_prompt: bool
) -> None:
    """The same greedy request, sent to one `frink serve` five times (the first call, when
    the steps' timed thread choices are still moving, included): the same tokens and the
    same log probabilities. Cached: later calls resume the prompt from the slot's cache."""
    openai = pytest.importorskip("openai")
    from serve_process import Server

    server = Server(smollm2_path, "-np", "2", "-c", "1024", "--backend", "numpy")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        answers = []
        for _ in range(5):
            r = client.chat.completions.create(
                model="SmolLM2-135M-Instruct.Q4_1",
                messages=[{"role": "user", "content": LONG_PROMPT}],
                temperature=0,
                max_tokens=24,
                logprobs=True,
                extra_body={"cache_prompt": cache_prompt},
            )
            content = r.choices[0].logprobs.content
            answers.append([(c.token, c.logprob) for c in content])
        assert len(answers[0]) >= 8
        assert all(a == answers[0] for a in answers[1:]), answers
    finally:
        server.stop()
        server.close()
