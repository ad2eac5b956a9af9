"""How long a prompt-lookup draft pays (`--spec ngram`): its length weighed against what
the target's verify step costs for it.

A lookup draft costs nothing to make; it costs the verify step's rows. On the host a step's
rows go through the kernels in tiles (quant/native_kdots.h's kd_tile_rows: 1, 2, 4, 8),
and a verify step of k + 1 rows (logits for each) costs verify_cost(k + 1) single-row
steps: 2 rows 1.3, 4 rows 1.9, 8 rows 2.9, 16 rows 5.8 (measured on Qwen2.5-Coder-1.5B
Q4_K_M and 0.5B, AVX-512; docs/performance.md). A 15-token draft of which one token is kept
makes its step cost almost six; on free text, where a 3-token match is followed by the
prompt's next words about a third of the time, prompt lookup made decoding ~10% slower than
plain.

So each draft's length k maximises the expected tokens per unit of step cost,
(1 + E[kept | k]) / cost(k + 1), with k = 0 (no draft) worth 1. E[kept | k] treats each
drafted token as kept with probability a, given the ones before it were:
a (1 - a^k) / (1 - a). The estimate a comes from this generation's recent drafts, checked
against the tokens that followed them: (kept + PRIOR_KEPT) / (kept + breaks + PRIOR_KEPT +
PRIOR_BREAKS) over the last WINDOW drafts, a draft adding its kept tokens and one break
where it was cut short. The prior (0.875, worth four tokens) makes the first draft 7
tokens, one tile of verify rows; drafts shrink to 3 and 1 as they are cut, and stop where a
falls under about 0.3 (a 2-row step no longer pays). A step of 16 rows costs two of 8, so
15 tokens pay only where nearly every draft is kept whole (measured alike on a code edit).
While no draft is made the oldest outcome is forgotten every PROBE_AFTER refusals, so text
that starts copying later is found again.

Where the target's layers run on a backend (metal, cuda) a step's rows cost little more than
one (BACKEND_ROW_COST each): long drafts pay even where few of their tokens are kept.

The budget only sets the drafts' length: every draft is verified as ever, so the output is
unchanged.
"""

from __future__ import annotations

from collections import deque

WINDOW = 8  # drafts whose outcomes are kept
PRIOR_KEPT, PRIOR_BREAKS = 3.5, 0.5  # the estimate before any outcome: 0.875
PROBE_AFTER = 8  # refusals after which the oldest outcome is forgotten
TILE_ROWS = 8  # the host kernels' widest tile of x's rows
# The cost of a host step of 1..TILE_ROWS rows in single-row steps (the tiles of 1, 2, 4, 8).
TILE_COST = (0.0, 1.0, 1.3, 1.9, 1.9, 2.9, 2.9, 2.9, 2.9)
BACKEND_ROW_COST = 0.02  # a backend step's cost per row past the first


def verify_cost(rows: int, backend: bool) -> float:
    """A target step of `rows` rows in single-row steps: host tiles of TILE_ROWS rows and a
    tile for the rest, or (backend) little more than one step."""
    if backend:
        return 1.0 + BACKEND_ROW_COST * (rows - 1)
    full, rest = divmod(rows, TILE_ROWS)
    return full * TILE_COST[TILE_ROWS] + TILE_COST[rest]


def expected_kept(a: float, k: int) -> float:
    """The expected kept tokens of a k-token draft, each kept with probability a after the
    ones before it."""
    if a >= 1.0:
        return float(k)
    return a * (1.0 - a**k) / (1.0 - a)


class DraftBudget:
    """The length of each lookup draft (`length`), learned from the outcomes `record`ed."""

    def __init__(self, backend: bool = False) -> None:
        self.backend = backend
        self.outcomes: deque[tuple[int, bool]] = deque(maxlen=WINDOW)  # (kept, cut short)
        self._refused = 0

    @property
    def acceptance(self) -> float:
        """The estimated probability that a drafted token is kept after those before it."""
        kept = sum(k for k, _ in self.outcomes)
        breaks = sum(1 for _, cut in self.outcomes if cut)
        return (kept + PRIOR_KEPT) / (kept + breaks + PRIOR_KEPT + PRIOR_BREAKS)

    def record(self, drafted: int, kept: int) -> None:
        """A draft of `drafted` tokens of which the first `kept` were the target's."""
        self.outcomes.append((kept, kept < drafted))

    def length(self, room: int) -> int:
        """The draft length (0..room) with the most expected tokens per unit of step cost."""
        a = self.acceptance
        best, best_rate = 0, 1.0
        for k in range(1, room + 1):
            rate = (1.0 + expected_kept(a, k)) / verify_cost(k + 1, self.backend)
            if rate > best_rate + 1e-9:
                best, best_rate = k, rate
        if best == 0:
            self._refused += 1
            if self._refused >= PROBE_AFTER and self.outcomes:
                self.outcomes.popleft()
                self._refused = 0
        else:
            self._refused = 0
        return best
