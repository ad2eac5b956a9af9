"""`frink bench`: tokens per second, measured the way llama-bench measures them.

People pick a runner by its numbers, and our goals are ratios against llama.cpp taken side
by side, so the method copies llama-bench's: synthetic token ids (tokenization and sampling
excluded), one warm-up, r repetitions; a prompt test (pp N) feeds N tokens to an empty
context as one batch, a generation test (tg N) feeds N tokens one at a time to an empty
context; both include the logits of the last row and nothing else. With -d D ("pp512 @
d4096") the context already holds D tokens, fed untimed before each run: speed at depth,
where attention over the cache is part of every token's cost. With a llama.cpp
comparison the two runners alternate repetition by repetition on the same GGUF and the same
ids, so a noisy shared machine slows both alike and the ratio stays meaningful.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .constraint import Constraint, Grammar, compile_constraint
from .errors import FrinkError
from .quant import kernels
from .report import checkpoint_facts
from .sampling import Sampler, SamplingParams

COMPARE_TARGETS = ("llama.cpp",)


@dataclass(frozen=True)
class BenchTest:
    name: str  # "pp512" | "tg128" | "tg128 @ d4096"
    n_prompt: int
    n_gen: int
    # Tokens already in the context when the clock starts (llama-bench's -d): filled,
    # untimed, before every run, so a test measures speed at that depth.
    n_depth: int = 0
    # "" (ids fed as they are), "free" or "json": a generation test whose tokens are
    # sampled (greedy) from the model's own logits each step, under a JSON-schema mask
    # for "json" (--constrained): the same loop either way, so the rows' ratio is what
    # the mask costs a decode token.
    decode: str = ""

    @property
    def n_ctx(self) -> int:
        # (a sampled test steps one id, untimed, for its first token's logits)
        return self.n_depth + self.n_prompt + self.n_gen + (1 if self.decode else 0)

    def warm_up(self) -> BenchTest:
        """The same test cut to one generated token (a prompt test stays whole)."""
        return self if self.n_prompt else replace(self, n_gen=1)


def bench_tests(
    n_prompt: int, n_gen: int, n_depth: int = 0, constrained: bool = False
) -> list[BenchTest]:
    """llama-bench's default pair: a prompt test and a generation test (0 skips one), each
    at a depth of n_depth tokens already in the context; with `constrained`, two more
    generation tests: sampled free and sampled under a JSON schema."""
    at = f" @ d{n_depth}" if n_depth else ""
    tests = []
    if n_prompt > 0:
        tests.append(BenchTest(f"pp{n_prompt}{at}", n_prompt, 0, n_depth))
    if n_gen > 0:
        tests.append(BenchTest(f"tg{n_gen}{at}", 0, n_gen, n_depth))
        if constrained:
            for kind in ("free", "json"):
                tests.append(BenchTest(f"tg{n_gen} {kind}{at}", 0, n_gen, n_depth, kind))
    if not tests:
        raise FrinkError("nothing to measure: -p/--n-prompt and -n/--n-gen are both 0")
    return tests


@dataclass
class Sample:
    seconds: float
    mask_seconds: float = 0.0  # of which in the constraint (mask and advance)
    submissions: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)


class Runner(Protocol):
    name: str  # what the table's backend column shows
    runner: str  # "frink" | "llama.cpp"

    def run(self, test: BenchTest, ids: np.ndarray) -> Sample: ...

    def threads(self, test: BenchTest) -> int: ...

    def close(self) -> None: ...


class FrinkRunner:
    """frink's decoder loop, with the active backend's ledger read around each sample."""

    runner = "frink"

    def __init__(self, model: Any, n_threads: int) -> None:
        self.model = model
        self.name = model.backend_name
        self.decoder = model.decoder
        self.n_threads = n_threads
        self._constraint: Constraint | None = None

    def _fresh_constraint(self) -> Constraint:
        """The bench schema's constraint in its start state (compiled once)."""
        if self._constraint is None:
            if self.model.tokenizer is None:
                raise FrinkError("--constrained needs the model's tokenizer")
            grammar = Grammar.json_schema(BENCH_SCHEMA, "--constrained")
            self._constraint = compile_constraint(self.model.tokenizer, grammar)[0]
        return self._constraint.copy()

    def threads(self, test: BenchTest) -> int:
        """Threads the test ran with (-t sets them)."""
        with kernels.threads(self.n_threads):
            n = kernels.current_threads()
        # Decode rows: where the decoder's timed choice (backends/host/linear.py) settled.
        return min(n, self.decoder.decode_threads.current) if test.n_gen else n

    def run(self, test: BenchTest, ids: np.ndarray) -> Sample:
        with kernels.threads(self.n_threads):
            return self._run(test, ids)

    def _run(self, test: BenchTest, ids: np.ndarray) -> Sample:
        dec = self.decoder
        d = test.n_depth
        # The context exists before the clock starts, as llama.cpp's does.
        cache = dec.new_cache(test.n_ctx)
        cache.reserve(test.n_ctx)
        if d:
            dec.step(ids[:d], cache)
        ledger = getattr(dec.backend, "ledger", None)
        if ledger is not None:
            ledger.reset()
        mask_seconds = 0.0
        if test.decode:
            seconds, mask_seconds = self._sampled(test, ids, cache)
        else:
            t0 = time.perf_counter()
            if test.n_prompt:
                dec.step(ids[d : d + test.n_prompt], cache)
            else:
                for i in range(d, d + test.n_gen):
                    dec.step(ids[i : i + 1], cache)
            seconds = time.perf_counter() - t0
        if ledger is None:
            return Sample(seconds, mask_seconds)
        return Sample(
            seconds,
            mask_seconds,
            Counter(ledger.submissions),
            Counter(ledger.refusals),
            Counter(getattr(ledger, "failures", {})),
        )

    def _sampled(self, test: BenchTest, ids: np.ndarray, cache: Any) -> tuple[float, float]:
        """(seconds, of which in the mask) for test.n_gen tokens each sampled greedily
        from the model's logits, masked for a "json" test; a grammar that ends starts
        again, so every token of the test is under it."""
        dec = self.decoder
        sampler = Sampler(SamplingParams(temperature=0.0), self.model.n_vocab)
        constraint = self._fresh_constraint() if test.decode == "json" else None
        d = test.n_depth
        logits = dec.step(ids[d : d + 1], cache)[-1]  # untimed: the first token's logits
        in_mask = 0.0
        t0 = time.perf_counter()
        for _ in range(test.n_gen):
            allowed = None
            if constraint is not None:
                m0 = time.perf_counter()
                allowed = constraint.allowed()
                in_mask += time.perf_counter() - m0
            token = sampler.sample(logits, (), allowed)
            if constraint is not None:
                m0 = time.perf_counter()
                if token in self.model.tokenizer.eog_ids or constraint.finished:
                    constraint = self._fresh_constraint()
                else:
                    constraint.accept(token)
                in_mask += time.perf_counter() - m0
            logits = dec.step(np.asarray([token]), cache)[-1]
        return time.perf_counter() - t0, in_mask

    def close(self) -> None:
        pass


