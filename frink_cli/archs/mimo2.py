"""Xiaomi MiMo-V2-Flash (GGUF `mimo2`, llama.cpp LLM_ARCH_MIMO2; HF `mimo_v2_flash`).

Follows llama.cpp's src/models/mimo2.cpp (hparams in its load_arch_hparams) and
transformers' MiMoV2FlashForCausalLM; the converter is conversion/mimo.py's MimoV2Model.
The pre-norm llama block (NEOX rope on the first rope.dimension_count dims of each head,
q.k scale 1/sqrt(key_length)) with:

- a per-layer sliding/full pattern (attention.sliding_window_pattern, one entry per block),
  the sliding layers rotating with their own base (rope.freq_base_swa);
- per-layer KV head counts (attention.head_count_kv an array: the released model, and
  transformers, give the sliding layers twice the full layers' KV heads);
- K heads key_length wide and V heads value_length wide;
- attention sinks (blk.N.attn_sinks.weight [n_head]) on the layers that have them (the
  sliding ones), as gpt-oss's: a logit per query head that joins the softmax, no value;
- the value scale (attention.value_scale): the attention output multiplied by it after
  wo (llama.cpp), which is transformers' scale on V (the output is linear in V);
- a dense SwiGLU FFN on the layers without a router (layer 0 in the released model) and
  sigmoid-gated experts on the others: top k of sigmoid(logits) + exp_probs_b (the
  selection bias), weighted by the unbiased sigmoids renormalized over the top k; no
  shared expert.

The converter always appends 3 multi-token-prediction blocks (block_count = layers + 3,
nextn_predict_layers 3, per-layer arrays as long as block_count); frink runs the trunk,
as llama.cpp's main pass does. llama.cpp's mimo2 reads neither expert groups nor an
expert weights scale: a file (or config) asking for either is refused by name, as are
configs llama.cpp and transformers would read apart (routed_scaling_factor != 1).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.attention import AttentionSpec
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import LayerPlan, LayerShape, ModelConfig
from .base import Arch, get
from .decoder import DecoderConfig, decoder_ext, with_ext
from .hf import HF_CORE_TENSORS, Composite, MetadataWriter, hf_types
from .hf_plan import hp_value
from .moe import HF_ROUTER, stacked_experts

# The MTP blocks the converter always appends (MimoV2Model._n_nextn).
HF_NEXTN = 3
# transformers' defaults (MiMoV2FlashConfig) where the config leaves a key out.
_PARTIAL_ROTARY = 0.334
_VALUE_SCALE = 0.707


@dataclasses.dataclass(frozen=True)
class Mimo2Config(DecoderConfig):
    """attn_sinks: per layer, whether its softmax takes the learned sink logits
    (blk.N.attn_sinks.weight); value_scale: the attention output's multiplier after wo
    (None: 1)."""

    attn_sinks: tuple[bool, ...] = ()
    value_scale: float | None = None

    def has_sinks(self, layer: int) -> bool:
        return bool(self.attn_sinks) and self.attn_sinks[layer]

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        spec = super().make_attention_spec(cfg, shape)
        return dataclasses.replace(spec, sinks=self.has_sinks(shape.index))

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        return dataclasses.replace(
            super().layer_plan(cfg, shape), sinks=self.has_sinks(shape.index)
        )

    def positive_values(self) -> list[tuple[str, float | None]]:
        return [*super().positive_values(), ("attention value scale", self.value_scale)]

    def mixer(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, at: At
    ) -> Array:
        a = super().mixer(ops, cfg, shape, w, h, at)
        return a if self.value_scale is None else ops.scale_(a, self.value_scale)


class Mimo2(Arch):
    name = "mimo2"
    ext_class = Mimo2Config
    hf_model_types = hf_types(
        "mimo_v2_flash",
        aliases={"num_local_experts": "n_routed_experts"},
        ignore=("model.mtp.",),
        ignored_note="multi-token-prediction layers ignored (frink runs the trunk)",
    )
    rope_type = "neox"
    per_layer_sizes = True

    hf_tensors = (
        *HF_CORE_TENSORS,
        ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.ffn_norm"),
        *HF_ROUTER,
    )
    hf_tensors_whole = (
        ("model.layers.{bid}.self_attn.attention_sink_bias", "blk.{bid}.attn_sinks.weight"),
        ("model.layers.{bid}.self_attn.sinks", "blk.{bid}.attn_sinks.weight"),
        ("model.layers.{bid}.mlp.gate.e_score_correction_bias", "blk.{bid}.exp_probs_b.bias"),
    )
    hf_composites: ClassVar[tuple[Composite, ...]] = (stacked_experts,)

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        md, key = ckpt.metadata, self.key
        if cfg.sliding_window is None:
            raise FrinkError(
                f"{ckpt.path}: model metadata is missing {key('attention.sliding_window')}"
            )
        if get(md, key("attention.sliding_window_pattern")) is None:
            raise FrinkError(
                f"{ckpt.path}: model metadata is missing {key('attention.sliding_window_pattern')}"
            )
        groups = int(get(md, key("expert_group_count"), 1) or 1)
        if groups != 1 or int(get(md, key("expert_group_used_count"), 1) or 1) != 1:
            raise FrinkError(
                f"{ckpt.path}: {key('expert_group_count')} {groups}: mimo2 with expert groups "
                "is not supported (llama.cpp's mimo2 routes without groups)"
            )
        if float(get(md, key("expert_weights_scale"), 1.0) or 1.0) != 1.0:
            raise FrinkError(
                f"{ckpt.path}: {key('expert_weights_scale')} is not supported (llama.cpp's "
                "mimo2 does not scale the expert weights)"
            )
        scale = float(get(md, key("attention.value_scale"), 1.0))
        if not (math.isfinite(scale) and scale > 0):
            raise FrinkError(
                f"{ckpt.path}: bad model metadata ({key('attention.value_scale')} = {scale})"
            )
        names = set(ckpt.tensors.names())
        sinks = tuple(f"blk.{i}.attn_sinks.weight" in names for i in range(cfg.n_layer))
        moe = decoder_ext(cfg).moe
        if moe is not None:
            moe = dataclasses.replace(
                moe,
                gating="sigmoid",
                norm_topk=True,
                expert_bias=any(f"blk.{i}.exp_probs_b.bias" in names for i in range(cfg.n_layer)),
            )
        return with_ext(
            cfg,
            moe=moe,
            attn_sinks=sinks if any(sinks) else (),
            value_scale=None if scale == 1.0 else scale,
        )

    # --- HF -> GGUF ----------------------------------------------------------------------
    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        hp = w.hp
        _hf_refuse(hp)
        super().hf_metadata(w, notes)
        n = int(hp["num_hidden_layers"])
        swa = _hf_swa_layers(hp, n) + [True] * HF_NEXTN
        kv = int(hp["num_key_value_heads"])
        kv_swa = hp_value(hp, "swa_num_key_value_heads", 2 * kv, "uint")
        w.set("block_count", n + HF_NEXTN)
        w.set("nextn_predict_layers", HF_NEXTN)
        w.set("attention.head_count_kv", [kv_swa if s else kv for s in swa])
        w.set("attention.sliding_window_pattern", [int(s) for s in swa])
        w.set("attention.sliding_window", _hf_window(hp))
        w.u32("attention.value_length", "v_head_dim")
        full = hp["_rope_full"]
        factor = hp_value(
            full,
            "partial_rotary_factor",
            hp_value(hp, "partial_rotary_factor", _PARTIAL_ROTARY, "number"),
            "number",
        )
        w.set("rope.dimension_count", int(int(hp["head_dim"]) * factor))
        # rope_parameters' sliding_attention base (hf_plan), else the released config's key.
        theta_swa = "rope_theta_swa" if hp.get("rope_theta_swa") is not None else "swa_rope_theta"
        w.f32("rope.freq_base_swa", theta_swa, optional=True)
        w.u32("expert_count", "n_routed_experts")
        w.u32("expert_used_count", "num_experts_per_tok")
        w.u32("expert_group_count", "n_group", optional=True)
        w.u32("expert_group_used_count", "topk_group", optional=True)
        w.u32("expert_feed_forward_length", "moe_intermediate_size")
        w.f32("attention.value_scale", "attention_value_scale", optional=True)


def _hf_list(hp: dict[str, Any], key: str, n: int) -> list[Any] | None:
    """config.json's per-layer list hp[key] (None where absent), n entries or refused."""
    value = hp.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise FrinkError(f"config.json: {key!r} must be a list, got {value!r:.40}")
    if len(value) != n:
        raise FrinkError(f"config.json: {key} has {len(value)} entries for {n} layers")
    return value


