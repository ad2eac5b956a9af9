"""The tiny fixtures' specs, as data: one TinySpec per model scripts/make_tiny_models.py builds.

Each entry states the transformers class and config a fixture is drawn from, its seed and
how its weights are drawn (the machinery lives in make_tiny_models.py). Every value here is
part of the fixture's fingerprint (stamp.json): changing one rebuilds that fixture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEQ_LEN = 40  # several times gemma3's sliding window of 6
# Router logits of these models are O(1) and the references agree on them to ~1e-6.
MIN_ROUTER_GAP = 1e-4
GREEDY_PROMPT = 16
WEIGHT_STD = 0.1
NORM_STD = 0.2


@dataclass(frozen=True)
class TinySpec:
    name: str
    hf_class: str  # transformers model class
    config_class: str
    config: dict[str, Any]
    seed: int
    # Gemma stores RMSNorm weights as (w - 1): random values around 0 there, around 1 elsewhere.
    norm_center: float = 1.0
    # Per-tensor overrides of norm_center, matched by substring of the parameter name.
    norm_center_overrides: dict[str, float] = field(default_factory=dict)
    # Whether llama.cpp's converter is expected to make a text GGUF of it; if not, only the
    # HF dir and the transformers reference are kept (all current specs do convert).
    expect_gguf: bool = True
    notes: str = ""
    # Tokens in the reference sequence (hybrid models run longer ones: past one 64-token
    # chunk of the delta-rule prefill, through several attention layers).
    seq_len: int = SEQ_LEN
    # Extra flags for llama.cpp's converter (e.g. --no-mtp).
    convert_args: tuple[str, ...] = ()
    # 1-D parameters (not norms) drawn as center + std * noise, by substring of the name:
    # e.g. A_log, so the delta-rule state decays slowly enough to carry across many tokens.
    vector_overrides: dict[str, tuple[float, float]] = field(default_factory=dict)
    # If > 0: also record llama.cpp's greedy continuation of the first greedy_prompt fixture
    # tokens, this many tokens long, and the logits of each of its decode steps.
    greedy: int = 0
    greedy_prompt: int = GREEDY_PROMPT
    # MoE models: the smallest margin allowed between the k-th and (k+1)-th router logit, at
    # every layer and position of the fixture tokens and of the greedy continuation (0: no
    # check). A near-tie there lets summation noise pick another expert, which moves the
    # logits by O(0.1) and would fail parity for no fault of the implementation.
    min_router_gap: float = 0.0
    # config.json's architectures as llama.cpp's converter registers them, when that differs
    # from transformers' class name (MPTForCausalLM vs MptForCausalLM); written before
    # conversion only.
    convert_architecture: str = ""
    # Matrices (by substring of the parameter name) drawn ternary: sign(noise) * c, with c
    # an f16-exact magnitude per tensor and no zeros. Such a matrix is a fixed point of
    # llama.cpp's bitnet converter (s = mean|W| = c) and of TQ1_0/TQ2_0 (block scale
    # max|W| = c), so transformers, the converted GGUF and its TQ requants hold the same
    # weights.
    ternary: tuple[str, ...] = ()
    # Parameter renames (substring -> replacement) in the copy handed to llama.cpp's
    # converter, where its tensor map knows another spelling than transformers' (bitnet's
    # sub-norms: the 1bitLLM names); the HF dir keeps transformers' names.
    convert_renames: dict[str, str] = field(default_factory=dict)
    # MoE routers' expert-selection bias (lfm2moe's expert_bias, a buffer the parameter
    # loop never sees): drawn as std * noise, so a reader that drops it picks other experts.
    router_bias_std: float = 0.0
    # config.json keys rewritten after save_pretrained, before anything reads the dir: the
    # spelling released checkpoints carry where transformers saves its own (Granite 4.0-H's
    # layer_types "mamba" / "attention", which llama.cpp's converter reads and transformers
    # maps on load to its "linear_attention" / "full_attention").
    config_overrides: dict[str, Any] = field(default_factory=dict)
    # Matrices (by substring of the parameter name) drawn with this std instead of
    # WEIGHT_STD: gpt-oss's expert gate/up rows, wide enough that the SwiGLU-OAI clamp at 7
    # bites on some of them.
    matrix_std: dict[str, float] = field(default_factory=dict)
    # Buffers (by substring of the name) drawn as center + std * noise: gemma4's
    # layer_scalar, a saved buffer the parameter loop never sees (1.0 would hide it).
    buffer_overrides: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Tensors (by substring of the name) left out of the copy handed to llama.cpp's
    # converter: buffers transformers saves that released checkpoints lack (MiniMax's
    # lightning decay tables), which the converter's tensor map cannot name.
    convert_drop: tuple[str, ...] = ()


_COMMON: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}

# gemma3's converter never writes a sliding-window pattern, so llama.cpp assumes the real
# Gemma 3 pattern (every 6th layer global). The fixture follows it with 7 layers so there are
# local layers on both sides of the global one (layer 5).
_GEMMA3_TEXT: dict[str, Any] = dict(
    _COMMON,
    num_hidden_layers=7,
    head_dim=32,  # != hidden / heads
    query_pre_attn_scalar=32,  # llama.cpp scales by 1/sqrt(head_dim) for non-27B gemma3
    sliding_window=6,
    layer_types=["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"],
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 200000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 3000.0},
    },
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
    tie_word_embeddings=True,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)

# llama.cpp's CPU GELU reads an f16 lookup table (GGML_GELU_FP16 in ggml-cpu/vec.h), so its
# gemma3 logits carry ~1e-3 relative noise from every FFN. Gemma's post-FFN norm rescales the
# FFN output to unit size whatever its weights, so that norm's scale sets how much of the
# noise reaches the logits: at ~0.5 (stored as w - 1 = -0.5) transformers and llama.cpp agree
# to ~1e-3 instead of ~2-3e-3, leaving the 2e-3 parity bar meaningful against both.
_GEMMA3_NORMS: dict[str, float] = {"post_feedforward_layernorm": -0.5}

# Gemma 4: sliding layers (window 6, head 16, 2 KV heads, rope over every dim at theta 3000)
# and full ones (head 32, 1 KV head and V = K: attention_k_eq_v, proportional rope over a
# quarter of the head at theta 2e5); the last 2 layers share the K/V of layers 3 (sliding)
# and 4 (full), which both llama.cpp's rule (n_kv - 2 / n_kv - 1) and transformers' (the
# last earlier layer of the kind) pick; their FFNs are double wide. Per-layer embeddings
# 8 wide, a final softcap that bites. Norms scale by w (around 1), except the ones that set
# how far llama.cpp's f16 GELU table noise (see _GEMMA3_NORMS) is carried: the post-FFN and
# per-layer-embedding norms at ~0.25, and Q/K norms at ~0.4 (q.k is unscaled here: sharp
# softmaxes amplify the noise). So drawn, the references agree to ~7e-4 instead of ~7e-2;
# transformers with its GELU input and output rounded to f16 agrees with llama.cpp to
# ~1e-3 either way (the rest of the two graphs is the same).
_GEMMA4_TEXT: dict[str, Any] = dict(
    _COMMON,
    num_hidden_layers=7,
    layer_types=[
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    ],
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=512,
    sliding_window=6,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 3000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 200000.0,
        },
    },
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    final_logit_softcapping=3.0,
    tie_word_embeddings=True,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)
# The MoE variant (Gemma 4 26B-A4B's shape): no per-layer embeddings, no KV sharing, V = K
# on the full layers; each layer's dense FFN runs beside the routed experts.
_GEMMA4_MOE: dict[str, Any] = dict(
    _GEMMA4_TEXT,
    num_hidden_layers=4,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    num_kv_shared_layers=0,
    use_double_wide_mlp=False,
    hidden_size_per_layer_input=0,
    enable_moe_block=True,
    num_experts=8,
    top_k_experts=2,
    moe_intermediate_size=32,
)
_GEMMA4_NORMS: dict[str, float] = {
    "post_feedforward_layernorm": 0.25,
    "post_per_layer_input_norm": 0.25,
    "q_norm": 0.4,
    "k_norm": 0.4,
}

# Qwen3.5 / Qwen3-Next hybrids: gated-delta-net (linear attention) layers with a gated
# full-attention layer every few. More value heads than key heads (4 vs 2), so a wrong
# value-head -> key-head mapping (tiled in qwen35 GGUFs, grouped elsewhere) moves the logits.
# Their RMSNorms scale by (1 + w) (weights drawn around 0), except the delta net's gated norm
# (plain w, around 1). A_log around -1.5 keeps the state decay slow (~0.8 per token), so
# state from many tokens back, and from the previous prefill chunk, reaches the logits.
_HYBRID_TEXT: dict[str, Any] = dict(
    _COMMON,
    head_dim=32,
    rms_norm_eps=1e-6,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    rope_parameters={"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.25},
)
_HYBRID_NORMS: dict[str, float] = {"linear_attn.norm": 1.0}
_HYBRID_VECTORS: dict[str, tuple[float, float]] = {"A_log": (-1.5, 0.3), "dt_bias": (0.0, 0.5)}
# Past one 64-token chunk of the delta-rule prefill (transformers' and frink's chunk size).
_HYBRID_SEQ_LEN = 80
# The recurrent family's greedy prompts cross the 64-row prefill chunk (the host scan's and
# metal's), so the decode steps start from a state carried across a chunk boundary.
_RECURRENT_GREEDY_PROMPT = 70
# Qwen3.5 MoE: the hybrid with a routed FFN on every layer and a gated shared expert. Its
# config has no intermediate_size (no dense FFN anywhere).
_QWEN35_MOE_TEXT: dict[str, Any] = dict(
    {k: v for k, v in _HYBRID_TEXT.items() if k != "intermediate_size"},
    num_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    tie_word_embeddings=False,
)
_QWEN35_VISION: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 8,
    "num_position_embeddings": 16,
}

# IBM Granite 3.x (granite, granitemoe): the llama layer with four multipliers, each far
# from neutral so a dropped one moves the logits by O(1) (tests/test_granite.py checks it):
#   embedding_multiplier  scales the token embeddings;
#   residual_multiplier   scales both branch outputs before their residual adds;
#   attention_multiplier  IS the q.k scale (replaces 1/sqrt(head_dim) = 0.25 here);
#   logits_scaling        divides the logits. The final norm is drawn around that same
#                         value, so the logits keep llama's spread and the fixture its
#                         clear argmaxes; dropping the division multiplies them by 8.
# Released Granite ties its embeddings with an embedding multiplier of 12. With random
# weights that makes every position's argmax its own input token (the scaled embedding
# swamps the branches and the tied head reads it back), so the tied fixtures scale the
# embeddings by 0.35 instead -- still a multiply a tied head must not see -- and the untied
# one (granitemoe) keeps 12.
# head_dim is hidden / heads (16): the converter ignores a head_dim key for granite.
_GRANITE: dict[str, Any] = dict(
    _COMMON,
    rope_theta=30000.0,
    rms_norm_eps=1e-6,
    embedding_multiplier=0.35,
    residual_multiplier=0.22,
    attention_multiplier=0.7,
    logits_scaling=8.0,
    tie_word_embeddings=True,
)
_GRANITE_NORMS: dict[str, float] = {"model.norm.": 8.0}
# GraniteMoE: every FFN a sparse MoE whose experts are stored fused (input_linear
# [E, 2*ff, d] = gate rows then up rows; output_linear [E, d, ff]); intermediate_size is
# the expert width (the converter writes it as feed_forward_length, no expert width key).
_GRANITE_MOE: dict[str, Any] = dict(
    _GRANITE,
    intermediate_size=32,
    num_local_experts=8,
    num_experts_per_tok=2,
)

# LayerNorm-with-bias families (starcoder2, bloom, mpt): every bias (LayerNorm and linear)
# drawn around 0, LayerNorm weights around 1 (bloom's final norm is "ln_f", not "*norm*").
_LN_VECTORS: dict[str, tuple[float, float]] = {
    ".bias": (0.0, WEIGHT_STD),
    "ln_f.weight": (1.0, NORM_STD),
}
# OLMo 2: no pre-norms (each branch reads the residual stream itself), an RMSNorm on each
# branch's output before its residual add, and Q/K norms over the whole projection width
# (n_head*head_dim and n_head_kv*head_dim weights, not one head's). Every norm weight is
# random around 1, so a dropped or per-head norm moves the logits (tests/test_olmo2.py).
# llama.cpp's olmo2 requires an output tensor: untied.
_OLMO2: dict[str, Any] = dict(
    _COMMON,
    rope_theta=20000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    pad_token_id=1,
    bos_token_id=None,
    eos_token_id=2,
)
# Rope scaling fixtures: the original context (32) is well below the reference sequence
# (_LONG_SEQ_LEN tokens), so YaRN's blend and LongRoPE's long factors both apply, and the
# scaling factors are far from 1 so a dropped one (or its cos/sin multiplier) fails parity.
_ROPE_ORIG_CTX = 32
_LONG_SEQ_LEN = 72
_YARN: dict[str, Any] = {
    "rope_type": "yarn",
    "factor": 8.0,
    "original_max_position_embeddings": _ROPE_ORIG_CTX,
}
# Phi-3: fused qkv_proj and gate_up_proj; head_dim 16 with half of it rotating (8 dims, 4
# LongRoPE factors each), so the cos/sin multiplier must leave the other half alone.
_PHI3: dict[str, Any] = dict(
    _COMMON,
    num_hidden_layers=3,
    rms_norm_eps=1e-5,
    original_max_position_embeddings=_ROPE_ORIG_CTX,
    sliding_window=None,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_PHI3_LONGROPE = dict(
    _PHI3,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": _ROPE_ORIG_CTX,
        "short_factor": [1.0, 1.3, 2.1, 3.5],
        "long_factor": [1.2, 2.5, 6.0, 14.0],
    },
)

# BitNet b1.58: rows 256 wide (hidden 256, ffn 512), whole TQ1_0/TQ2_0 blocks, so
# tests/test_bitnet.py can requantize it; every projection ternary (spec.ternary: a fixed
# point of the converter's ternarization and of the TQ types); SiLU, the activation
# llama.cpp's bitnet graph applies whatever the config says (transformers' default relu2
# would make the references disagree); tied, as llama.cpp's bitnet always is. The
# converter's tensor map knows only the 1bitLLM names of the sub-norms, so its copy has
# them renamed; the HF dir keeps transformers' names.
_BITNET: dict[str, Any] = dict(
    _COMMON,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# Mamba-1 (MambaForCausalLM; llama.cpp `mamba`): no attention, no FFN, a selective-scan
# mixer per layer. d_inner = 2 * hidden (the converter asserts the expansion of 2), a
# time_step_rank stated (8, not the ceil(hidden / 16) = 4 default) so a reader that
# derives it fails; the conv has its bias. Falcon-Mamba adds weightless RMSNorms on dt, B
# and C: llama.cpp norms them with the layer epsilon, transformers with mixer_rms_eps, so
# the fixture sets the two alike.
_MAMBA: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    state_size=16,
    conv_kernel=4,
    expand=2,
    time_step_rank=8,
    layer_norm_epsilon=1e-5,
    use_conv_bias=True,
    use_bias=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# LFM2 (Lfm2ForCausalLM; llama.cpp `lfm2`): short-conv layers (in_proj -> B, C, x; a causal
# depthwise conv of B*x, no bias; C * conv; out_proj) mixed with attention layers that have
# per-head QK RMSNorms; a SwiGLU FFN on every layer. The FFN width is auto-adjusted as
# transformers and the converter both do (int(2 * 200 / 3) = 133, rounded up to a multiple
# of 32: 160), so a reader that takes intermediate_size as it stands fails. The attention
# layers sit irregularly, so a reader that guesses the pattern fails.
_LFM2: dict[str, Any] = dict(
    _COMMON,
    intermediate_size=200,
    num_hidden_layers=6,
    layer_types=["conv", "full_attention", "conv", "conv", "full_attention", "conv"],
    conv_L_cache=3,
    conv_bias=False,
    block_auto_adjust_ff_dim=True,
    block_ffn_dim_multiplier=1.0,
    block_multiple_of=32,
    norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# Mamba-2 (Mamba2ForCausalLM; llama.cpp `mamba2`): the fused in_proj (z, xBC, dt), a conv
# over x, B and C, per-head scalar decays, B/C in 2 groups of 4 heads, the gated grouped
# RMSNorm. 8 heads of 16 (d_inner = 2 * hidden, as the converter asserts). A_log around
# -1.5 and dt_bias around 0 keep the decay slow (~0.85 per token), so state from the
# previous 64-token prefill chunk reaches the logits; D around 1 so the skip term shows.
# chunk_size 32: transformers' chunked SSD prefill crosses its own chunks too.
_MAMBA2: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    state_size=16,
    num_heads=8,
    head_dim=16,
    n_groups=2,
    conv_kernel=4,
    expand=2,
    layer_norm_epsilon=1e-5,
    use_conv_bias=True,
    use_bias=False,
    chunk_size=32,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# LFM2-MoE (Lfm2MoeForCausalLM; llama.cpp `lfm2moe`): LFM2's mixers, the first
# num_dense_layers FFNs dense, the rest routed by a sigmoid router whose expert bias (a
# buffer, randomized here: router_bias_std) moves the selection but not the weights.
_LFM2_MOE: dict[str, Any] = dict(
    _COMMON,
    num_hidden_layers=6,
    layer_types=["conv", "conv", "full_attention", "conv", "full_attention", "conv"],
    conv_L_cache=3,
    conv_bias=False,
    norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    num_dense_layers=2,
    num_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=32,
    use_expert_bias=True,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    # Tied, as every LFM2-MoE: llama.cpp's converter has no name for an lm_head here.
    tie_word_embeddings=True,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

_MAMBA2_VECTORS: dict[str, tuple[float, float]] = {
    "A_log": (-1.5, 0.3),
    "dt_bias": (0.0, 0.5),
    "mixer.D": (1.0, 0.3),
}

# Granite 4.0-H (GraniteMoeHybridForCausalLM; llama.cpp `granitehybrid`): Mamba-2 layers and
# NoPE attention layers in one stack (a layer is Mamba-2 where the GGUF's per-layer
# head_count_kv is 0), every layer followed by the FFN: a sparse MoE (input_linear fused
# gate|up) plus the always-on shared_mlp, or (no experts) shared_mlp alone as the dense FFN.
# Granite's multipliers away from neutral, as in _GRANITE (the final norm around
# logits_scaling). The mamba sizes as _MAMBA2's: 8 heads of 16, 2 groups, state 16.
_GRANITE_HYBRID_LAYERS = ["mamba", "attention", "mamba", "mamba", "attention"]
_GRANITE_HYBRID: dict[str, Any] = dict(
    _COMMON,
    num_hidden_layers=len(_GRANITE_HYBRID_LAYERS),
    layer_types=_GRANITE_HYBRID_LAYERS,
    intermediate_size=32,
    shared_intermediate_size=48,
    num_local_experts=4,
    num_experts_per_tok=2,
    rms_norm_eps=1e-5,
    embedding_multiplier=0.35,
    residual_multiplier=0.3,
    attention_multiplier=0.7,
    logits_scaling=8.0,
    position_embedding_type="nope",
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_n_groups=2,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_chunk_size=32,
    mamba_conv_bias=True,
    mamba_proj_bias=False,
    tie_word_embeddings=True,
)

# Falcon-H1 (FalconH1ForCausalLM; llama.cpp `falcon-h1`): attention (neox rope) and a Mamba-2
# mixer in parallel on the same normed input, their outputs summed, then the FFN. Every
# multiplier is away from 1 so each matters; llama.cpp's converter folds them all into the
# weights (embedding, lm head, q/k/v/o, in_proj per z/x/B/C/dt segment, out_proj, gate and
# down), so the GGUF graph has none. mamba_rms_norm off, as released Falcon-H1 configs have
# it (llama.cpp's graph then skips the gated norm: y * silu(z)). Untied: the converter scales
# the embedding and the head apart.
_FALCON_H1: dict[str, Any] = dict(
    _COMMON,
    intermediate_size=96,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
    mamba_d_ssm=128,
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_n_groups=2,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_chunk_size=32,
    mamba_conv_bias=True,
    mamba_proj_bias=False,
    mamba_rms_norm=False,
    mamba_norm_before_gate=False,
    projectors_bias=False,
    lm_head_multiplier=1.5,
    embedding_multiplier=0.6,
    mlp_multipliers=[0.6, 1.7],
    key_multiplier=0.5,
    attention_in_multiplier=1.5,
    attention_out_multiplier=0.6,
    ssm_multipliers=[1.5, 1.6, 0.6, 1.5, 0.7],
    ssm_in_multiplier=0.7,
    ssm_out_multiplier=4.0,
    tie_word_embeddings=False,
)

# gpt-oss (GptOssForCausalLM; llama.cpp `gpt-oss`): sliding-window layers (even ones)
# alternating with full ones, a learned sink logit per head, biases on Q/K/V/O, on the router
# and on the experts, SwiGLU-OAI experts (alpha 1.702, limit 7: llama.cpp hard-codes both),
# YaRN on every layer. truncate is left at transformers' default (True): released configs
# say False, where transformers' correction range differs from llama.cpp's (floor / ceil).
_GPT_OSS: dict[str, Any] = dict(
    _COMMON,
    num_hidden_layers=3,
    head_dim=16,
    intermediate_size=32,  # the expert width
    sliding_window=6,
    num_local_experts=8,
    num_experts_per_tok=4,
    rms_norm_eps=1e-5,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 64,
    },
    tie_word_embeddings=False,
)

# --- deepseek2 (issue 31): multi-head latent attention, grouped MoE routing, YaRN mscale ---
# V3-style: the Q low-rank path (q_a -> norm -> q_b), sigmoid scoring with the selection
# bias and 4 groups of 2 experts (top 2 groups), a leading dense layer, YaRN x4 with
# mscale_all_dim (the softmax scale moves too); K (nope + rope) and V head widths differ.
_DEEPSEEK_MLA: dict[str, Any] = dict(
    _COMMON,
    num_key_value_heads=4,
    num_hidden_layers=3,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=20,
    moe_intermediate_size=32,
    n_shared_experts=1,
    first_k_dense_replace=1,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
_DEEPSEEK_V3: dict[str, Any] = dict(
    _DEEPSEEK_MLA,
    q_lora_rank=48,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    rope_interleave=True,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
)
# V2-Lite-style: plain wq (no q_lora_rank), softmax scoring, no groups, no renormalization.
# 26 layers: llama.cpp reads no q_lora_rank only for its "lite" layer counts (26, 27).
_DEEPSEEK_V2_LITE: dict[str, Any] = dict(
    _DEEPSEEK_MLA,
    num_hidden_layers=26,
    q_lora_rank=None,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_group=1,
    topk_group=1,
    topk_method="greedy",
    routed_scaling_factor=1.5,
    norm_topk_prob=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
_DEEPSEEK_SPECS = [
    TinySpec(
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        _DEEPSEEK_V3,
        seed=131,
        buffer_overrides={"e_score_correction_bias": (0.0, 0.05)},
        # As released configs state them (transformers' class has no such field; llama.cpp's
        # converter writes the gating function only from scoring_func).
        config_overrides={"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
        greedy=24,
        notes="MLA with q_lora_rank (kv_lora 32, rope 8, nope 16, v 20), 1 dense + 2 MoE "
        "layers (8 experts top 2 in 4 groups top 2, sigmoid + selection bias, x2.5, "
        "renormalized), a shared expert, YaRN x4 with mscale_all_dim 1",
    ),
    TinySpec(
        "deepseek_v2_lite",
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
        _DEEPSEEK_V2_LITE,
        seed=132,
        config_overrides={"scoring_func": "softmax"},
        greedy=24,
        notes="MLA without q_lora_rank, 1 dense + 25 MoE layers (8 experts top 3, softmax, "
        "x1.5, not renormalized), a shared expert",
    ),
]


SPECS: dict[str, TinySpec] = {
    s.name: s
    for s in [
        TinySpec(
            "llama",
            "LlamaForCausalLM",
            "LlamaConfig",
            dict(
                _COMMON,
                num_hidden_layers=3,
                rope_theta=50000.0,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
            seed=1,
        ),
        # Rows 256 wide (hidden 256, ffn 512): whole super-blocks of the K-quant and IQ types
        # (256 weights each), so llama.cpp quantizes every matrix to the type asked for
        # instead of falling back; tests/test_quant_types.py requantizes this one.
        TinySpec(
            "llama_q",
            "LlamaForCausalLM",
            "LlamaConfig",
            dict(
                _COMMON,
                hidden_size=256,
                intermediate_size=512,
                num_hidden_layers=2,
                rope_theta=10000.0,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
            seed=12,
            notes="llama with 256-wide rows, for the quant-type tests",
        ),
        TinySpec(
            "llama_tied",
            "LlamaForCausalLM",
            "LlamaConfig",
            dict(
                _COMMON,
                num_hidden_layers=2,
                rope_theta=20000.0,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
            ),
            seed=2,
        ),
        TinySpec(
            "mistral",
            "MistralForCausalLM",
            "MistralConfig",
            dict(
                _COMMON,
                num_hidden_layers=2,
                rope_theta=1000000.0,
                rms_norm_eps=1e-5,
                head_dim=16,
                sliding_window=None,
                tie_word_embeddings=False,
            ),
            seed=3,
        ),
        TinySpec(
            "qwen2",
            "Qwen2ForCausalLM",
            "Qwen2Config",
            dict(
                _COMMON,
                num_hidden_layers=2,
                rope_theta=300000.0,
                rms_norm_eps=1e-6,
                use_sliding_window=False,
                tie_word_embeddings=False,
            ),
            seed=4,
            notes="QKV biases (randomized, non-zero)",
        ),
        TinySpec(
            "qwen3",
            "Qwen3ForCausalLM",
            "Qwen3Config",
            dict(
                _COMMON,
                num_hidden_layers=3,
                head_dim=32,
                rope_theta=1000000.0,
                rms_norm_eps=1e-6,
                use_sliding_window=False,
                attention_bias=False,
                tie_word_embeddings=False,
            ),
            seed=5,
            notes="QK norm, head_dim 32 != hidden/heads",
        ),
        # Rows 256 wide (hidden 256, heads 4 x 64, ffn 512): whole 128-weight blocks of
        # Q1_0, the 1-bit type of the Bonsai qwen3 models; tests/test_q1_0.py has llama.cpp
        # quantize this one to Q1_0.
        TinySpec(
            "qwen3_q",
            "Qwen3ForCausalLM",
            "Qwen3Config",
            dict(
                _COMMON,
                hidden_size=256,
                intermediate_size=512,
                num_hidden_layers=2,
                head_dim=64,
                rope_theta=1000000.0,
                rms_norm_eps=1e-6,
                use_sliding_window=False,
                attention_bias=False,
                tie_word_embeddings=False,
            ),
            seed=42,
            notes="qwen3 with 256-wide rows, for the Q1_0 tests",
        ),
        TinySpec(
            "gemma3_text",
            "Gemma3ForCausalLM",
            "Gemma3TextConfig",
            _GEMMA3_TEXT,
            seed=6,
            norm_center=0.0,
            norm_center_overrides=_GEMMA3_NORMS,
            notes="5 local (window 6) + 1 global + 1 local layer, two rope thetas",
        ),
        TinySpec(
            "gemma3",
            "Gemma3ForConditionalGeneration",
            "Gemma3Config",
            {
                "text_config": dict(_GEMMA3_TEXT),
                "vision_config": {
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "image_size": 32,
                    "patch_size": 8,
                },
                "mm_tokens_per_image": 4,
                # Out of the text vocab, so no fixture token is an image placeholder.
                "image_token_index": 600,
                "boi_token_index": 601,
                "eoi_token_index": 602,
            },
            seed=7,
            norm_center=0.0,
            norm_center_overrides=_GEMMA3_NORMS,
            notes="HF model_type gemma3: text model inside text_config, tiny vision tower",
        ),
        TinySpec(
            "qwen35",
            "Qwen3_5ForCausalLM",
            "Qwen3_5TextConfig",
            dict(_HYBRID_TEXT, num_hidden_layers=8, tie_word_embeddings=True),
            seed=20,  # (seeds chosen so the first few token sequences have clear argmaxes)
            norm_center=0.0,
            norm_center_overrides=_HYBRID_NORMS,
            seq_len=_HYBRID_SEQ_LEN,
            convert_args=("--no-mtp",),
            vector_overrides=_HYBRID_VECTORS,
            greedy=24,
            notes="GDN x3 ATTN x1 (x2), tied embeddings, 4 value heads on 2 key heads",
        ),
        TinySpec(
            "qwen35_vl",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5Config",
            {
                "text_config": dict(
                    _HYBRID_TEXT,
                    num_hidden_layers=4,
                    tie_word_embeddings=False,
                    rope_parameters=dict(
                        _HYBRID_TEXT["rope_parameters"],
                        mrope_section=[2, 1, 1],
                        mrope_interleaved=True,
                    ),
                ),
                "vision_config": dict(_QWEN35_VISION),
                # Out of the text vocab, so no fixture token is a vision placeholder.
                "image_token_id": 600,
                "video_token_id": 601,
                "vision_start_token_id": 602,
                "vision_end_token_id": 603,
                "tie_word_embeddings": False,
            },
            seed=12,
            norm_center=0.0,
            norm_center_overrides=_HYBRID_NORMS,
            seq_len=_HYBRID_SEQ_LEN,
            convert_args=("--no-mtp",),
            vector_overrides=_HYBRID_VECTORS,
            greedy=24,
            notes="HF model_type qwen3_5: text model inside text_config, tiny vision tower, "
            "mrope sections",
        ),
        TinySpec(
            "qwen3next",
            "Qwen3NextForCausalLM",
            "Qwen3NextConfig",
            dict(
                _HYBRID_TEXT,
                num_hidden_layers=6,
                # Every third layer attends (not the default fourth): the GGUF's
                # recurrent_layers array, not full_attention_interval, must decide.
                layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=48,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                tie_word_embeddings=False,
            ),
            seed=26,
            norm_center=0.0,
            norm_center_overrides=_HYBRID_NORMS,
            seq_len=_HYBRID_SEQ_LEN,
            convert_args=("--no-mtp",),
            vector_overrides=_HYBRID_VECTORS,
            greedy=24,
            notes="GDN x2 ATTN x1 (x2), sparse MoE (4 experts, top 2) + gated shared expert",
        ),
        TinySpec(
            "qwen3moe",
            "Qwen3MoeForCausalLM",
            "Qwen3MoeConfig",
            dict(
                _COMMON,
                num_hidden_layers=3,
                head_dim=32,
                rope_theta=1000000.0,
                rms_norm_eps=1e-6,
                use_sliding_window=False,
                num_experts=8,
                num_experts_per_tok=3,
                moe_intermediate_size=32,
                # llama.cpp's qwen3moe always renormalizes the top k; transformers only
                # with this flag (released Qwen3 MoE configs set it).
                norm_topk_prob=True,
                tie_word_embeddings=False,
            ),
            seed=31,
            greedy=24,
            min_router_gap=MIN_ROUTER_GAP,
            notes="qwen3 attention + sparse MoE on every layer (8 experts, top 3), "
            "no shared expert",
        ),
        TinySpec(
            "qwen35moe",
            "Qwen3_5MoeForCausalLM",
            "Qwen3_5MoeTextConfig",
            dict(_QWEN35_MOE_TEXT, num_hidden_layers=8),
            seed=32,
            norm_center=0.0,
            norm_center_overrides=_HYBRID_NORMS,
            seq_len=_HYBRID_SEQ_LEN,
            convert_args=("--no-mtp",),
            vector_overrides=_HYBRID_VECTORS,
            greedy=24,
            min_router_gap=MIN_ROUTER_GAP,
            notes="GDN x3 ATTN x1 (x2), sparse MoE (8 experts, top 3) + gated shared expert, "
            "no intermediate_size",
        ),
        TinySpec(
            "qwen35moe_vl",
            "Qwen3_5MoeForConditionalGeneration",
            "Qwen3_5MoeConfig",
            {
                "text_config": dict(
                    _QWEN35_MOE_TEXT,
                    num_hidden_layers=4,
                    rope_parameters=dict(
                        _HYBRID_TEXT["rope_parameters"],
                        mrope_section=[2, 1, 1],
                        mrope_interleaved=True,
                    ),
                ),
                "vision_config": dict(_QWEN35_VISION),
                # Out of the text vocab, so no fixture token is a vision placeholder.
                "image_token_id": 600,
                "video_token_id": 601,
                "vision_start_token_id": 602,
                "vision_end_token_id": 603,
                "tie_word_embeddings": False,
            },
            seed=33,
            norm_center=0.0,
            norm_center_overrides=_HYBRID_NORMS,
            seq_len=_HYBRID_SEQ_LEN,
            convert_args=("--no-mtp",),
            vector_overrides=_HYBRID_VECTORS,
            min_router_gap=MIN_ROUTER_GAP,
            notes="HF model_type qwen3_5_moe: text model inside text_config, tiny vision tower",
        ),
        TinySpec(
            "granite",
            "GraniteForCausalLM",
            "GraniteConfig",
            dict(_GRANITE, num_hidden_layers=3),
            seed=40,
            norm_center_overrides=_GRANITE_NORMS,
            greedy=24,
            notes="llama layer + embedding, residual (both branches), attention (kq) "
            "multipliers, logits / 8; tied",
        ),
        TinySpec(
            "granitemoe",
            "GraniteMoeForCausalLM",
            "GraniteMoeConfig",
            dict(
                _GRANITE_MOE,
                num_hidden_layers=3,
                embedding_multiplier=12.0,
                attention_multiplier=1.5,
                tie_word_embeddings=False,
            ),
            seed=41,
            norm_center_overrides=_GRANITE_NORMS,
            greedy=24,
            min_router_gap=MIN_ROUTER_GAP,
            notes="granite multipliers (embedding x12, kq 1.5) + sparse MoE on every layer "
            "(8 experts, top 2, fused input_linear); untied",
        ),
        TinySpec(
            "granitemoeshared",
            "GraniteMoeSharedForCausalLM",
            "GraniteMoeSharedConfig",
            dict(
                _GRANITE_MOE,
                num_hidden_layers=3,
                num_experts_per_tok=3,
                shared_intermediate_size=48,
            ),
            seed=42,
            norm_center_overrides=_GRANITE_NORMS,
            greedy=24,
            min_router_gap=MIN_ROUTER_GAP,
            notes="granitemoe (8 experts, top 3) + an ungated shared expert "
            "(GGUF arch granitemoe); tied",
        ),
        TinySpec(
            "starcoder2",
            "Starcoder2ForCausalLM",
            "Starcoder2Config",
            dict(
                _COMMON,
                num_hidden_layers=2,
                rope_theta=30000.0,
                norm_epsilon=1e-5,
                use_bias=True,
                hidden_act="gelu_pytorch_tanh",
                tie_word_embeddings=True,
            ),
            seed=50,
            vector_overrides=_LN_VECTORS,
            notes="LayerNorm with bias, biases on q/k/v/o and the plain GELU MLP (c_fc, c_proj)",
        ),
        TinySpec(
            "bloom",
            "BloomForCausalLM",
            "BloomConfig",
            dict(
                vocab_size=512,
                hidden_size=64,
                n_layer=2,
                n_head=4,
                layer_norm_epsilon=1e-5,
                tie_word_embeddings=True,
            ),
            seed=51,
            vector_overrides=_LN_VECTORS,
            notes="ALiBi (no rope), LayerNorm on the embeddings, interleaved fused QKV, GELU MLP",
        ),
        TinySpec(
            "mpt",
            "MptForCausalLM",
            "MptConfig",
            dict(
                vocab_size=512,
                d_model=64,
                n_heads=4,
                n_layers=2,
                expansion_ratio=4,
                max_seq_len=256,
                no_bias=True,
                layer_norm_epsilon=1e-5,
                attn_config={"alibi": True, "alibi_bias_max": 8, "clip_qkv": 1.0},
            ),
            seed=52,
            vector_overrides=_LN_VECTORS,
            convert_architecture="MPTForCausalLM",
            notes="ALiBi (max bias 8), clip_qkv 1.0 (clamps ~20% of QKV outputs), no linear "
            "biases; exact GELU in transformers, tanh GELU in llama.cpp",
        ),
        TinySpec(
            "olmo2",
            "Olmo2ForCausalLM",
            "Olmo2Config",
            dict(_OLMO2, num_hidden_layers=3),
            seed=43,
            greedy=24,
            notes="no pre-norms; post-attention and post-FFN RMSNorms; Q/K RMSNorm over the "
            "full projection width; NeoX rope; untied",
        ),
        TinySpec(
            "llama_yarn",
            "LlamaForCausalLM",
            "LlamaConfig",
            dict(
                _COMMON,
                num_hidden_layers=2,
                rms_norm_eps=1e-5,
                rope_parameters=dict(_YARN, rope_theta=10000.0),
                tie_word_embeddings=False,
            ),
            seed=50,
            seq_len=_LONG_SEQ_LEN,
            notes="YaRN x8 from an original context of 32, 72 tokens",
        ),
        TinySpec(
            "qwen3_yarn",
            "Qwen3ForCausalLM",
            "Qwen3Config",
            dict(
                _COMMON,
                num_hidden_layers=2,
                head_dim=32,
                rms_norm_eps=1e-6,
                rope_parameters=dict(_YARN, factor=4.0, rope_theta=10000.0),
                use_sliding_window=False,
                attention_bias=False,
                tie_word_embeddings=False,
            ),
            seed=51,
            seq_len=_LONG_SEQ_LEN,
            notes="qwen3 (neox rope, QK norm) + YaRN x4 from an original context of 32",
        ),
        TinySpec(
            "phi3",
            "Phi3ForCausalLM",
            "Phi3Config",
            dict(_PHI3, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
            seed=52,
            notes="fused qkv and gate_up, neox rope, no scaling",
        ),
        TinySpec(
            "phi3_longrope",
            "Phi3ForCausalLM",
            "Phi3Config",
            _PHI3_LONGROPE,
            seed=53,
            seq_len=_LONG_SEQ_LEN,
            notes="LongRoPE (long factors past 32 tokens, attention factor), half of each "
            "head rotating",
        ),
        TinySpec(
            "bitnet",
            "BitNetForCausalLM",
            "BitNetConfig",
            _BITNET,
            seed=61,
            ternary=("_proj",),
            convert_renames={
                "self_attn.attn_sub_norm": "self_attn.inner_attn_ln",
                "mlp.ffn_sub_norm": "mlp.ffn_layernorm",
            },
            notes="attention and FFN sub-norms, ternary projections (no zeros), SiLU, tied",
        ),
        TinySpec(
            "mamba",
            "MambaForCausalLM",
            "MambaConfig",
            dict(_MAMBA, num_hidden_layers=3, tie_word_embeddings=True),
            seed=70,
            seq_len=_HYBRID_SEQ_LEN,
            greedy=24,
            greedy_prompt=_RECURRENT_GREEDY_PROMPT,
            notes="Mamba-1: conv + selective scan per layer, no attention or FFN; tied",
        ),
        TinySpec(
            "falcon_mamba",
            "FalconMambaForCausalLM",
            "FalconMambaConfig",
            dict(_MAMBA, num_hidden_layers=2, mixer_rms_eps=1e-5, tie_word_embeddings=False),
            seed=71,
            seq_len=_HYBRID_SEQ_LEN,
            greedy=24,
            greedy_prompt=_RECURRENT_GREEDY_PROMPT,
            notes="Falcon-Mamba: Mamba-1 with weightless RMSNorms on dt, B and C; untied",
        ),
        TinySpec(
            "lfm2",
            "Lfm2ForCausalLM",
            "Lfm2Config",
            dict(_LFM2, tie_word_embeddings=True),
            seed=80,
            seq_len=_HYBRID_SEQ_LEN,  # past metal's 64-row recurrent prefill chunk
            greedy=24,
            greedy_prompt=_RECURRENT_GREEDY_PROMPT,
            notes="CONV x1 ATTN x1 CONV x2 ATTN x1 CONV x1, QK norms, auto-adjusted FFN; tied",
        ),
        TinySpec(
            "lfm2moe",
            "Lfm2MoeForCausalLM",
            "Lfm2MoeConfig",
            _LFM2_MOE,
            seed=82,
            seq_len=_HYBRID_SEQ_LEN,  # past metal's 64-row recurrent prefill chunk
            greedy=24,
            greedy_prompt=_RECURRENT_GREEDY_PROMPT,
            min_router_gap=MIN_ROUTER_GAP,
            router_bias_std=0.3,
            notes="LFM2 mixers; 2 dense FFNs then sigmoid-routed MoE (8 experts, top 3) with "
            "an expert bias; tied",
        ),
        TinySpec(
            "mamba2",
            "Mamba2ForCausalLM",
            "Mamba2Config",
            dict(_MAMBA2, num_hidden_layers=3, tie_word_embeddings=False),
            seed=72,
            seq_len=_HYBRID_SEQ_LEN,
            vector_overrides=_MAMBA2_VECTORS,
            greedy=24,
            greedy_prompt=_RECURRENT_GREEDY_PROMPT,
            notes="Mamba-2: SSD mixer per layer (8 heads, 2 B/C groups, gated grouped norm)",
        ),
        TinySpec(
            "granitehybrid",
            "GraniteMoeHybridForCausalLM",
            "GraniteMoeHybridConfig",
            dict(_GRANITE_HYBRID),
            seed=73,
            norm_center_overrides=_GRANITE_NORMS,
            seq_len=_HYBRID_SEQ_LEN,
            vector_overrides=_MAMBA2_VECTORS,
            greedy=24,
            greedy_prompt=_RECURRENT_GREEDY_PROMPT,
            min_router_gap=MIN_ROUTER_GAP,
            config_overrides={"layer_types": _GRANITE_HYBRID_LAYERS},
            notes="MAMBA2 ATTN MAMBA2 x2 ATTN (NoPE), MoE (4 experts, top 2) + shared "
            "expert on every layer, granite multipliers; tied",
        ),
        TinySpec(
            "granitehybrid_dense",
            "GraniteMoeHybridForCausalLM",
            "GraniteMoeHybridConfig",
            dict(
                _GRANITE_HYBRID,
                num_hidden_layers=4,
                layer_types=_GRANITE_HYBRID_LAYERS[:4],
                num_local_experts=0,
                num_experts_per_tok=0,
                # llama.cpp sizes the dense FFN by feed_forward_length (intermediate_size)
                # and the converter stores shared_mlp there: released dense configs set the
                # two alike.
                intermediate_size=48,
                tie_word_embeddings=False,
                embedding_multiplier=12.0,
            ),
            seed=74,
            norm_center_overrides=_GRANITE_NORMS,
            seq_len=_HYBRID_SEQ_LEN,
            vector_overrides=_MAMBA2_VECTORS,
            greedy=24,
            greedy_prompt=_RECURRENT_GREEDY_PROMPT,
            config_overrides={"layer_types": _GRANITE_HYBRID_LAYERS[:4]},
            notes="MAMBA2 ATTN MAMBA2 x2 (NoPE), no experts: shared_mlp as the dense FFN; untied",
        ),
        TinySpec(
            "falcon_h1",
            "FalconH1ForCausalLM",
            "FalconH1Config",
            dict(_FALCON_H1, num_hidden_layers=3),
            seed=75,
            seq_len=_HYBRID_SEQ_LEN,
            vector_overrides=_MAMBA2_VECTORS,
            greedy=24,
            greedy_prompt=_RECURRENT_GREEDY_PROMPT,
            notes="attention + Mamba-2 in parallel per layer, then the FFN; every Falcon-H1 "
            "multiplier away from 1 (folded into the weights by the converter); untied",
        ),
        TinySpec(
            "falcon_h1_norm",
            "FalconH1ForCausalLM",
            "FalconH1Config",
            # The gated grouped norm on, gating before it (llama.cpp's only order).
            dict(_FALCON_H1, num_hidden_layers=2, mamba_rms_norm=True),
            seed=76,
            norm_center_overrides={"mamba.norm": 1.0},
            seq_len=_HYBRID_SEQ_LEN,
            vector_overrides=_MAMBA2_VECTORS,
            greedy=24,
            greedy_prompt=_RECURRENT_GREEDY_PROMPT,
            notes="falcon_h1 with mamba_rms_norm (norm(y * silu(z)) per group); 2 layers",
        ),
        TinySpec(
            "gpt_oss",
            "GptOssForCausalLM",
            "GptOssConfig",
            _GPT_OSS,
            seed=91,
            # Every sink a real share of its head's softmax (scores here are O(1)).
            vector_overrides={"sinks": (1.0, 1.0)},
            # gate/up rows of std ~4: the clamp at 7 cuts a few percent of them.
            matrix_std={"gate_up_proj": 0.5},
            greedy=24,
            min_router_gap=MIN_ROUTER_GAP,
            notes="SWA ATTN SWA (window 6), attention sinks, Q/K/V/O biases, 8 experts top 4 "
            "(softmax over the top-k biased router logits), SwiGLU-OAI with biases, yarn x4",
        ),
        TinySpec(
            "gemma4",
            "Gemma4ForCausalLM",
            "Gemma4TextConfig",
            _GEMMA4_TEXT,
            seed=101,
            norm_center_overrides=_GEMMA4_NORMS,
            buffer_overrides={"layer_scalar": (1.0, 0.3)},
            greedy=24,
            notes="SWA/ATTN with per-kind head widths and KV heads, V = K on full layers, "
            "proportional rope, 2 KV-sharing layers (double-wide FFNs), per-layer "
            "embeddings, layer scalars, final softcap 3",
        ),
        TinySpec(
            "gemma4_mm",
            "Gemma4ForConditionalGeneration",
            "Gemma4Config",
            {
                "text_config": dict(_GEMMA4_TEXT),
                "vision_config": {
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "num_key_value_heads": 2,
                    "head_dim": 16,
                    "patch_size": 8,
                    "position_embedding_size": 64,
                    "pooling_kernel_size": 2,
                },
                # Out of the text vocab, so no fixture token is a media placeholder.
                "image_token_id": 600,
                "boi_token_id": 601,
                "eoi_token_id": 602,
                "video_token_id": 603,
                "boa_token_id": 604,
                "eoa_token_index": 605,
                "audio_token_id": 606,
            },
            seed=103,
            norm_center_overrides=_GEMMA4_NORMS,
            buffer_overrides={"layer_scalar": (1.0, 0.3)},
            greedy=24,
            notes="HF model_type gemma4 (how Gemma 4 is released): gemma4's text model "
            "under model.language_model, a tiny vision tower and its embedder",
        ),
        TinySpec(
            "gemma4_moe",
            "Gemma4ForCausalLM",
            "Gemma4TextConfig",
            _GEMMA4_MOE,
            seed=102,
            norm_center_overrides=_GEMMA4_NORMS,
            buffer_overrides={"layer_scalar": (1.0, 0.3)},
            # The router's input scale and the per-expert output scales around 1, so
            # neither is ~0 (the 1-D default) and each moves the logits.
            vector_overrides={"router.scale": (1.0, 0.3), "per_expert_scale": (1.0, 0.3)},
            # Router logits of O(1), so routing decisions (compared as softmax probabilities,
            # what transformers records) have clear margins.
            matrix_std={"router.proj": 1.0},
            greedy=24,
            min_router_gap=MIN_ROUTER_GAP,
            notes="the 26B-A4B shape: every layer's dense FFN beside 8 experts (top 2) "
            "routed from the normed residual; no per-layer embeddings, no KV sharing",
        ),
    ]
    # deepseek2 (issue 31)
    + _DEEPSEEK_SPECS
}


# --- Llama 4 ---------------------------------------------------------------------------
# 4 layers: 0-2 rope (chunked, L2-normed Q/K), 3 NoPE (global, attention temperature);
# experts (4, top 2, sigmoid weights on their inputs, a shared expert) on layers 1 and 3,
# dense FFNs 128 wide on 0 and 2. llama.cpp 0.3.36 hard-codes chunk 8192, floor_scale 8192
# and attn_scale 0.1, so the fixture checked against it carries those (its 40 tokens sit in
# one chunk, with temperature 1); llama4_chunked sets chunk 8, floor_scale 4, attn_scale
# 0.5 (40 tokens: five chunks, temperatures up to 2.2), which only transformers honours.
_LLAMA4: dict[str, Any] = dict(
    _COMMON,
    num_hidden_layers=4,
    head_dim=16,
    intermediate_size=32,
    intermediate_size_mlp=128,
    num_local_experts=4,
    num_experts_per_tok=2,
    interleave_moe_layer_step=2,
    no_rope_layer_interval=4,
    use_qk_norm=True,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    attention_chunk_size=8192,
    floor_scale=8192,
    attn_scale=0.1,
    attn_temperature_tuning=True,
    tie_word_embeddings=False,
    pad_token_id=0,
)

_LLAMA4_SPECS = [
    TinySpec(
        "llama4",
        "Llama4ForCausalLM",
        "Llama4TextConfig",
        _LLAMA4,
        seed=131,
        greedy=24,
        notes="3 chunked rope layers + 1 NoPE layer, MoE (4 experts, top 2) + shared "
        "expert every 2nd layer, llama.cpp's chunk / temperature constants",
    ),
    TinySpec(
        "llama4_chunked",
        "Llama4ForCausalLM",
        "Llama4TextConfig",
        dict(_LLAMA4, attention_chunk_size=8, floor_scale=4, attn_scale=0.5),
        seed=132,
        notes="llama4 with chunk 8, floor_scale 4, attn_scale 0.5: transformers only",
    ),
]
SPECS.update({s.name: s for s in _LLAMA4_SPECS})


# --- mimo2 (issue 31): MiMo-V2-Flash ---------------------------------------------------
# 4 layers FULL SWA SWA FULL (window 6; SWA rope base 3000, full 50000; 8 of 24 dims rotated),
# twice the KV heads on the SWA layers (transformers hard-codes 2x), learned sinks on the
# SWA layers only, K heads 24 wide and V heads 16, the value scale 0.6, a dense layer 0 then
# sigmoid-routed experts (8, top 2) with the selection bias, renormalized. config_overrides:
# the released config's spelling, which llama.cpp's converter reads (hybrid_layer_pattern,
# swa_* sizes, a top-level partial_rotary_factor) and transformers ignores.
_MIMO2_ROPE: dict[str, Any] = {
    "full_attention": {
        "rope_type": "default",
        "rope_theta": 50000.0,
        "partial_rotary_factor": 0.334,
    },
    "sliding_attention": {
        "rope_type": "default",
        "rope_theta": 3000.0,
        "partial_rotary_factor": 0.334,
    },
}
_MIMO2: dict[str, Any] = dict(
    _COMMON,
    num_hidden_layers=4,
    num_key_value_heads=1,
    head_dim=24,
    v_head_dim=16,
    sliding_window=6,
    layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    rope_parameters=_MIMO2_ROPE,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    attention_value_scale=0.6,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
_MIMO2_SPECS = [
    TinySpec(
        "mimo2",
        "MiMoV2FlashForCausalLM",
        "MiMoV2FlashConfig",
        _MIMO2,
        seed=141,
        vector_overrides={"sinks": (1.0, 1.0)},
        buffer_overrides={"e_score_correction_bias": (0.0, 0.05)},
        config_overrides={
            "hybrid_layer_pattern": [0, 1, 1, 0],
            "swa_num_key_value_heads": 2,
            "swa_num_attention_heads": 4,
            "swa_head_dim": 24,
            "swa_v_head_dim": 16,
            "topk_method": "noaux_tc",
            "rope_parameters": dict(_MIMO2_ROPE, partial_rotary_factor=0.334),
        },
        greedy=24,
        min_router_gap=MIN_ROUTER_GAP,
        notes="FULL SWA SWA FULL (window 6, SWA rope base 3000), 2x KV heads and sinks on "
        "SWA layers, K 24 / V 16 wide, 8 of 24 dims rotated, value scale 0.6, dense layer 0 "
        "then 8 experts top 2 (sigmoid + selection bias, renormalized)",
    ),
]
SPECS.update({s.name: s for s in _MIMO2_SPECS})
# minimax-01 (issue 31): 7 lightning layers and 1 softmax-attention layer (llama.cpp's
# default pattern, which the converter leaves to it), an MoE on every layer, every residual
# scaled by 1.7. transformers' lightning blocks are 8 tokens (block_size), so its prefill
# crosses ten; frink's 64-token blocks are crossed by the 80 tokens. rotary_dim = head_dim:
# transformers' MiniMax rotates the whole head, llama.cpp rope.dimension_count dims.
_MINIMAX_ALPHA = 1.7
_MINIMAX_SPECS = [
    TinySpec(
        "minimax",
        "MiniMaxForCausalLM",
        "MiniMaxConfig",
        dict(
            _COMMON,
            num_hidden_layers=8,
            head_dim=16,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            block_size=8,
            layer_types=["linear_attention"] * 7 + ["full_attention"],
            full_attn_alpha_factor=_MINIMAX_ALPHA,
            linear_attn_alpha_factor=_MINIMAX_ALPHA,
            mlp_alpha_factor=_MINIMAX_ALPHA,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
        ),
        seed=141,
        seq_len=_HYBRID_SEQ_LEN,
        greedy=24,
        greedy_prompt=_RECURRENT_GREEDY_PROMPT,
        convert_architecture="MiniMaxText01ForCausalLM",
        config_overrides={
            "rotary_dim": 16,
            "layernorm_full_attention_alpha": _MINIMAX_ALPHA,
            "layernorm_linear_attention_alpha": _MINIMAX_ALPHA,
            "layernorm_mlp_alpha": _MINIMAX_ALPHA,
            "layernorm_full_attention_beta": 1.0,
            "layernorm_linear_attention_beta": 1.0,
            "layernorm_mlp_beta": 1.0,
        },
        convert_drop=("slope_rate", "query_decay", "key_decay", "diagonal_decay"),
        notes="LIGHTNING x7 ATTN x1, MoE (4 experts, top 2) on every layer, residual x1.7",
    ),
]
SPECS.update({s.name: s for s in _MINIMAX_SPECS})
