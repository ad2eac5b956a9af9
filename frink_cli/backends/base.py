"""DeviceBackend: what every accelerated backend shares, so each keeps only its own part.

Shared here: the per-layer refusal table (asked once, from the backend's eligibility
predicate), uploading the layers it takes at bind (borrowing each from the layer store so
the host never holds two), what is resident, the run planning (the longest run of
resident layers from l, then the backend's step predicate), the per-sequence device
mirrors, and the launch guard that turns a DEVICE error into LaunchFailed for the decoder
loop. Only the backend's own `device_errors` are caught: an ordinary Python bug in a
backend (a TypeError, a KeyError...) propagates and fails the test that hit it, instead
of hiding behind a silent host fallback.

A subclass implements: `layer_reasons(layer)` (eligibility), `upload_layer(layer, lw)`,
`upload_head(weights)`, `new_mirror()`, `launch(run, x, positions, cache, head)`, and
optionally `step_refusal(...)`.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from ..model.config import ModelConfig
from ..model.weights import ModelWeights, borrow_layer
from .ledger import Ledger
from .protocol import LaunchFailed, Refusal, Run

NOT_RESIDENT = "weights not resident"
MULTI_SEQUENCE = "multi-sequence step"


class DeviceBackend(ABC):
    name = "device"
    # Whether launch() takes a multi-sequence step (cache a cache.SeqBatch, kind "batch").
    runs_batches = False
    # Whether its linears carry LoRA parts (model/lora.py); load() keeps adapters off one
    # that does not.
    runs_lora = False
    # Exceptions that mean "the device failed", never "frink has a bug".
    device_errors: tuple[type[BaseException], ...] = (RuntimeError, MemoryError)

    def __init__(self, cfg: ModelConfig, ledger: Ledger | None = None) -> None:
        self.cfg = cfg
        self.ledger = ledger if ledger is not None else Ledger()
        self.reasons: list[list[str]] = [self.layer_reasons(i) for i in range(cfg.n_layer)]
        # Per layer, the reason the ledger counts (the first), or None: what plan() reads.
        self.refusal: list[str | None] = [r[0] if r else None for r in self.reasons]
        self.resident: dict[int, Any] = {}
        self.head: Any = None
        self._mirrors: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # --- what the subclass says -------------------------------------------------------------

    @abstractmethod
    def layer_reasons(self, layer: int) -> list[str]:
        """Every reason this backend cannot run layer `layer` exactly as the host body
        would; [] when it takes it for every kind of step."""

    @abstractmethod
    def upload_layer(self, layer: int, lw: Any) -> Any:
        """Layer `lw`'s weights made resident, in the form the backend's ops read."""

    def upload_head(self, weights: ModelWeights) -> Any:
        """The resident lm head (final norm + output), or None to leave it on the host."""
        return None

    @abstractmethod
    def new_mirror(self) -> Any:
        """A sequence's device state, made the first time a cache is seen."""

    def step_refusal(
        self, kind: str, n_rows: int, cache: Any, positions: np.ndarray | None, layers: range
    ) -> str | None:
        """A refusal of THIS step (its batch, positions, cache), or None."""
        return None

    @abstractmethod
    def launch(
        self, run: Run, x: np.ndarray, positions: np.ndarray, cache: Any, head: str | None
    ) -> np.ndarray:
        """Run the layers of `run` (and the lm head when `head`) over the rows x; write the
        host cache only once every device result is back."""

    # --- shared ---------------------------------------------------------------------------

    @property
    def runs_head(self) -> bool:
        """The decoder asks for the logits from a run's own submission only when the head
        is resident (not, say, when the last layer is refused)."""
        return self.head is not None

    def bind(self, weights: ModelWeights, layers: range | None = None) -> None:
        """Upload every layer this backend takes, and the lm head, once, in layer order. When
        the device runs out part way, the layers already up stay resident and the rest run
        on the host body (as llama.cpp offloads what fits); the failure is reported once.
        `layers`: only these (a pipeline stage's), all by default; the head goes up with
        the last layer."""
        self.resident.clear()
        self.head = None
        self.prepare(weights)
        own = layers if layers is not None else range(self.cfg.n_layer)
        wanted = [i for i in own if self.refusal[i] is None]
        for n_up, i in enumerate(wanted):
            try:
                # Borrowed: the host copy lives only while this layer uploads.
                self.resident[i] = self.upload_layer(i, borrow_layer(weights.layers, i))
            except self.device_errors as e:
                self.ledger.fail(
                    f"weight upload: {type(e).__name__}: {e} ({n_up} of {len(wanted)} "
                    "layers resident, the rest run on the host)"
                )
                return
        if self.cfg.n_layer - 1 in self.resident:
            try:
                self.head = self.upload_head(weights)
            except self.device_errors as e:
                self.ledger.fail(f"lm head upload: {type(e).__name__}: {e} (logits on the host)")

    def prepare(self, weights: ModelWeights) -> None:
        """Model-wide device state made before the layers upload (rope tables...)."""
        return None  # an optional hook: nothing model-wide to make by default

    def end_thread(self) -> None:
        """Nothing is kept per thread unless a backend says otherwise."""
        return None

    def resident_layers(self) -> set[int]:
        """After bind(): the layers the device holds whole. The decoder drops their host
        copies and loads every other layer at once."""
        return set(self.resident)

    def plan(
        self, kind: str, layer: int, n_rows: int, cache: Any, positions: np.ndarray | None = None
    ) -> Run | Refusal:
        """The longest run of resident layers from `layer`, or a named refusal, decided
        before any cache or device state is touched."""
        reason = self.refusal[layer]
        if reason is not None:
            return Refusal(reason)
        if kind == "batch" and not self.runs_batches:
            return Refusal(MULTI_SEQUENCE)
        if layer not in self.resident:
            return Refusal(NOT_RESIDENT)
        stop = layer + 1
        while stop < self.cfg.n_layer and self.refusal[stop] is None and stop in self.resident:
            stop += 1
        refusal = self.step_refusal(kind, n_rows, cache, positions, range(layer, stop))
        return Refusal(refusal) if refusal is not None else Run(layer, stop)

    def mirror(self, cache: Any) -> Any:
        """The sequence's device mirror, made on first use, gone with the cache."""
        m = self._mirrors.get(cache)
        if m is None:
            m = self._mirrors[cache] = self.new_mirror()
        return m

    def run(self, run: Run, x: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        return self._guarded(run, x, positions, cache, None)

    def run_head(
        self, run: Run, x: np.ndarray, positions: np.ndarray, cache: Any, all_rows: bool
    ) -> np.ndarray:
        """A run ending at the last layer, with the lm head in the same submission."""
        return self._guarded(run, x, positions, cache, "all" if all_rows else "last")

    def _guarded(
        self, run: Run, x: np.ndarray, positions: np.ndarray, cache: Any, head: str | None
    ) -> np.ndarray:
        # launch() writes no host cache row until every device result is back, so a device
        # error here leaves the caches as they were.
        try:
            return self.launch(run, x, positions, cache, head)
        except self.device_errors as e:
            raise LaunchFailed(f"{self.name}: {type(e).__name__}: {e}") from e
