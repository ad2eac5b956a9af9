"""The KV cache: one contiguous K and V buffer per layer, grown geometrically.

The host cache is authoritative (device mirrors re-sync from it). Rows are stored per KV
head, [n_head_kv, capacity, head_dim], so attention reads a prefix view with no copy.
Capacity doubles up to the context size, so appending a decode row never reallocates in
the common case. Positions are implicit: row i holds position i.
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
        c = self._cache
        start = c.n_past
        end = start + k.shape[0]
        c.reserve(end)
        kb, vb = c.k[self._layer], c.v[self._layer]
        kb[:, start:end] = k.transpose(1, 0, 2)
        vb[:, start:end] = v.transpose(1, 0, 2)
        return kb[:, :end], vb[:, :end]


class KvCache:
    def __init__(self, cfg: ModelConfig, n_ctx: int) -> None:
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_past = 0
        self.capacity = 0
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self._alloc(min(n_ctx, 256))

    def _alloc(self, capacity: int) -> None:
        cfg = self.cfg
        new_k = [np.zeros((cfg.n_head_kv, capacity, cfg.head_dim_k), np.float32) for _ in range(cfg.n_layer)]
        new_v = [np.zeros((cfg.n_head_kv, capacity, cfg.head_dim_v), np.float32) for _ in range(cfg.n_layer)]
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
        if self.n_past + n_new > self.n_ctx:
            raise FrinkError(
                f"prompt too long: {self.n_past + n_new} tokens do not fit in a context of "
                f"{self.n_ctx} (raise -c/--ctx-size)"
            )
        self.reserve(self.n_past + n_new)

    def slot(self, layer: int) -> KvSlot:
        return KvSlot(self, layer)

    def commit(self, n_new: int) -> None:
        self.n_past += n_new

    def truncate(self, n_past: int) -> None:
        if not 0 <= n_past <= self.n_past:
            raise FrinkError(f"cannot truncate a cache of {self.n_past} rows to {n_past}")
        self.n_past = n_past
