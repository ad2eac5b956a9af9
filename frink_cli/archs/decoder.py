"""The llama-style pre-norm decoder most architectures build on, composed from the block
library (graph/blocks), and the decorations several of them share.

    h = norm(x);  a = mixer(h)                  attention (or the architecture's mixer)
    a = post_attn_norm(a) * residual_scale;  x = x + a
    h = norm(x);  f = ffn(h)                    dense gated or plain FFN, or routed experts
    f = post_ffn_norm(f) * residual_scale;   x = x + f

An architecture with more (a side stream, another mixer, a second FFN) subclasses
DecoderConfig in its own module and overrides the step it changes: `mixer`, `ffn`,
`pre_norm`, `make_attention_spec`, `embed`, `compose` or `head`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

from ..errors import FrinkError
from ..graph.blocks.attention import AttentionSpec, attention
from ..graph.blocks.ffn import gated_ffn, plain_ffn
from ..graph.blocks.moe import MoeConfig, moe
from ..graph.blocks.norms import norm, optional_rms_norm_, scaled
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import ArchConfig, HeadPlan, LayerPlan, LayerShape, ModelConfig

# Per-layer attention specs, made once per (architecture config, layer shape) and kept
# with both, so an entry is only ever found for the very objects it was made from.
_SPECS: dict[tuple[int, int], tuple[ArchConfig, LayerShape, ModelConfig, AttentionSpec]] = {}
_MAX_SPECS = 4096
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class DecoderConfig(ArchConfig):
    """The shared decorations of the pre-norm decoder (all off by default)."""

    qk_norm: bool = False  # per-head RMSNorms on Q and K
    # Q/K norms over the whole projection width instead of per head (a LayerNorm with
    # biases when layer_norm).
    qk_norm_full: bool = False
    post_attn_norm: bool = False  # an RMSNorm on the attention branch's output
    post_ffn_norm: bool = False  # an RMSNorm on the FFN branch's output
    embd_scale: float | None = None  # the looked-up embeddings are multiplied by this
    final_logit_softcap: float | None = None  # cap * tanh(logits / cap)
    attn_logit_softcap: float | None = None  # cap * tanh(scores / cap)
    # The query projection also yields a per-head gate: out *= sigmoid(gate) before o_proj.
    attn_output_gate: bool = False
    # Each branch's output is multiplied by this before the residual add.
    residual_scale: float | None = None
    logit_scale: float | None = None  # the logits are divided by this
    # Every norm is a LayerNorm (mean-centered, optional bias) instead of an RMSNorm.
    layer_norm: bool = False
    plain_ffn: bool = False  # the dense FFN is down(act(up(h))), not gated
    # Where the pre-FFN norm and the final norm are stored (GGUF names).
    ffn_norm_tensor: str = "ffn_norm"
    output_norm_tensor: str = "output_norm"
    moe: MoeConfig | None = None  # routed FFNs on the layers moe.layers names

    # A hybrid's recurrent mixer: the name of the field holding its block config, whose
    # `layers` names the layers it replaces attention on; the name is also those layers'
    # LayerShape.mixer ("gdn", "shortconv", ...). "" where the decoder has none.
    recurrent_mixer: ClassVar[str] = ""
    # Its section of `frink info --json`: key -> the block config's field.
    recurrent_info_fields: ClassVar[dict[str, str]] = {}

    # --- what the layers are ------------------------------------------------------------
    def layer_shape(self, cfg: ModelConfig, layer: int) -> LayerShape:
        shape = super().layer_shape(cfg, layer)
        if self.moe is not None and self.moe.layers[layer]:
            ffn = "dense+moe" if self.moe.parallel_dense else "moe"
            shape = dataclasses.replace(shape, ffn=ffn)
        if self.recurrent_mixer and self.is_recurrent(cfg, layer):
            shape = self.recurrent_layer_shape(shape)
        return shape

    def recurrent_block(self) -> Any:
        """The recurrent mixer's block config, or None (see `recurrent_mixer`)."""
        return getattr(self, self.recurrent_mixer) if self.recurrent_mixer else None

    def is_recurrent(self, cfg: ModelConfig, layer: int) -> bool:
        block = self.recurrent_block()
        return block is not None and bool(block.layers[layer])

    def recurrent_layer_shape(self, shape: LayerShape) -> LayerShape:
        """A recurrent layer's shape: the mixer named (an override may drop its heads)."""
        return dataclasses.replace(shape, mixer=self.recurrent_mixer)

    def recurrent_info(self) -> dict[str, Any]:
        """The recurrent mixer's section of `frink info --json` (asked only when it has one):
        its layer count and the block config's fields `recurrent_info_fields` names."""
        block = self.recurrent_block()
        fields = {key: getattr(block, name) for key, name in self.recurrent_info_fields.items()}
        return {"layers": sum(block.layers), **fields}

    def info(self) -> dict[str, Any]:
        out = self._moe_info()
        if self.recurrent_block() is not None:
            out[self.recurrent_mixer] = self.recurrent_info()
        return out

    def _moe_info(self) -> dict[str, Any]:
        m = self.moe
        if m is None:
            return {}
        return {
            "moe": {
                "layers": sum(m.layers),
                "experts": m.n_expert,
                "experts_used": m.n_expert_used,
                "expert_ff": m.n_ff_exp,
                "shared_ff": m.n_ff_shexp,
                "parallel_dense": m.parallel_dense,
                "norm_topk": m.norm_topk,
                "gating": m.gating,
                "expert_bias": m.expert_bias,
                "weights_scale": m.weights_scale,
                # Llama 4's: shown only where it is on, as deepseek2 shows its groups.
                **({"weights_before": True} if m.weights_before else {}),
            }
        }

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        qk = "full" if self.qk_norm_full else "head" if self.qk_norm else ""
        return LayerPlan(
            ffn_norm=self.ffn_norm_tensor,
            norm_biases=self.layer_norm,
            post_attn_norm=self.post_attn_norm,
            post_ffn_norm=self.post_ffn_norm,
            q_gate=self.attn_output_gate,
            qk_norm=qk,
            plain_ffn=self.plain_ffn,
        )

    def head_plan(self, cfg: ModelConfig) -> HeadPlan:
        return HeadPlan(output_norm=self.output_norm_tensor, norm_biases=self.layer_norm)

    def positive_values(self) -> list[tuple[str, float | None]]:
        return [
            ("final logit softcap", self.final_logit_softcap),
            ("attention logit softcap", self.attn_logit_softcap),
        ]

    def matrix_rows(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        rows = super().matrix_rows(cfg)
        if self.attn_output_gate:
            rows[1] = ("query width", 2 * cfg.n_head * cfg.head_dim_k)
        if self.moe is not None:
            rows.append(("expert feed_forward_length", self.moe.n_ff_exp))
        return rows

    # --- the composition ------------------------------------------------------------------
    def embed(self, ops: Ops, cfg: ModelConfig, w: Any, x: Array, lookup: Any) -> Array:
        if self.embd_scale is not None:
            x = ops.scale_(x, self.embd_scale)
        return x

    def layer(
        self,
        ops: Ops,
        cfg: ModelConfig,
        shape: LayerShape,
        w: Any,
        x: Array,
        pos: Any,
        kv: Any,
        rope: Any,
    ) -> Array:
        return self.compose(ops, cfg, shape, w, x, At(pos, kv, rope))

    def compose(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, x: Array, at: At
    ) -> Array:
        """x [T, n_embd] (left as it was) -> the layer's output rows, a new array (x itself
        from a layer with neither branch)."""
        # x_ours: x is an array this layer made (so the FFN's residual add may overwrite
        # it). A layer without a mixer branch passes x on unnormed.
        x_ours = shape.mixer != "none"
        if x_ours:
            h = self.pre_norm(ops, cfg, x, w.attn_norm, w.attn_norm_b)
            a = self.mixer(ops, cfg, shape, w, h, at)
            # a is ours: adding x into it leaves the caller's x as it was.
            x = ops.add_(self.branch_out(ops, cfg, a, w.post_attn_norm), x)
        if shape.ffn == "none":
            return x
        # Without a pre-norm the FFN reads x, which the residual add below then overwrites:
        # the FFN's output is a new array by then, so x is read before it is written.
        h = self.pre_norm(ops, cfg, x, w.ffn_norm, w.ffn_norm_b)
        f = scaled(self.ffn(ops, cfg, shape, w, x, h), w.down_scale)
        f = self.branch_out(ops, cfg, f, w.post_ffn_norm)
        # The sum into whichever of the two is ours (the caller's x is left as it was).
        return ops.add_(x, f) if x_ours else ops.add_(f, x)

    def pre_norm(self, ops: Ops, cfg: ModelConfig, x: Array, w: Array, b: Array | None) -> Array:
        """A branch's input: the model's norm of x, into a new array."""
        return norm(ops, self.layer_norm, x, w, b, cfg.norm_eps)

    def branch_out(self, ops: Ops, cfg: ModelConfig, y: Array, post_norm: Array | None) -> Array:
        """A branch's output as it joins the residual stream: post-norm, then multiplier."""
        y = optional_rms_norm_(ops, y, post_norm, cfg.norm_eps)
        if self.residual_scale is not None:
            y = ops.scale_(y, self.residual_scale)
        return y

    def mixer(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, at: At
    ) -> Array:
        """The normed rows h -> the mixer branch's output (attention here; an architecture
        with other mixers overrides this for its kinds)."""
        if shape.mixer != "attention":
            raise ValueError(f"{cfg.arch}: mixer {shape.mixer} has no block")
        spec = self.attention_spec(cfg, shape)
        return scaled(attention(ops, spec, w, h, *at), w.wo_scale)

    def ffn(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, x: Array, h: Array
    ) -> Array:
        """The normed rows h (x: the residual rows, left as they are) -> the FFN branch."""
        if shape.ffn == "moe":
            assert self.moe is not None  # layer_shape says "moe" only with a MoeConfig
            return moe(ops, self.moe, cfg.ffn_act, w.moe, h)
        if self.plain_ffn:
            return plain_ffn(ops, cfg.ffn_act, w, h)
        return gated_ffn(ops, cfg.ffn_act, w, h, cfg.norm_eps)

    def attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        """The attention block's setup for a layer of this shape (made once, then kept)."""
        key = (id(cfg), id(shape))
        hit = _SPECS.get(key)
        if hit is not None and hit[0] is self and hit[1] is shape and hit[2] is cfg:
            return hit[3]
        spec = self.make_attention_spec(cfg, shape)
        if len(_SPECS) >= _MAX_SPECS:
            _SPECS.clear()
        _SPECS[key] = (self, shape, cfg, spec)
        return spec

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        """The attention block's setup for a layer of this shape."""
        return AttentionSpec(
            n_head=shape.n_head,
            n_head_kv=shape.n_head_kv,
            head_dim_k=shape.head_dim_k,
            head_dim_v=shape.head_dim_v,
            eps=cfg.norm_eps,
            scale=cfg.attn_scale,
            window=shape.window,
            softcap=self.attn_logit_softcap,
            output_gate=self.attn_output_gate,
            full_qk_norm=self.qk_norm_full,
            full_qk_layer_norm=self.qk_norm_full and self.layer_norm,
            shares_kv=shape.kv_source is not None,
        )

    def final_norm(
        self, ops: Ops, cfg: ModelConfig, output_norm: Array, x: Array, output_norm_b: Array | None
    ) -> Array:
        """The residual stream's columns of x, normed as the head reads them."""
        if cfg.residual_width != cfg.n_embd:
            x = x[:, : cfg.n_embd]
        return norm(ops, self.layer_norm, x, output_norm, output_norm_b, cfg.norm_eps)

    def head(
        self,
        ops: Ops,
        cfg: ModelConfig,
        output_norm: Array,
        output: Any,
        x: Array,
        output_norm_b: Array | None = None,
    ) -> Array:
        """Final norm (a LayerNorm with its bias when layer_norm), output projection, then
        the logits divided by logit_scale and softcapped, where the model says. The rows'
        first n_embd columns are the residual stream (a side stream may ride after). An
        embedding-only model (ext.embeds_only) has no head: a FrinkError."""
        if cfg.ext.embeds_only():
            raise FrinkError(f"{cfg.arch} is an embedding model: it has no logits (use embed)")
        h = self.final_norm(ops, cfg, output_norm, x, output_norm_b)
        logits = ops.linear(h, output)
        if self.logit_scale is not None:
            logits = ops.scale_(logits, 1.0 / self.logit_scale)
        if self.final_logit_softcap:
            logits = ops.softcap_(logits, self.final_logit_softcap)
        return logits


def with_ext(cfg: ModelConfig, **changes: Any) -> ModelConfig:
    """cfg with fields of its architecture config changed."""
    return dataclasses.replace(cfg, ext=dataclasses.replace(cfg.ext, **changes))


def decoder_ext(cfg: ModelConfig) -> DecoderConfig:
    """cfg's architecture config, typed as the decoder's (every architecture's is one)."""
    assert isinstance(cfg.ext, DecoderConfig)
    return cfg.ext


def extended(cls: type[T], base: Any, **extra: Any) -> T:
    """An instance of cls (a subclass of base's dataclass) with base's fields and extra."""
    return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, **extra)
