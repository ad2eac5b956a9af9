"""Weight matmuls: x [T, in] -> x @ W.T + b over a (possibly fused) Linear, and how many
threads they get.

Which kernel: a sequence's few rows (up to SMALL_ROWS: a decode row, a short prompt) go
through the compiled small-batch product (quant.kernels.matmul_f32, C), a prompt's
chunk through BLAS's GEMM. On SmolLM2's matrices, streamed from memory, the kernel reads
f32 weights at ~21 GB/s on one core and ~28 on two where OpenBLAS's GEMV reads ~12 and
~21 (its column-major GEMV ~18 on one), and 8 rows take it 0.5x OpenBLAS's GEMM time
(which packs W first): a decode token ~1.3x faster, a server's batch of eight ~2x. Its
sums run in one order for any row count, and a batched step multiplies each sequence's
rows as it would alone (`product`, `sequences`), so a sequence's numbers never depend on
what is stepped beside it: a server answers a request as it would answer it alone.
Without the compiled kernels everything is BLAS's (a row's sums then differ between GEMV and GEMM).

Threads: when another process holds a core, a step split over two threads waits on it
(a SmolLM2 token went from ~50 ms to ~570 ms under load), and on an idle machine two
threads are faster. Which one wins is a property of the moment, not of the model, so
steps choose by timing themselves (ThreadChoice): decode steps run on one thread, try two
now and then, keep whichever was faster, and drop back at once when the wide setting
turns slow; prefill layers, alike in cost, start wide and are the timed units. The thread
count never changes a result (each output element is one thread's sum; OpenBLAS's output
is bit-identical on 1 or 2 threads). The count goes to the pool doing the step's heavy
work, the other pool gets one thread (`step_threads`: both spin-wait after a call and
fight over the cores). The settings are restored after every step, so a program
embedding frink keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

import numpy as np

from ..model.weights import Linear
from ..quant import kernels
from ..quant.blocks import QuantRows

# Up to this many rows of a sequence go through the compiled small-batch product (quant.
# kernels.matmul_f32), more through BLAS: a decode row, a server's batch of them, a short
# prompt's rows (see the module note for the figures).
SMALL_ROWS = kernels.SMALL_T

# The row counts of the sequences whose rows one step carries, in row order (Decoder.
# step_batch sets it; None: x is one sequence's rows).
_sequences: ContextVar[tuple[int, ...] | None] = ContextVar("frink_sequences", default=None)


@contextmanager
def sequences(rows: Sequence[int]) -> Iterator[None]:
    """The linears inside the block see x's rows as these sequences' rows, in order."""
    token = _sequences.set(tuple(int(n) for n in rows))
    try:
        yield
    finally:
        _sequences.reset(token)


def linear(x: np.ndarray, lin: Linear) -> np.ndarray:
    y = product(x, lin.w)
    if lin.b is not None:
        y += lin.b
    return y


def row_sequences() -> tuple[int, ...] | None:
    """The sequences' row counts the current step carries (None outside a batched step)."""
    return _sequences.get()


def product(
    x: np.ndarray, w: np.ndarray | QuantRows, rows: Sequence[int] | None = None
) -> np.ndarray:
    """x @ w.T (w f32 [out, in] or in the file's blocks), each sequence's rows computed
    exactly as they would be alone.

    `rows`: the row counts of the sequences x's rows belong to, in order (default: the
    step's, when x has all its rows; else x is one sequence). A sequence with up to
    SMALL_ROWS rows is multiplied by the compiled kernel, whose sums do not depend on
    the rows beside them, so all such rows share one call (one pass over W for a whole
    decode batch); a longer one (a prompt chunk) is one BLAS GEMM of its own rows (over
    tiles of W dequantized, for blocks), as it would be alone. So a server's answer does
    not change with what else it is serving."""
    if rows is None:
        rows = _sequences.get()
        if rows is None or sum(rows) != x.shape[0]:
            rows = (x.shape[0],)
    few_kernel, many_kernel = _kernels(w)
    if all(n <= SMALL_ROWS for n in rows):
        return few_kernel(x, w)
    if len(rows) == 1:
        return _many(many_kernel, x, w)
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    ends = np.cumsum(rows)
    few = [np.arange(e - n, e) for n, e in zip(rows, ends) if n <= SMALL_ROWS]
    if few:
        idx = np.concatenate(few)
        # One kernel thread beside BLAS's: each pool spin-waits on the cores the other is
        # about to use (see quant.kernels), and these rows are a sliver of the step's work.
        with kernels.threads(1):
            y[idx] = few_kernel(x[idx], w)
    for n, e in zip(rows, ends):
        if n > SMALL_ROWS:
            y[e - n : e] = _many(many_kernel, x[e - n : e], w)
    return y


