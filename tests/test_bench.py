"""`frink bench`: the row schema, the table, the ledger columns and the llama.cpp comparison.

On a tiny random model, so the suite stays fast; speed itself is never asserted (it is what
the benchmark measures, on whatever machine runs it).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from frink_subprocess import assert_error, frink
from script_loader import load_script

import frink_cli
from frink_cli import bench as B
from frink_cli.backends import Refusal, Run
from frink_cli.backends.ledger import Ledger
from frink_cli.constraint import Constraint
from frink_cli.errors import FrinkError

ROW_KEYS = {"test", "n_prompt", "n_gen", "backend", "avg_ts", "stddev_ts", "samples_ts"}


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model: Callable[[str], Any]) -> Path:
    gguf = tiny_model("llama").gguf
    assert gguf is not None
    return gguf


def _check_row(row: dict[str, Any], test: str, n_prompt: int, n_gen: int, reps: int) -> None:
    assert ROW_KEYS <= set(row), row
    assert (row["test"], row["n_prompt"], row["n_gen"]) == (test, n_prompt, n_gen)
    assert len(row["samples_ts"]) == reps and len(row["samples_ns"]) == reps
    assert all(isinstance(v, float) and v > 0 for v in row["samples_ts"])
    assert row["avg_ts"] == pytest.approx(sum(row["samples_ts"]) / reps)
    assert row["stddev_ts"] >= 0
    # ns and t/s describe the same samples.
    n = n_prompt + n_gen
    for ns, ts in zip(row["samples_ns"], row["samples_ts"]):
        assert ts == pytest.approx(n / (ns * 1e-9))


def test_json_rows_have_the_documented_schema(tiny_gguf: Path) -> None:
    r = frink("bench", tiny_gguf, "-p", "8", "-n", "4", "-r", "2", "--json")
    assert r.returncode == 0, r.describe()
    rows = json.loads(r.stdout)  # stdout is the JSON alone; progress went to stderr
    assert [row["test"] for row in rows] == ["pp8", "tg4"]
    _check_row(rows[0], "pp8", 8, 0, 2)
    _check_row(rows[1], "tg4", 0, 4, 2)
    for row in rows:
        assert row["backend"] == "numpy" and row["runner"] == "frink"
        assert row["model_n_params"] > 0 and row["model_size"] == tiny_gguf.stat().st_size
        assert row["peak_memory_mib"] > 0
        # Ledger columns only when asked for.
        assert "submissions" not in row and "submissions_per_token" not in row
    assert "tg4 rep 2/2" in r.stderr


def test_markdown_table_is_the_default(tiny_gguf: Path) -> None:
    r = frink("bench", tiny_gguf, "-p", "4", "-n", "2", "-r", "1")
    assert r.returncode == 0, r.describe()
    lines = r.stdout.splitlines()
    assert lines[0] == "| model | size | params | backend | test | t/s |"
    assert set(lines[1]) <= set("|:- ")
    body = [line for line in lines[2:] if line.startswith("|")]
    assert [line.split("|")[5].strip() for line in body] == ["pp4", "tg2"]
    for line in body:
        mean, sd = line.split("|")[6].split("±")
        assert float(mean) > 0 and float(sd) >= 0
    assert any(line.startswith("peak memory") for line in lines)


def test_csv_and_md_flags(tiny_gguf: Path) -> None:
    r = frink("bench", tiny_gguf, "-p", "4", "-n", "0", "-r", "2", "--csv")
    assert r.returncode == 0, r.describe()
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 1 and rows[0]["test"] == "pp4"
    assert len(json.loads(rows[0]["samples_ts"])) == 2
    r = frink("bench", tiny_gguf, "-p", "0", "-n", "2", "-r", "1", "--md")
    assert r.returncode == 0, r.describe()
    assert "| tg2 |" in r.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("--json", "--csv"), ("--json", "--csv")),
        (("-r", "0"), ("--repetitions",)),
        (("-p", "0", "-n", "0"), ("nothing to measure",)),
        (("--compare", "vllm"), ("--compare", "vllm")),
    ],
)
def test_bad_bench_flags_are_one_line_errors(
    tiny_gguf: Path, args: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    assert_error(frink("bench", tiny_gguf, *args), *fragments)


class _CountingBackend:
    """Takes every layer but the first in one run and counts one submission per run, as a
    device backend would; the host body does the arithmetic."""

    name = "counting"

    def __init__(self, model: Any) -> None:
        self.ledger = Ledger()
        self.host = model.decoder.host
        self.n_layer = model.config.n_layer

    def bind(self, weights: Any) -> None:
        pass

    def plan(
        self, kind: str, layer: int, n_rows: int, cache: Any, positions: Any = None
    ) -> Run | Refusal:
        return Refusal("first layer stays home") if layer == 0 else Run(layer, self.n_layer)

    def run(self, run: Run, x: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        for layer in range(run.start, run.stop):
            x = self.host.layer(layer, x, positions, cache)
        self.ledger.submit("dense-run")
        return x


def test_submissions_rows_read_the_backend_ledger(tiny_gguf: Path) -> None:
    model = frink_cli.load(tiny_gguf)
    backend = _CountingBackend(model)
    model.decoder.backend = backend
    model.backend_name = backend.name
    rows = B.run_bench(model, n_prompt=6, n_gen=3, repetitions=2, submissions=True)
    data = json.loads(B.format_json(rows, submissions=True))
    pp, tg = data
    assert pp["backend"] == tg["backend"] == "counting"
    # One run per step: one submission per prefill, one per decoded token.
    assert pp["submissions"] == 1.0 and "submissions_per_token" not in pp
    assert tg["submissions_per_token"] == 1.0 and "submissions" not in tg
    assert pp["submissions_by_kind"] == {"dense-run": 1.0}
    assert tg["submissions_by_kind"] == {"dense-run": 1.0}
    assert pp["refusals"] == tg["refusals"] == {"first layer stays home": 1.0}
    assert pp["failures"] == {}
    # The markdown table (bench's default output) carries the same ledger figures.
    md = B.format_md(rows, submissions=True).splitlines()
    assert md[0].endswith("| submissions |")
    assert md[2].endswith("| 1/prompt; refused first layer stays home x1 |")
    assert md[3].endswith("| 1/token; refused first layer stays home x1 |")
    assert "submissions" not in B.format_md(rows)


def test_submissions_on_the_host_body_are_zero(tiny_gguf: Path) -> None:
    r = frink("bench", tiny_gguf, "-p", "4", "-n", "2", "-r", "1", "--json", "--submissions")
    assert r.returncode == 0, r.describe()
    pp, tg = json.loads(r.stdout)
    assert pp["submissions"] == 0 and tg["submissions_per_token"] == 0
    assert pp["submissions_by_kind"] == {} and tg["refusals"] == {}


def test_submissions_rows_from_a_real_backend(tiny_gguf: Path) -> None:
    pytest.importorskip("mlx.core")
    r = frink(
        "bench",
        tiny_gguf,
        "--backend",
        "metal",
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--json",
        "--submissions",
    )
    assert r.returncode == 0, r.describe()
    pp, tg = json.loads(r.stdout)
    assert pp["backend"] == tg["backend"] == "metal"
    assert pp["submissions"] >= 1 and tg["submissions_per_token"] >= 1
    assert sum(tg["submissions_by_kind"].values()) == pytest.approx(tg["submissions_per_token"])
    assert isinstance(tg["refusals"], dict)


def test_compare_llama_cpp_alternates_on_the_same_file(tiny_gguf: Path) -> None:
    pytest.importorskip("llama_cpp")
    r = frink(
        "bench", tiny_gguf, "-p", "8", "-n", "4", "-r", "2", "--compare", "llama.cpp", "--json"
    )
    assert r.returncode == 0, r.describe()
    rows = json.loads(r.stdout)
    assert [(row["runner"], row["test"]) for row in rows] == [
        ("frink", "pp8"),
        ("llama.cpp", "pp8"),
        ("frink", "tg4"),
        ("llama.cpp", "tg4"),
    ]
    for frink_row, cpp_row in (rows[0:2], rows[2:4]):
        _check_row(cpp_row, frink_row["test"], frink_row["n_prompt"], frink_row["n_gen"], 2)
        assert frink_row["ratio_vs_llama_cpp"] == pytest.approx(
            frink_row["avg_ts"] / cpp_row["avg_ts"]
        )
        assert cpp_row["ratio_vs_llama_cpp"] is None
        # llama.cpp's own peak memory (a child process), beside frink's.
        assert cpp_row["peak_memory_mib"] > 0 and frink_row["peak_memory_mib"] > 0
    # Alternating: each rep of frink is followed by one of llama.cpp.
    progress = [line for line in r.stderr.splitlines() if " rep " in line]
    assert [line.split(": ")[1].split()[0] for line in progress[:4]] == ["frink", "llama.cpp"] * 2

    r = frink("bench", tiny_gguf, "-p", "4", "-n", "0", "-r", "1", "--compare", "llama.cpp")
    assert r.returncode == 0, r.describe()
    header = r.stdout.splitlines()[0]
    assert header == "| model | size | params | backend | test | t/s | vs llama.cpp |"
    assert any(
        line.startswith("peak memory (frink): ") and "; llama.cpp: " in line
        for line in r.stdout.splitlines()
    ), r.stdout


def test_depth_fills_the_context_untimed_before_each_run(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """-d D: every run (warm-ups included) of both runners first feeds D tokens, then the
    test's own tokens after them; the rows say "@ dD" and carry n_depth."""
    model = frink_cli.load(tiny_gguf, backend="numpy")
    fed: list[tuple[int, int]] = []  # (rows fed, positions already held) per frink step
    step = model.decoder.step

    def recording_step(ids: Any, cache: Any, *a: Any, **k: Any) -> Any:
        fed.append((len(ids), cache.n_past))
        return step(ids, cache, *a, **k)

    monkeypatch.setattr(model.decoder, "step", recording_step)
    rows = B.run_bench(model, n_prompt=4, n_gen=2, n_depth=6, repetitions=1)
    assert [(r.test, r.n_prompt, r.n_gen, r.n_depth) for r in rows] == [
        ("pp4 @ d6", 4, 0, 6),
        ("tg2 @ d6", 0, 2, 6),
    ]
    warm_ups = [(6, 0), (4, 6), (6, 0), (1, 6)]
    timed = [(6, 0), (4, 6), (6, 0), (1, 6), (1, 7)]
    assert fed == warm_ups + timed