# A JSON schema long enough that a greedy answer stays under it for a tg test (objects,
# strings, numbers, enums, an array), restarting when it ends.
BENCH_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 40},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "role": {"enum": ["admin", "user", "guest"]},
                    "bio": {"type": "string", "maxLength": 200},
                },
                "required": ["name", "age", "role", "bio"],
            },
        }
    },
    "required": ["people"],
}


# Set (to anything): llama.cpp runs without its extra CPU buffer types (AMX, repacked
# weights), ggml's plain CPU path. Some virtual machines advertise AMX, grant it, and then
# crash llama.cpp's AMX path (a segfault on the first decode of a quantized file); the test
# suite sets it, since its llama.cpp is a reference and the plain path is the same
# everywhere. Unset, llama.cpp runs as llama-bench would.
PLAIN_CPU_ENV = "FRINK_LLAMA_CPP_NO_EXTRA_BUFTS"


def llama_cpp_plain_cpu_buffers() -> None:
    """From now on, every llama.cpp model this process loads (llama-cpp-python's Llama and
    the C API alike take llama_model_default_params) uses no extra CPU buffer types."""
    import llama_cpp.llama_cpp as C

    if getattr(C.llama_model_default_params, "_frink_plain", False):
        return
    default = C.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    params._frink_plain = True  # type: ignore[attr-defined]
    C.llama_model_default_params = params


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python's C API, as llama-bench drives it: batches from
    llama_batch_get_one (logits of the last token only), the KV memory cleared per sample."""

    runner = "llama.cpp"
    name = "llama.cpp"

    @staticmethod
    def check(path: Path) -> Any:
        """The llama_cpp module, or a FrinkError saying why this comparison cannot run."""
        if path.is_dir() or path.suffix.lower() != ".gguf":
            raise FrinkError(f"--compare llama.cpp needs a GGUF file, not {path}")
        try:
            import llama_cpp
        except ImportError:
            raise FrinkError(
                "--compare llama.cpp needs llama-cpp-python (pip install llama-cpp-python)"
            ) from None
        return llama_cpp

    def __init__(self, path: Path, n_ctx: int, n_threads: int) -> None:
        llama_cpp = self.check(path)
        if os.environ.get(PLAIN_CPU_ENV):
            llama_cpp_plain_cpu_buffers()
        self._L = llama_cpp
        self.n_batch = 512
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=max(n_ctx, 64),
                n_batch=self.n_batch,
                n_ubatch=self.n_batch,
                # Its default is half the cores for generation; llama-bench uses them all.
                n_threads=n_threads,
                n_threads_batch=n_threads,
                verbose=False,
            )
        except (ValueError, RuntimeError) as e:
            raise FrinkError(f"llama.cpp cannot load {path}: {e}") from None
        self.ctx = self.llm.ctx
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_threads = n_threads
        self.name = f"llama.cpp ({n_threads} threads)"

    def threads(self, test: BenchTest) -> int:
        return self.n_threads

    def _prefill(self, ids: np.ndarray, start: int, stop: int) -> None:
        for i in range(start, stop, self.n_batch):
            self._decode(ids[i : min(i + self.n_batch, stop)])

    def _decode(self, tokens: np.ndarray) -> None:
        L = self._L
        arr = (L.llama_token * len(tokens))(*(int(t) for t in tokens))
        rc = L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise FrinkError(f"llama.cpp decode failed (code {rc})")

    def run(self, test: BenchTest, ids: np.ndarray) -> Sample:
        L = self._L
        L.llama_memory_clear(self.memory, True)
        d = test.n_depth
        self._prefill(ids, 0, d)
        L.llama_synchronize(self.ctx)
        t0 = time.perf_counter()
        if test.n_prompt:
            self._prefill(ids, d, d + test.n_prompt)
        else:
            for i in range(d, d + test.n_gen):
                self._decode(ids[i : i + 1])
        L.llama_synchronize(self.ctx)
        return Sample(time.perf_counter() - t0)

    def close(self) -> None:
        self.llm.close()


@dataclass
class ModelFacts:
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


def peak_memory_mib() -> float:
    """This process's peak resident memory in MiB (run, bench and info all report this).

    On Linux, VmHWM from /proc/self/status: the high-water mark of this address space
    alone. getrusage's ru_maxrss is not that: Linux carries the RSS a process had before
    execve into it, so a frink started by a big parent (a test runner holding models, a
    notebook) would report the parent's size as its own."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def llama_cpp_peak_mib(path: Path, n_ctx: int, n_threads: int, tests: list[BenchTest]) -> float:
    """llama.cpp's peak resident memory on the same file and context after the same warm-up
    work, measured in a child process: in this one frink's own memory would count too. It
    maps the file, so the pages it reads count, as they do for a llama-cli run."""
    import subprocess

    args = {
        "path": str(path),
        "n_ctx": n_ctx,
        "n_threads": n_threads,
        "tests": [[t.name, t.n_prompt, t.n_gen, t.n_depth] for t in tests],
    }
    code = "from frink_cli.bench import _llama_cpp_peak_child; _llama_cpp_peak_child()"
    r = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, timeout=600
    )
    if r.returncode != 0:
        raise FrinkError(f"llama.cpp's memory run failed: {r.stderr.strip()[-300:]}")
    return float(r.stdout.strip().splitlines()[-1])


