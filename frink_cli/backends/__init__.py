"""Accelerated backends and how the decoder loop asks them for work.

The decoder loop asks the active backend, before touching any cache, for the longest run
of layers it will take from layer l for this kind of step ("prefill" batch or "decode"
row). The answer is a Run or a named Refusal; on a refusal the host body runs the layer.
The NumPy host body itself is not a backend object: "numpy" means no backend, every
layer on the host. Backends never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import FrinkError
from .ledger import Ledger

BACKEND_NAMES = ("auto", "numpy", "metal", "cuda")


@dataclass(frozen=True)
class Refusal:
    reason: str


@dataclass(frozen=True)
class Run:
    start: int
    stop: int  # exclusive


class Backend(Protocol):
    name: str
    ledger: Ledger

    def plan(self, kind: str, layer: int, n_rows: int, cache) -> Run | Refusal: ...

    def run(self, run: Run, x: np.ndarray, positions: np.ndarray, cache) -> np.ndarray: ...


def select_backend(name: str, cfg) -> Backend | None:
    """None means the host body runs everything."""
    if name not in BACKEND_NAMES:
        raise FrinkError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_NAMES)})")
    if name in ("auto", "numpy"):
        return None
    raise FrinkError(f"backend {name!r} is not available in this version of frink (use --backend numpy)")