def _hf_swa_layers(hp: dict[str, Any], n: int) -> list[bool]:
    """Which layers slide: hybrid_layer_pattern (the released config's, 1 = sliding) or
    layer_types (transformers'), which must agree where both are given; neither:
    transformers' default (full on layer 0 and every 6th)."""
    pattern = _hf_list(hp, "hybrid_layer_pattern", n)
    types = _hf_list(hp, "layer_types", n)
    from_pattern = None if pattern is None else [x == 1 for x in pattern]
    from_types = None if types is None else [t == "sliding_attention" for t in types]
    if from_pattern is not None and from_types is not None and from_pattern != from_types:
        raise FrinkError("config.json: hybrid_layer_pattern and layer_types disagree")
    default = [not (i == 0 or (i + 1) % 6 == 0) for i in range(n)]
    return from_pattern or from_types or default


def _hf_window(hp: dict[str, Any]) -> int:
    """transformers' window: sliding_window_size + 1 where the released config states it
    (the query and sliding_window_size keys before it), else sliding_window."""
    size = hp.get("sliding_window_size")
    if size is not None:
        window = hp_value(hp, "sliding_window_size", 0, "uint") + 1
    else:
        window = hp_value(hp, "sliding_window", 0, "uint")
    if window <= 0:
        raise FrinkError("config.json: mimo2 needs a sliding_window (or sliding_window_size)")
    return window


def _hf_refuse(hp: dict[str, Any]) -> None:
    """What llama.cpp's mimo2 does not read, refused rather than run apart from
    transformers."""
    if hp_value(hp, "n_group", 1, "uint") > 1 or hp_value(hp, "topk_group", 1, "uint") > 1:
        raise FrinkError("config.json: mimo2 with expert groups (n_group > 1) is not supported")
    rsf = hp_value(hp, "routed_scaling_factor", 1.0, "number")
    if rsf != 1.0:
        raise FrinkError(
            f"config.json: routed_scaling_factor {rsf} is not supported (llama.cpp's mimo2 "
            "does not scale the expert weights)"
        )
    if hp.get("attention_bias"):
        raise FrinkError("config.json: mimo2 with attention biases is not supported")
    # The converter asserts the sliding layers' sizes equal the full layers' (but KV heads).
    for swa_key, key in (
        ("swa_num_attention_heads", "num_attention_heads"),
        ("swa_head_dim", "head_dim"),
        ("swa_v_head_dim", "v_head_dim"),
    ):
        if hp.get(swa_key) is not None and hp[swa_key] != hp.get(key):
            raise FrinkError(
                f"config.json: {swa_key} {hp[swa_key]!r:.40} != {key} {hp.get(key)!r:.40} "
                "(not supported, as in llama.cpp's converter)"
            )
