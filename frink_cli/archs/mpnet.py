"""MPNet (`mpnet`): the encoder of all-mpnet-base-v2 and its kin. BERT's post-norm layer with
T5-style relative position buckets beside its learned absolute positions.

    x = LayerNorm(tok[id] + pos[p + 2])            positions start after the padding row
    bias[h, q, k] = rel[bucket(k - q), h]          computed once, added in every layer
    per layer (post-norm):
        x = LayerNorm(x + attention(x, bias))      no mask: every token sees every token
        x = LayerNorm(x + down(gelu(up(x))))       GELU with erf, biases everywhere

Follows transformers' MPNetModel (modeling_mpnet.py): bucket(d) splits the 32 buckets into
two halves by the sign of d (keys after the query in the upper half), each exact for
|d| < 8 and logarithmic up to max_distance 128, past which every distance shares the last
bucket. transformers buckets into 32 with max_distance 128 whatever config.json says, so a
config stating other values is refused. No token types, no LM head.

An HF directory only: llama.cpp has no MPNet (its converter has no class for it and
llama-model.cpp no LLM_ARCH for it), so no GGUF exists to compare; the metadata keys this
module writes for the HF directory (attention.relative_buckets_count, the T5 key, and
attention.relative_max_distance) are frink's own.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.attention import AttentionSpec
from ..model.config import LayerShape, ModelConfig
from ..model.reader import TensorReader
from .base import Arch, get
from .bert import Bert, BertConfig, BertLayerWeights
from .decoder import extended
from .hf import MetadataWriter, hf_types

# What transformers' MPNetEncoder.compute_position_bias uses, whatever the config says.
HF_BUCKETS = 32
HF_MAX_DISTANCE = 128
# The largest max_distance read: the bias table has 2 * max_distance + 1 columns per head.
MOST_DISTANCE = 1 << 16
# MPNetEmbeddings' padding row is 1 whatever the config's pad_token_id: position 0 is row 2.
POSITION_OFFSET = 2
REL_BIAS = "attn_rel_b.weight"  # [n_buckets, n_head], one table for every layer


def relative_bucket(d: np.ndarray, n_buckets: int, max_distance: int) -> np.ndarray:
    """transformers' MPNet bucket of each key - query distance d (int), in its float32
    arithmetic: half the buckets for each sign, exact below n_buckets // 4, log-spaced up
    to max_distance, the last of each half for every distance past it."""
    half = n_buckets // 2
    exact = half // 2
    n = -np.asarray(d, dtype=np.int64)
    ret = np.where(n < 0, half, 0)
    n = np.abs(n)
    with np.errstate(divide="ignore"):
        scaled = np.log(n.astype(np.float32) / np.float32(exact))
    scaled = scaled / np.float32(math.log(max_distance / exact)) * np.float32(half - exact)
    large = exact + np.where(n < exact, 0, scaled).astype(np.int64)
    return ret + np.where(n < exact, n, np.minimum(large, half - 1))


def bias_table(rel: np.ndarray, n_buckets: int, max_distance: int) -> np.ndarray:
    """The attention bias [n_head, 2 * max_distance + 1] by key - query position +
    max_distance from the bucket embedding rel [n_buckets, n_head]; every distance past
    max_distance falls in its edge column's bucket, so the attention's clipping is exact."""
    d = np.arange(-max_distance, max_distance + 1)
    return np.ascontiguousarray(rel[relative_bucket(d, n_buckets, max_distance)].T, np.float32)


@dataclass
class MpnetLayerWeights(BertLayerWeights):
    """A BERT layer and the relative bias table it adds to its scores (the model's one table,
    shared by every layer)."""

    attn_rel_bias: Any = None  # [n_head, 2 * max_distance + 1]


@dataclass(frozen=True)
class MpnetConfig(BertConfig):
    """BERT's encoder with relative position buckets: rel_buckets buckets over distances up
    to rel_max_distance (0: none, the bias switched off)."""

    rel_buckets: int = 0
    rel_max_distance: int = 0

    def read_layer(self, r: TensorReader, cfg: ModelConfig, layer: int, base: Any) -> Any:
        w = super().read_layer(r, cfg, layer, base)
        table = None
        if self.rel_buckets:
            rel = r.get(REL_BIAS, (self.rel_buckets, cfg.n_head))
            table = bias_table(rel, self.rel_buckets, self.rel_max_distance)
        return extended(MpnetLayerWeights, w, attn_rel_bias=table)

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        spec = super().make_attention_spec(cfg, shape)
        return dataclasses.replace(spec, rel_bias=bool(self.rel_buckets))


def check_buckets(where: str, n_buckets: int, max_distance: int) -> None:
    """Refuse, by name, a bucket count or max distance the bucketing cannot run on."""
    if n_buckets < 4 or n_buckets % 2 or n_buckets > 4096:
        raise FrinkError(f"{where}: mpnet relative_buckets_count {n_buckets} (an even 4..4096)")
    if not n_buckets // 4 < max_distance <= MOST_DISTANCE:
        raise FrinkError(
            f"{where}: mpnet relative_max_distance {max_distance} "
            f"(more than {n_buckets // 4}, at most {MOST_DISTANCE})"
        )


class Mpnet(Bert):
    name = "mpnet"
    ext_class = MpnetConfig
    hf_model_types = hf_types(
        "mpnet",
        strip=("mpnet.",),
        ignore=("pooler.", "lm_head.", "embeddings.position_ids"),
        ignored_note="the pooler, the masked-LM head and position_ids not read",
    )
    # BERT's names but for its attention and token types, which MPNet has its own way.
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = tuple(
        (hf, gg) for hf, gg in Bert.hf_tensors if "attention" not in hf and "token_type" not in hf
    ) + (
        ("encoder.relative_attention_bias", "attn_rel_b"),
        ("encoder.layer.{bid}.attention.attn.q", "blk.{bid}.attn_q"),
        ("encoder.layer.{bid}.attention.attn.k", "blk.{bid}.attn_k"),
        ("encoder.layer.{bid}.attention.attn.v", "blk.{bid}.attn_v"),
        ("encoder.layer.{bid}.attention.attn.o", "blk.{bid}.attn_output"),
        ("encoder.layer.{bid}.attention.LayerNorm", "blk.{bid}.attn_output_norm"),
    )

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # BERT's keys; the context is the position table less its padding rows; the buckets
        # are what transformers runs (32 over distances to 128), a config stating others refused.
        hp = w.hp
        buckets = hp.get("relative_attention_num_buckets", HF_BUCKETS)
        distance = hp.get("relative_attention_max_distance", HF_MAX_DISTANCE)
        if buckets != HF_BUCKETS or distance != HF_MAX_DISTANCE:
            raise FrinkError(
                f"config.json: mpnet relative_attention_num_buckets {buckets!r}, max distance "
                f"{distance!r} (transformers' MPNetModel buckets into {HF_BUCKETS} over "
                f"{HF_MAX_DISTANCE})"
            )
        super().hf_metadata(w, notes)
        w.set("context_length", int(hp["max_position_embeddings"]) - POSITION_OFFSET)
        w.set("attention.relative_buckets_count", buckets)
        w.set("attention.relative_max_distance", distance)

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = Arch.config(self, ckpt)
        md = ckpt.metadata
        eps = float(get(md, self.key("attention.layer_norm_epsilon"), required=True))
        buckets = int(get(md, self.key("attention.relative_buckets_count"), required=True))
        distance = int(get(md, self.key("attention.relative_max_distance"), required=True))
        check_buckets(str(ckpt.path), buckets, distance)
        assert isinstance(cfg.ext, MpnetConfig)  # ext_class
        ext = dataclasses.replace(
            cfg.ext,
            layer_norm=True,
            plain_ffn=True,
            n_token_types=0,
            position_offset=POSITION_OFFSET,
            rel_buckets=buckets,
            rel_max_distance=distance,
        )
        return dataclasses.replace(cfg, norm_eps=eps, ext=ext)
