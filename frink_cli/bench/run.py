"""`frink bench`'s loop: check the arguments, warm each runner up, then run every test's
repetitions with the runners alternating rep by rep, and reduce the samples to rows."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FrinkError
from .cases import BenchTest, Runner, Sample, bench_tests, peak_memory_mib
from .frink import FrinkRunner
from .llamacpp import LlamaCppRunner, llama_cpp_peak_mib
from .rows import BenchRow, ModelFacts, bench_row, model_facts

COMPARE_TARGETS = ("llama.cpp",)


def _check_args(
    repetitions: int,
    n_prompt: int,
    n_gen: int,
    n_depth: int,
    compare: str | None,
    constrained: bool,
    speculative: bool = False,
) -> None:
    """A FrinkError naming the option for any argument run_bench cannot measure with."""
    if repetitions < 1:
        raise FrinkError(f"invalid value for -r/--repetitions: {repetitions} (must be >= 1)")
    if n_prompt < 0 or n_gen < 0 or n_depth < 0:
        raise FrinkError(
            "invalid test size: -p/--n-prompt, -n/--n-gen and -d/--n-depth must be >= 0"
        )
    if compare is not None and compare not in COMPARE_TARGETS:
        raise FrinkError(
            f"invalid value for --compare: {compare!r} (choose from {', '.join(COMPARE_TARGETS)})"
        )
    if constrained and compare:
        raise FrinkError("--constrained measures frink alone: leave out --compare")
    if constrained and n_gen == 0:
        raise FrinkError("--constrained needs a generation test (-n/--n-gen > 0)")
    if speculative and compare:
        raise FrinkError("--spec / -md measure frink alone: leave out --compare")
    if speculative and n_gen == 0:
        raise FrinkError("--spec / -md need a generation test (-n/--n-gen > 0)")


def _group_rows(
    group: list[BenchTest],
    runners: list[Runner],
    ids: np.ndarray,
    repetitions: int,
    say: Callable[[str], None],
    facts: ModelFacts,
    submissions: bool,
) -> list[BenchRow]:
    """The rows of a group of tests, their repetitions run alternately (rep by rep, test by
    test, runner by runner) so every runner measures under the same machine load."""
    samples: dict[str, list[list[Sample]]] = {t.name: [[] for _ in runners] for t in group}
    for rep in range(repetitions):
        for t in group:
            for r, runner in enumerate(runners):
                s = runner.run(t, ids)
                samples[t.name][r].append(s)
                say(
                    f"{t.name} rep {rep + 1}/{repetitions}: {runner.runner} "
                    f"{(t.n_prompt + t.n_gen) / s.seconds:.1f} t/s"
                )
    return [
        bench_row(facts, runner, t, samples[t.name][r], submissions)
        for t in group
        for r, runner in enumerate(runners)
    ]


def run_bench(
    model: Any,
    *,
    n_prompt: int = 512,
    n_gen: int = 128,
    n_depth: int = 0,
    repetitions: int = 3,
    n_threads: int | None = None,
    compare: str | None = None,
    submissions: bool = False,
    constrained: bool = False,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    """Measure `model` (a frink_cli.api.Model); rows in test order, frink's before
    llama.cpp's. `constrained` adds the sampled free and JSON-schema generation tests
    (frink only); a model set to speculate (Model.speculate) adds greedy generation, plain
    and speculative (frink only)."""
    speculative = model.speculation is not None
    _check_args(repetitions, n_prompt, n_gen, n_depth, compare, constrained, speculative)
    tests = bench_tests(n_prompt, n_gen, n_depth, constrained, speculative)
    n_ctx = max(t.n_ctx for t in tests)
    if n_ctx > model.config.n_ctx_train:
        raise FrinkError(
            f"test of {n_ctx} tokens exceeds the model's context of {model.config.n_ctx_train}"
        )
    n_threads = n_threads or os.cpu_count() or 1
    path = Path(model.checkpoint.path)
    if compare:
        LlamaCppRunner.check(path)  # before minutes of frink samples
    say = progress or (lambda _msg: None)
    facts = model_facts(model)
    # Synthetic ids, as llama-bench uses: the speed of a step does not depend on which
    # tokens it sees, and no tokenizer time enters the numbers.
    ids = np.random.default_rng(seed).integers(0, model.config.n_vocab, n_ctx, dtype=np.int64)

    runners: list[Runner] = [FrinkRunner(model, n_threads)]
    rows: list[BenchRow] = []
    try:
        # frink warms up before llama.cpp is loaded, so the peak memory it reports is its own.
        for t in tests:
            say(f"{t.name}: warm-up (frink)")
            runners[0].run(t.warm_up(), ids)
        frink_peak = peak_memory_mib()
        cpp_peak = None
        if compare:
            say("llama.cpp's peak memory (a child process)")
            # The cache types frink runs with (f16 by default, as llama.cpp's), llama.cpp too.
            types = model.decoder.cache_types
            cache = (types.k, types.v)
            cpp_peak = llama_cpp_peak_mib(path, n_ctx, n_threads, tests, cache)
            say("loading llama.cpp")
            runners.append(LlamaCppRunner(path, n_ctx, n_threads, cache))
            for t in tests:
                say(f"{t.name}: warm-up (llama.cpp)")
                runners[1].run(t.warm_up(), ids)
        # Each pair (sampled free / json; greedy / spec) runs rep by rep alternately too:
        # their ratio is the figure.
        groups = [[t] for t in tests if not t.decode] + [
            [t for t in tests if t.decode in pair]
            for pair in (("free", "json"), ("greedy", "spec"))
        ]
        for group in (g for g in groups if g):
            rows.extend(_group_rows(group, runners, ids, repetitions, say, facts, submissions))
    finally:
        for runner in runners:
            runner.close()
    for row in rows:
        row.peak_memory_mib = frink_peak if row.runner == "frink" else cpp_peak
    _set_ratios(rows, bool(compare))
    return rows


def _set_ratios(rows: list[BenchRow], compared: bool) -> None:
    """Each row's ratios: frink's against llama.cpp's next to it (compared), a JSON test's
    against its free one, a speculative test's against its greedy one."""
    if compared:
        for mine, theirs in zip(rows[::2], rows[1::2], strict=True):
            mine.ratio_vs_llama_cpp = mine.avg_ts / theirs.avg_ts
    free = {row.test.replace(" free", " json"): row for row in rows if " free" in row.test}
    greedy = {row.test.replace(" greedy", " spec"): row for row in rows if " greedy" in row.test}
    for row in rows:
        if row.test in free:
            row.ratio_vs_free = row.avg_ts / free[row.test].avg_ts
        if row.test in greedy:
            row.ratio_vs_greedy = row.avg_ts / greedy[row.test].avg_ts
