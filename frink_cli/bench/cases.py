"""What `frink bench` measures: a test (pp N / tg N at a depth), one sample of it, the
runner protocol both runners follow, and the peak-memory reading every report uses."""

from __future__ import annotations

import resource
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from ..errors import FrinkError


@dataclass(frozen=True)
class BenchTest:
    """One test of llama-bench's kind: n_prompt tokens as one batch or n_gen one at a time,
    after n_depth tokens already in the context."""

    name: str  # "pp512" | "tg128" | "tg128 @ d4096"
    n_prompt: int
    n_gen: int
    # Tokens already in the context when the clock starts (llama-bench's -d): filled,
    # untimed, before every run, so a test measures speed at that depth.
    n_depth: int = 0
    # "" (ids fed as they are), "free" or "json": a generation test whose tokens are
    # sampled (greedy) from the model's own logits each step, under a JSON-schema mask
    # for "json" (--constrained): the same loop either way, so the rows' ratio is what
    # the mask costs a decode token. "greedy" or "spec" (--spec / -md): n_gen tokens
    # generated greedily from SPEC_PROMPT (end-of-generation ignored), plainly or
    # speculatively: their ratio is what speculation gains.
    decode: str = ""

    @property
    def n_ctx(self) -> int:
        # (a sampled test steps one id, untimed, for its first token's logits)
        return self.n_depth + self.n_prompt + self.n_gen + (1 if self.decode else 0)

    def warm_up(self) -> BenchTest:
        """The same test cut to one generated token (a prompt test stays whole)."""
        return self if self.n_prompt else replace(self, n_gen=1)


def bench_tests(
    n_prompt: int,
    n_gen: int,
    n_depth: int = 0,
    constrained: bool = False,
    speculative: bool = False,
) -> list[BenchTest]:
    """llama-bench's default pair: a prompt test and a generation test (0 skips one), each
    at a depth of n_depth tokens already in the context; with `constrained`, two more
    generation tests: sampled free and sampled under a JSON schema; with `speculative`,
    greedy generation from SPEC_PROMPT, plain and speculative."""
    at = f" @ d{n_depth}" if n_depth else ""
    tests = []
    if n_prompt > 0:
        tests.append(BenchTest(f"pp{n_prompt}{at}", n_prompt, 0, n_depth))
    if n_gen > 0:
        tests.append(BenchTest(f"tg{n_gen}{at}", 0, n_gen, n_depth))
        if constrained:
            for kind in ("free", "json"):
                tests.append(BenchTest(f"tg{n_gen} {kind}{at}", 0, n_gen, n_depth, kind))
        if speculative:
            for kind in ("greedy", "spec"):
                tests.append(BenchTest(f"tg{n_gen} {kind}", 0, n_gen, 0, kind))
    if not tests:
        raise FrinkError("nothing to measure: -p/--n-prompt and -n/--n-gen are both 0")
    return tests


@dataclass
class Sample:
    """One timed repetition of a test, with the device ledger's counts over it."""

    seconds: float
    mask_seconds: float = 0.0  # of which in the constraint (mask and advance)
    submissions: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    drafted: int = 0  # speculative tests: tokens drafted, and how many were kept
    accepted: int = 0
    # Under --mem-budget (experts left in the file): the expert cache's (hits, misses,
    # bytes read) over the timed part.
    experts: tuple[int, int, int] | None = None


class Runner(Protocol):
    name: str  # what the table's backend column shows
    runner: str  # "frink" | "llama.cpp"

    def run(self, test: BenchTest, ids: np.ndarray) -> Sample: ...

    def threads(self, test: BenchTest) -> int: ...

    def close(self) -> None: ...


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


# The speculative tests' prompt: a code edit whose answer repeats most of the prompt, the
# case prompt lookup is for (and where a draft model agrees with its target most).
SPEC_PROMPT = """Rename the function `calc` to `order_total` and its parameter `q` to \
`quantity` everywhere in this code. Reply with the whole code and nothing else.

```python
PRICES = {"apple": 0.5, "pear": 0.75, "plum": 0.4}


def calc(item, q):
    if item not in PRICES:
        raise KeyError(f"unknown item: {item}")
    if q < 0:
        raise ValueError("q must not be negative")
    price = PRICES[item] * q
    if q >= 10:
        price = price * 0.9
    return round(price, 2)


def receipt(order):
    lines = []
    for item, q in order.items():
        lines.append(f"{item:>8} x{q:<3} {calc(item, q):8.2f}")
    lines.append(f"{'total':>8}      {sum(calc(i, q) for i, q in order.items()):8.2f}")
    return "\\n".join(lines)
```"""
