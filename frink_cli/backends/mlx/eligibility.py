"""What the MLX graphs carry, decided before any state is touched: ONE predicate.

`layer_refusals(cfg, layer)` lists every reason the device graph cannot run layer l
exactly as the host body would; an empty list means it takes the layer for prefill and
decode alike. Every feature ModelConfig can express appears here, carried or refused, so
a new decoration cannot slip through silently.
"""

from __future__ import annotations

from ...model.config import ModelConfig

CARRIED_ACTIVATIONS = ("silu", "gelu_tanh")


def layer_refusals(cfg: ModelConfig, layer: int) -> list[str]:
    shape = cfg.layer_shape(layer)
    reasons = []
    if shape.mixer != "attention":
        reasons.append(f"mixer {shape.mixer} not carried")
    if shape.ffn != "dense":
        reasons.append(f"ffn {shape.ffn} not carried")
    if cfg.ffn_act not in CARRIED_ACTIVATIONS:
        reasons.append(f"activation {cfg.ffn_act}")
    if cfg.attn_logit_softcap:
        reasons.append("attention logit softcap")
    if cfg.head_dim_k != cfg.head_dim_v:
        reasons.append("V width differs from K width")
    # Decorations added to ModelConfig by later architectures are refused until carried.
    for name in ("attn_output_gate", "sinks", "alibi", "residual_scale", "embedding_multiplier"):
        if getattr(cfg, name, None):
            reasons.append(name.replace("_", " "))
    return reasons
