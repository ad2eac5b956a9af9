"""An MLA layer's cache (multi-head latent attention, graph/blocks/mla.py): per token the
compressed latent and the rotated key part, [latent | k_pe], one row shared by every head.

The attention over it is MQA with one KV head: keys are the whole rows (latent + rope
dims), values their first `latent` columns, read as a view of the same buffer, so a
token takes kv_lora_rank + rope_dim values per layer, not n_head * (k + v) as full K/V
would. Rows are f32 (a 16-bit or quantized latent is not carried: refused by name).
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
    """Every position's [latent | k_pe] row (one KV head); the values are a view of it."""

    def __init__(
        self, width: int, latent: int, n_ctx: int, *, types: CacheTypes = F32_CACHE
    ) -> None:
        check_latent_types(types)
        if not 0 < latent <= width:
            raise FrinkError(f"bad latent cache widths: latent {latent} of rows {width} wide")
        self.latent = latent
        # No value buffer: zero columns, zero bytes.
        super().__init__(1, width, 0, n_ctx, types=types)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> int:
        """Write rows k [T, 1, width] (v [T, 1, latent] is k's first columns: not kept)."""
        return super().write(start, k, k[..., :0])

    def rows(self, a: int, b: int) -> tuple[Rows, Rows]:
        k = self._k[:, a:b]
        return k, k[..., : self.latent]

    def by_position(self) -> tuple[np.ndarray, np.ndarray]:
        k, _ = super().by_position()
        return k, k[..., : self.latent]
