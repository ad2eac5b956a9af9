"""How many threads the BLAS library NumPy loaded may use, scoped to a block.

frink calls BLAS with one thread during a forward (backends/host/linear.py `step_threads`): a
multithreaded GEMM splits its work by the thread count, and where that split moves a
product's rounding (OpenBLAS's Haswell kernels do) the thread count would change the
logits. The product's own threads come from frink's tiles instead (quant/kernels.py).
Settings are restored on leaving each block, so a program embedding frink keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any


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

    def exactly(self, n: int) -> AbstractContextManager[None]:
        """n BLAS threads inside the block, more or fewer than now."""
        return self._set(n, lambda before: before != n)

    def limit(self, n: int | None) -> AbstractContextManager[None]:
        """At most n BLAS threads inside the block (None: leave BLAS as it is)."""
        if n is None:
            return nullcontext()
        return self._set(n, lambda before: before > n)

    @contextmanager
    def _set(self, n: int, change: Callable[[int], bool]) -> Iterator[None]:
        """n threads for each BLAS whose count `change` says to change; restored after."""
        changed = []
        for c in self._controllers():
            before = c.get_num_threads()
            if before is not None and change(before):
                c.set_num_threads(n)
                changed.append((c, before))
        try:
            yield
        finally:
            for c, before in changed:
                c.set_num_threads(before)


blas_threads = BlasThreads()
