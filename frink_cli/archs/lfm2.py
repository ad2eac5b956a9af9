"""Liquid LFM2 (`lfm2`) and LFM2-MoE (`lfm2moe`): short-conv layers mixed with attention.

Follows llama.cpp's src/models/lfm2.cpp / lfm2moe.cpp (one graph: build_shortconv_block,
build_attn_block with per-head QK RMSNorms and NeoX rope, then a SwiGLU FFN or, from
`leading_dense_block_count` on, build_moe_ffn with sigmoid gating and the exp_probs_b
selection bias, always renormalized) and transformers' Lfm2ForCausalLM /
Lfm2MoeForCausalLM. Which layers are short convs is the GGUF's per-layer head_count_kv:
0 there is a conv layer (llama.cpp's is_recr). The final norm is stored as
token_embd_norm (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2, "fix for wrong tensor name";
transformers' model.embedding_norm), though it norms the last layer's output.

The HF side is the converter's LFM2Model / LFM2MoeModel: head_count_kv written per layer
(0 for the conv layers), the FFN width auto-adjusted as transformers sizes it
(block_auto_adjust_ff_dim), the conv kernel [d, 1, L] squeezed to [d, L], the experts
stacked per kind, expert_bias as exp_probs_b.bias, expert_gating_func sigmoid (2).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.shortconv import ShortConvConfig, shortconv
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import LayerShape, ModelConfig
from .base import Arch, get
from .decoder import DecoderConfig, decoder_ext, with_ext
from .hf import Composite, MetadataWriter, f32, hf_types
from .hf_plan import Kept, Plan, Transform
from .moe import stack_per_expert
from .transforms import SQUEEZE

# llama.cpp's expert_gating_func values (LLAMA_EXPERT_GATING_FUNC_TYPE_*).
_GATING = {1: "softmax", 2: "sigmoid"}

_ALIASES = {"tie_embedding": "tie_word_embeddings", "block_ff_dim": "intermediate_size"}


@dataclass(frozen=True)
class Lfm2Config(DecoderConfig):
    """Gated short convolutions on the layers shortconv.layers names (no KV heads), GQA
    attention on the rest."""

    shortconv: ShortConvConfig | None = None

    recurrent_mixer = "shortconv"
    recurrent_info_fields: ClassVar[dict[str, str]] = {"conv_kernel": "conv_kernel"}

    def recurrent_layer_shape(self, shape: LayerShape) -> LayerShape:
        return dataclasses.replace(shape, mixer="shortconv", n_head=0, n_head_kv=0)

    def recurrent_shapes(
        self, cfg: ModelConfig, layer: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        assert self.shortconv is not None
        # The conv tail is the whole state: the second array is empty.
        return (self.shortconv.conv_kernel - 1, cfg.n_embd), (0,)

    def recurrent_state_bytes(self, cfg: ModelConfig) -> int:
        return 0 if self.shortconv is None else self.shortconv.state_bytes(cfg.n_embd)

    def mixer(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, at: At
    ) -> Array:
        if shape.mixer == "shortconv":
            return shortconv(ops, cfg.n_embd, w.shortconv, h, at.kv)
        return super().mixer(ops, cfg, shape, w, h, at)


class Lfm2(Arch):
    ext_class = Lfm2Config
    name = "lfm2"
    hf_model_types = hf_types("lfm2", aliases=_ALIASES)
    rope_type = "neox"
    qk_norm = True
    zero_kv_recurrent = True
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = (
        ("model.embed_tokens", "token_embd"),
        ("model.embedding_norm", "token_embd_norm"),
        ("lm_head", "output"),
        ("model.layers.{bid}.operator_norm", "blk.{bid}.attn_norm"),
        ("model.layers.{bid}.ffn_norm", "blk.{bid}.ffn_norm"),
        ("model.layers.{bid}.self_attn.q_proj", "blk.{bid}.attn_q"),
        ("model.layers.{bid}.self_attn.k_proj", "blk.{bid}.attn_k"),
        ("model.layers.{bid}.self_attn.v_proj", "blk.{bid}.attn_v"),
        ("model.layers.{bid}.self_attn.out_proj", "blk.{bid}.attn_output"),
        ("model.layers.{bid}.self_attn.q_layernorm", "blk.{bid}.attn_q_norm"),
        ("model.layers.{bid}.self_attn.k_layernorm", "blk.{bid}.attn_k_norm"),
        ("model.layers.{bid}.conv.in_proj", "blk.{bid}.shortconv.in_proj"),
        ("model.layers.{bid}.conv.conv", "blk.{bid}.shortconv.conv"),
        ("model.layers.{bid}.conv.out_proj", "blk.{bid}.shortconv.out_proj"),
        ("model.layers.{bid}.feed_forward.w1", "blk.{bid}.ffn_gate"),
        ("model.layers.{bid}.feed_forward.w3", "blk.{bid}.ffn_up"),
        ("model.layers.{bid}.feed_forward.w2", "blk.{bid}.ffn_down"),
    )

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        """The llama-style keys, the short-conv layers (head_count_kv 0) and their width;
        the final norm read from token_embd_norm."""
        cfg = super().config(ckpt)
        md, key = ckpt.metadata, self.key
        kv = get(md, key("attention.head_count_kv"), required=True)
        per_layer = [int(v) for v in list(kv)] if hasattr(kv, "__len__") else [int(kv)]
        if len(per_layer) == 1:
            per_layer *= cfg.n_layer
        if len(per_layer) < cfg.n_layer:
            raise FrinkError(
                f"{ckpt.path}: {key('attention.head_count_kv')} has {len(per_layer)} entries "
                f"for {cfg.n_layer} layers"
            )
        conv_layers = tuple(v == 0 for v in per_layer[: cfg.n_layer])
        kernel = int(get(md, key("shortconv.l_cache"), required=True))
        if kernel < 2:
            raise FrinkError(f"{ckpt.path}: bad shortconv.l_cache {kernel} (llama.cpp needs > 1)")
        if get(md, key("attention.sliding_window")):
            raise FrinkError(
                f"{ckpt.path}: {self.name} with a sliding window (LFM2.5 audio tokenizer) is "
                "not supported"
            )
        if not bool(get(md, key("attention.causal"), True)):
            raise FrinkError(
                f"{ckpt.path}: a non-causal {self.name} (an embedding model) is not supported"
            )
        moe = decoder_ext(cfg).moe
        if moe is not None:
            moe = dataclasses.replace(
                moe,
                gating=self._gating(ckpt),
                expert_bias=True,
                # llama.cpp's lfm2moe always renormalizes; an HF config may say otherwise.
                norm_topk=bool(get(md, key("expert_weights_norm"), True)),
                weights_scale=float(get(md, key("expert_weights_scale"), 0.0) or 1.0),
            )
        return with_ext(
            cfg,
            shortconv=ShortConvConfig(layers=conv_layers, conv_kernel=kernel),
            output_norm_tensor="token_embd_norm",
            moe=moe,
        )

    def _gating(self, ckpt: Checkpoint) -> str:
        value = int(get(ckpt.metadata, self.key("expert_gating_func"), 2))
        if value not in _GATING:
            raise FrinkError(
                f"{ckpt.path}: expert_gating_func {value} is not supported (softmax: 1, sigmoid: 2)"
            )
        return _GATING[value]

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return {"blk.{bid}.shortconv.conv.weight": (SQUEEZE,)}

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # As the converter's LFM2Model.set_gguf_parameters writes them.
        hp = w.hp
        n = int(hp["num_hidden_layers"])
        kinds = hp.get("layer_types")
        if kinds is None:
            full = hp.get("full_attn_idxs")
            full = list(range(n)) if full is None else [int(i) for i in full]
            kinds = ["full_attention" if i in full else "conv" for i in range(n)]
        if len(kinds) != n or not set(kinds) <= {"conv", "full_attention"}:
            raise FrinkError(f"config.json: bad layer_types {list(kinds)!r} for {n} layers")
        if hp.get("conv_bias"):
            raise FrinkError(
                "config.json: conv_bias (short-conv biases) is not supported for lfm2: "
                "llama.cpp's graph has no such bias"
            )
        w.u32("block_count", "num_hidden_layers")
        w.u32("context_length", "max_position_embeddings")
        w.u32("embedding_length", "hidden_size")
        w.u32("attention.head_count", "num_attention_heads")
        kv = int(hp["num_key_value_heads"])
        w.set("attention.head_count_kv", [kv if k != "conv" else 0 for k in kinds])
        w.f32("rope.freq_base", "rope_theta")
        w.set("attention.layer_norm_rms_epsilon", f32(hp["norm_eps"]))
        w.u32("vocab_size", "n_vocab")
        w.u32("shortconv.l_cache", "conv_L_cache")
        self.hf_rope_scaling(w)
        self.hf_ffn_metadata(w)

    def hf_ffn_metadata(self, w: MetadataWriter) -> None:
        """The dense FFN width as transformers' Lfm2MLP sizes it (and the converter's
        _add_feed_forward_length: the two agree whenever block_ffn_dim_multiplier is set)."""
        hp = w.hp
        ff = int(hp["intermediate_size"])
        if hp.get("block_auto_adjust_ff_dim"):
            ff = int(2 * ff / 3)
            mult = hp.get("block_ffn_dim_multiplier")
            if mult is None:
                raise FrinkError(
                    "config.json: block_auto_adjust_ff_dim without block_ffn_dim_multiplier "
                    "sizes the FFN differently in transformers and llama.cpp's converter"
                )
            of = int(hp["block_multiple_of"])
            ff = of * ((int(mult * ff) + of - 1) // of)
        w.set("feed_forward_length", ff)


_W123 = re.compile(r"model\.layers\.(\d+)\.feed_forward\.experts\.(\d+)\.(w1|w2|w3)\.weight$")


def _stacked_w123(kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """The per-expert w1 (gate), w3 (up), w2 (down) matrices stacked per kind, as the
    converter's LFM2MoeModel.modify_tensors merges them."""
    return stack_per_expert(kept, _W123, {"w1": "gate", "w3": "up", "w2": "down"})


