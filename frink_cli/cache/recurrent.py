"""A recurrent layer's state (a gated delta net: qwen35, qwen3next; a Mamba-1/2 mixer): no K/V
rows, but the conv tail (the last kernel-1 conv inputs) and the recurrence's state (the
delta-rule matrices, or the selective scan's [d_inner, d_state]), zero at sequence start.

That state summarises every token so far and cannot be rewound, so it refuses truncation to
anything but its start (or where it already is). A step's new state is staged and becomes
current only at commit, like the K/V rows beside it, so a step that fails leaves the state
as it was.
"""

from __future__ import annotations

import numpy as np

from ..model.config import ModelConfig


class RecurrentState:
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        self.conv_shape, self.state_shape = cfg.recurrent_shapes(layer)
        mixer = cfg.layer_shape(layer).mixer
        self.kind = {"mamba": "mamba selective scan", "mamba2": "mamba2 selective scan"}.get(
            mixer, "gated delta net"
        )
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
