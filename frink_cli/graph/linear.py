"""Weight matmuls: x [T, in] -> x @ W.T + b over a (possibly fused) Linear, and how many
BLAS threads they get.

A decode row is ~150 GEMVs per token, bound by reading f32 weights: one core streams them
at ~18 GB/s here, two at ~37 GB/s, so when the machine is idle two BLAS threads make a
SmolLM2 token ~20% faster. But OpenBLAS splits every call between its threads and waits
for both; when another process holds the other core, each of those waits can last a
scheduler slice, and a token went from ~50 ms to ~570 ms under load. Which one wins is
a property of the moment, not of the model, so decode steps choose by timing themselves
(ThreadChoice): they run on one thread, try all of BLAS's threads now and then, keep
whichever was faster, and drop back at once when the wide setting turns slow. The thread
count does not change results (OpenBLAS gives bit-identical GEMV/GEMM output for 1 or 2
threads). Prefill batches are a few large GEMMs per layer, which scale with cores on an
idle machine (SmolLM2 pp512: ~530 tok/s on two threads, ~320 on one) and lose to one
thread under load (~210 vs ~320 with one busy process): a prefill starts wide and its
layers, alike in cost, are the timed units. The setting is restored after every step,
so a program embedding frink keeps its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..model.weights import Linear


def linear(x: np.ndarray, lin: Linear) -> np.ndarray:
    y = x @ lin.w.T
    if lin.b is not None:
        y += lin.b
    return y


class BlasThreads:
    """Limits the BLAS libraries NumPy loaded (through threadpoolctl, when installed)."""

    def __init__(self) -> None:
        self._libs: list[Any] | None = None

    def _controllers(self) -> list[Any]:
        if self._libs is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:  # an optional nicety: without it BLAS keeps its own setting
                self._libs = []
            else:
                self._libs = [
                    c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"
                ]
        return self._libs

    def current(self) -> int | None:
        """BLAS's thread count now (None when no BLAS library can be asked)."""
        counts = [c.get_num_threads() for c in self._controllers()]
        return max((n for n in counts if n is not None), default=None)

    @contextmanager
    def limit(self, n: int | None) -> Iterator[None]:
        """At most n BLAS threads inside the block (None: leave BLAS as it is)."""
        changed = []
        if n is not None:
            for c in self._controllers():
                before = c.get_num_threads()
                if before is not None and before > n:
                    c.set_num_threads(n)
                    changed.append((c, before))
        try:
            yield
        finally:
            for c, before in changed:
                c.set_num_threads(before)


blas_threads = BlasThreads()


class ThreadChoice:
    """Picks BLAS threads between 1 and BLAS's own count by timing the work they do.

    `choose()` before a unit of work (a decode step; a prefill layer), `record(n, seconds)`
    after it; units must be alike in cost. The current choice is kept while its running
    average holds; the other one is tried after `interval` units, the interval doubling
    each time the try loses (so a machine under load pays for a slow wide unit rarely) and
    resetting when it wins (by at least MARGIN). A wide setting whose average grows past
    FALLBACK times the last one-thread time is left at once.
    """

    MARGIN = 0.95
    FALLBACK = 1.5
    ALPHA = 0.25

    def __init__(
        self,
        fixed: int | None = None,
        *,
        start_wide: bool = False,
        first_try: int = 4,
        base_interval: int = 16,
        max_interval: int = 1024,
    ) -> None:
        self.fixed = fixed  # a thread count to use always (None: choose by timing)
        self.current = 0 if start_wide else 1  # 0: BLAS's own count, once it is known
        self.wide = 1  # BLAS's own thread count, read at each choice (a caller may cap it)
        self.average: dict[int, float] = {}
        self._countdown = first_try
        self._base = self._interval = base_interval
        self._max = max_interval

    @classmethod
    def for_prefill(cls) -> ThreadChoice:
        """Over prefill layers: wide first (a prefill's GEMMs scale with cores on an idle
        machine), one thread tried on the next layer, then less and less often."""
        return cls(start_wide=True, first_try=1, base_interval=4)

    def choose(self) -> int:
        if self.fixed is not None:
            return self.fixed
        self.wide = blas_threads.current() or 1
        if self.current == 0:
            self.current = self.wide
        if self.wide <= 1:
            return 1
        if self._countdown <= 0:
            return 1 if self.current != 1 else self.wide
        return self.current

    def record(self, n: int, seconds: float) -> None:
        if self.fixed is not None or self.wide <= 1:
            return
        avg = self.average
        if n == self.current:
            prev = avg.get(n)
            avg[n] = seconds if prev is None else prev + self.ALPHA * (seconds - prev)
            self._countdown -= 1
            one = avg.get(1)
            if n != 1 and one is not None and avg[n] > self.FALLBACK * one:
                self._switch(1, won=True)
        else:  # a try of the other setting: one fresh sample against the running average
            avg[n] = seconds
            self._switch(n, won=seconds < self.MARGIN * avg.get(self.current, float("inf")))

    def _switch(self, n: int, won: bool) -> None:
        if won:
            self.current = n
            self._interval = self._base
        else:
            self._interval = min(2 * self._interval, self._max)
        self._countdown = self._interval