def test_llama_cpp_runs_at_the_same_depth(tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("llama_cpp")
    decoded: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        B.LlamaCppRunner, "_decode", lambda self, t: decoded.append(tuple(int(i) for i in t))
    )
    runner = B.LlamaCppRunner(tiny_gguf, 16, 1)
    try:
        for t in B.bench_tests(4, 2, 6):
            runner.run(t, np.arange(16))
    finally:
        runner.close()
    assert decoded == [(0, 1, 2, 3, 4, 5), (6, 7, 8, 9), (0, 1, 2, 3, 4, 5), (6,), (7,)]


def test_depth_beyond_the_models_context_is_refused(tiny_gguf: Path) -> None:
    assert_error(frink("bench", tiny_gguf, "-d", "1000000"), "exceeds the model's context")
    assert_error(frink("bench", tiny_gguf, "-d", "-1"), "-d/--n-depth")


def test_compare_llama_cpp_needs_a_gguf(tiny_model: Callable[[str], Any]) -> None:
    pytest.importorskip("llama_cpp")
    tiny = tiny_model("llama")
    assert_error(
        frink("bench", tiny.hf_dir, "-p", "4", "-n", "0", "--compare", "llama.cpp"), "GGUF"
    )


# --- the decode thread choice the benchmark numbers depend on (backends/host/linear.py) ---