Kernel = Callable[[np.ndarray, Any], np.ndarray]


def _many(kernel: Kernel, x: np.ndarray, w: np.ndarray | QuantRows) -> np.ndarray:
    """A prompt chunk's product. Where a prompt's products run on AMX tiles the step gave
    its cores to the compiled kernels (`step_threads`); a weight the tiles do not take (f32,
    F16, BF16) goes to BLAS, which gets them back for the call."""
    on_tiles = isinstance(w, QuantRows) and all(kernels.on_tiles(p) for p in w.parts)
    if on_tiles or not kernels.prompt_tiles():
        return kernel(x, w)
    with blas_threads.exactly(kernels.current_threads()), kernels.threads(1):
        return kernel(x, w)


def _kernels(w: np.ndarray | QuantRows) -> tuple[Kernel, Kernel]:
    """(few rows' kernel, many rows' kernel) for w."""
    if isinstance(w, QuantRows):
        return _blocks_few, _blocks_many
    if kernels.compiled() and w.dtype == np.float32 and w.flags.c_contiguous:
        return kernels.matmul_f32, _blas
    # No compiled kernels: BLAS for all (a row's sums then differ between GEMV and GEMM).
    return _blas, _blas


def _blas(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x @ w.T


def _blocks_few(x: np.ndarray, w: QuantRows) -> np.ndarray:
    return _by_part(x, w, kernels.dots)


def _blocks_many(x: np.ndarray, w: QuantRows) -> np.ndarray:
    return _by_part(x, w, kernels.matmul)


def _by_part(x: np.ndarray, w: QuantRows, kernel: Callable[..., np.ndarray]) -> np.ndarray:
    if len(w.parts) == 1:
        return kernel(x, w.parts[0])
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    for p, r0 in zip(w.parts, w.offsets()):
        y[:, r0 : r0 + p.rows] = kernel(x, p)
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


def few_rows(rows: Sequence[int]) -> bool:
    """Whether every sequence of a step has few enough rows for the compiled product."""
    return all(n <= SMALL_ROWS for n in rows)


@contextmanager
def step_threads(n: int | None, few: bool) -> Iterator[None]:
    """n threads for a step's linears: the compiled kernels' (`few`: decode rows) or BLAS's
    (prompt chunks), and one for the other pool. Both pools spin-wait on the cores after a
    call, so two wide pools in one step fight: a SmolLM2 decode token with both at two
    threads took 263 ms where either alone took 30 (quant.kernels). n None: BLAS's own."""
    if few or kernels.prompt_tiles():
        # (a prompt's products on AMX tiles run in the compiled kernels' pool too: BLAS is
        # left attention's products: Gemma 3 270M's prefill ran 852 -> 1035 tokens/s with
        # this split against BLAS wide beside the tiles)
        wide = n if n is not None else blas_threads.current()
        with blas_threads.limit(1), kernels.threads(wide):
            yield
    else:
        with blas_threads.limit(n), kernels.threads(1):
            yield


def host_ways() -> int:
    """2 where a prompt step's NumPy work (attention's query blocks, the FFN's activation)
    may go two ways now, else 1: its products run on AMX tiles, so the step's cores are
    the compiled kernels' (`step_threads`) and BLAS, one thread, leaves the second core
    idle between them. Without tiles OpenBLAS's wide workers spin on that core after each
    GEMM: a second Python thread gained nothing there."""
    return 2 if kernels.prompt_tiles() and kernels.current_threads() > 1 else 1


@lru_cache(maxsize=1)
def _second_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="frink-host")


def both(first: Callable[[], object], second: Callable[[], object]) -> None:
    """first() on this thread while second() runs on a second Python thread (NumPy
    releases the GIL in its ufuncs and GEMMs); both done on return."""
    other = _second_thread().submit(second)
    try:
        first()
    finally:
        other.result()


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
