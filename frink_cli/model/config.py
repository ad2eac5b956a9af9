"""ModelConfig: the globals of a model and every decoration, read from canonical metadata.

The decoder is one loop over layers; what differs between architectures is data. Each
decoration llama.cpp's graph builders apply (QK norm, post norms, GeGLU, embedding scale,
sliding windows with their own rope base, logit softcap...) is an explicit field here,
filled from the GGUF keys by the architecture's module in frink_cli/archs/.
`layer_shape(l)` says what layer l is, so the host body and every backend ask one place.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class LayerShape:
    """What layer l is. Backends decide eligibility from this alone."""

    # "attention" | "gdn" (gated delta net: linear attention with recurrent state) |
    # "mamba" (Mamba-1's selective state-space mixer, recurrent state, no attention) |
    # "shortconv" (LFM2's gated short convolution: a causal depthwise conv, its tail the state) |
    # "mamba2" (Mamba-2's SSD mixer: per-head scalar decay, grouped B/C, gated grouped norm) |
    # "attention+mamba2" (falcon-h1: attention and a Mamba-2 mixer side by side on the same
    # normed input, their outputs summed) |
    # "linear" (deci's "linear attention": only wo, applied to the normed input) |
    # "none" (deci's attention-free layer: the branch is absent, x passes on)
    mixer: str
    # "dense" | "moe" (sparse mixture of experts) | "dense+moe" (both side by side, gemma4) |
    # "none" (no FFN branch)
    ffn: str
    window: int | None  # sliding-window width (keys q - k < window are visible), None = full
    rope_base: float
    rope_scale: float  # position multiplier (1 / linear scaling factor)
    # This layer's sizes: the model's own, or its per-layer ones (ModelConfig.layer_sizes).
    # A layer without attention has n_head_kv 0 (its KV slot holds nothing).
    n_head: int
    n_head_kv: int
    n_ff: int
    # This layer's head widths and rotated dims: the model's, or a sliding layer's own
    # (ModelConfig.swa_head_dim / swa_rope_dim: gemma4's key_length_swa, dimension_count_swa).
    head_dim_k: int = 0
    head_dim_v: int = 0
    rope_dim: int = 0
    # The model's rope_freqs do not apply here (gemma4's sliding layers: the factors are
    # its full layers' proportional rope).
    no_rope_freqs: bool = False
    # KV sharing (gemma4): this layer computes no K/V of its own and attends over the rows
    # layer kv_source wrote for this step and before (None: its own K/V).
    kv_source: int | None = None
    # No V projection: V is the raw K projection (before K's norm and rope), gemma4's
    # attention_k_eq_v.
    v_from_k: bool = False
    # gemma4's per-layer embeddings: this layer's index into the per-layer input columns
    # (None: the model has none).
    per_layer_input: int | None = None


# Fields every model has (sizes and always-present choices), not features.
_CORE_FIELDS = frozenset(
    {
        "arch",
        "n_layer",
        "n_embd",
        "n_head",
        "n_head_kv",
        "head_dim_k",
        "head_dim_v",
        "n_ff",
        "n_vocab",
        "n_ctx_train",
        "norm_eps",
        "rope_type",
        "rope_dim",
        "rope_base",
        "rope_scale",
        "rope_base_swa",
        "attn_scale",
        "ffn_act",
        "tied_embeddings",
        "swa_layers",
    }
)


@dataclass(frozen=True)
class RopeScaling:
    """YaRN or LongRoPE, as llama.cpp applies them (ggml's rope_yarn; graph/rope.py's
    `rope_frequencies` turns this into per-pair frequencies and a cos/sin multiplier).

    kind "yarn": ext_factor 1 blends interpolated (position * 1/factor) and extrapolated
    angles per pair over the ramp between the beta_fast/beta_slow correction dims, and cos/sin
    are multiplied by get_mscale(factor) = 1 + 0.1 ln(factor) (times attn_factor).
    kind "longrope" (phi3): per-pair frequency divisors, the long ones when the context is
    longer than orig_ctx (llama.cpp's n_ctx_seq > n_ctx_orig_yarn), else the short ones;
    cos/sin multiplied by attn_factor. kind "attn" : only attn_factor (rope.scaling.attn_factor
    on a model with no other scaling)."""

    kind: str  # "yarn" | "longrope" | "attn"
    factor: float  # the model's rope.scaling.factor (1 if none)
    orig_ctx: int  # rope.scaling.original_context_length (llama.cpp's n_ctx_orig_yarn)
    ext_factor: float = 0.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attn_factor: float = 1.0  # rope.scaling.attn_factor: multiplies cos and sin

    def long(self, n_ctx: int) -> bool:
        """LongRoPE's switch: the long factors for a context beyond the original one."""
        return self.kind == "longrope" and n_ctx > self.orig_ctx


@dataclass(frozen=True)
class LayerSizes:
    """Per-layer head counts and FFN widths (openelm, deci: llama.cpp's n_head_arr,
    n_head_kv_arr, n_ff_arr from array-valued GGUF keys). Present only when they vary;
    ModelConfig's n_head / n_head_kv / n_ff then hold the largest of each, and every
    per-layer reader (the composition, the weights, the caches, the backends) asks
    layer_shape(l).

    deci's zero entries, as llama.cpp's deci.cpp reads them: n_head 0 is an attention-free
    layer (mixer "none"), n_head > 0 with n_head_kv 0 a "linear attention" layer (mixer
    "linear": wo on the normed input), n_ff 0 an FFN-free layer (ffn "none")."""

    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_ff: tuple[int, ...]


@dataclass(frozen=True)
class GdnConfig:
    """Gated delta net layers (qwen35, qwen3next): linear attention with recurrent state."""

    layers: tuple[bool, ...]  # per layer: GDN instead of attention
    conv_kernel: int  # width of the causal depthwise conv over q/k/v
    n_k_heads: int  # ssm.group_count
    n_v_heads: int  # ssm.time_step_rank
    head_dim_k: int  # ssm.state_size
    head_dim_v: int  # ssm.inner_size / n_v_heads
    # Which key head value head h reads when n_v > n_k: "tiled" h % n_k (qwen35 GGUFs: the
    # converter reorders value heads for ggml's broadcast) or "grouped" h // (n_v / n_k).
    v_head_order: str = "grouped"

    @property
    def conv_dim(self) -> int:
        """Channels of the conv (and its state): q, k (n_k heads each) and v (n_v heads)."""
        return 2 * self.n_k_heads * self.head_dim_k + self.n_v_heads * self.head_dim_v

    def key_heads(self) -> list[int]:
        """Per value head, the key head it reads (the host body and every backend ask here)."""
        n_k, n_v = self.n_k_heads, self.n_v_heads
        if self.v_head_order == "tiled":
            return [h % n_k for h in range(n_v)]
        return [h // (n_v // n_k) for h in range(n_v)]

    def state_bytes(self) -> int:
        """f32 bytes of recurrent state one sequence holds: conv tail + delta state per layer."""
        per_layer = (self.conv_kernel - 1) * self.conv_dim + (
            self.n_v_heads * self.head_dim_k * self.head_dim_v
        )
        return 4 * per_layer * sum(self.layers)


@dataclass(frozen=True)
class MambaConfig:
    """Mamba layers: Mamba-1 (llama.cpp `mamba`, transformers MambaForCausalLM /
    Falcon-Mamba) or Mamba-2 (`mamba2`, Mamba2ForCausalLM: n_group > 0). Every layer a
    selective state-space mixer with no attention and no FFN, unless `layers` names the
    mamba layers of a hybrid stack. Per layer the recurrent state is the conv tail
    [conv_kernel-1, conv_dim] and the scan state [d_inner, d_state] (Mamba-2's
    [n_head, head_dim, d_state], flattened the same way)."""

    conv_kernel: int  # ssm.conv_kernel: width of the causal depthwise conv
    d_inner: int  # ssm.inner_size: the expanded width (x and z each)
    d_state: int  # ssm.state_size: N, the state per channel
    # ssm.time_step_rank: Mamba-1's low-rank width dt is projected from; Mamba-2's head
    # count (one dt, A and D per head), as llama.cpp reads it.
    dt_rank: int
    # ssm.dt_b_c_rms (Falcon-Mamba): RMSNorms on dt, B and C before they are used.
    dt_b_c_rms: bool = False
    # ssm.group_count: Mamba-2's B/C groups (heads h*G/n_head .. share one); 0: Mamba-1.
    n_group: int = 0
    # Per layer: a mamba mixer (hybrid stacks); None: every layer is one.
    layers: tuple[bool, ...] | None = None
    # falcon-h1: each mamba mixer runs beside the layer's attention (mixer
    # "attention+mamba2"), not instead of it.
    parallel: bool = False

    @property
    def version2(self) -> bool:
        return self.n_group > 0

    @property
    def conv_dim(self) -> int:
        """Channels of the conv (and its tail): x (Mamba-1); x, B and C (Mamba-2)."""
        return self.d_inner + (2 * self.n_group * self.d_state if self.version2 else 0)

    def is_layer(self, layer: int) -> bool:
        return self.layers is None or self.layers[layer]

    def state_bytes(self, n_layer: int) -> int:
        """f32 bytes of recurrent state one sequence holds: conv tail + scan state per layer."""
        per_layer = (self.conv_kernel - 1) * self.conv_dim + self.d_inner * self.d_state
        n = n_layer if self.layers is None else sum(self.layers)
        return 4 * per_layer * n


@dataclass(frozen=True)
class ShortConvConfig:
    """LFM2's short-conv layers (llama.cpp `lfm2` / `lfm2moe`, transformers Lfm2ShortConv):
    in_proj -> B, C, x; y = C * conv(B * x), a causal depthwise conv without bias; out_proj.
    The recurrent state is the conv tail alone, [conv_kernel-1, n_embd] per layer."""

    layers: tuple[bool, ...]  # per layer: a short conv instead of attention (head_count_kv 0)
    conv_kernel: int  # shortconv.l_cache: the conv's width (L_cache)

    def state_bytes(self, n_embd: int) -> int:
        """f32 bytes of recurrent state one sequence holds: the conv tail per conv layer."""
        return 4 * (self.conv_kernel - 1) * n_embd * sum(self.layers)


@dataclass(frozen=True)
class MoeConfig:
    """A sparse mixture-of-experts FFN on the layers that have a router."""

    layers: tuple[bool, ...]  # per layer: the FFN is routed
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int = 0  # shared expert width (always on); 0 = none
    norm_topk: bool = True  # renormalize the top-k router probabilities to sum to 1
    # The shared expert's output is scaled by sigmoid(its gate row) (qwen3next, qwen35moe);
    # False: added as it is (granitemoe's shared expert has no gate).
    shared_gate: bool = True
    # The router's gating (llama.cpp's expert_gating_func): "softmax" over the experts, or
    # "sigmoid" per expert (lfm2moe). The weights are the gated probabilities of the chosen.
    gating: str = "softmax"
    # An expert-selection bias (llama.cpp's exp_probs_b, lfm2moe's expert_bias): the top k
    # is taken over probs + bias, the weights stay the unbiased probs.
    expert_bias: bool = False
    # The chosen weights' multiplier after any renormalization (expert_weights_scale,
    # transformers' routed_scaling_factor); 1 = none.
    weights_scale: float = 1.0
    # Biases on the router (ffn_gate_inp.bias) and on every expert's gate, up and down rows
    # (ffn_{gate,up,down}_exps.bias [n_expert, rows]): gpt-oss.
    biases: bool = False
    # gemma4's MoE (ffn "dense+moe"): the layer's dense FFN runs beside the experts, each
    # branch with its own norms; the router reads the weightless-RMS-normed residual scaled
    # by ffn_gate_inp.scale / sqrt(n_embd); each chosen expert's weight is multiplied by its
    # scale (ffn_down_exps.scale).
    parallel_dense: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """The core every model has, the decorations as explicit optional fields, and the
    optional sub-configs (gdn, moe, mamba: None when the model has none).

    `features()` names what is present beyond the plain pre-norm llama layer, so a backend
    decides what it carries by name and refuses the rest by name."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope_type: str  # "norm" (adjacent pairs, llama) | "neox" (halves)
    rope_dim: int  # leading dims of each head that rotate
    rope_base: float
    rope_scale: float
    rope_base_swa: float
    attn_scale: float  # multiplies q before q.k
    sliding_window: int | None
    swa_layers: tuple[bool, ...]
    ffn_act: str  # "silu" | "gelu_tanh"
    qk_norm: bool
    post_attn_norm: bool
    post_ffn_norm: bool
    embd_scale: float | None
    final_logit_softcap: float | None
    attn_logit_softcap: float | None
    tied_embeddings: bool
    has_rope_freqs: bool  # per-dimension frequency factors (llama 3.x "rope_freqs.weight")
    # Where the pre-FFN norm is stored: qwen35/qwen3next name it post_attention_norm.
    ffn_norm_tensor: str = "ffn_norm"
    # Where the final norm is stored: lfm2 names it token_embd_norm (llama.cpp's
    # LLM_TENSOR_OUTPUT_NORM_LFM2, "fix for wrong tensor name"), though it norms the output.
    output_norm_tensor: str = "output_norm"
    # The query projection also yields a per-head gate: out *= sigmoid(gate) before o_proj.
    # Its rows interleave per head, [q_h (head_dim), gate_h (head_dim)], as HF and GGUF store them.
    attn_output_gate: bool = False
    # Each branch's output (attention, FFN) is multiplied by this before the residual add
    # (granite's residual_multiplier).
    residual_scale: float | None = None
    # The logits are divided by this (granite's logits_scaling).
    logit_scale: float | None = None
    # Every norm (the layers', the final one, QK norms) is a LayerNorm, mean-centered and
    # with an optional bias, instead of an RMSNorm (starcoder2, bloom, mpt).
    layer_norm: bool = False
    # The dense FFN is plain, not gated: down(act(up(h))) (starcoder2, bloom, mpt).
    plain_ffn: bool = False
    # A LayerNorm on the looked-up embeddings (bloom's token_embd_norm).
    embd_norm: bool = False
    # ALiBi instead of rope: each head adds -slope_h * (query pos - key pos) to its scores,
    # slopes from this max bias as llama.cpp (ggml_soft_max_ext) computes them.
    alibi_bias: float | None = None
    # NoPE: the attention layers rotate nothing and see no positions (Granite 4.0-H:
    # rope.scaling.finetuned false, llama.cpp's has_rope off).
    no_rope: bool = False
    # The QKV projection's output is clipped to [-c, c] (mpt's clip_qkv).
    clamp_kqv: float | None = None
    # No pre-norms: each branch reads the residual stream itself (olmo2: no attn_norm or
    # ffn_norm; its post_attn_norm / post_ffn_norm normalize the branch outputs instead).
    no_pre_norm: bool = False
    # QK norm over the full projection width (olmo2; mpt's qk_ln): one norm over all
    # n_head*hd_k query columns (weight [n_head*hd_k]) and one over all n_head_kv*hd_k key
    # columns, before the split into heads; a LayerNorm with its biases when layer_norm.
    # Not per head: qk_norm is the per-head form.
    qk_norm_full: bool = False
    # BitNet's sub-norms: an RMSNorm on the attention output before o_proj (weight
    # [n_head*hd_v], attn_sub_norm) and on the FFN's gated activation before down (weight
    # [n_ff], ffn_sub_norm), as llama.cpp's bitnet.cpp applies them.
    attn_sub_norm: bool = False
    ffn_sub_norm: bool = False
    # talkie: the layer norms, the final norm and the QK norms have no weight tensors (all
    # ones: load_weights fills them in, so every backend that reads the weights carries it).
    weightless_norms: bool = False
    # talkie: the skip stream. The looked-up embeddings are RMS-normed (weightless) into the
    # residual stream, and that same normed embedding, times a per-layer scalar
    # (layer_output_scale), is added into every layer's output. It rides beside the
    # residual stream between layers: rows are [stream | skip], residual_width wide.
    embd_skip: bool = False
    # talkie: a per-head Q gain (attn_q_norm [n_head, 1]) after a weightless per-head RMSNorm
    # of Q; K is RMS-normed per head with no weight.
    attn_q_gain: bool = False
    # The attention and FFN output projections' per-tensor scales (attn_output.scale,
    # ffn_down.scale, shape [1]): each projection's output is multiplied by its scale, as
    # llama.cpp's build_lora_mm / build_ffn do (talkie's attn_gain / mlp_gain).
    proj_scales: bool = False
    # YaRN / LongRoPE / an attention factor on cos and sin (None: plain or linear rope).
    rope_scaling: RopeScaling | None = None
    # gpt-oss: a learned logit per query head joins each softmax and takes no value
    # (attn_sinks [n_head]: llama.cpp's ggml_soft_max_add_sinks, transformers' s_aux).
    attn_sinks: bool = False
    # The sliding-window layers keep the model's rope scaling (gpt-oss: llama.cpp's
    # rope_freq_scale_train_swa = rope_freq_scale_train); else they rotate unscaled (gemma3).
    swa_rope_scaled: bool = False
    # gemma4: the sliding layers' head width (K = V) and rotated dims, where they differ from
    # the full layers' head_dim_k / rope_dim (llama.cpp's n_embd_head_k_swa, n_rot_swa).
    swa_head_dim: int | None = None
    swa_rope_dim: int | None = None
    # rope_freqs apply to the full-attention layers only (gemma4's proportional rope).
    rope_freqs_global_only: bool = False
    # A weightless RMSNorm on each V head (gemma4's v_norm).
    v_norm: bool = False
    # KV sharing (gemma4's shared_kv_layers): layers from this index on reuse the K/V of
    # the last earlier layer of their kind (llama.cpp: n_kv - 2 for sliding, n_kv - 1 for
    # full layers, n_kv = this index). None: every layer has its own.
    kv_shared_from: int | None = None
    # Per layer: no V projection, V = the raw K projection (gemma4's attention_k_eq_v).
    v_from_k: tuple[bool, ...] = ()
    # gemma4's per-layer embeddings: n_embd_per_layer columns per layer, computed once from
    # the tokens and the scaled embeddings, ride beside the residual stream (rows are
    # [stream | n_layer * per_layer_embd]); each layer adds its gated projection after its
    # FFN. 0: none.
    per_layer_embd: int = 0
    # A per-layer scalar multiplying each layer's output (gemma4's layer_output_scale).
    layer_out_scale: bool = False
    # Per-layer head counts and FFN widths (openelm, deci); None when every layer has the
    # model's n_head / n_head_kv / n_ff.
    layer_sizes: LayerSizes | None = None
    gdn: GdnConfig | None = None
    moe: MoeConfig | None = None
    # Mamba-1 / Mamba-2: the selective-scan mixers (mixer "mamba" / "mamba2"; ffn "none"
    # unless a hybrid stack's layer has one).
    mamba: MambaConfig | None = None
    # LFM2: the layers with no KV heads are short convs (mixer "shortconv").
    shortconv: ShortConvConfig | None = None

    def alibi_slopes(self) -> tuple[float, ...]:
        """Per query head, its ALiBi slope: ggml's m0^(h+1) for the first 2^floor(log2 H)
        heads, then m1^(2(h - n)+1) (as llama.cpp's soft_max_ext with max_bias)."""
        assert self.alibi_bias is not None
        H = self.n_head
        n = 1 << (H.bit_length() - 1)  # 2^floor(log2(H))
        m0 = 2.0 ** (-self.alibi_bias / n)
        m1 = 2.0 ** (-(self.alibi_bias / 2.0) / n)
        return tuple(m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(H))

    @property
    def residual_width(self) -> int:
        """Columns of the rows passed between layers: n_embd, 2*n_embd with the skip
        stream beside the residual stream (embd_skip), or n_embd plus the per-layer inputs
        (per_layer_embd)."""
        if self.embd_skip:
            return 2 * self.n_embd
        return self.n_embd + self.n_layer * self.per_layer_embd

    def kv_source(self, layer: int) -> int | None:
        """The layer whose K/V rows a KV-sharing layer attends over (None: its own), as
        llama.cpp's gemma4 reuse rule picks it."""
        n_kv = self.kv_shared_from
        if n_kv is None or layer < n_kv:
            return None
        return n_kv - (2 if self.swa_layers[layer] else 1)

    def is_recurrent(self, layer: int) -> bool:
        """The layer keeps a recurrent state (conv tail + state) instead of K/V rows."""
        if self.shortconv is not None and self.shortconv.layers[layer]:
            return True
        if self.mamba is not None and self.mamba.is_layer(layer):
            return True
        return self.gdn is not None and self.gdn.layers[layer]

    def is_moe(self, layer: int) -> bool:
        return self.moe is not None and self.moe.layers[layer]

    def recurrent_state_bytes(self) -> int:
        if self.mamba is not None:
            return self.mamba.state_bytes(self.n_layer)
        if self.shortconv is not None:
            return self.shortconv.state_bytes(self.n_embd)
        return self.gdn.state_bytes() if self.gdn is not None else 0

    def recurrent_shapes(self, layer: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv tail shape, state shape) of a recurrent layer's state (cache.RecurrentState)."""
        if self.mamba is not None:
            m = self.mamba
            return (m.conv_kernel - 1, m.conv_dim), (m.d_inner, m.d_state)
        if self.shortconv is not None:
            # The conv tail is the whole state: the second array is empty.
            return (self.shortconv.conv_kernel - 1, self.n_embd), (0,)
        g = self.gdn
        assert g is not None and g.layers[layer]  # asked only of a recurrent layer
        return (g.conv_kernel - 1, g.conv_dim), (g.n_v_heads, g.head_dim_k, g.head_dim_v)

    def features(self) -> set[str]:
        """Every decoration and sub-config this model uses, by field name (the rope layout,
        activation and other always-present choices are not features: backends check their
        values). A backend carries a model when it carries each of these."""
        core = _CORE_FIELDS
        out = set()
        for f in fields(self):
            if f.name not in core and getattr(self, f.name):
                out.add(f.name)
        if self.ffn_norm_tensor == "ffn_norm":
            out.discard("ffn_norm_tensor")
        if self.output_norm_tensor == "output_norm":
            out.discard("output_norm_tensor")
        return out

    def layer_shape(self, layer: int) -> LayerShape:
        swa = self.swa_layers[layer]
        n_head, n_head_kv, n_ff = self.n_head, self.n_head_kv, self.n_ff
        if self.layer_sizes is not None:
            s = self.layer_sizes
            n_head, n_head_kv, n_ff = s.n_head[layer], s.n_head_kv[layer], s.n_ff[layer]
        if self.mamba is not None and self.mamba.parallel:
            mixer = "attention+mamba2"  # the model's own heads and FFN
        elif self.mamba is not None and self.mamba.layers is None:
            mixer = "mamba2" if self.mamba.version2 else "mamba"
            n_head, n_head_kv, n_ff = 0, 0, 0
        elif self.mamba is not None and self.mamba.is_layer(layer):
            # A hybrid stack's mamba layer: no heads; its FFN as the model says.
            mixer, n_head, n_head_kv = "mamba2" if self.mamba.version2 else "mamba", 0, 0
        elif self.shortconv is not None and self.shortconv.layers[layer]:
            mixer, n_head, n_head_kv = "shortconv", 0, 0
        elif self.is_recurrent(layer):
            mixer = "gdn"
        elif n_head == 0:
            mixer, n_head_kv = "none", 0
        elif n_head_kv == 0:
            mixer = "linear"
        else:
            mixer = "attention"
        if self.is_moe(layer):
            assert self.moe is not None
            ffn = "dense+moe" if self.moe.parallel_dense else "moe"
        elif n_ff == 0 and (
            self.layer_sizes is not None or (self.mamba is not None and not self.mamba.parallel)
        ):
            ffn = "none"
        else:
            ffn = "dense"
        hk, hv, rope_dim = self.head_dim_k, self.head_dim_v, self.rope_dim
        if swa and self.swa_head_dim is not None:
            hk = hv = self.swa_head_dim
        if swa and self.swa_rope_dim is not None:
            rope_dim = self.swa_rope_dim
        return LayerShape(
            mixer=mixer,
            ffn=ffn,
            window=self.sliding_window if swa else None,
            rope_base=self.rope_base_swa if swa else self.rope_base,
            rope_scale=1.0 if swa and not self.swa_rope_scaled else self.rope_scale,
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_ff=n_ff,
            head_dim_k=hk,
            head_dim_v=hv,
            rope_dim=rope_dim,
            no_rope_freqs=self.has_rope_freqs and self.rope_freqs_global_only and swa,
            kv_source=self.kv_source(layer),
            v_from_k=bool(self.v_from_k) and self.v_from_k[layer],
            per_layer_input=layer if self.per_layer_embd else None,
        )

    def _layer_name(self, layer: int) -> str:
        """The layer's kind in layer_pattern: GDN, SWA, ATTN, LINEAR (wo only) or NONE (no
        attention); with per-layer sizes the heads, KV heads and FFN width ride along
        ("ATTN 12/3 ff768", "NONE ff0") so the pattern shows how the stack is shaped."""
        shape = self.layer_shape(layer)
        if shape.mixer == "gdn":
            name = "GDN"
        elif shape.mixer == "mamba":
            name = "MAMBA"
        elif shape.mixer == "shortconv":
            name = "CONV"
        elif shape.mixer == "mamba2":
            name = "MAMBA2"
        elif shape.mixer == "attention+mamba2":
            name = "ATTN+MAMBA2"
        elif shape.mixer == "none":
            name = "NONE"
        elif shape.mixer == "linear":
            name = "LINEAR"
        else:
            name = "SWA" if self.swa_layers[layer] else "ATTN"
        if self.layer_sizes is None:
            return name
        heads = f" {shape.n_head}/{shape.n_head_kv}" if shape.mixer == "attention" else ""
        return f"{name}{heads} ff{shape.n_ff}"

    def layer_pattern(self) -> str:
        """A compact summary such as 'SWA x5 ATTN x1 (x3)' or 'GDN x3 ATTN x1 (x6)'."""
        names = [self._layer_name(i) for i in range(self.n_layer)]
        runs: list[tuple[str, int]] = []
        for n in names:
            if runs and runs[-1][0] == n:
                runs[-1] = (n, runs[-1][1] + 1)
            else:
                runs.append((n, 1))
        # The shortest group of runs that repeats to make the whole stack, shown once.
        for period in range(1, len(runs)):
            if len(runs) % period == 0 and runs == runs[:period] * (len(runs) // period):
                group = " ".join(f"{n} x{c}" for n, c in runs[:period])
                return f"{group} (x{len(runs) // period})"
        return " ".join(f"{n} x{c}" for n, c in runs)
