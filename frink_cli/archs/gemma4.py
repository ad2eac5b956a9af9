"""Gemma 4 (GGUF `gemma4`, llama.cpp's src/models/gemma4.cpp; HF `gemma4_text` /
`gemma4`, transformers' Gemma4ForCausalLM / Gemma4ForConditionalGeneration, text only).

Gemma 3's layer (GeGLU, sandwich norms, QK norm, embeddings scaled by sqrt(n_embd),
sliding-window layers with their own rope base, final logit softcap) with:

- norms that scale by w, not 1 + w (the converter's norm_shift 0);
- q.k unscaled (attention scale 1.0: Q and K are normed per head);
- a weightless RMSNorm on V (v_norm); a layer without attn_v takes V = its raw K
  projection (transformers' attention_k_eq_v, on full layers; llama.cpp's optional attn_v);
- per-kind head widths: sliding layers use key_length_swa (and their KV head count may
  differ: head_count_kv as an array, read as per-layer sizes), full ones key_length;
- proportional rope on the full layers: the converter writes n_rot = key_length and a
  rope_freqs tensor of 1 (rotated pairs) and 1e30 (pairs that do not rotate), which only
  the full layers apply; sliding layers rotate rope.dimension_count_swa dims at
  rope.freq_base_swa;
- KV sharing: the last attention.shared_kv_layers layers compute no K/V and attend over
  the rows of layer n_kv - 2 (sliding) or n_kv - 1 (full), n_kv = n_layer - shared, as
  llama.cpp's reuse rule says (transformers: the last earlier layer of the same kind; the
  two agree when those layers are of those kinds, which the file must then say);
- per-layer embeddings (embedding_length_per_layer_input > 0): Gemma4Config.embed and
  Gemma4Config.layer;
- a per-layer output scale (layer_output_scale [1], HF's layer_scalar);
- the MoE variant (26B-A4B; HF enable_moe_block): every layer's dense FFN runs beside the
  routed experts (ffn "dense+moe", Gemma4Config.ffn), the router
  reading the normed residual (ffn_gate_inp.scale), per-expert scales
  (ffn_down_exps.scale, HF's router.per_expert_scale), the experts' gate/up fused
  (ffn_gate_up_exps, HF's experts.gate_up_proj: gate rows then up rows).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.attention import AttentionSpec
from ..graph.blocks.ffn import gated_ffn
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import LayerPlan, LayerShape, ModelConfig
from ..model.linear import Linear
from ..model.weights import LayerWeights, TensorReader
from ..quant.blocks import QuantRows
from .base import get
from .decoder import DecoderConfig, decoder_ext, extended, with_ext
from .gemma3 import GemmaArch
from .hf import MetadataWriter, f32, hf_type, multimodal
from .hf_plan import HfModelType

# The multimodal checkpoint's towers and their embedders (not read), at the top level or
# under model.
_TOWERS = tuple(
    root + part
    for root in ("", "model.")
    for part in ("vision_tower.", "audio_tower.", "embed_vision.", "embed_audio.")
)

# The converter's frequency factor for the pairs proportional rope leaves unrotated.
UNROTATED_FACTOR = 1e30

_TEXT = hf_type("gemma4_text")


def _layer_types(hp: dict[str, Any]) -> list[str]:
    """transformers' Gemma4TextConfig rule: layer_types, else five sliding per full one;
    the last layer is always full."""
    n = int(hp["num_hidden_layers"])
    types = hp.get("layer_types")
    if not (isinstance(types, list) and len(types) == n):
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    types = list(types)
    types[-1] = "full_attention"
    return types


def _full_override(hp: dict[str, Any], key: str) -> Any:
    """A full layer's head_dim / num_key_value_heads: global_head_dim /
    num_global_key_value_heads, else per_layer_config's entry (as the converter reads it)."""
    name = {"head_dim": "global_head_dim", "num_key_value_heads": "num_global_key_value_heads"}
    if hp.get(name[key]) is not None:
        return hp[name[key]]
    per_layer = hp.get("per_layer_config")
    if isinstance(per_layer, dict):
        types = _layer_types(hp)
        for idx, layer_cfg in per_layer.items():
            i = int(idx) if str(idx).isdigit() else -1
            if 0 <= i < len(types) and types[i] == "full_attention" and key in layer_cfg:
                return layer_cfg[key]
    return None


