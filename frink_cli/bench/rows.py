"""`frink bench`'s result rows: the model columns (the facts `frink info` reports) and a
test's samples reduced to llama-bench's row (mean and sample deviation, ledger counts)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..report import checkpoint_facts
from .cases import BenchTest, Runner, Sample


@dataclass
class ModelFacts:
    """The model columns of every row."""

    desc: str  # "llama 135M Q4_1"
    filename: str
    size_bytes: int
    n_params: int


def model_facts(model: Any) -> ModelFacts:
    """The model columns, from the same facts `frink info` reports (report.py)."""
    ckpt = model.checkpoint
    facts = checkpoint_facts(ckpt)
    qtype = _file_type(ckpt.metadata.get("general.file_type"))
    if qtype is None:
        # No file type recorded (safetensors, or a GGUF without the key): the stored type
        # holding most of the matrices' weights.
        by_type: Counter[str] = Counter()
        for i in (ckpt.tensors.info(n) for n in ckpt.tensors.names()):
            if len(i.shape) >= 2:
                by_type[i.dtype] += int(np.prod(i.shape))
        qtype = by_type.most_common(1)[0][0] if by_type else "F32"
    desc = f"{model.config.arch} {_human_params(facts.n_params)} {qtype}"
    return ModelFacts(desc, Path(ckpt.path).name, facts.file_bytes, facts.n_params)


def _file_type(value: Any) -> str | None:
    """GGUF's general.file_type as llama-bench names it ("Q4_K_M"): a quantization mix
    names itself, where the type of its largest tensor would not (Gemma 3's Q4_K_M file
    keeps its 262k-row embedding in Q8_0)."""
    try:
        from gguf import LlamaFileType

        name = LlamaFileType(int(value)).name
    except (ImportError, TypeError, ValueError):
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _human_params(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


@dataclass
class BenchRow:
    """One test's result for one runner: llama-bench's JSON row, plus frink's columns."""

    model: str
    model_filename: str
    model_size: int
    model_n_params: int
    runner: str
    backend: str
    n_threads: int
    test: str
    n_prompt: int
    n_gen: int
    n_depth: int
    avg_ns: float
    stddev_ns: float
    avg_ts: float
    stddev_ts: float
    samples_ns: list[float]
    samples_ts: list[float]
    peak_memory_mib: float | None = None
    ratio_vs_llama_cpp: float | None = None
    # Sampled tests (--constrained): ms per token spent in the constraint, and the
    # "json" row's speed over the "free" row's.
    mask_ms_per_token: float | None = None
    ratio_vs_free: float | None = None
    # Speculative tests (--spec / -md): drafted tokens the target kept, and the "spec"
    # row's speed over the plain "greedy" row's.
    acceptance: float | None = None
    ratio_vs_greedy: float | None = None
    # Filled with --submissions (frink rows only; llama.cpp has no ledger). Decode rows
    # count per token, prefill rows per prefill, both averaged over the repetitions.
    submissions_per_token: float | None = None
    submissions: float | None = None
    submissions_by_kind: dict[str, float] | None = None
    refusals: dict[str, float] | None = None
    failures: dict[str, float] | None = None
    # Under --mem-budget (frink rows whose experts stay in the file): the share of chosen
    # experts the cache held, and the bytes read from the file per token.
    expert_hit_rate: float | None = None
    expert_bytes_per_token: float | None = None

    def to_dict(self, with_submissions: bool, with_compare: bool) -> dict[str, Any]:
        d = asdict(self)
        for k in (
            "mask_ms_per_token",
            "ratio_vs_free",
            "acceptance",
            "ratio_vs_greedy",
            "expert_hit_rate",
            "expert_bytes_per_token",
        ):
            if d[k] is None:
                d.pop(k)
        if not with_compare:
            d.pop("ratio_vs_llama_cpp")
        if not with_submissions:
            for k in (
                "submissions_per_token",
                "submissions",
                "submissions_by_kind",
                "refusals",
                "failures",
            ):
                d.pop(k)
        elif self.n_gen:
            d.pop("submissions")
        else:
            d.pop("submissions_per_token")
        return d


def _stats(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    # Sample standard deviation, as llama-bench reports it.
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def bench_row(
    facts: ModelFacts, runner: Runner, test: BenchTest, samples: list[Sample], submissions: bool
) -> BenchRow:
    n_tokens = test.n_prompt + test.n_gen
    ns = [s.seconds * 1e9 for s in samples]
    ts = [n_tokens / s.seconds for s in samples]
    avg_ns, sd_ns = _stats(ns)
    avg_ts, sd_ts = _stats(ts)
    row = BenchRow(
        facts.desc,
        facts.filename,
        facts.size_bytes,
        facts.n_params,
        runner.runner,
        runner.name,
        runner.threads(test),
        test.name,
        test.n_prompt,
        test.n_gen,
        test.n_depth,
        avg_ns,
        sd_ns,
        avg_ts,
        sd_ts,
        ns,
        ts,
    )
    if test.decode == "json":
        row.mask_ms_per_token = (
            sum(s.mask_seconds for s in samples) * 1e3 / (len(samples) * test.n_gen)
        )
    if test.decode == "spec":
        drafted = sum(s.drafted for s in samples)
        row.acceptance = sum(s.accepted for s in samples) / drafted if drafted else 0.0
    counted = [s.experts for s in samples if s.experts is not None]
    if counted:
        hits, misses, read = (sum(c[i] for c in counted) for i in range(3))
        row.expert_hit_rate = hits / (hits + misses) if hits + misses else 0.0
        row.expert_bytes_per_token = read / (len(counted) * n_tokens)
    if submissions and runner.runner == "frink":
        per = len(samples) * (test.n_gen or 1)
        kinds: Counter[str] = Counter()
        refusals: Counter[str] = Counter()
        failures: Counter[str] = Counter()
        for s in samples:
            kinds.update(s.submissions)
            refusals.update(s.refusals)
            failures.update(s.failures)
        total = sum(kinds.values()) / per
        if test.n_gen:
            row.submissions_per_token = total
        else:
            row.submissions = total
        row.submissions_by_kind = {k: v / per for k, v in sorted(kinds.items())}
        row.refusals = {k: v / per for k, v in sorted(refusals.items())}
        row.failures = {k: v / per for k, v in sorted(failures.items())}
    return row
