"""BERT (`bert`): the bidirectional encoder of most sentence-embedding models
(all-MiniLM, bge, e5). No LM head: `Model.embed` pools its last layer's rows.

    x = LayerNorm(tok[id] + pos[p] + type[0])      learned absolute positions, token type 0
    per layer (post-norm):
        x = LayerNorm(x + attention(x))            no mask: every token sees every token
        x = LayerNorm(x + down(gelu(up(x))))       GELU with erf, biases everywhere

Follows llama.cpp's src/models/bert.cpp (LLM_ARCH_BERT) and transformers' BertModel. The
converter's BertModel maps tensors by name: embeddings.{word,position,token_type}_embeddings
-> token_embd / position_embd / token_types, embeddings.LayerNorm -> token_embd_norm,
attention.output.LayerNorm -> attn_output_norm, output.LayerNorm -> layer_output_norm;
the pooler and the masked-LM head are not read. Bidirectional attention is the attention
block's mask choice (AttentionSpec.causal); the rows of one sequence are its only keys, so
sequences batched in one forward never see each other.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.attention import AttentionSpec
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import HeadPlan, LayerPlan, LayerShape, ModelConfig
from ..model.reader import TensorReader
from ..model.weights import LayerWeights
from .base import Arch, get
from .decoder import DecoderConfig, extended
from .hf import MetadataWriter, hf_types


@dataclass
class BertLayerWeights(LayerWeights):
    """A BERT layer: the blocks' tensors and its two post-norms (LayerNorms with biases)."""

    attn_out_norm: Any = None  # [n_embd] after the attention's residual add
    attn_out_norm_b: Any = None
    out_norm: Any = None  # [n_embd] after the FFN's residual add
    out_norm_b: Any = None


@dataclass
class BertHead:
    """The embedding tables beside the token embeddings (ModelWeights.arch)."""

    position_embd: np.ndarray | None  # [n_ctx_train, n_embd]; None where rope positions
    token_types: np.ndarray | None  # [n_token_types, n_embd]; None where the model has none


@dataclass(frozen=True)
class BertConfig(DecoderConfig):
    """The post-norm encoder layer; n_token_types: rows of the token-type table (0: none);
    learned_positions: a position table added to the embeddings (else rope in attention);
    position_offset: the table's row for position 0 (RoBERTa-style tables start after
    their padding row)."""

    n_token_types: int = 2
    learned_positions: bool = True
    position_offset: int = 0

    def embeds_only(self) -> bool:
        return True

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        return dataclasses.replace(
            super().layer_plan(cfg, shape), pre_norms=False, norm_biases=True
        )

    def head_plan(self, cfg: ModelConfig) -> HeadPlan:
        return HeadPlan(weightless=True, embd_norm="layer_norm")

    def read_layer(self, r: TensorReader, cfg: ModelConfig, layer: int, base: Any) -> Any:
        p, d = f"blk.{layer}.", (cfg.n_embd,)
        return extended(
            BertLayerWeights,
            base,
            attn_out_norm=r.get(p + "attn_output_norm.weight", d),
            attn_out_norm_b=r.get(p + "attn_output_norm.bias", d),
            out_norm=r.get(p + "layer_output_norm.weight", d),
            out_norm_b=r.get(p + "layer_output_norm.bias", d),
        )

    def read_head(self, r: TensorReader, cfg: ModelConfig) -> BertHead:
        d = cfg.n_embd
        pos = types = None
        if self.learned_positions:
            off = self.position_offset
            pos = r.get("position_embd.weight", (cfg.n_ctx_train + off, d))[off:]
        if self.n_token_types:
            types = r.get("token_types.weight", (self.n_token_types, d))
        return BertHead(position_embd=pos, token_types=types)

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        spec = super().make_attention_spec(cfg, shape)
        return dataclasses.replace(spec, rotates=not self.learned_positions, causal=False)

    def embed(self, ops: Ops, cfg: ModelConfig, w: Any, x: Array, lookup: Any) -> Array:
        """Token rows + position rows (where the model has a table) + token type 0's row
        (where it has a type table), then the embedding LayerNorm."""
        if w.arch.position_embd is not None:
            x = ops.add_(x, lookup(w.arch.position_embd, by_position=True))
        if w.arch.token_types is not None:
            x = x + w.arch.token_types[0]
        return ops.layer_norm(x, w.token_embd_norm, w.token_embd_norm_b, cfg.norm_eps)

    def compose(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, x: Array, at: At
    ) -> Array:
        """x (left as it was) -> LayerNorm(h + FFN(h)), h = LayerNorm(x + attention(x));
        the FFN is the decoder's (plain here, gated where plain_ffn is off)."""
        a = self.mixer(ops, cfg, shape, w, x, at)
        h = ops.layer_norm(ops.add_(a, x), w.attn_out_norm, w.attn_out_norm_b, cfg.norm_eps)
        f = self.ffn(ops, cfg, shape, w, h, h)
        return ops.layer_norm(ops.add_(f, h), w.out_norm, w.out_norm_b, cfg.norm_eps)

    def final_norm(
        self, ops: Ops, cfg: ModelConfig, output_norm: Array, x: Array, output_norm_b: Array | None
    ) -> Array:
        return x  # post-norm: the last layer's rows are normed already