@dataclasses.dataclass
class Gemma4LayerWeights(LayerWeights):
    """A layer's weights with its per-layer input's gate [n, n_embd], projection [n_embd, n]
    and post-norm [n_embd] (None without per-layer inputs), and its output scale [1]."""

    ple_gate: Linear | None = None
    ple_proj: Linear | None = None
    ple_post_norm: np.ndarray | None = None
    out_scale: np.ndarray | None = None


@dataclasses.dataclass
class Gemma4HeadWeights:
    """The per-layer inputs' tables: the token table [n_vocab, n_layer * n] (f32 or the
    file's blocks, rows dequantized on lookup), the projection of the scaled embeddings
    [n_layer * n, n_embd] and its norm [n]."""

    per_layer_token_embd: np.ndarray | QuantRows
    per_layer_model_proj: Linear
    per_layer_proj_norm: np.ndarray


@dataclasses.dataclass(frozen=True)
class Gemma4Config(DecoderConfig):
    """Gemma 4's additions to the decoder (see the module docstring)."""

    # The sliding layers' head width (K = V) and rotated dims, where they differ from the
    # full layers' head_dim_k / rope_dim (llama.cpp's n_embd_head_k_swa, n_rot_swa).
    swa_head_dim: int | None = None
    swa_rope_dim: int | None = None
    rope_freqs_global_only: bool = False  # rope_freqs apply to the full layers only
    v_norm: bool = False  # a weightless RMSNorm on each V head
    # Layers from this index on reuse the K/V of the last earlier layer of their kind
    # (llama.cpp: n_kv - 2 for sliding, n_kv - 1 for full layers). None: none share.
    kv_shared_from: int | None = None
    v_from_k: tuple[bool, ...] = ()  # per layer: no V projection, V = the raw K projection
    # n_embd_per_layer columns per layer, computed once from the tokens and the scaled
    # embeddings, ride beside the residual stream (rows are [stream | n_layer * n]); each
    # layer adds its gated projection after its FFN. 0: none.
    per_layer_embd: int = 0
    layer_out_scale: bool = False  # a per-layer scalar multiplies each layer's output

    def layer_shape(self, cfg: ModelConfig, layer: int) -> LayerShape:
        shape = super().layer_shape(cfg, layer)
        if not cfg.swa_layers[layer]:
            return shape
        hk = self.swa_head_dim or shape.head_dim_k
        return dataclasses.replace(
            shape,
            head_dim_k=hk,
            head_dim_v=self.swa_head_dim or shape.head_dim_v,
            rope_dim=self.swa_rope_dim or shape.rope_dim,
            no_rope_freqs=cfg.has_rope_freqs and self.rope_freqs_global_only,
        )

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        v_from_k = bool(self.v_from_k) and self.v_from_k[shape.index]
        return dataclasses.replace(super().layer_plan(cfg, shape), v_from_k=v_from_k)

    def read_layer(self, r: TensorReader, cfg: ModelConfig, layer: int, base: Any) -> Any:
        p, d, n = f"blk.{layer}.", cfg.n_embd, self.per_layer_embd
        extra: dict[str, Any] = {}
        if n:
            extra["ple_gate"] = r.linear([(p + "inp_gate", n)], d, bias=False)
            extra["ple_proj"] = r.linear([(p + "proj", d)], n, bias=False)
            extra["ple_post_norm"] = r.get(p + "post_norm.weight", (d,))
        if self.layer_out_scale:
            extra["out_scale"] = r.get(p + "layer_output_scale.weight", (1,))
        return extended(Gemma4LayerWeights, base, **extra)

    def read_head(self, r: TensorReader, cfg: ModelConfig) -> Gemma4HeadWeights | None:
        n = cfg.n_layer * self.per_layer_embd
        if not n:
            return None
        return Gemma4HeadWeights(
            per_layer_token_embd=r.table("per_layer_token_embd", cfg.n_vocab, n),
            per_layer_model_proj=r.linear([("per_layer_model_proj", n)], cfg.n_embd, bias=False),
            per_layer_proj_norm=r.get("per_layer_proj_norm.weight", (self.per_layer_embd,)),
        )

    def kv_source(self, cfg: ModelConfig, layer: int) -> int | None:
        n_kv = self.kv_shared_from
        if n_kv is None or layer < n_kv:
            return None
        return n_kv - (2 if cfg.swa_layers[layer] else 1)

    def residual_width(self, cfg: ModelConfig) -> int:
        return cfg.n_embd + cfg.n_layer * self.per_layer_embd

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        spec = super().make_attention_spec(cfg, shape)
        v_from_k = bool(self.v_from_k) and self.v_from_k[shape.index]
        return dataclasses.replace(spec, v_norm=self.v_norm, v_from_k=v_from_k)

    def embed(self, ops: Ops, cfg: ModelConfig, w: Any, x: Array, lookup: Any) -> Array:
        """The scaled embeddings x [T, n_embd] and, beside them, the per-layer inputs ->
        [T, n_embd + n_layer * n]: each layer's n columns are

            (rms_norm(proj . x / sqrt(n_embd)) + rows * sqrt(n)) / sqrt(2)

        (the norm per layer's n columns; rows: the tokens' per_layer_token_embd rows), as
        llama.cpp's project_per_layer_inputs and transformers' get_per_layer_inputs /
        project_per_layer_inputs compute them."""
        x = super().embed(ops, cfg, w, x, lookup)
        n, L, T = self.per_layer_embd, cfg.n_layer, x.shape[0]
        if not n:
            return x
        tables = w.arch
        rows = lookup(tables.per_layer_token_embd)
        p = ops.scale_(ops.linear(x, tables.per_layer_model_proj), cfg.n_embd**-0.5)
        p = ops.rms_norm_(p.reshape(T, L, n), tables.per_layer_proj_norm, cfg.norm_eps)
        p = ops.add_(p.reshape(T, L * n), ops.scale_(rows, math.sqrt(n)))
        return ops.concat([x, ops.scale_(p, 0.5**0.5)])

    def compose(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, x: Array, at: At
    ) -> Array:
        """The decoder layer, then this layer's per-layer input (after the FFN's residual
        add: x + post_norm(proj(act(gate(x)) * inp_l))) and its output scale."""
        n = self.per_layer_embd
        side = None
        if n:
            x, side = x[:, : cfg.n_embd], x[:, cfg.n_embd :]
        out = super().compose(ops, cfg, shape, w, x, at)
        if side is not None:
            i = shape.index
            g = ops.act(ops.linear(out, w.ple_gate), cfg.ffn_act) * side[:, i * n : (i + 1) * n]
            g = ops.rms_norm_(ops.linear(g, w.ple_proj), w.ple_post_norm, cfg.norm_eps)
            out = ops.add_(out, g)
        if w.out_scale is not None:
            out = out * w.out_scale  # layer_output_scale [1]
        return out if side is None else ops.concat([out, side])

    def ffn(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, x: Array, h: Array
    ) -> Array:
        """The MoE layer's FFN (llama.cpp's gemma4.cpp, transformers' Gemma4TextDecoderLayer
        with enable_moe_block): the dense FFN on h = ffn_norm(x), post-normed, plus the
        experts on pre_norm_2(x), post-normed; the router reads rms_norm(x) * scale /
        sqrt(n_embd) (folded into one norm weight at load); softmax over the experts, top
        k, renormalized, each weight times its expert's scale."""
        if shape.ffn != "dense+moe":
            return super().ffn(ops, cfg, shape, w, x, h)
        m, e, eps = self.moe, w.moe, cfg.norm_eps
        assert m is not None  # layer_shape says "dense+moe" only with a MoeConfig
        dense = ops.rms_norm_(gated_ffn(ops, cfg.ffn_act, w, h, eps), e.dense_post_norm, eps)
        r = ops.linear(ops.rms_norm(x, e.router_norm, eps), e.inp)
        ids, weights = ops.route(r, m.n_expert_used, m.norm_topk, m.gating, None)
        weights = weights * e.expert_scale[ids]
        routed = ops.experts(ops.rms_norm(x, e.pre_norm, eps), ids, weights, e, cfg.ffn_act)
        return ops.add_(dense, ops.rms_norm_(routed, e.post_norm, eps))


