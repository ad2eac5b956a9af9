"""What a backend is to the decoder loop: the Backend protocol, a Run of layers it takes
or the Refusal naming why not, and LaunchFailed for an admitted run that failed on the
device. Device backends import these from here, never from the package, which imports them
lazily."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .ledger import Ledger


@dataclass(frozen=True)
class Refusal:
    reason: str


@dataclass(frozen=True)
class Run:
    start: int
    stop: int  # exclusive


class LaunchFailed(Exception):
    """A run the backend admitted failed on the device. Raised before any cache row was
    written; the decoder loop reports it (once per distinct message) and has the host body
    run the same layers."""


class Backend(Protocol):
    name: str
    ledger: Ledger
    runs_lora: bool  # its linears carry LoRA parts (model/lora.py)

    def bind(self, weights, layers: range | None = None) -> None:
        """Called once by the decoder with the loaded weights (upload what the device needs;
        `layers`: only those, a pipeline stage's, where given).
        Read a layer to upload through model.weights.borrow_layer(weights.layers, i): a
        layer store then loads it for the upload alone instead of keeping it on the host."""
        ...

    def resident_layers(self) -> set[int]:
        """After bind(): the layers the device holds whole. The decoder drops the host
        copies of these (the host body reloads one from the checkpoint if a launch fails
        after admission) and loads every other layer at once."""
        ...

    def plan(
        self, kind: str, layer: int, n_rows: int, cache, positions: np.ndarray | None = None
    ) -> Run | Refusal: ...

    def run(self, run: Run, x: np.ndarray, positions: np.ndarray, cache) -> np.ndarray: ...

    def end_thread(self) -> None:
        """The calling thread will run nothing more on this backend: free what the device
        runtime keeps per thread (a thread that ends holding it can abort the process)."""
        ...


class HeadBackend(Backend, Protocol):
    """A backend that can also run the lm head in a run's own submission (base.DeviceBackend
    does); the decoder asks for it only where `runs_head` says the head is resident."""

    @property
    def runs_head(self) -> bool: ...

    def run_head(
        self, run: Run, x: np.ndarray, positions: np.ndarray, cache, all_rows: bool
    ) -> np.ndarray: ...
