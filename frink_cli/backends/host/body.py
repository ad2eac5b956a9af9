"""HostBody: the whole decoder stack in NumPy, layer by layer.

The layer is the architecture's composition (ModelConfig.ext: its embed, layer and head);
here it runs over the host ops (backends/host/ops.py). `layer()` serves every kind of step;
the decoder loop decides which layers run here and which on a backend.
"""

from __future__ import annotations

import ctypes
import platform
from typing import Any

import numpy as np

from ...graph.rope import rope_factors
from ...model.config import ModelConfig
from ...model.weights import ModelWeights, embedding_rows
from .ops import HOST_OPS
from .rope import Rope

_malloc_tuned = False


def keep_freed_memory() -> None:
    """Have glibc keep freed blocks up to 32 MiB for reuse instead of returning them.

    A prefill's temporaries (scores, gate/up rows: megabytes each) are allocated and freed
    every layer. glibc hands blocks that size back to the kernel on free (mmap, or a heap
    trim), so the next layer's first touch of every page faults again: ~10,000 page faults
    and a measurable share of a prefill (docs/performance.md). Kept, the pages
    are reused warm. Larger blocks (a 262k-row embedding being dequantized at load) are
    still returned. Process-wide and glibc only; elsewhere a no-op.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h> parameter numbers
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 256 << 20)


class HostBody:
    """The layers, embedding and head on the host: the architecture's composition over
    HostOps, with the per-layer rope tables built once."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights) -> None:
        self.cfg = cfg
        self.w = weights
        keep_freed_memory()
        # Fixed per model; asked once here, not once per layer per token.
        self.shapes = [cfg.layer_shape(layer) for layer in range(cfg.n_layer)]
        # Per layer rope tables, per LongRoPE choice (long factors for a long context).
        self._ropes: dict[bool, list[Rope]] = {}
        self.ropes = self.ropes_for(0)

    def ropes_for(self, n_ctx: int) -> list[Rope]:
        """Each layer's Rope for a context of n_ctx tokens (LongRoPE switches on it)."""
        cfg, w = self.cfg, self.w
        long = cfg.rope_scaling is not None and cfg.rope_scaling.long(n_ctx)
        if long not in self._ropes:
            factors = rope_factors(
                cfg, w.rope_freqs, w.rope_factors_long, w.rope_factors_short, n_ctx
            )
            ropes: dict[tuple[float, float, int, bool], Rope] = {}
            keys = [(s.rope_base, s.rope_scale, s.rope_dim, s.no_rope_freqs) for s in self.shapes]
            for key in keys:
                if key not in ropes:
                    base, scale, dim, plain = key
                    ropes[key] = Rope(
                        dim,
                        base,
                        scale,
                        cfg.rope_type,
                        None if plain else factors,
                        cfg.rope_scaling,
                    )
            self._ropes[long] = [ropes[key] for key in keys]
        return self._ropes[long]

    def embed(self, ids: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """The rows the first layer reads for tokens `ids` at `positions` (default 0, 1, ...:
        a fresh sequence)."""
        x = embedding_rows(self.w.token_embd, ids)  # a copy: the residual stream is ours
        at = np.arange(len(ids)) if positions is None else np.asarray(positions)

        def lookup(table: np.ndarray, by_position: bool = False) -> np.ndarray:
            return embedding_rows(table, at if by_position else ids)

        return self.cfg.ext.embed(HOST_OPS, self.cfg, self.w, x, lookup)

    def layer(self, layer: int, x: np.ndarray, positions: np.ndarray, cache) -> np.ndarray:
        return self.layer_as(layer, self.w.layers[layer], x, positions, cache)

    def layer_as(
        self, layer: int, weights: Any, x: np.ndarray, positions: np.ndarray, cache
    ) -> np.ndarray:
        """Layer `layer`'s composition (its shape, rope and cache slot) over `weights`: its
        own, or a block of the same shape stored outside the trunk (a NextN block)."""
        return self.cfg.ext.layer(
            HOST_OPS,
            self.cfg,
            self.shapes[layer],
            weights,
            x,
            positions,
            cache.slot(layer),
            self.ropes_for(cache.n_ctx)[layer],
        )

    def final_norm(self, x: np.ndarray) -> np.ndarray:
        """The last layer's rows as the head reads them (ModelConfig.ext.final_norm)."""
        w = self.w
        return self.cfg.ext.final_norm(HOST_OPS, self.cfg, w.output_norm, x, w.output_norm_b)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self.logits_over(x, self.w.output)

    def logits_over(self, x: np.ndarray, output: Any) -> np.ndarray:
        """The head with `output` as its matrix (some of the head's rows: a draft model's
        vocabulary, draft_vocab.py): logits [T, output's rows]."""
        w = self.w
        return self.cfg.ext.head(HOST_OPS, self.cfg, w.output_norm, output, x, w.output_norm_b)
