"""Test helpers: one composed block (graph/blocks) run on the host ops, for tests that
compare a block alone against a reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from frink_cli.backends.host.ops import HOST_OPS
from frink_cli.backends.host.rope import Rope
from frink_cli.graph.blocks.attention import attention as attention_block
from frink_cli.graph.blocks.gdn import gdn as gdn_block
from frink_cli.model.config import LayerShape, ModelConfig
from frink_cli.model.weights import GdnWeights, LayerWeights


def attention(
    x: np.ndarray,
    w: LayerWeights,
    cfg: ModelConfig,
    shape: LayerShape,
    rope: Rope,
    positions: np.ndarray,
    kv: Any,
) -> np.ndarray:
    """x: normed hidden rows [T, n_embd] -> attention output [T, n_embd] (after o_proj)."""
    spec = cfg.ext.attention_spec(cfg, shape)  # type: ignore[attr-defined]
    return attention_block(HOST_OPS, spec, w, x, positions, kv, rope)


def gdn(x: np.ndarray, w: GdnWeights, cfg: ModelConfig, slot: Any) -> np.ndarray:
    """x: normed rows [T, n_embd] -> block output [T, n_embd]; `slot` holds the layer's
    recurrent state."""
    return gdn_block(HOST_OPS, cfg.ext.gdn, cfg.norm_eps, w, x, slot)  # type: ignore[attr-defined]