def _drive(policy: Any, seconds: dict[int, float], steps: int) -> list[int]:
    """Run the policy over synthetic step times; the thread count of each step."""
    chosen = []
    for _ in range(steps):
        n = policy.choose()
        policy.record(n, seconds[n])
        chosen.append(n)
    return chosen


@pytest.fixture()
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads to choose from (the kernels' count; FRINK_THREADS unset)."""
    from frink_cli.quant import kernels

    monkeypatch.setattr(kernels, "current_threads", lambda: 2)
    monkeypatch.setattr(kernels, "FORCED_THREADS", None)


def test_decode_threads_settle_on_the_faster_setting(two_threads: None) -> None:
    from frink_cli.backends.host.linear import ThreadChoice

    # Idle machine: two threads are faster, and stay chosen.
    chosen = _drive(ThreadChoice(), {1: 0.030, 2: 0.024}, 200)
    assert chosen[0] == 1 and chosen[-50:].count(2) >= 48
    # Busy machine: two threads collapse; tries become rare (the interval doubles).
    p = ThreadChoice()
    chosen = _drive(p, {1: 0.035, 2: 0.300}, 2000)
    assert chosen.count(2) <= 10 and p.current == 1


def test_decode_threads_leave_a_wide_setting_that_turns_slow(two_threads: None) -> None:
    from frink_cli.backends.host.linear import ThreadChoice

    p = ThreadChoice()
    _drive(p, {1: 0.030, 2: 0.024}, 50)
    assert p.current == 2
    # Load arrives: within a few steps the policy is back on one thread.
    chosen = _drive(p, {1: 0.035, 2: 0.300}, 10)
    assert chosen.index(1) <= 3 and p.current == 1


def test_decode_threads_fixed_and_single_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    from frink_cli.backends.host import linear

    assert _drive(linear.ThreadChoice(fixed=2), {1: 0.01, 2: 1.0}, 20) == [2] * 20
    monkeypatch.setattr(linear.kernels, "current_threads", lambda: 1)
    monkeypatch.setattr(linear.kernels, "FORCED_THREADS", None)
    assert _drive(linear.ThreadChoice(), {1: 1.0, 2: 0.01}, 20) == [1] * 20


def test_prefill_layers_start_wide_and_follow_the_faster(two_threads: None) -> None:
    from frink_cli.backends.host.linear import ThreadChoice

    idle = _drive(ThreadChoice.for_prefill(), {1: 0.012, 2: 0.007}, 30)
    assert idle[0] == 2 and idle[1] == 1 and idle[2:].count(2) >= 24
    busy = _drive(ThreadChoice.for_prefill(), {1: 0.012, 2: 0.020}, 30)
    assert busy[:2] == [2, 1] and busy[2:].count(1) >= 24


# --- the fast paths the numbers come from, against llama.cpp --------------------------------
# The tiny fixtures' 40 tokens fit in one query block; these 150 take the blocked prefill
# (several blocks, a partial last one, gemma3's 6-token window cutting keys per block) and a
# prefill that continues a cached prefix, each checked against llama.cpp on the same GGUF.

LONG = 150
REF_TOL = 2e-3  # as tests/test_conformance.py: f32 summation-order room, no more


@pytest.mark.parametrize("name", ["llama", "gemma3_text", "qwen2"])
def test_blocked_prefill_matches_llama_cpp(tiny_model: Callable[[str], Any], name: str) -> None:
    pytest.importorskip("llama_cpp")
    make_tiny_models = load_script("make_tiny_models")

    from frink_cli.backends.host import attention

    tm = tiny_model(name)
    if tm.gguf is None:
        pytest.skip(f"{name}: no GGUF")
    assert LONG > 2 * attention.QUERY_BLOCK
    model = frink_cli.load(tm.gguf)
    tokens = make_tiny_models.fixture_tokens(seed=7, length=LONG, vocab=model.n_vocab)
    want = make_tiny_models.llama_cpp_logits(tm.gguf, tokens)

    whole = model.logits(tokens)
    assert np.abs(whole - want).max() <= REF_TOL

    dec = model.decoder
    cache = dec.new_cache(LONG)
    dec.step(tokens[:100], cache)
    rest = dec.step(tokens[100:], cache, all_logits=True)
    assert np.abs(rest - want[100:]).max() <= REF_TOL


@pytest.mark.real
def test_constrained_rows_put_every_token_under_the_schema(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--constrained adds a free and a JSON-schema sampled generation row, alternated rep
    by rep; the json row names the mask's time per token and its speed over the free
    row's; every token of the json row was one the mask allowed (Constraint.accept
    refuses any other: the run would fail)."""
    from frink_cli.api import load

    allowed_calls = []
    real_allowed = Constraint.allowed

    def counting(self: Any) -> Any:
        mask = real_allowed(self)
        allowed_calls.append(int(mask.sum()) if mask is not None else None)
        return mask

    monkeypatch.setattr(Constraint, "allowed", counting)
    model = load(smollm2_path)
    rows = B.run_bench(model, n_prompt=0, n_gen=6, repetitions=2, constrained=True)
    assert [r.test for r in rows] == ["tg6", "tg6 free", "tg6 json"]
    free, json_row = rows[1], rows[2]
    assert free.mask_ms_per_token is None and free.ratio_vs_free is None
    assert json_row.mask_ms_per_token is not None and json_row.mask_ms_per_token > 0
    assert json_row.ratio_vs_free == pytest.approx(json_row.avg_ts / free.avg_ts)
    # warm-up (1 token) + 2 reps of 6, each under a mask that narrows the vocabulary
    assert len(allowed_calls) == 13
    assert all(n is not None and 0 < n < 49152 for n in allowed_calls)
    table = B.format_md(rows)
    assert "tg6 json:" in table and "the free row's speed" in table
    with pytest.raises(FrinkError, match="--constrained"):
        B.run_bench(model, n_prompt=0, n_gen=4, constrained=True, compare="llama.cpp")


@pytest.mark.real
def test_speculative_rows_pair_plain_and_drafted_greedy(smollm2_path: Path) -> None:
    """--spec adds a plain greedy and a speculative greedy generation row from the code-edit
    prompt, alternated rep by rep; the spec row names its acceptance and its speed over the
    greedy row's; both generate the same tokens (greedy speculation is exact)."""
    from frink_cli.api import load
    from frink_cli.bench.cases import SPEC_PROMPT
    from frink_cli.speculative import SpecParams

    model = load(smollm2_path)
    model.speculate(SpecParams())
    rows = B.run_bench(model, n_prompt=0, n_gen=24, repetitions=1)
    assert [r.test for r in rows] == ["tg24", "tg24 greedy", "tg24 spec"]
    greedy, spec = rows[1], rows[2]
    assert greedy.acceptance is None and greedy.ratio_vs_greedy is None
    assert spec.acceptance is not None and 0 < spec.acceptance <= 1
    assert spec.ratio_vs_greedy == pytest.approx(spec.avg_ts / greedy.avg_ts)
    assert "tg24 spec:" in B.format_md(rows) and "accepted" in B.format_md(rows)
    ids = model.prompt_ids(SPEC_PROMPT)
    drafted = list(model.generate_ids(ids, max_tokens=24, temperature=0.0))
    model.speculate(None)
    assert drafted == list(model.generate_ids(ids, max_tokens=24, temperature=0.0))
    model.speculate(SpecParams())
    with pytest.raises(FrinkError, match="--spec / -md measure frink alone"):
        B.run_bench(model, n_prompt=0, n_gen=4, compare="llama.cpp")


def test_llama_cpp_is_given_the_cache_type_frink_was_given() -> None:
    """--compare runs llama.cpp on frink's -ctk/-ctv, named by ggml's own type ids (as
    gguf-py numbers them), and on llama.cpp's own default where frink runs its default; a
    quantized V cache turns on the flash attention llama.cpp reads it with."""
    from gguf import GGMLQuantizationType

    from frink_cli.bench.llamacpp import GGML_CACHE_TYPES, LLAMA_CPP_CACHE, cache_params
    from frink_cli.cache.kv_types import CACHE_TYPES

    assert set(GGML_CACHE_TYPES) == set(CACHE_TYPES)
    for name, ident in GGML_CACHE_TYPES.items():
        assert GGMLQuantizationType[name.upper()] == ident, name
    assert cache_params(LLAMA_CPP_CACHE) == {}
    assert cache_params(("bf16", "bf16")) == {"type_k": 30, "type_v": 30}
    assert cache_params(("f16", "q8_0")) == {"type_k": 1, "type_v": 8, "flash_attn": True}
