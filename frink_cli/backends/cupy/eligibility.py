"""What the dense stack takes: ONE predicate per kind of work, all in this file.

Why one place: a refusal decided anywhere else is a feature some path forgets. The decoder
asks before any cache or device memory is touched; `frink info --backend cuda` asks the
same layer predicate without a GPU. Every refusal has a name (counted in the ledger by it).

- `layer_reasons(cfg, layer)` / `layer_refusal(...)` (its first reason, the one the ledger
  counts): what layer l IS (from ModelConfig and layer_shape alone).
  The stack carries pre-norm GQA attention (QKV biases, QK norm, both rope layouts, partial
  rope, rope frequency factors, linear rope scaling, any q scale, sliding windows with
  their own rope base, or ALiBi instead of rope; the QKV clamp), RMSNorm or LayerNorm
  (with or without a bias), post-attention and post-FFN norms at the model's one norm eps,
  and a dense FFN, gated (SwiGLU or GeGLU) or plain, SiLU or GELU (tanh form). Everything
  else is refused by name. The check is exhaustive by construction: every ModelConfig and
  LayerShape field is either listed in CARRIED / OUTSIDE_THE_LAYERS below or refused when
  it holds anything but a neutral value (None, False, 0, empty), so a decoration added to
  the config later is refused ("<field> not carried") until someone classifies it here.
- `step_refusal(...)`: what THIS step is: a decode row, or a prefill batch of at least
  MIN_BATCH rows, at positions that continue the cache, over cache slots that still hold
  every row the step sees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...model.config import ModelConfig
from .ops import ACT_CODES

# Prefill batches below this stay on the host body: a 2-3 row batch is a chat turn's tail,
# where the host's GEMVs cost no more than an upload, a sync and a download. Decode rows
# (batch 1) run on the device: their K/V history is already there (the device KV cache),
# and with the lm head in the same submission a decode token is one round trip.
MIN_BATCH = 4
# Shared-memory bounds of kernels/attention.cu (FRINK_MAX_HEAD_DIM; 2 dims per thread of 128).
MAX_HEAD_DIM = 256

# The stack's refusal reasons, as counted in the ledger. Fixed strings (no numbers) so the
# counts of many steps add up under one name.
BATCH = "batch < 4"
STEP_KIND = "step kind not carried"
POSITIONS = "positions != cache start"
EVICTED = "cache rows != positions (evicted window)"
CACHE_TYPE = "cache layout not carried"
from ..base import NOT_RESIDENT  # noqa: E402,F401 - one name for every backend

MOE = "MoE ffn (experts not resident)"
ACTIVATION = "activation not SiLU/GELU-tanh"
SOFTCAP = "attn logit softcap"
OUTPUT_GATE = "attn output gate"
KV_WIDTHS = "K/V head widths differ"
PER_LAYER_HEADS = "per-layer head widths or rope dims"
HEAD_DIM = "head dim > 256"
ROPE_DIMS = "rope dims (odd or > head dim)"
ROPE_TYPE = "rope layout unknown"

# ModelConfig fields the stack reads and carries (checked below where only some values are).
CARRIED = frozenset(
    {
        "n_embd",
        "n_head",
        "n_head_kv",
        "head_dim_k",
        "head_dim_v",
        "n_ff",
        "norm_eps",
        "rope_type",
        "rope_dim",
        "rope_base",
        "rope_scale",
        "rope_base_swa",
        "attn_scale",
        "qk_norm",
        "post_attn_norm",
        "post_ffn_norm",
        "ffn_act",
        "sliding_window",
        "swa_layers",
        "attn_logit_softcap",
        "has_rope_freqs",
        # YaRN / LongRoPE: the host-built cos/sin tables carry them (rope_frequencies).
        "rope_scaling",
        # The composition's multipliers (archs/decoder.py): scale ops between the kernels.
        "residual_scale",
        "logit_scale",
        # olmo2: branches read the residual stream (no pre-norm ops); full-width QK norm
        # is the rms_norm kernel over a contiguous copy of the q / k columns.
        "no_pre_norm",
        "qk_norm_full",
        # bitnet: the rms_norm kernel over the attention output / gated activation rows.
        "attn_sub_norm",
        "ffn_sub_norm",
        # talkie: the skip stream rides beside the residual stream (its rows are 2*n_embd
        # wide: the concat and a scale between the kernels), the per-head Q gain and the
        # projection scales are array products (the array module's elementwise kernels).
        "embd_skip",
        "attn_q_gain",
        "proj_scales",
        # openelm, deci: each layer's head counts and FFN width from its LayerShape (the
        # weights, the device KV cache and the stack's returned rows are sized per layer);
        # deci's "linear" / "none" mixers and FFN-free layers are refused by those names.
        "layer_sizes",
        # starcoder2, bloom, mpt: the layer_norm kernel (weight, optional bias), the plain
        # FFN's act kernel, ALiBi slopes inside the attention kernel, the clamp kernel.
        "layer_norm",
        "plain_ffn",
        "alibi_bias",
        "clamp_kqv",
    }
)
# Fields that concern only what happens before the first layer or after the last (embedding,
# logits: both stay on the host) or that only describe the model.
OUTSIDE_THE_LAYERS = frozenset(
    {
        "arch",
        "n_layer",
        "n_vocab",
        "n_ctx_train",
        "embd_scale",
        "final_logit_softcap",
        "tied_embeddings",
        # bloom's LayerNorm on the looked-up embeddings: the host's, with the lookup.
        "embd_norm",
    }
)
# Fields read only by layers of another kind, which layer_shape names (mixer "gdn" or
# "mamba" or "shortconv", ffn "moe") and which are refused by that name before these could
# matter.
OTHER_LAYER_KINDS = frozenset({"gdn", "moe", "mamba", "shortconv"})
# Fields that only say where load_weights finds a tensor: the stack gets the loaded weights.
LOAD_TIME = frozenset({"ffn_norm_tensor", "weightless_norms", "output_norm_tensor"})
# Fields refused by their own named check above (kept out of the generic rule's words).
REFUSED_BY_NAME = frozenset({"attn_output_gate"})
# LayerShape fields the stack reads (mixer, ffn and window are checked below).
# n_head / n_head_kv / n_ff: the layer's own sizes (ModelConfig.layer_sizes, or the model's).
# head_dim_k / head_dim_v / rope_dim: the stack sizes every layer by the model's, so a
# layer whose own differ (gemma4's sliding layers) is refused by PER_LAYER_HEADS.
CARRIED_SHAPE = frozenset(
    {
        "mixer",
        "ffn",
        "window",
        "rope_base",
        "rope_scale",
        "n_head",
        "n_head_kv",
        "n_ff",
        "head_dim_k",
        "head_dim_v",
        "rope_dim",
        "index",
    }
)


def _neutral(value: Any) -> bool:
    """A value that switches nothing on: None, False, 0, "", or a sequence of such."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return not value
    if isinstance(value, (tuple, list, frozenset, set)):
        return all(_neutral(v) for v in value)
    return False