class Bert(Arch):
    name = "bert"
    ext_class = BertConfig
    ffn_act = "gelu"
    hf_model_types = hf_types(
        "bert",
        strip=("bert.",),
        ignore=(
            "pooler.",
            "bert.pooler.",
            "cls.",
            "embeddings.position_ids",
            "bert.embeddings.position_ids",
        ),
        ignored_note="the pooler, the masked-LM head and position_ids not read",
    )
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = (
        ("embeddings.word_embeddings", "token_embd"),
        ("embeddings.position_embeddings", "position_embd"),
        ("embeddings.token_type_embeddings", "token_types"),
        ("embeddings.LayerNorm", "token_embd_norm"),
        ("encoder.layer.{bid}.attention.self.query", "blk.{bid}.attn_q"),
        ("encoder.layer.{bid}.attention.self.key", "blk.{bid}.attn_k"),
        ("encoder.layer.{bid}.attention.self.value", "blk.{bid}.attn_v"),
        ("encoder.layer.{bid}.attention.output.dense", "blk.{bid}.attn_output"),
        ("encoder.layer.{bid}.attention.output.LayerNorm", "blk.{bid}.attn_output_norm"),
        ("encoder.layer.{bid}.intermediate.dense", "blk.{bid}.ffn_up"),
        ("encoder.layer.{bid}.output.dense", "blk.{bid}.ffn_down"),
        ("encoder.layer.{bid}.output.LayerNorm", "blk.{bid}.layer_output_norm"),
    )

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # What the converter's BertModel writes (TextModel's keys, the LayerNorm epsilon,
        # non-causal attention); GELU with erf and absolute positions are all it carries.
        hp = w.hp
        if hp.get("hidden_act") != "gelu":
            raise FrinkError(f"config.json: bert hidden_act {hp.get('hidden_act')!r} (only gelu)")
        if hp.get("position_embedding_type", "absolute") != "absolute":
            raise FrinkError(
                f"config.json: bert position_embedding_type "
                f"{hp.get('position_embedding_type')!r} (only absolute)"
            )
        w.sizes()
        w.u32("attention.head_count_kv", "num_attention_heads")
        w.f32("attention.layer_norm_epsilon", "layer_norm_eps")
        w.set("attention.causal", False)
        w.u32("vocab_size", "n_vocab")

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        md = ckpt.metadata
        if get(md, self.key("attention.causal"), False):
            raise FrinkError(f"{ckpt.path}: a causal bert is not supported")
        eps = float(get(md, self.key("attention.layer_norm_epsilon"), required=True))
        n_types = ckpt.tensors.info("token_types.weight").shape[0]
        assert isinstance(cfg.ext, BertConfig)  # ext_class
        ext = dataclasses.replace(cfg.ext, layer_norm=True, plain_ffn=True, n_token_types=n_types)
        return dataclasses.replace(cfg, norm_eps=eps, ext=ext)
