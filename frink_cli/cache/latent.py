"""An MLA layer's cache (multi-head latent attention, graph/blocks/mla.py): per token the
compressed latent and the rotated key part, [latent | k_pe], one row shared by every head.

The attention over it is MQA with one KV head whose values are its keys (V = K: the
same buffer; the block keeps the latent columns of the output), so a token takes
kv_lora_rank + rope_dim values per layer, not n_head * (k + v) as full K/V would. Rows
are f32 (a 16-bit or quantized latent is not carried: refused by name).
"""

from __future__ import annotations

import numpy as np

from ..errors import FrinkError
from .attention import AttentionKv
from .kv_types import F32_CACHE, OPTION_K, CacheTypes, Rows


def check_latent_types(types: CacheTypes) -> None:
    """FrinkError unless the K and V cache types are f32 (the latent rows are both)."""
    if types != F32_CACHE:
        raise FrinkError(
            f"{OPTION_K} {types.k} / -ctv {types.v}: the latent (MLA) cache holds f32 rows only"
        )


class LatentKv(AttentionKv):
    """Every position's [latent | k_pe] row (one KV head); the values are the same rows."""

    def __init__(self, width: int, n_ctx: int, *, types: CacheTypes = F32_CACHE) -> None:
        check_latent_types(types)
        # No value buffer: zero columns, zero bytes.
        super().__init__(1, width, 0, n_ctx, types=types)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> int:
        """Write rows k [T, 1, width] (v is k itself: not kept twice)."""
        return super().write(start, k, k[..., :0])

    def rows(self, a: int, b: int) -> tuple[Rows, Rows]:
        k = self._k[:, a:b]
        return k, k

    def by_position(self) -> tuple[np.ndarray, np.ndarray]:
        k, _ = super().by_position()
        return k, k
