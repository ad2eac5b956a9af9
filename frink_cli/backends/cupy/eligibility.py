"""What the dense stack takes: ONE predicate per kind of work, all in this file.

Why one place: a refusal decided anywhere else is a feature some path forgets. The decoder
asks before any cache or device memory is touched; `frink info --backend cuda` asks the
same layer predicate without a GPU. Every refusal has a name (counted in the ledger by it).

- `layer_reasons(cfg, layer, source)` / `layer_refusal(...)` (its first reason, the one the
  ledger counts): what layer l DOES, from its trace (graph/trace.py): every call the
  stack's ops do not carry (capabilities.py), named "<op>: <argument>", then what the
  stack's own state cannot hold: its device KV cache gives every layer the model's head
  widths and rope dims, and every layer of a run writes its K/V rows there.
- `step_refusal(...)`: what THIS step is: a decode row, or a prefill batch of at least
  MIN_BATCH rows, at positions that continue the cache, over cache slots that still hold
  every row the step sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...graph.trace import Source, model_traces
from ...model.config import ModelConfig
from ..base import NOT_RESIDENT  # noqa: F401 - one name for every backend
from ..capability import trace_refusals
from .capabilities import CUDA_OPS

# Prefill batches below this stay on the host body: a 2-3 row batch is a chat turn's tail,
# where the host's GEMVs cost no more than an upload, a sync and a download. Decode rows
# (batch 1) run on the device: their K/V history is already there (the device KV cache),
# and with the lm head in the same submission a decode token is one round trip.
MIN_BATCH = 4

# The stack's refusal reasons, as counted in the ledger. Fixed strings (no numbers) so the
# counts of many steps add up under one name.
BATCH = "batch < 4"
STEP_KIND = "step kind not carried"
POSITIONS = "positions != cache start"
EVICTED = "cache rows != positions (evicted window)"
CACHE_TYPE = "cache layout not carried"
PER_LAYER_HEADS = "per-layer head widths or rope dims"
NO_KV_ROWS = "attention: none in the layer"
# The first refusal of a layer that makes these calls (its trace's first unsupported op).
MOE = "route: not implemented"
ACTIVATION = "glu: act"
SOFTCAP = "attention: softcap"
SINKS = "attention: sinks"
OUTPUT_GATE = "sigmoid_mul_: not implemented"
KV_WIDTHS = "attention: K/V widths differ"
HEAD_DIM = "attention: head dim > 256"
ROPE_DIMS = "rope_: dims (odd or > head dim)"
ROPE_TYPE = "rope_: layout"
NO_WEIGHT = "rms_norm_: no weight"
SHARED_KV = "attention: no K/V of its own"


def layer_reasons(cfg: ModelConfig, layer: int, source: Source = None) -> list[str]:
    """Every reason the stack refuses layer `layer` of this model; [] if it carries it.
    source: what the trace reads the weights from (graph/trace.py: a checkpoint, the
    weights, or None for the shapes the config implies)."""
    calls = model_traces(cfg, source)[layer]
    reasons = trace_refusals(CUDA_OPS, calls)
    shape = cfg.layer_shape(layer)
    if sum(c.op == "attention" for c in calls) != 1:
        reasons.append(NO_KV_ROWS)  # the run brings back each layer's K/V rows
    if (shape.head_dim_k, shape.head_dim_v, shape.rope_dim) != (
        cfg.head_dim_k,
        cfg.head_dim_v,
        cfg.rope_dim,
    ):
        reasons.append(PER_LAYER_HEADS)  # the device KV cache is sized by the model's
    return reasons


def layer_refusal(cfg: ModelConfig, layer: int, source: Source = None) -> str | None:
    """None if the stack carries layer `layer`, else the first reason (the one counted)."""
    reasons = layer_reasons(cfg, layer, source)
    return reasons[0] if reasons else None


def layer_refusals(cfg: ModelConfig, source: Source = None) -> list[str | None]:
    return [layer_refusal(cfg, layer, source) for layer in range(cfg.n_layer)]


def step_refusal(
    cfg: ModelConfig,
    kind: str,
    n_rows: int,
    cache: Any,
    positions: np.ndarray | None,
    layers: Sequence[int],
) -> str | None:
    """None if this step (its batch, positions and cache) can run `layers` on the stack."""
    if kind not in ("prefill", "decode"):
        return STEP_KIND
    if kind == "prefill" and n_rows < MIN_BATCH:
        return BATCH
    n_past = getattr(cache, "n_past", None)
    if not isinstance(n_past, int) or not callable(getattr(cache, "slot", None)):
        return CACHE_TYPE
    if positions is not None:
        positions = np.asarray(positions)
        if (
            len(positions) != n_rows
            or int(positions[0]) != n_past
            or (n_rows > 1 and not np.all(np.diff(positions) == 1))
        ):
            return POSITIONS
    # The stack attends over a device mirror indexed by position, synced from each layer's
    # held rows (cache.KvSlot): a layer must still hold every row the step's first query
    # sees. A window cache holds its window, enough; a slot that dropped more cannot serve.
    for layer in layers:
        first = getattr(cache.slot(layer), "first", None)
        if not isinstance(first, int):
            return CACHE_TYPE
        window = cfg.layer_shape(layer).window
        if first > (max(0, n_past - window + 1) if window is not None else 0):
            return EVICTED
    return None
