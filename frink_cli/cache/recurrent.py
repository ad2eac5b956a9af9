"""A recurrent layer's state (a gated delta net, a Mamba-1/2 mixer, a short conv): no K/V
rows, but the conv tail (the last kernel-1 conv inputs) and the recurrence's state (the
delta-rule matrices, or the selective scan's [d_inner, d_state]), zero at sequence start.

That state summarises every token so far and cannot be rewound, so it refuses truncation to
anything but its start (or where it already is). A step's new state is staged and becomes
current only at commit, like the K/V rows beside it, so a step that fails leaves the state
as it was.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model.config import ModelConfig


class RecurrentState:
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        self.conv_shape, self.state_shape = cfg.recurrent_shapes(layer)
        mixer = cfg.layer_shape(layer).mixer
        kinds = {
            "mamba": "mamba selective scan",
            "mamba2": "mamba2 selective scan",
            "attention+mamba2": "mamba2 selective scan",
            "shortconv": "short conv",
            "lightning": "lightning attention",
        }
        self.kind = kinds.get(mixer, "gated delta net")
        self.n_past = 0
        self._pending: tuple[np.ndarray, np.ndarray] | None = None
        self._reset()

    def _reset(self) -> None:
        self.conv = np.zeros(self.conv_shape, np.float32)
        # The recurrence's state (named for the delta rule, its first user).
        self.delta = np.zeros(self.state_shape, np.float32)
        self._pending = None

    def recurrent_state(self) -> tuple[np.ndarray, np.ndarray]:
        """(conv tail [kernel-1, channels], state: GDN [n_v, hd_k, hd_v], mamba / mamba2
        [d_inner, d_state]): this step's staged state if a run of it already moved the
        layer on, else the committed one; read-only."""
        return self._pending if self._pending is not None else (self.conv, self.delta)

    def set_recurrent_state(self, conv: np.ndarray, delta: np.ndarray) -> None:
        """Stage this step's new state; it becomes current when the step commits."""
        self._pending = (conv, delta)

    def reserve(self, end: int) -> None:
        pass  # the state's size does not grow with the sequence

    def commit(self, n_past: int) -> None:
        if self._pending is not None:
            self.conv, self.delta = self._pending
        self._pending = None
        self.n_past = n_past

    def rollback(self) -> None:
        self._pending = None

    def truncation_refusal(self, n_past: int) -> str | None:
        if n_past in (0, self.n_past):
            return None
        # The state has no per-position history to roll back to.
        return f"its recurrent ({self.kind}) state cannot be rolled back"

    def truncate(self, n_past: int) -> None:
        if n_past == 0:
            self._reset()
        self.n_past = n_past

    def restore(self, n_past: int, conv: np.ndarray, delta: np.ndarray) -> None:
        """Back to a state saved when the sequence was n_past long (KvCache.restore): the
        arrays are never written in place (a step stages new ones), so the saved
        references are the state itself."""
        self.conv, self.delta, self.n_past = conv, delta, n_past
        self._pending = None


class ParallelSlot:
    """A layer whose attention and recurrent mixer run side by side: its K/V
    rows and its recurrent state, one slot to the composition (the attention op reads the
    rows, the mamba block the state), staged, committed and rolled back together. Truncation
    is refused as the recurrent state refuses it."""

    def __init__(self, kv: Any, state: RecurrentState) -> None:
        self.kv, self.state = kv, state
        self.kind = state.kind

    @property
    def n_past(self) -> int:
        return int(self.kv.n_past)

    @n_past.setter
    def n_past(self, value: int) -> None:
        self.kv.n_past = self.state.n_past = value

    @property
    def first(self) -> int:
        return int(self.kv.first)

    @property
    def version(self) -> int:
        return int(self.kv.version)

    @property
    def types(self) -> Any:
        """The K/V rows' cache types (kv_types.CacheTypes)."""
        return self.kv.types

    @property
    def conv(self) -> np.ndarray:
        return self.state.conv

    @property
    def delta(self) -> np.ndarray:
        return self.state.delta

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[int, Any, Any]:
        first, K, V = self.kv.append(k, v)
        return first, K, V

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> int:
        return int(self.kv.write(start, k, v))

    def held(self) -> tuple[int, Any, Any]:
        first, K, V = self.kv.held()
        return first, K, V

    def recurrent_state(self) -> tuple[np.ndarray, np.ndarray]:
        return self.state.recurrent_state()

    def set_recurrent_state(self, conv: np.ndarray, delta: np.ndarray) -> None:
        self.state.set_recurrent_state(conv, delta)

    def reserve(self, end: int) -> None:
        self.kv.reserve(end)
        self.state.reserve(end)

    def commit(self, n_past: int) -> None:
        self.kv.commit(n_past)
        self.state.commit(n_past)

    def rollback(self) -> None:
        self.kv.rollback()
        self.state.rollback()

    def truncation_refusal(self, n_past: int) -> str | None:
        return self.state.truncation_refusal(n_past) or self.kv.truncation_refusal(n_past)

    def truncate(self, n_past: int) -> None:
        self.kv.truncate(n_past)
        self.state.truncate(n_past)

    def restore(self, n_past: int, conv: np.ndarray, delta: np.ndarray) -> None:
        self.kv.truncate(n_past)
        self.state.restore(n_past, conv, delta)
