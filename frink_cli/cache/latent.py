"""An MLA layer's cache (multi-head latent attention, graph/blocks/mla.py): per token the
compressed latent and the rotated key part, [latent | k_pe], one row shared by every head.

The attention over it is MQA with one KV head whose values are its keys (V = K: the
same buffer; the block keeps the latent columns of the output), so a token takes
kv_lora_rank + rope_dim values per layer, not n_head * (k + v) as full K/V would. Rows
are stored as the K cache type (f32, f16 or bf16, as llama.cpp keeps its MLA latent in its
K cache); a quantized latent is not carried, nor a V type other than K's where one was
chosen (the values are the K rows): both refused by name.
"""

from __future__ import annotations

import numpy as np

from ..errors import FrinkError
from .attention import AttentionKv
from .kv_types import F32_CACHE, OPTION_K, OPTION_V, CacheTypes, Rows

LATENT_TYPES = ("f32", "f16", "bf16")


def check_latent_types(types: CacheTypes) -> None:
    """FrinkError unless the K type is one a latent row is kept in and a chosen V type is
    the same (the latent rows are the keys and the values)."""
    if types.k not in LATENT_TYPES:
        raise FrinkError(
            f"{OPTION_K} {types.k}: the latent (MLA) cache holds {', '.join(LATENT_TYPES)} rows"
        )
    if types.given[1] and types.v != types.k:
        raise FrinkError(
            f"{OPTION_V} {types.v}: the latent (MLA) cache's values are its keys, kept as "
            f"{OPTION_K} says ({types.k})"
        )


class LatentKv(AttentionKv):
    """Every position's [latent | k_pe] row (one KV head); the values are the same rows."""

    def __init__(self, width: int, n_ctx: int, *, types: CacheTypes = F32_CACHE) -> None:
        check_latent_types(types)
        # No value buffer: zero columns, zero bytes.
        super().__init__(1, width, 0, n_ctx, types=CacheTypes(types.k, types.k))

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> int:
        """Write rows k [T, 1, width] (v is k itself: not kept twice)."""
        return super().write(start, k, k[..., :0])

    def rows(self, a: int, b: int) -> tuple[Rows, Rows]:
        k, _ = super().rows(a, b)
        return k, k

    def by_position(self) -> tuple[np.ndarray, np.ndarray]:
        k, _ = super().by_position()
        return k, k
