"""Weight matmuls: x [T, in] -> x @ W.T + b over a (possibly fused) Linear, and how many
threads they get.

Which kernel: a sequence's few rows (up to SMALL_ROWS: a decode row, a short prompt) go
through the compiled small-batch product (quant.kernels.matmul_f32 / dots, C), a prompt's
chunk through the same kernels over blocks of its rows (quant.kernels.matmul; AMX int8
tiles where the CPU has them). On small models' matrices, streamed from memory, the kernel
reads f32 weights at ~21 GB/s on one core and ~28 on two where OpenBLAS's GEMV reads ~12
and ~21 (its column-major GEMV ~18 on one), and 8 rows take it 0.5x OpenBLAS's GEMM time
(which packs W first): a decode token ~1.3x faster, a server's batch of eight ~2x. Its
sums run in one order for any row count, so a row's product is the same bits in a decode
step, a prompt, or a prompt cut into other chunks (docs/performance.md has what that costs
a prompt of f32 or 16-bit weights against BLAS's GEMM), and a batched step multiplies each
sequence's rows as it would alone (`product`, `sequences`), so a sequence's numbers never
depend on what is stepped beside it: a server answers a request as it would answer it
alone. Without the compiled kernels everything is BLAS's (a row's sums then differ between
GEMV and GEMM, and with the prompt's chunking).

Threads: when another process holds a core, a step split over two threads waits on it
(a decode token then takes ~10x as long), and on an idle machine two threads are faster.
Which one wins is a property of the moment, not of the model, so steps choose by timing
themselves (ThreadChoice): decode steps run on one thread, try two now and then, keep
whichever was faster, and drop back at once when the wide setting turns slow; prefill
layers, alike in cost, start wide and are the timed units. FRINK_THREADS=n fixes the count.
The count never changes a result: it goes to the compiled kernels (each output element
one thread's sum) and to the Python threads sharing a prompt product's tiles of W (cut
from W's shape alone, each a BLAS call on one thread: quant.kernels); BLAS itself runs on
one thread throughout a step (`step_threads`), since a multithreaded GEMM may round
differently on another thread count. The settings are restored after every step, so a
program embedding frink keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

import numpy as np

from ...model.weights import Linear
from ...quant import kernels
from ...quant.blas import blas_threads
from ...quant.blocks import QuantRows
from .lora import add_lora

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
    """x @ W.T + b, plus the LoRA adapters on W's rows (backends/host/lora.py)."""
    y = product(x, lin.w)
    if lin.b is not None:
        y += lin.b
    if lin.lora:
        add_lora(y, x, lin.lora, product, _sequences.get())
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
    decode batch); a longer one (a prompt chunk) is one product of its own rows (the same
    kernel over blocks of rows, or AMX tiles; BLAS without the compiled kernels), as it
    would be alone. So a server's answer does not change with what else it is serving."""
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
    """A prompt chunk's product, on the step's threads (quant.kernels: the same bits on any
    count)."""
    return kernel(x, w)


def _kernels(w: np.ndarray | QuantRows) -> tuple[Kernel, Kernel]:
    """(few rows' kernel, many rows' kernel) for w."""
    if isinstance(w, QuantRows):
        return _blocks_few, _blocks_many
    if kernels.compiled() and w.dtype == np.float32 and w.flags.c_contiguous:
        # One kernel for every row count: a prompt's rows get a decode row's sums.
        return kernels.matmul_f32, kernels.matmul_f32
    # No compiled kernels: BLAS's tiles for all (a row's sums then differ between a decode
    # row and a prompt's rows).
    return kernels.gemm_f32, kernels.gemm_f32


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


def few_rows(rows: Sequence[int]) -> bool:
    """Whether every sequence of a step has few enough rows for the compiled product."""
    return all(n <= SMALL_ROWS for n in rows)


@contextmanager
def step_threads(n: int | None, few: bool) -> Iterator[None]:
    """n threads for a step (None: the calling thread's `kernels.threads`): the compiled
    kernels' and the Python threads sharing a prompt product's tiles; BLAS one thread, so
    that no product's rounding depends on the count (module note). `few` (every sequence's
    rows go to the compiled kernels) is accepted for the callers' sake: both kinds of step
    now split the same way."""
    del few
    wide = n if n is not None else kernels.current_threads()
    with blas_threads.limit(1), kernels.threads(wide):
        yield


def host_ways() -> int:
    """How many ways (1 or 2) a prompt step's NumPy work (attention's query blocks) may go
    now: two where the step has two threads or more. BLAS runs on one thread in a step, so
    the second Python thread has the second core to itself."""
    return 2 if kernels.current_threads() > 1 else 1


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
    """Picks a step's threads between 1 and the calling thread's `kernels.threads` by timing
    the work they do (FRINK_THREADS, when set, is the choice).

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
        self.current = 0 if start_wide else 1  # 0: the wide count, once it is known
        self.wide = 1  # the kernels' thread count, read at each choice (a caller may cap it)
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
        if kernels.FORCED_THREADS is not None:
            return kernels.FORCED_THREADS
        self.wide = kernels.current_threads()
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
