"""What the MLX graphs carry, decided before any state is touched: ONE predicate.

`layer_refusals(cfg, layer)` lists every reason the device graph cannot run layer l
exactly as the host body would; an empty list means it takes the layer for prefill and
decode alike. Every ModelConfig field is either listed here as carried or refused when
set, so a decoration added to the config later is refused until the graph carries it.
"""

from __future__ import annotations

from dataclasses import fields

from ...model.config import ModelConfig

CARRIED_ACTIVATIONS = ("silu", "gelu_tanh")
CARRIED_MIXERS = ("attention", "gdn")
CARRIED_FFNS = ("dense", "moe")

# Fields the graph reads and honours in every value (checked by the rules below where a
# value is refused).
_CARRIED_FIELDS = {
    "arch", "n_layer", "n_embd", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "n_ff",
    "n_vocab", "n_ctx_train", "norm_eps", "rope_type", "rope_dim", "rope_base", "rope_scale",
    "rope_base_swa", "attn_scale", "sliding_window", "swa_layers", "ffn_act", "qk_norm",
    "post_attn_norm", "post_ffn_norm", "embd_scale", "final_logit_softcap", "tied_embeddings",
    "has_rope_freqs", "ffn_norm_tensor", "attn_output_gate", "gdn", "moe",
    "attn_logit_softcap",  # refused below when set
}


def layer_refusals(cfg: ModelConfig, layer: int) -> list[str]:
    shape = cfg.layer_shape(layer)
    reasons = []
    if shape.mixer not in CARRIED_MIXERS:
        reasons.append(f"mixer {shape.mixer} not carried")
    if shape.ffn not in CARRIED_FFNS:
        reasons.append(f"ffn {shape.ffn} not carried")
    if cfg.ffn_act not in CARRIED_ACTIVATIONS:
        reasons.append(f"activation {cfg.ffn_act}")
    if shape.mixer == "attention":
        if cfg.attn_logit_softcap:
            reasons.append("attention logit softcap")
        if cfg.head_dim_k != cfg.head_dim_v:
            reasons.append("V width differs from K width")
    for f in fields(cfg):
        if f.name not in _CARRIED_FIELDS and getattr(cfg, f.name):
            reasons.append(f"{f.name} not carried")
    return reasons