class Lfm2Moe(Lfm2):
    name = "lfm2moe"
    hf_model_types = hf_types(
        "lfm2_moe",
        aliases={"tie_embedding": "tie_word_embeddings", "num_local_experts": "num_experts"},
    )
    hf_tensors = Lfm2.hf_tensors + (
        ("model.layers.{bid}.feed_forward.gate", "blk.{bid}.ffn_gate_inp"),
    )
    hf_tensors_whole: ClassVar[tuple[tuple[str, str], ...]] = (
        ("model.layers.{bid}.feed_forward.expert_bias", "blk.{bid}.exp_probs_b.bias"),
    )
    hf_composites: ClassVar[tuple[Composite, ...]] = (_stacked_w123,)

    def hf_ffn_metadata(self, w: MetadataWriter) -> None:
        """As LFM2MoeModel writes them: the dense width as it stands (no auto-adjust), the
        expert keys, the leading dense layers, sigmoid gating. norm_topk_prob and
        routed_scaling_factor are carried (transformers honours both; the converter writes
        neither and llama.cpp always renormalizes, never scales)."""
        hp = w.hp
        w.u32("feed_forward_length", "intermediate_size")
        w.u32("expert_count", "num_experts")
        w.u32("expert_used_count", "num_experts_per_tok")
        w.u32("expert_feed_forward_length", "moe_intermediate_size")
        w.u32("leading_dense_block_count", "num_dense_layers")
        w.set("expert_gating_func", 2)
        w.flag("expert_weights_norm", "norm_topk_prob")
        scale = hp.get("routed_scaling_factor")
        if scale is not None and float(scale) != 1.0:
            w.set("expert_weights_scale", f32(scale))
        if not hp.get("use_expert_bias", True):
            raise FrinkError(
                "config.json: use_expert_bias false is not supported for lfm2moe: llama.cpp's "
                "graph requires the expert bias (exp_probs_b)"
            )