def _llama_cpp_peak_child() -> None:
    args = json.loads(sys.argv[1])
    runner = LlamaCppRunner(Path(args["path"]), args["n_ctx"], args["n_threads"])
    ids = np.zeros(args["n_ctx"], np.int64) + 1
    for name, n_prompt, n_gen, n_depth in args["tests"]:
        runner.run(BenchTest(name, n_prompt, n_gen, n_depth).warm_up(), ids)
    print(peak_memory_mib())


@dataclass
class BenchRow:
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
    # Filled with --submissions (frink rows only; llama.cpp has no ledger). Decode rows
    # count per token, prefill rows per prefill, both averaged over the repetitions.
    submissions_per_token: float | None = None
    submissions: float | None = None
    submissions_by_kind: dict[str, float] | None = None
    refusals: dict[str, float] | None = None
    failures: dict[str, float] | None = None

    def to_dict(self, with_submissions: bool, with_compare: bool) -> dict[str, Any]:
        d = asdict(self)
        for k in ("mask_ms_per_token", "ratio_vs_free"):
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


def _row(
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
    (frink only)."""
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
    tests = bench_tests(n_prompt, n_gen, n_depth, constrained)
    n_ctx = max(t.n_ctx for t in tests)
    if n_ctx > model.config.n_ctx_train:
        raise FrinkError(
            f"test of {n_ctx} tokens exceeds the model's context of {model.config.n_ctx_train}"
        )
    n_threads = n_threads or os.cpu_count() or 1
    if compare:
        LlamaCppRunner.check(Path(model.checkpoint.path))  # before minutes of frink samples
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
            cpp_peak = llama_cpp_peak_mib(Path(model.checkpoint.path), n_ctx, n_threads, tests)
            say("loading llama.cpp")
            runners.append(LlamaCppRunner(Path(model.checkpoint.path), n_ctx, n_threads))
            for t in tests:
                say(f"{t.name}: warm-up (llama.cpp)")
                runners[1].run(t.warm_up(), ids)
        # The sampled pair runs rep by rep alternately too: their ratio is the figure.
        groups = [[t] for t in tests if not t.decode] + [[t for t in tests if t.decode]]
        for group in (g for g in groups if g):
            samples: dict[str, list[list[Sample]]] = {t.name: [[] for _ in runners] for t in group}
            for rep in range(repetitions):
                # Alternating rep by rep keeps both runners under the same machine load.
                for t in group:
                    for r, runner in enumerate(runners):
                        s = runner.run(t, ids)
                        samples[t.name][r].append(s)
                        say(
                            f"{t.name} rep {rep + 1}/{repetitions}: {runner.runner} "
                            f"{(t.n_prompt + t.n_gen) / s.seconds:.1f} t/s"
                        )
            for t in group:
                test_rows = [
                    _row(facts, runner, t, samples[t.name][r], submissions)
                    for r, runner in enumerate(runners)
                ]
                test_rows[0].peak_memory_mib = frink_peak
                if compare:
                    test_rows[1].peak_memory_mib = cpp_peak
                    test_rows[0].ratio_vs_llama_cpp = test_rows[0].avg_ts / test_rows[1].avg_ts
                rows.extend(test_rows)
        free = {row.test.replace(" free", " json"): row for row in rows if " free" in row.test}
        for row in rows:
            if row.test in free:
                row.ratio_vs_free = row.avg_ts / free[row.test].avg_ts
    finally:
        for runner in runners:
            runner.close()
    return rows


# --- output --------------------------------------------------------------------------------


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _ledger_cell(r: BenchRow) -> str:
    """Device submissions per decode token (tg rows) or per prompt (pp rows), then any
    refusals and failures per run, as `frink bench --submissions` reports them."""
    if r.submissions_by_kind is None:
        return ""
    n = r.submissions_per_token if r.submissions_per_token is not None else r.submissions
    cell = (
        f"{n:g}/{'token' if r.submissions_per_token is not None else 'prompt'}"
        if n is not None
        else ""
    )
    extra = [f"refused {k} x{v:g}" for k, v in (r.refusals or {}).items()]
    extra += [f"FAILED x{v:g}" for v in (r.failures or {}).values()]
    return "; ".join([cell, *extra]) if extra else cell


def format_md(rows: list[BenchRow], submissions: bool = False) -> str:
    """llama-bench's markdown table (plus the ratio to llama.cpp when compared, and the
    ledger's submissions with --submissions)."""
    compare = any(r.runner == "llama.cpp" for r in rows)
    head = ["model", "size", "params", "backend", "test", "t/s"]
    align = [":", "-:", "-:", ":", "-:", "-:"]
    if compare:
        head.append("vs llama.cpp")
        align.append("-:")
    if submissions:
        head.append("submissions")
        align.append("-:")
    lines = [
        "| " + " | ".join(head) + " |",
        "| "
        + " | ".join(("-" * 5 + a) if a.startswith("-") else (a + "-" * 5) for a in align)
        + " |",
    ]
    for r in rows:
        cells = [
            r.model,
            _size(r.model_size),
            _params(r.model_n_params),
            r.backend,
            r.test,
            f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}",
        ]
        if compare:
            cells.append(f"{r.ratio_vs_llama_cpp:.2f}x" if r.ratio_vs_llama_cpp is not None else "")
        if submissions:
            cells.append(_ledger_cell(r))
        lines.append("| " + " | ".join(cells) + " |")
    for r in rows:
        if r.ratio_vs_free is not None and r.mask_ms_per_token is not None:
            lines.append("")
            lines.append(
                f"{r.test}: {r.ratio_vs_free:.2f}x the free row's speed; the mask "
                f"{r.mask_ms_per_token:.2f} ms of a {1e3 / r.avg_ts:.1f} ms token"
            )
    peaks = [
        r.peak_memory_mib for r in rows if r.peak_memory_mib is not None and r.runner == "frink"
    ]
    cpp = [r.peak_memory_mib for r in rows if r.peak_memory_mib is not None and r.runner != "frink"]
    if peaks:
        lines.append("")
        line = f"peak memory (frink): {max(peaks):.0f} MiB"
        if cpp:
            line += f"; llama.cpp: {max(cpp):.0f} MiB ({max(peaks) / max(cpp):.2f}x)"
        lines.append(line)
    return "\n".join(lines) + "\n"


def format_json(rows: list[BenchRow], submissions: bool) -> str:
    compare = any(r.runner == "llama.cpp" for r in rows)
    return json.dumps([r.to_dict(submissions, compare) for r in rows], indent=2) + "\n"


def format_csv(rows: list[BenchRow], submissions: bool) -> str:
    compare = any(r.runner == "llama.cpp" for r in rows)
    dicts = [r.to_dict(submissions, compare) for r in rows]
    fields: list[str] = []
    for d in dicts:
        fields.extend(k for k in d if k not in fields)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for d in dicts:
        # Lists and dicts as JSON inside one cell, as llama-bench writes its samples.
        w.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in d.items()})
    return buf.getvalue()
