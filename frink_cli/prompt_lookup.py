"""Prompt lookup: drafting from the history itself (`--spec ngram`, llama.cpp's
`--spec-type ngram-simple`), for answers that repeat their prompt (code edits, quoting,
extraction). It needs no second model, so a draft costs nothing to make; what it costs is
the verify step's rows, so it drafts only where a draft is likely to be kept.

- The match: the history's last `ngram_min` tokens found earlier in it; of the
  occurrences, the one whose match extends furthest back (up to `ngram_max` tokens), the
  latest of those. No occurrence: no draft (llama.cpp's ngram-simple likewise drafts only
  on a match of --spec-ngram-size-n tokens).
- The draft: the tokens that followed the match, as many as asked for.
- Edits learned from rejections: where a draft was rejected, the answer departed from the
  text it was copying; once the answer is back on that text (its last `ngram_min` tokens
  found again shortly after the departure), the departure is diffed token by token
  against what the answer wrote instead, and each replaced run (`q` -> `quantity`) is
  applied to later drafts. A code edit renames the same names throughout, so its later
  drafts carry the renames instead of being rejected at each of them.
- The length: what the verify step's rows cost against how often this generation's drafts
  have been kept (draft_budget.py): short or none on free text, up to the room where the
  answer copies.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import numpy as np

from .draft_budget import DraftBudget
from .speculative import SpecParams

# How far (tokens) an edit may reach: a longer departure is not learned from.
EDIT_SPAN = 12


class NgramDrafter:
    """Drafts the continuation of the best earlier match of the history's suffix, with the
    edits learned from earlier rejections applied."""

    reads_hidden = False

    def __init__(self, params: SpecParams, budget: DraftBudget | None = None) -> None:
        """budget: what sets each draft's length (a host target's, by default)."""
        self.n_min, self.n_max = params.ngram_min, params.ngram_max
        self.budget = budget if budget is not None else DraftBudget()
        self.edits: dict[tuple[int, ...], tuple[int, ...]] = {}  # a run -> its replacement
        # The last draft: (len(history) then, each drafted token's source index, tokens).
        self._last: tuple[int, list[int], list[int]] | None = None
        # A departure not learned yet: (source index, history index) where they parted.
        self._departed: tuple[int, int] | None = None

    def observe(self, start: int, hidden: np.ndarray) -> None:
        pass

    def prepare(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, history: Sequence[int], n: int) -> list[int]:
        h = [int(t) for t in history]
        self._learn(h)
        start = self._match(h) if n > 0 else None
        if start is None:
            return []
        n = self.budget.length(n)
        if n == 0:
            return []
        out: list[int] = []
        src: list[int] = []
        j = start
        while len(out) < n and j < len(h):
            orig, repl = self._edit_at(h, j)
            out += repl
            src += [j] * len(repl)
            j += len(orig)
        self._last = (len(h), src[:n], out[:n])
        return out[:n]

    def _match(self, h: list[int]) -> int | None:
        """Where the continuation of the best match of h's suffix starts, or None."""
        end, n = len(h), self.n_min
        if end <= n:
            return None
        arr = np.asarray(h, dtype=np.int64)
        key = arr[end - n :]
        best, best_len = None, 0
        for j in np.flatnonzero(arr[: end - n] == key[0])[::-1]:  # latest first
            j = int(j)
            if not np.array_equal(arr[j : j + n], key):
                continue
            size = n  # extend the match backwards
            while (
                size < self.n_max
                and j - (size - n) > 0
                and h[j - (size - n) - 1] == h[end - size - 1]
            ):
                size += 1
            if size > best_len:
                best, best_len = j + n, size
        return best

    def _edit_at(self, h: list[int], j: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the source run at j, what a draft writes for it): a learned edit, or h[j]."""
        for orig, repl in self.edits.items():
            if tuple(h[j : j + len(orig)]) == orig:
                return orig, repl
        return (h[j],), (h[j],)

    def _learn(self, h: list[int]) -> None:
        """Note how much of the last draft was kept (the budget's outcome) and where it was
        rejected; learn the edit once the answer is back on the text it copied."""
        if self._last is not None:
            at, src, drafted = self._last
            kept = 0
            while kept < len(drafted) and at + kept < len(h) and h[at + kept] == drafted[kept]:
                kept += 1
            if kept == len(drafted) or at + kept < len(h):
                self.budget.record(len(drafted), kept)
            if kept < len(drafted) and at + kept < len(h):
                self._departed = (src[kept], at + kept)
            self._last = None
        if self._departed is None:
            return
        s, d = self._departed
        end, n = len(h), self.n_min
        if end - d > EDIT_SPAN + n:  # too long a departure: not an edit
            self._departed = None
            return
        key = h[end - n :]
        for q in range(s, min(s + EDIT_SPAN, end - n) + 1):
            if h[q : q + n] == key and q + n <= d:  # back on the source text
                orig, repl = h[s:q], h[d : end - n]
                diff = difflib.SequenceMatcher(a=orig, b=repl, autojunk=False)
                for tag, i1, i2, j1, j2 in diff.get_opcodes():
                    if tag == "replace":
                        self.edits[tuple(orig[i1:i2])] = tuple(repl[j1:j2])
                self._departed = None
                return