def _unknown_fields(obj: Any, known: frozenset[str]) -> list[str]:
    return [
        f"{f.name} not carried"
        for f in dataclasses.fields(obj)
        if f.name not in known and not _neutral(getattr(obj, f.name))
    ]


def layer_reasons(cfg: ModelConfig, layer: int) -> list[str]:
    """Every reason the stack refuses layer `layer` of this model; [] if it carries it."""
    shape = cfg.layer_shape(layer)
    checks = [
        (shape.mixer != "attention", f"mixer {shape.mixer}"),
        (shape.ffn == "moe", MOE),
        (shape.ffn not in ("dense", "moe"), f"ffn {shape.ffn}"),
        (cfg.ffn_act not in ACT_CODES, ACTIVATION),
        (bool(cfg.decorations().get("attn_logit_softcap")), SOFTCAP),
        (bool(cfg.decorations().get("attn_output_gate")), OUTPUT_GATE),
        (cfg.head_dim_k != cfg.head_dim_v, KV_WIDTHS),
        (
            (shape.head_dim_k, shape.head_dim_v, shape.rope_dim)
            != (cfg.head_dim_k, cfg.head_dim_v, cfg.rope_dim),
            PER_LAYER_HEADS,
        ),
        (max(cfg.head_dim_k, cfg.head_dim_v) > MAX_HEAD_DIM, HEAD_DIM),
        (cfg.rope_dim % 2 == 1 or cfg.rope_dim > cfg.head_dim_k, ROPE_DIMS),
        (cfg.rope_type not in ("norm", "neox"), ROPE_TYPE),
    ]
    reasons = [reason for refused, reason in checks if refused]
    known = CARRIED | OUTSIDE_THE_LAYERS | OTHER_LAYER_KINDS | LOAD_TIME | REFUSED_BY_NAME
    core = [
        r for r in _unknown_fields(cfg, known | cfg.decorations().keys()) if r != "ext not carried"
    ]
    unknown = [f"{name} not carried" for name in sorted(cfg.decorations().keys() - known)]
    return reasons + core + unknown + _unknown_fields(shape, CARRIED_SHAPE)


def layer_refusal(cfg: ModelConfig, layer: int) -> str | None:
    """None if the stack carries layer `layer`, else the first reason (the one counted)."""
    reasons = layer_reasons(cfg, layer)
    return reasons[0] if reasons else None


def layer_refusals(cfg: ModelConfig) -> list[str | None]:
    return [layer_refusal(cfg, layer) for layer in range(cfg.n_layer)]


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
