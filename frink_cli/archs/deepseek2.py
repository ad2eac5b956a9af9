"""DeepSeek V2 / V2-Lite / V3 (GGUF arch deepseek2, and the models that reuse it): multi-head
latent attention (graph/blocks/mla.py) with its latent cache (cache/latent.py), routed
experts with an ungated shared expert, grouped routing, leading dense layers, and YaRN
whose mscale also scales the softmax.

Follows llama.cpp's src/models/deepseek2.cpp (the absorbed MLA form) and transformers'
DeepseekV2/V3ForCausalLM. What the converter (conversion/deepseek.py: DeepseekV2Model)
writes: head_count_kv 1, key_length kv_lora_rank + rope dim and value_length kv_lora_rank
(the MQA form), key_length_mla / value_length_mla (the per-head widths), kv_b_proj split
per head into attn_k_b [H, kv_lora, nope] and attn_v_b [H, v, kv_lora], the expert
groups, leading_dense_block_count, expert_shared_count, and yarn_log_multiplier as
0.1 * mscale_all_dim. llama.cpp's defaults: softmax gating, no renormalization.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.mla import MlaConfig, mla_attention
from ..graph.blocks.moe import MoeConfig
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import LayerShape, ModelConfig
from ..model.weights import LayerWeights, Linear, TensorReader
from .base import Arch, get
from .decoder import DecoderConfig, decoder_ext, extended, with_ext
from .deepseek2_hf import DeepseekHf

_GATING = {1: "softmax", 2: "sigmoid"}


@dataclass
class MlaLayerWeights(LayerWeights):
    """A layer's MLA tensors (wo is the base's attn_output)."""

    wq: Linear | None = None  # [H * (nope + rope), n_embd] without q_lora_rank
    wq_a: Linear | None = None  # [q_lora, n_embd]
    q_a_norm: np.ndarray | None = None  # [q_lora]
    wq_b: Linear | None = None  # [H * (nope + rope), q_lora]
    wkv_a: Linear | None = None  # [kv_lora + rope, n_embd]
    kv_a_norm: np.ndarray | None = None  # [kv_lora]
    k_b: np.ndarray | None = None  # [H, kv_lora, nope]
    v_b: np.ndarray | None = None  # [H, v, kv_lora]


@dataclass(frozen=True)
class Deepseek2Config(DecoderConfig):
    """Multi-head latent attention on every layer; the MoE is the decoder's (groups
    included); yarn_mscale: YaRN's softmax multiplier mscale^2 (None: no YaRN)."""

    mla: MlaConfig | None = None
    yarn_mscale: float | None = None

    def layer_shape(self, cfg: ModelConfig, layer: int) -> LayerShape:
        # The attention's values are its keys' rows (graph/blocks/mla.py): V as wide as K.
        shape = super().layer_shape(cfg, layer)
        return dataclasses.replace(shape, mixer="mla", head_dim_v=shape.head_dim_k)

    def info(self) -> dict[str, Any]:
        out = super().info()
        m = self.moe
        if m is not None:
            out["moe"] |= {"groups": m.n_group, "groups_used": m.topk_group}
        if self.mla is not None:
            a = self.mla
            out["mla"] = {
                "kv_lora_rank": a.kv_lora_rank,
                "q_lora_rank": a.q_lora_rank,
                "head_dim_nope": a.head_dim_nope,
                "rope_dim": a.rope_dim,
                "head_dim_v": a.head_dim_v,
                "cache": "latent",
                "cache_floats_per_token": a.kv_lora_rank + a.rope_dim,
                "full_kv_floats_per_token": a.n_head
                * (a.head_dim_nope + a.rope_dim + a.head_dim_v),
            }
        return out

    def positive_values(self) -> list[tuple[str, float | None]]:
        return [*super().positive_values(), ("yarn mscale", self.yarn_mscale)]

    def matrix_rows(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        rows = super().matrix_rows(cfg)
        a = self.mla
        if a is not None:
            rows += [
                ("key_length_mla x heads", a.n_head * (a.head_dim_nope + a.rope_dim)),
                ("kv_lora_rank + rope dim", a.kv_lora_rank + a.rope_dim),
                ("q_lora_rank", a.q_lora_rank),
                ("value_length_mla x heads", a.n_head * a.head_dim_v),
            ]
        return rows

    def read_layer(self, r: TensorReader, cfg: ModelConfig, layer: int, base: Any) -> Any:
        a = self.mla
        assert a is not None  # config() always sets it
        p, d, H = f"blk.{layer}.", cfg.n_embd, a.n_head
        nq = H * (a.head_dim_nope + a.rope_dim)
        q: dict[str, Any] = {}
        if a.q_lora_rank:
            q["wq_a"] = r.linear([(p + "attn_q_a", a.q_lora_rank)], d, bias=False)
            q["q_a_norm"] = r.get(p + "attn_q_a_norm.weight", (a.q_lora_rank,))
            q["wq_b"] = r.linear([(p + "attn_q_b", nq)], a.q_lora_rank, bias=False)
        else:
            q["wq"] = r.linear([(p + "attn_q", nq)], d, bias=False)
        c = a.kv_lora_rank
        w = extended(
            MlaLayerWeights,
            base,
            wkv_a=r.linear([(p + "attn_kv_a_mqa", c + a.rope_dim)], d, bias=False),
            kv_a_norm=r.get(p + "attn_kv_a_norm.weight", (c,)),
            k_b=r.get(p + "attn_k_b.weight", (H, c, a.head_dim_nope)),
            v_b=r.get(p + "attn_v_b.weight", (H, a.head_dim_v, c)),
            **q,
        )
        return dataclasses.replace(
            w, wo=r.linear([(p + "attn_output", d)], H * a.head_dim_v, bias=False)
        )

    def mixer(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, at: At
    ) -> Array:
        assert self.mla is not None
        return mla_attention(ops, self.mla, w, h, *at)


class Deepseek2(DeepseekHf, Arch):
    name = "deepseek2"
    ext_class = Deepseek2Config

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        md, key = ckpt.metadata, self.key
        mla = self._mla(ckpt, cfg)
        if cfg.n_head_kv != 1 or cfg.head_dim_k != mla.kv_lora_rank + mla.rope_dim:
            raise FrinkError(
                f"{ckpt.path}: {self.name} needs the MQA form the converter writes "
                f"(head_count_kv 1, key_length kv_lora_rank + rope dim = "
                f"{mla.kv_lora_rank + mla.rope_dim}); the file has {cfg.n_head_kv} and "
                f"{cfg.head_dim_k}"
            )
        if cfg.head_dim_v != mla.kv_lora_rank:
            raise FrinkError(
                f"{ckpt.path}: value_length {cfg.head_dim_v} is not kv_lora_rank {mla.kv_lora_rank}"
            )
        if get(md, key("attention.temperature_scale")):
            raise FrinkError(
                f"{ckpt.path}: {self.name} attention temperature tuning is not supported"
            )
        cfg, mscale = self._yarn(ckpt, cfg, mla)
        mla = dataclasses.replace(mla, scale=cfg.attn_scale)
        return with_ext(cfg, mla=mla, moe=self._moe(ckpt, cfg), yarn_mscale=mscale)

    def _mla(self, ckpt: Checkpoint, cfg: ModelConfig) -> MlaConfig:
        """The MLA sizes, each checked (a zero or absurd rank refused by name)."""
        md, key = ckpt.metadata, self.key
        kv_lora = int(get(md, key("attention.kv_lora_rank"), required=True))
        q_lora = int(get(md, key("attention.q_lora_rank"), 0))
        hk = int(get(md, key("attention.key_length_mla"), required=True))
        hv = int(get(md, key("attention.value_length_mla"), required=True))
        rope = cfg.rope_dim
        for what, value in (
            ("attention.kv_lora_rank", kv_lora),
            ("attention.key_length_mla", hk),
            ("attention.value_length_mla", hv),
            ("rope.dimension_count", rope),
        ):
            if value <= 0:
                raise FrinkError(f"{ckpt.path}: bad model metadata ({self.name}.{what} = {value})")
        if q_lora < 0:
            raise FrinkError(
                f"{ckpt.path}: bad model metadata ({self.name}.q_lora_rank = {q_lora})"
            )
        if hk <= rope or rope % 2:
            raise FrinkError(
                f"{ckpt.path}: key_length_mla {hk} must exceed an even rope dim ({rope})"
            )
        return MlaConfig(
            n_head=cfg.n_head,
            kv_lora_rank=kv_lora,
            q_lora_rank=q_lora,
            head_dim_nope=hk - rope,
            rope_dim=rope,
            head_dim_v=hv,
            eps=cfg.norm_eps,
            scale=1.0 / math.sqrt(hk),
        )

    def _yarn(
        self, ckpt: Checkpoint, cfg: ModelConfig, mla: MlaConfig
    ) -> tuple[ModelConfig, float | None]:
        """(cfg with the softmax scale and rope multiplier llama.cpp's deepseek2 uses, the
        softmax's YaRN multiplier or None). With YaRN: scale (attn_factor * m)^2 /
        sqrt(nope + rope), m = 1 + yarn_log_multiplier * ln(factor) (the converter writes
        0.1 * mscale_all_dim); the rotation's cos/sin multiplier is attn_factor alone
        (transformers' mscale / mscale_all_dim ratio, 1 in DeepSeek's configs)."""
        base = 1.0 / math.sqrt(mla.head_dim_nope + mla.rope_dim)
        sc = cfg.rope_scaling
        if sc is None or sc.kind != "yarn":
            return dataclasses.replace(cfg, attn_scale=base), None
        log_mul = float(get(ckpt.metadata, self.key("rope.scaling.yarn_log_multiplier"), 0.0))
        if not (math.isfinite(log_mul) and log_mul >= 0):
            raise FrinkError(f"{ckpt.path}: bad rope.scaling.yarn_log_multiplier {log_mul}")
        m = sc.attn_factor * (1.0 + log_mul * math.log(sc.factor))
        # graph/rope.py multiplies cos/sin by attn_factor * (1 + 0.1 ln factor): cancel the
        # second factor, as llama.cpp's context does for this architecture.
        rope = dataclasses.replace(
            sc, attn_factor=sc.attn_factor / (1.0 + 0.1 * math.log(sc.factor))
        )
        cfg = dataclasses.replace(cfg, attn_scale=base * m * m, rope_scaling=rope)
        return cfg, (m * m if m != 1.0 else None)

    def _moe(self, ckpt: Checkpoint, cfg: ModelConfig) -> MoeConfig | None:
        """The routed experts as llama.cpp's deepseek2 reads them (None: no MoE layer)."""
        moe = decoder_ext(cfg).moe
        if moe is None:
            return None
        md, key = ckpt.metadata, self.key
        dense = int(get(md, key("leading_dense_block_count"), 0))
        if [not x for x in moe.layers] != [i < dense for i in range(cfg.n_layer)]:
            raise FrinkError(
                f"{ckpt.path}: leading_dense_block_count {dense} does not match the layers "
                "that have a router (ffn_gate_inp)"
            )
        gating = int(get(md, key("expert_gating_func"), 1))
        if gating not in _GATING:
            raise FrinkError(
                f"{ckpt.path}: expert_gating_func {gating} is not supported (softmax: 1, "
                "sigmoid: 2)"
            )
        n_shared = int(get(md, key("expert_shared_count"), 0))
        if not 0 <= n_shared <= moe.n_expert:
            raise FrinkError(f"{ckpt.path}: bad expert_shared_count {n_shared}")
        n_group = int(get(md, key("expert_group_count"), 1) or 1)
        used = int(get(md, key("expert_group_used_count"), n_group) or n_group)
        if n_group < 1 or moe.n_expert % n_group or (n_group > 1 and moe.n_expert // n_group < 2):
            raise FrinkError(
                f"{ckpt.path}: expert_group_count {n_group} does not divide the "
                f"{moe.n_expert} experts into groups of at least 2"
            )
        if not 0 < used <= n_group:
            raise FrinkError(
                f"{ckpt.path}: expert_group_used_count {used} is not in 1..{n_group} "
                "(expert_group_count)"
            )
        names = set(ckpt.tensors.names())
        return dataclasses.replace(
            moe,
            n_ff_shexp=moe.n_ff_exp * n_shared,
            shared_gate=False,
            gating=_GATING[gating],
            expert_bias=any(f"blk.{i}.exp_probs_b.bias" in names for i in range(cfg.n_layer)),
            norm_topk=bool(get(md, key("expert_weights_norm"), False)),
            weights_scale=float(get(md, key("expert_weights_scale"), 0.0) or 1.0),
            n_group=n_group,
            topk_group=used,
        )