class Gemma4(GemmaArch):
    name = "gemma4"
    ext_class = Gemma4Config
    hf_model_types: ClassVar[dict[str, HfModelType]] = {
        "gemma4_text": _TEXT,
        "gemma4": multimodal(_TEXT, _TOWERS, "vision and audio towers and their embedders"),
    }
    per_layer_sizes = True  # head_count_kv per layer kind; FFN width double on shared layers
    hf_tensors = GemmaArch.hf_tensors + (
        ("model.embed_tokens_per_layer", "per_layer_token_embd"),
        ("model.per_layer_model_projection", "per_layer_model_proj"),
        ("model.per_layer_projection_norm", "per_layer_proj_norm"),
        ("model.layers.{bid}.per_layer_input_gate", "blk.{bid}.inp_gate"),
        ("model.layers.{bid}.per_layer_projection", "blk.{bid}.proj"),
        ("model.layers.{bid}.post_per_layer_input_norm", "blk.{bid}.post_norm"),
        ("model.layers.{bid}.router.proj", "blk.{bid}.ffn_gate_inp"),
        ("model.layers.{bid}.pre_feedforward_layernorm_2", "blk.{bid}.pre_ffw_norm_2"),
        ("model.layers.{bid}.post_feedforward_layernorm_1", "blk.{bid}.post_ffw_norm_1"),
        ("model.layers.{bid}.post_feedforward_layernorm_2", "blk.{bid}.post_ffw_norm_2"),
    )
    hf_tensors_whole = (
        ("model.layers.{bid}.layer_scalar", "blk.{bid}.layer_output_scale.weight"),
        ("model.layers.{bid}.router.scale", "blk.{bid}.ffn_gate_inp.scale"),
        ("model.layers.{bid}.router.per_expert_scale", "blk.{bid}.ffn_down_exps.scale"),
        ("model.layers.{bid}.experts.gate_up_proj", "blk.{bid}.ffn_gate_up_exps.weight"),
        ("model.layers.{bid}.experts.down_proj", "blk.{bid}.ffn_down_exps.weight"),
    )

    def attn_scale_default(self, n_layer: int, n_embd: int, n_head: int, head_dim_k: int) -> float:
        return 1.0  # llama.cpp's f_attention_scale for gemma4 (transformers' scaling 1.0)

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        md, key = ckpt.metadata, self.key
        cfg = super().config(ckpt)
        moe = decoder_ext(cfg).moe
        if moe is not None:
            if not all(moe.layers):
                raise FrinkError(f"{ckpt.path}: Gemma 4 MoE with dense-only layers")
            # Softmax over the experts, top k renormalized (llama.cpp's build_moe_ffn with
            # norm_w; transformers' Gemma4TextRouter).
            cfg = with_ext(cfg, moe=dataclasses.replace(moe, parallel_dense=True, norm_topk=True))
        names = set(ckpt.tensors.names())
        n = cfg.n_layer
        head_swa = int(get(md, key("attention.key_length_swa"), cfg.head_dim_k))
        if int(get(md, key("attention.value_length_swa"), head_swa)) != head_swa:
            raise FrinkError(f"{ckpt.path}: gemma4 needs key_length_swa == value_length_swa")
        if cfg.head_dim_k != cfg.head_dim_v:
            raise FrinkError(f"{ckpt.path}: gemma4 needs key_length == value_length")
        rope_swa = int(get(md, key("rope.dimension_count_swa"), head_swa))
        if rope_swa % 2 or not 0 < rope_swa <= head_swa:
            raise FrinkError(
                f"{ckpt.path}: bad model metadata ({self.name}.rope.dimension_count_swa = "
                f"{rope_swa}, head width {head_swa})"
            )
        shared = int(get(md, key("attention.shared_kv_layers"), 0))
        kv_from = n - shared if shared else None
        if kv_from is not None:
            if not 2 <= kv_from < n:
                raise FrinkError(
                    f"{ckpt.path}: {shared} KV-sharing layers of {n} leave no layers to share"
                )
            for layer in range(kv_from, n):
                src = kv_from - (2 if cfg.swa_layers[layer] else 1)
                if cfg.swa_layers[src] != cfg.swa_layers[layer]:
                    raise FrinkError(
                        f"{ckpt.path}: KV-sharing layer {layer} would read layer {src}'s K/V, "
                        "a layer of the other kind (llama.cpp reuses layer n_kv - 2 for "
                        "sliding layers and n_kv - 1 for full ones)"
                    )
        v_from_k = tuple(
            (kv_from is None or layer < kv_from)
            and f"blk.{layer}.attn_v.weight" not in names
            and f"blk.{layer}.attn_qkv.weight" not in names
            for layer in range(n)
        )
        n_pl = int(get(md, key("embedding_length_per_layer_input"), 0))
        if n_pl < 0:
            raise FrinkError(
                f"{ckpt.path}: bad model metadata ({self.name}.embedding_length_per_layer_input"
                f" = {n_pl})"
            )
        scales = [f"blk.{layer}.layer_output_scale.weight" in names for layer in range(n)]
        if any(scales) and not all(scales):
            raise FrinkError(f"{ckpt.path}: layer_output_scale on some layers only")
        return with_ext(
            cfg,
            swa_head_dim=head_swa if head_swa != cfg.head_dim_k else None,
            swa_rope_dim=rope_swa if rope_swa != cfg.rope_dim else None,
            rope_freqs_global_only=True,
            v_norm=True,
            kv_shared_from=kv_from,
            v_from_k=v_from_k if any(v_from_k) else (),
            per_layer_embd=n_pl,
            layer_out_scale=all(scales),
        )

    # --- HF -> GGUF ----------------------------------------------------------------

    def hf_rope_scaling(self, w: MetadataWriter) -> None:
        # "proportional" is the generated rope_freqs tensor (hf_generated); nothing else.
        rope_type = w.hp["_rope_full"].get("rope_type")
        if rope_type not in (None, "default", "proportional"):
            raise FrinkError(f"config.json: unsupported rope type {rope_type!r} for gemma4")

    def hf_generated(self, hp: dict[str, Any]) -> dict[str, np.ndarray]:
        """The converter's rope_freqs: 1 for the pairs proportional rope rotates, 1e30 for
        the rest (ggml's neox rope rotates a prefix of the pairs only)."""
        full = hp["_rope_full"]
        head = int(_full_override(hp, "head_dim") or hp["head_dim"])
        if full.get("rope_type") != "proportional":
            return {}
        n_rot = int(head * float(full.get("partial_rotary_factor", 1.0)) / 2)
        values = [1.0] * n_rot + [UNROTATED_FACTOR] * (head // 2 - n_rot)
        return {"rope_freqs.weight": np.asarray(values, np.float32)}

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        hp = w.hp
        if hp.get("use_bidirectional_attention") == "all":
            raise FrinkError("config.json: bidirectional Gemma 4 attention is not supported")
        super().hf_metadata(w, notes)
        n = int(hp["num_hidden_layers"])
        types = _layer_types(hp)
        swa = [t == "sliding_attention" for t in types]
        head_swa = int(hp["head_dim"])
        head_full = int(_full_override(hp, "head_dim") or head_swa)
        w.set("attention.sliding_window_pattern", swa)
        w.u32("attention.sliding_window", "sliding_window")
        w.set("attention.key_length", head_full)
        w.set("attention.value_length", head_full)
        w.set("attention.key_length_swa", head_swa)
        w.set("attention.value_length_swa", head_swa)
        w.set("rope.dimension_count", head_full)
        w.set("rope.dimension_count_swa", head_swa)
        if hp.get("rope_theta_swa") is not None:
            w.set("rope.freq_base_swa", f32(hp["rope_theta_swa"]))
        w.f32("final_logit_softcapping", "final_logit_softcapping", optional=True)
        shared = int(hp.get("num_kv_shared_layers") or 0)
        w.set("attention.shared_kv_layers", shared)
        w.set("embedding_length_per_layer_input", int(hp.get("hidden_size_per_layer_input") or 0))
        kv_swa = int(hp["num_key_value_heads"])
        kv_full = _full_override(hp, "num_key_value_heads") if hp.get("attention_k_eq_v") else None
        if kv_full is not None:
            w.set("attention.head_count_kv", [kv_swa if s else int(kv_full) for s in swa])
        if hp.get("enable_moe_block"):
            w.u32("expert_count", "num_experts")
            w.u32("expert_used_count", "top_k_experts")
            w.u32("expert_feed_forward_length", "moe_intermediate_size")
        if hp.get("use_double_wide_mlp") and shared:
            ff = int(hp["intermediate_size"])
            w.set("feed_forward_length", [ff if i < n - shared else 2 * ff for i in range(n)])
