"""The submissions ledger shared by every backend.

A submission is one host<->device synchronization. Backends count every one through
`submit(kind)`, every refusal through `refuse(reason)` and every launch that failed after
admission through `fail(message)`; bench, parity and info read the same counts, so no
backend keeps its own tally. A failure is logged (stderr) the first time its message is
seen, not at every step it recurs.
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger("frink")


class Ledger:
    def __init__(self) -> None:
        self.submissions: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self._reported: set[str] = (
            set()
        )  # outlives reset(): a failure is told once per run of frink

    def submit(self, kind: str, n: int = 1) -> None:
        self.submissions[kind] += n

    def refuse(self, reason: str) -> None:
        self.refusals[reason] += 1

    def fail(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            log.warning("frink: backend failure, the host body runs these layers: %s", message)
        self.failures[message] += 1

    def total(self) -> int:
        return sum(self.submissions.values())

    def reset(self) -> None:
        self.submissions.clear()
        self.refusals.clear()
        self.failures.clear()
