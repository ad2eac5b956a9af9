"""The attention kernel's geometry: what causal_gqa_attention_f32 (and its NumPy
reference) is told about one layer's step besides its buffers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionGeometry:
    """One layer's attention over one step: the new rows sit at positions n_prefix + t;
    n_head query heads over n_head_kv KV heads (GQA: query head h reads KV head
    h // (n_head / n_head_kv)), head_dim for Q and K, head_dim_v for V; the scores are
    scaled by `scale`, and with a window only keys with q - k < window are visible."""

    n_prefix: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_v: int
    scale: float
    window: int | None = None

    @property
    def out_width(self) -> int:
        """Columns of the output rows: every query head's values side by side."""
        return self.n_head * self.head_dim_v
