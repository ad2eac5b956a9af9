"""The submissions ledger shared by every backend.

A submission is one host<->device synchronization. Backends count every one through
`submit(kind)`, and every refusal through `refuse(reason)`; bench, parity and info read
the same counts, so no backend keeps its own tally.
"""

from __future__ import annotations

from collections import Counter


class Ledger:
    def __init__(self) -> None:
        self.submissions: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()

    def submit(self, kind: str, n: int = 1) -> None:
        self.submissions[kind] += n

    def refuse(self, reason: str) -> None:
        self.refusals[reason] += 1

    def total(self) -> int:
        return sum(self.submissions.values())

    def reset(self) -> None:
        self.submissions.clear()
        self.refusals.clear()
