"""What the MLX graphs carry, decided before any state is touched: ONE predicate.

`layer_refusals(cfg, layer, source)` lists every reason the device graph cannot run layer
l exactly as the host body would: each call of the layer's trace (graph/trace.py) that
the MLX ops do not carry (capabilities.py), named "<op>: <argument>". An empty list means
it takes the layer for prefill and decode alike.
"""

from __future__ import annotations

from ...graph.trace import Source, model_traces
from ...model.config import ModelConfig
from ..capability import trace_refusals
from .capabilities import MLX_OPS


def layer_refusals(cfg: ModelConfig, layer: int, source: Source = None) -> list[str]:
    """source: what the trace reads the weights from (a checkpoint, the weights, or None
    for the shapes the config implies)."""
    return trace_refusals(MLX_OPS, model_traces(cfg, source)[layer])
