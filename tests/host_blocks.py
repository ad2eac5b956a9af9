"""Test helpers: one composed block (graph/layer.py) run on the host ops, for tests that
compare a block alone against a reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from frink_cli.backends.host.ops import HOST_OPS
from frink_cli.backends.host.rope import Rope
from frink_cli.graph.layer import attention_block, gdn_block
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
    return attention_block(HOST_OPS, cfg, shape, w, x, positions, kv, rope)


def gdn(x: np.ndarray, w: GdnWeights, cfg: ModelConfig, slot: Any) -> np.ndarray:
    """x: normed rows [T, n_embd] -> block output [T, n_embd]; `slot` holds the layer's
    recurrent state."""
    return gdn_block(HOST_OPS, cfg, w, x, slot)
