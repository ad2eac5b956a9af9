"""What the MLX graphs carry, decided before any state is touched: ONE predicate.

`layer_refusals(cfg, layer)` lists every reason the device graph cannot run layer l
exactly as the host body would; an empty list means it takes the layer for prefill and
decode alike. Every feature a model uses (ModelConfig.features()) is either carried here
or refused by name.
"""

from __future__ import annotations

from ...model.config import ModelConfig

CARRIED_ACTIVATIONS = ("silu", "gelu_tanh", "swiglu_oai")
CARRIED_MIXERS = (
    "attention",
    "gdn",
    "linear",
    "none",
    "mamba",
    "mamba2",
    "attention+mamba2",
    "shortconv",
)
CARRIED_FFNS = ("dense", "moe", "dense+moe", "none")

# The features (ModelConfig.features(): decorations and sub-configs) the MLX ops and the
# composition carry in every value. Anything else a model uses is refused by its name,
# so a decoration added to the config later is refused until someone carries it here.
CARRIED_FEATURES = frozenset(
    {
        "qk_norm",
        "post_attn_norm",
        "post_ffn_norm",
        "embd_scale",
        "final_logit_softcap",
        "has_rope_freqs",
        "rope_scaling",
        "ffn_norm_tensor",
        "attn_output_gate",
        "sliding_window",
        "gdn",
        "moe",
        # Mamba-1 / Mamba-2: the selective scan unrolled in the traced graph; its conv tail
        # and scan state are mirrored on the device as the gated delta net's are.
        "mamba",
        "residual_scale",
        "logit_scale",
        "layer_norm",
        "plain_ffn",
        "embd_norm",  # applied on the host with the embedding lookup
        "alibi_bias",
        "no_rope",  # the composition skips the rotation
        "clamp_kqv",
        "no_pre_norm",
        "qk_norm_full",
        "attn_sub_norm",
        "ffn_sub_norm",
        # talkie: norms loaded as ones; the skip stream rides beside the residual stream
        # (concat); the Q gain and projection scales are products with weight arrays.
        "weightless_norms",
        "embd_skip",
        "attn_q_gain",
        "proj_scales",
        # openelm, deci: each layer's sizes come from layer_shape (weights, KV mirrors).
        "layer_sizes",
        # lfm2: the short conv is causal_conv between two linears in the traced graph, its
        # conv tail mirrored on the device as the gated delta net's is; the final norm's
        # tensor name only matters at load. (MoE's sigmoid gating and expert bias ride in
        # "moe": MlxOps.route carries both.)
        "shortconv",
        "output_norm_tensor",
        # gpt-oss: the sinks are SDPA's own argument; the sliding-window layers' rope scale
        # comes from layer_shape like every layer's. (Router and expert biases, SwiGLU-OAI:
        # in "moe" and the activation, carried by MlxOps.)
        "attn_sinks",
        "swa_rope_scaled",
        # gemma4: per-kind head widths and rope dims come from layer_shape (mirrors, ropes);
        # the V norm and V = K are composition; a KV-sharing layer reads its source layer's
        # device state inside the same traced run; the per-layer inputs ride beside the
        # residual stream (made on the host with the embedding lookup); the layer scale is
        # a product with a weight array.
        "swa_head_dim",
        "swa_rope_dim",
        "rope_freqs_global_only",
        "v_norm",
        "v_from_k",
        "kv_shared_from",
        "per_layer_embd",
        "layer_out_scale",
    }
)


def layer_refusals(cfg: ModelConfig, layer: int) -> list[str]:
    shape = cfg.layer_shape(layer)
    reasons = []
    if shape.mixer not in CARRIED_MIXERS:
        reasons.append(f"mixer {shape.mixer} not carried")
    if shape.ffn not in CARRIED_FFNS:
        reasons.append(f"ffn {shape.ffn} not carried")
    if cfg.ffn_act not in CARRIED_ACTIVATIONS:
        reasons.append(f"activation {cfg.ffn_act}")
    if shape.mixer == "attention" and shape.head_dim_k != shape.head_dim_v:
        reasons.append("V width differs from K width")
    features = cfg.features()
    if "attn_logit_softcap" in features:
        reasons.append("attention logit softcap")
        features.discard("attn_logit_softcap")
    reasons += [f"{name} not carried" for name in sorted(features - CARRIED_FEATURES)]
    return reasons
