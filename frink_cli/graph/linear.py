"""Weight matmuls: x [T, in] -> x @ W.T + b over a (possibly fused) Linear, and how many
BLAS threads they get.

A decode row is ~150 small GEMVs per token. Split over OpenBLAS's threads, each call pays a
thread hand-off, and when another process holds the other core the hand-off waits a whole
scheduler slice: measured on the 2-core machine, a SmolLM2 decode token went from ~50 ms
to ~570 ms with 2 BLAS threads under load, and single-threaded GEMVs were faster even at
best (the layers' matrices are too small to gain from a second core). A prefill batch is a
few large GEMMs, which scale with cores. So decode steps run with one BLAS thread and
prefill batches with BLAS's own setting; the setting is restored after every step, so a
program embedding frink keeps its own.
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
                self._libs = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
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
