"""KvCache: one sequence's cache, a slot per layer (its kind chosen from the layer's shape)
plus the sequence's length.

The host cache is authoritative (device mirrors re-sync from it, through the slots). A step
is admitted by check_room before any layer writes, staged by the layers, and made current
by commit; a step that fails is rolled back by the next check_room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import FrinkError
from ..model.config import ModelConfig
from .attention import AttentionKv, ChunkKv, SharedKv, WindowKv
from .kv_types import F32_CACHE, OPTION_K, OPTION_V, CacheTypes, check_width
from .latent import LatentKv, check_latent_types
from .paged import PagedKv, PagePools, PageTable
from .protocol import KvSlot, LayerSlot, NothingToMove, RecurrentSlot
from .recurrent import ParallelSlot, RecurrentState


def layer_slot(
    cfg: ModelConfig,
    layer: int,
    n_ctx: int,
    windowed: bool = True,
    types: CacheTypes = F32_CACHE,
    rewind: int = 0,
    tables: Sequence[PageTable] = (),
) -> LayerSlot:
    """The cache slot layer `layer` needs, its K/V rows stored as `types` say; a sliding
    window keeps `rewind` rows more, so the cache can step back rewind + 1 tokens. With
    page tables, an attention layer's rows are in the pages of the pool holding it
    (paged.py; a recurrent layer keeps its state here as without)."""
    shape = cfg.layer_shape(layer)
    if cfg.is_recurrent(layer) and shape.mixer != "attention+mamba2":
        return RecurrentState(cfg, layer)
    table = next((t for t in tables if layer in t.pool.k), None)
    if table is not None:
        paged = PagedKv(table, layer, (shape.head_dim_k, shape.head_dim_v))
        if shape.mixer == "attention+mamba2":
            return ParallelSlot(paged, RecurrentState(cfg, layer))
        return paged
    # The layer's own KV heads (per-layer sizes); 0 for a layer that attends to nothing
    # (the "none" and "linear" mixers): its slot then holds no rows at all.
    window, n_kv = shape.window, shape.n_head_kv
    kv: AttentionKv
    hk, hv = shape.head_dim_k, shape.head_dim_v  # the layer's own
    if shape.mixer == "mla":  # [latent | k_pe] rows, the values the same rows
        return LatentKv(hk, n_ctx, types=types)
    if windowed and window is not None and window < n_ctx:
        kv = WindowKv(n_kv, hk, hv, n_ctx, window, types=types, rewind=rewind)
    elif windowed and shape.chunk is not None and shape.chunk < n_ctx:
        kv = ChunkKv(n_kv, hk, hv, n_ctx, shape.chunk, types=types, rewind=rewind)
    else:
        kv = AttentionKv(n_kv, hk, hv, n_ctx, types=types)
    if shape.mixer == "attention+mamba2":  # K/V rows and mamba state
        return ParallelSlot(kv, RecurrentState(cfg, layer))
    return kv


def check_cache_types(cfg: ModelConfig, types: CacheTypes) -> None:
    """FrinkError (one line) if an attention layer's head widths cannot be stored as
    `types` (q8_0 / q4_0 rows are whole blocks of 32): asked at load, before any cache."""
    for layer in range(cfg.n_layer):
        shape = cfg.layer_shape(layer)
        if cfg.is_recurrent(layer) and shape.mixer != "attention+mamba2":
            continue
        if shape.mixer == "mla":
            check_latent_types(types)
        elif shape.n_head_kv:
            check_width(types.k, shape.head_dim_k, OPTION_K)
            check_width(types.v, shape.head_dim_v, OPTION_V)


def keeps_recurrent_state(cfg: ModelConfig) -> bool:
    """Whether any layer keeps a recurrent state (as layer_slot chooses a RecurrentState or
    a ParallelSlot)."""
    return any(
        cfg.is_recurrent(i) or cfg.layer_shape(i).mixer == "attention+mamba2"
        for i in range(cfg.n_layer)
    )


class UnheldSlot(NothingToMove):
    """A layer some other decoder runs (a pipeline's other ranks): no rows, no state, no
    memory; every step passes it by."""

    n_past = 0


@dataclass(frozen=True)
class CacheSnapshot:
    """A sequence's recurrent state at one length (attention rows need no copy: a prefix of
    them is kept by truncating). What a prompt cache saves at the end of a prompt, the only
    points a recurrent model can later resume from."""

    n_past: int
    states: tuple[tuple[int, np.ndarray, np.ndarray], ...]  # (layer, conv tail, state)


class KvCache:
    """`windowed=False` keeps every row of sliding-window layers too (a reference for tests);
    `types`: the K and V cache types (kv_types.py), f32 unless asked; `rewind`: how many
    tokens beyond one the cache must be able to step back (truncate) through sliding
    windows; `pools`: the attention rows go in those page pools' pages, through the
    cache's page table for each (`tables`; the serve engine's paged cache)."""

    def __init__(
        self,
        cfg: ModelConfig,
        n_ctx: int,
        windowed: bool = True,
        types: CacheTypes = F32_CACHE,
        rewind: int = 0,
        layers: range | None = None,
        pools: PagePools | None = None,
    ) -> None:
        self.cfg = cfg
        self.tables = [PageTable(p, rewind) for p in pools] if pools is not None else []
        self.n_ctx = n_ctx
        self.types = types
        self.rewind = rewind
        self.n_past = 0
        self.slots: list = []
        held = layers if layers is not None else range(cfg.n_layer)
        for layer in range(cfg.n_layer):
            source = cfg.kv_source(layer)
            # A KV-sharing layer reads an earlier layer's slot: one set of rows.
            self.slots.append(
                UnheldSlot()
                if layer not in held
                else SharedKv(self.slots[source])
                if source is not None
                else layer_slot(cfg, layer, n_ctx, windowed, types, rewind, self.tables)
            )
        self._recurrent = keeps_recurrent_state(cfg)

    @property
    def kv_bytes(self) -> int:
        """Bytes the attention layers' K/V buffers take now (they grow as the cache fills;
        reserve(n_ctx) first for a full context's)."""
        kv = [s.kv if isinstance(s, ParallelSlot) else s for s in self.slots]
        return sum(s.nbytes for s in kv if isinstance(s, (AttentionKv, SharedKv, PagedKv)))

    @property
    def has_recurrent_state(self) -> bool:
        """Whether the model keeps recurrent state (in any layer, held here or not: a
        pipeline's rank 0 tells the others when to save theirs)."""
        return self._recurrent

    def slot(self, layer: int) -> KvSlot | RecurrentSlot:
        return self.slots[layer]

    def reserve(self, n_rows: int) -> None:
        """Room for positions up to n_rows in every layer."""
        if n_rows > self.n_ctx:
            raise FrinkError(
                f"context full: {n_rows} tokens do not fit in a context of {self.n_ctx}"
            )
        for t in self.tables:  # before any layer writes (paged.PoolFull if no room)
            t.reserve(self.n_past, n_rows)
        for s in self.slots:
            s.reserve(n_rows)

    def check_room(self, n_new: int) -> None:
        """Refuse a batch before any layer writes, so a failed step leaves the cache intact."""
        # Rows and state staged by a step that failed before its commit are stale: drop them.
        for s in self.slots:
            s.rollback()
        if self.n_past + n_new > self.n_ctx:
            raise FrinkError(
                f"prompt too long: {self.n_past + n_new} tokens do not fit in a context of "
                f"{self.n_ctx} (raise -c/--ctx-size)"
            )
        self.reserve(self.n_past + n_new)

    def commit(self, n_new: int) -> None:
        self.n_past += n_new
        for s in self.slots:
            s.commit(self.n_past)
        for t in self.tables:  # windowed pools' pages that left the window go back
            t.slide(self.n_past)

    def truncate(self, n_past: int) -> None:
        if not 0 <= n_past <= self.n_past:
            raise FrinkError(f"cannot truncate a cache of {self.n_past} rows to {n_past}")
        # Every slot is asked before any moves, so a refusal changes nothing.
        for layer, s in enumerate(self.slots):
            reason = s.truncation_refusal(n_past)
            if reason is not None:
                raise FrinkError(
                    f"cannot truncate to {n_past} of {self.n_past} tokens: layer {layer} of this "
                    f"{self.cfg.arch} model: {reason}; start a new context"
                )
        for s in self.slots:
            s.truncate(n_past)
        self.n_past = n_past
        for t in self.tables:
            t.truncate(n_past)

    def adopt(
        self, pages: list[list[int]], n_past: int, state: CacheSnapshot | None = None
    ) -> None:
        """An empty paged cache starts from `pages`, per pool (another sequence's, shared:
        a prefix's rows; paged.GONE where a windowed pool needs none), holding their first
        n_past rows, and its recurrent layers from `state` (saved at n_past)."""
        assert self.tables and self.n_past == 0, "only an empty paged cache adopts"
        for t, held in zip(self.tables, pages):
            t.adopt(held)
        for s in self.slots:
            s.commit(n_past)
        self.n_past = n_past
        for t in self.tables:
            t.truncate(n_past)
            t.slide(n_past)
        if state is not None:
            assert state.n_past == n_past, "a state saved at another length"
            for layer, conv, delta in state.states:
                self.slots[layer].restore(n_past, conv, delta)

    def snapshot(self) -> CacheSnapshot:
        """The committed recurrent state of every recurrent layer, at the current length."""
        states = tuple(
            (layer, s.conv, s.delta)
            for layer, s in enumerate(self.slots)
            if isinstance(s, (RecurrentState, ParallelSlot))
        )
        return CacheSnapshot(self.n_past, states)

    def restore(self, snap: CacheSnapshot) -> None:
        """Back to the length `snap` was taken at: attention rows truncated to it, recurrent
        layers given the saved state. Refused (FrinkError, nothing moved) when the cache is
        shorter than that, or a sliding window no longer holds the rows it needs."""
        n = snap.n_past
        if n > self.n_past:
            raise FrinkError(f"cannot restore {n} tokens into a cache of {self.n_past}")
        saved = {layer: (conv, delta) for layer, conv, delta in snap.states}
        for layer, s in enumerate(self.slots):
            kv = s.kv if isinstance(s, ParallelSlot) else s
            reason = None if isinstance(kv, RecurrentState) else kv.truncation_refusal(n)
            if reason is None and isinstance(s, (RecurrentState, ParallelSlot)):
                reason = None if layer in saved else "no saved recurrent state"
            if reason is not None:
                raise FrinkError(f"cannot go back to {n} tokens: layer {layer}: {reason}")
        for layer, s in enumerate(self.slots):
            if isinstance(s, (RecurrentState, ParallelSlot)):
                s.restore(n, *saved[layer])
            else:
                s.truncate(n)
        self.n_past = n

    # --- position-indexed views, for tests and debugging (backends use the slots) ------------

    @property
    def k(self) -> list[np.ndarray]:
        """Per layer, K [Hkv, rows, hd_k] with row i at position i (none for recurrent layers)."""
        return [self._by_position(s)[0] for s in self.slots]

    @property
    def v(self) -> list[np.ndarray]:
        return [self._by_position(s)[1] for s in self.slots]

    @property
    def conv_state(self) -> list[np.ndarray | None]:
        """Per layer, the committed conv tail (None for attention layers)."""
        return [
            s.conv if isinstance(s, (RecurrentState, ParallelSlot)) else None for s in self.slots
        ]

    @property
    def delta_state(self) -> list[np.ndarray | None]:
        return [
            s.delta if isinstance(s, (RecurrentState, ParallelSlot)) else None for s in self.slots
        ]

    def _by_position(self, s: LayerSlot) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(s, ParallelSlot):
            s = s.kv
        if isinstance(s, (AttentionKv, SharedKv, PagedKv)):
            return s.by_position()
        cfg = self.cfg
        return (
            np.zeros((cfg.n_head_kv, 0, cfg.head_dim_k), np.float32),
            np.zeros((cfg.n_head_kv, 0, cfg.head_dim_v), np.float32),
        )
