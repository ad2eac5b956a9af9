"""The one protocol every layer's cache slot speaks, so neither the layer composition nor a
backend reaches into how a kind of layer keeps its history.

Every slot stages a step and then commits it or rolls it back, and says whether it can be
truncated. An attention slot (full or sliding-window) adds rows; a recurrent slot holds a
state instead.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .kv_types import Rows


class LayerSlot(Protocol):
    n_past: int  # positions before this are committed

    def reserve(self, end: int) -> None:
        """Room for positions up to `end`, made before any layer of the step writes."""

    def commit(self, n_past: int) -> None:
        """The step's staged rows or state become current; n_past is the new length."""

    def rollback(self) -> None:
        """Forget what a step staged and did not commit (it failed)."""

    def truncation_refusal(self, n_past: int) -> str | None:
        """Why this slot cannot go back to n_past (asked for every slot before any moves)."""

    def truncate(self, n_past: int) -> None: ...


class NothingToMove:
    """The LayerSlot steps of a slot with no rows or state of its own to stage, commit or
    truncate (a KV-sharing layer's, or a layer another decoder runs)."""

    def reserve(self, end: int) -> None:
        pass

    def commit(self, n_past: int) -> None:
        pass

    def rollback(self) -> None:
        pass

    def truncation_refusal(self, n_past: int) -> str | None:
        return None  # whoever holds the rows answers for them

    def truncate(self, n_past: int) -> None:
        pass


class StagedRows:
    """The LayerSlot steps of a slot whose rows [0, n_past) are committed and [n_past, end)
    staged by the step in flight: commit() keeps them, rollback() forgets them, and it can
    go back to any length (truncate; a subclass drops what it holds past it)."""

    n_past: int
    end: int

    def commit(self, n_past: int) -> None:
        self.n_past = self.end = n_past

    def rollback(self) -> None:
        self.end = self.n_past

    def truncation_refusal(self, n_past: int) -> str | None:
        return None

    def truncate(self, n_past: int) -> None:
        self.n_past = self.end = n_past


class KvSlot(LayerSlot, Protocol):
    first: int  # the first position held (later than 0 once a window has slid)
    version: int  # a count of writes: a device mirror re-syncs when it changes

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[int, Rows, Rows]:
        """Write the step's rows at n_past..; (first, K, V) of every row its queries see."""

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> int:
        """Write rows at positions start.. (a backend pushing its rows back); the end."""

    def held(self) -> tuple[int, Rows, Rows]:
        """(first, K [Hkv, n, hd_k], V [Hkv, n, hd_v]) of the committed rows (f32, or a
        cache type's `Coded` rows)."""


class RecurrentSlot(LayerSlot, Protocol):
    def recurrent_state(self) -> tuple[np.ndarray, np.ndarray]:
        """The staged state if this step already moved the layer on, else the committed one."""

    def set_recurrent_state(self, conv: np.ndarray, delta: np.ndarray) -> None:
        """Stage the step's new state."""
