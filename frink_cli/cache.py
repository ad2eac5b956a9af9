"""The KV cache: one contiguous K and V buffer per layer, grown geometrically.

The host cache is authoritative (device mirrors re-sync from it). Rows are stored per KV
head, [n_head_kv, capacity, head_dim], so attention reads a prefix view with no copy.
Capacity doubles up to the context size, so appending a decode row never reallocates in
the common case. Positions are implicit: row i holds position i.

Gated-delta-net layers (qwen35, qwen3next) keep no K/V rows; their slot holds the layer's
recurrent state instead: the conv tail (the last kernel-1 conv inputs) and the delta-rule
state, zero at sequence start. That state summarises every token so far and cannot be
rewound, so a cache holding it refuses truncation to anything but its start. A step's new
state is staged and becomes current only at commit, like the K/V rows it sits beside, so a
step that fails leaves the state as it was.
"""

from __future__ import annotations

import numpy as np

from .errors import FrinkError
from .model.config import ModelConfig


class KvSlot:
    """One layer's K/V rows. The attention block writes and reads through this interface."""

    def __init__(self, cache: "KvCache", layer: int) -> None:
        self._cache = cache
        self._layer = layer

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write k [T, Hkv, hd_k], v [T, Hkv, hd_v] at the cache's next positions; return
        every row so far as views K [Hkv, S, hd_k], V [Hkv, S, hd_v]."""
        end = self.write(self._cache.n_past, k, v)
        c = self._cache
        return c.k[self._layer][:, :end], c.v[self._layer][:, :end]

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> int:
        """Write k [T, Hkv, hd_k], v [T, Hkv, hd_v] at positions start..; return the end."""
        c = self._cache
        end = start + k.shape[0]
        c.reserve(end)
        c.k[self._layer][:, start:end] = k.transpose(1, 0, 2)
        c.v[self._layer][:, start:end] = v.transpose(1, 0, 2)
        c.versions[self._layer] += 1
        return end

    def recurrent_state(self) -> tuple[np.ndarray, np.ndarray]:
        """The committed (conv tail [kernel-1, conv_dim], delta state [n_v, hd_k, hd_v]); read-only."""
        c = self._cache
        return c.conv_state[self._layer], c.delta_state[self._layer]

    def set_recurrent_state(self, conv: np.ndarray, delta: np.ndarray) -> None:
        """Stage this step's new state; it becomes current when the step commits."""
        self._cache.pending_state[self._layer] = (conv, delta)


class KvCache:
    def __init__(self, cfg: ModelConfig, n_ctx: int) -> None:
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_past = 0
        self.capacity = 0
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.conv_state: list[np.ndarray | None] = [None] * cfg.n_layer
        self.delta_state: list[np.ndarray | None] = [None] * cfg.n_layer
        self.pending_state: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # Per layer, a count of writes to its rows. A device mirror remembers the count
        # its own rows were written under; any other write (the host body running the
        # layer after a refusal or a failed launch) changes it, and the mirror re-syncs.
        # Lengths alone cannot tell: truncate, then rewrite, gives the same length.
        self.versions = [0] * cfg.n_layer
        self._reset_recurrent()
        self._alloc(min(n_ctx, 256))

    @property
    def has_recurrent_state(self) -> bool:
        return any(s is not None for s in self.delta_state)

    def _reset_recurrent(self) -> None:
        cfg = self.cfg
        for layer in range(cfg.n_layer):
            if cfg.is_recurrent(layer):
                self.conv_state[layer] = np.zeros((cfg.gdn.conv_kernel - 1, cfg.gdn.conv_dim), np.float32)
                self.delta_state[layer] = np.zeros(
                    (cfg.gdn.n_v_heads, cfg.gdn.head_dim_k, cfg.gdn.head_dim_v), np.float32
                )
        self.pending_state.clear()

    def _alloc(self, capacity: int) -> None:
        cfg = self.cfg
        # Recurrent (GDN) layers keep no rows: zero-capacity buffers keep indexing uniform.
        rows = [0 if cfg.is_recurrent(layer) else capacity for layer in range(cfg.n_layer)]
        new_k = [np.zeros((cfg.n_head_kv, r, cfg.head_dim_k), np.float32) for r in rows]
        new_v = [np.zeros((cfg.n_head_kv, r, cfg.head_dim_v), np.float32) for r in rows]
        for old, new in ((self.k, new_k), (self.v, new_v)):
            for o, n in zip(old, new):
                n[:, : self.n_past] = o[:, : self.n_past]
        self.k, self.v, self.capacity = new_k, new_v, capacity

    def reserve(self, n_rows: int) -> None:
        if n_rows > self.n_ctx:
            raise FrinkError(f"context full: {n_rows} tokens do not fit in a context of {self.n_ctx}")
        if n_rows > self.capacity:
            self._alloc(min(self.n_ctx, max(n_rows, 2 * self.capacity)))

    def check_room(self, n_new: int) -> None:
        """Refuse a batch before any layer writes, so a failed step leaves the cache intact."""
        # State staged by a step that failed before its commit is stale: drop it.
        self.pending_state.clear()
        if self.n_past + n_new > self.n_ctx:
            raise FrinkError(
                f"prompt too long: {self.n_past + n_new} tokens do not fit in a context of "
                f"{self.n_ctx} (raise -c/--ctx-size)"
            )
        self.reserve(self.n_past + n_new)

    def slot(self, layer: int) -> KvSlot:
        return KvSlot(self, layer)

    def commit(self, n_new: int) -> None:
        for layer, (conv, delta) in self.pending_state.items():
            self.conv_state[layer], self.delta_state[layer] = conv, delta
        self.pending_state.clear()
        self.n_past += n_new

    def truncate(self, n_past: int) -> None:
        if not 0 <= n_past <= self.n_past:
            raise FrinkError(f"cannot truncate a cache of {self.n_past} rows to {n_past}")
        if self.has_recurrent_state and 0 < n_past < self.n_past:
            # The recurrent state has no per-position history to roll back to.
            raise FrinkError(
                f"cannot truncate to {n_past} of {self.n_past} tokens: this {self.cfg.arch} model's "
                "recurrent (gated delta net) state cannot be rolled back; start a new context"
            )
        if n_past == 0:
            self._reset_recurrent()
        self.n_past = n_past
