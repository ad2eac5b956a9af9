"""MiniMax-Text-01 (GGUF `minimax-01`; HF `minimax`): lightning attention mixed with
softmax attention, a sparse MoE FFN on every layer, and scaled residuals.

Follows llama.cpp's src/models/minimax-01.cpp (hparams in its load_arch_hparams) and
transformers' MiniMaxForCausalLM; the converter is conversion/minimax.py's
MiniMaxText01Model. Each branch reads the normed rows h and adds to h itself, scaled:

    h = attn_norm(x);  x = alpha h + mixer(h)       lightning or softmax attention
    h = ffn_norm(x);   x = alpha h + moe(h)         softmax top-k, renormalized

alpha is `residual_scale` (transformers' *_alpha_factor, all equal; the betas 1, as the
converter asserts). Lightning layers are those attention.recurrent_layers names, else all
but every full_attention_interval-th (8, llama.cpp's default; the converter writes
neither). NeoX rope over rope.dimension_count dims (transformers rotates the whole head,
so a fixture sets rotary_dim = head_dim for the references to agree).

The lightning output norm's eps is the model's rms eps, as llama.cpp has it; transformers'
MiniMaxLightningAttention builds that norm with its class default 1e-6 instead, which moves
the first tokens' logits (where the state, and so the normed rows, are small) by ~3e-4.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.lightning import LightningConfig, lightning
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import LayerShape, ModelConfig
from ..model.linear import Linear
from ..model.reader import TensorReader
from ..model.weights import LayerWeights
from .base import Arch, get
from .decoder import DecoderConfig, extended, with_ext
from .hf import HF_ATTENTION_TENSORS, Composite, MetadataWriter, hf_type
from .hf_plan import HfModelType, Kept, Plan, pop_matching
from .moe import stack_per_expert

FULL_ATTENTION_INTERVAL = 8  # llama.cpp's default for a file that states no pattern
MAX_HEAD_DIM = 1 << 12  # a lightning state is [n_head, d, d] per layer: d beyond is broken


@dataclass
class LightningWeights:
    """A lightning attention layer (llama.cpp's names)."""

    qkv: Linear  # [3 * H * d, n_embd]: per head q, k, v (attn_qkv)
    gate: Linear  # [H * d, n_embd] the output gate (attn_gate)
    norm: Any  # [H * d] the RMSNorm over the output (attn_norm_2)
    out: Linear  # [n_embd, H * d] (attn_output)


@dataclass
class MinimaxLayerWeights(LayerWeights):
    lightning: LightningWeights | None = None


@dataclass(frozen=True)
class MinimaxConfig(DecoderConfig):
    """Lightning attention on the layers lightning.layers names; each branch adds to its
    normed input scaled by residual_alpha."""

    lightning: LightningConfig | None = None
    residual_alpha: float = 1.0

    recurrent_mixer = "lightning"

    recurrent_info_fields: ClassVar[dict[str, str]] = {"heads": "n_head", "head_dim": "head_dim"}

    def recurrent_info(self) -> dict[str, Any]:
        cache = "lightning attention state (K^T V per head)"
        return {**super().recurrent_info(), "residual_alpha": self.residual_alpha, "cache": cache}

    def recurrent_shapes(
        self, cfg: ModelConfig, layer: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        assert self.lightning is not None and self.lightning.layers[layer]
        return self.lightning.state_shapes()

    def recurrent_state_bytes(self, cfg: ModelConfig) -> int:
        return 0 if self.lightning is None else self.lightning.state_bytes()

    def read_layer(self, r: TensorReader, cfg: ModelConfig, layer: int, base: Any) -> Any:
        if not self.is_recurrent(cfg, layer):
            return base
        assert self.lightning is not None
        p, d = f"blk.{layer}.", cfg.n_embd
        width = self.lightning.n_head * self.lightning.head_dim
        w = LightningWeights(
            qkv=r.linear([(p + "attn_qkv", 3 * width)], d, bias=False),
            gate=r.linear([(p + "attn_gate", width)], d, bias=False),
            norm=r.get(p + "attn_norm_2.weight", (width,)),
            out=r.linear([(p + "attn_output", d)], width, bias=False),
        )
        return extended(MinimaxLayerWeights, base, lightning=w)

    def compose(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, x: Array, at: At
    ) -> Array:
        """x -> alpha h + mixer(h) (h = attn_norm(x)), then the same around the MoE."""
        alpha = self.residual_alpha
        h = self.pre_norm(ops, cfg, x, w.attn_norm, None)
        x = ops.add_(self.mixer(ops, cfg, shape, w, h, at), ops.scale_(h, alpha))
        h = self.pre_norm(ops, cfg, x, w.ffn_norm, None)
        return ops.add_(self.ffn(ops, cfg, shape, w, x, h), ops.scale_(h, alpha))

    def mixer(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, at: At
    ) -> Array:
        if shape.mixer == "lightning":
            assert self.lightning is not None
            return lightning(ops, self.lightning, shape.index, cfg.norm_eps, w.lightning, h, at.kv)
        return super().mixer(ops, cfg, shape, w, h, at)


def _drop_buffers(kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """transformers saves the lightning layers' decay tables (slope_rate, query_decay,
    key_decay, diagonal_decay): buffers computed from the config, which the converter drops
    too. They are not read."""
    rx = re.compile(
        r"model\.layers\.\d+\.self_attn\.(slope_rate|query_decay|key_decay|diagonal_decay)$"
    )
    for _ in pop_matching(kept, rx):
        pass
    return {}


def _experts(kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """block_sparse_moe.experts.{e}.w1 / w3 / w2 -> ffn_gate / up / down_exps."""
    rx = re.compile(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight$")
    return stack_per_expert(kept, rx, {"w1": "gate", "w3": "up", "w2": "down"})


_ATTN = "model.layers.{bid}.self_attn"
_ORIGINAL = hf_type(
    "MiniMaxText01",
    aliases={"num_experts": "num_local_experts"},
)


class Minimax(Arch):
    name = "minimax-01"
    ext_class = MinimaxConfig
    rope_type = "neox"
    moe_every_layer = True
    hf_needs_ffn_width = True
    hf_model_types: ClassVar[dict[str, HfModelType]] = {
        # The released checkpoints' own config (MiniMaxText01ForCausalLM, remote code):
        # layernorm_*_alpha / _beta, attn_type_list, rotary_dim; the same tensor names.
        "MiniMaxText01": _ORIGINAL,
        "minimax": hf_type(
            "minimax",
            aliases={"num_experts": "num_local_experts"},
        ),
    }
    hf_tensors = (
        ("model.embed_tokens", "token_embd"),
        ("model.norm", "output_norm"),
        ("lm_head", "output"),
        *HF_ATTENTION_TENSORS,
        (_ATTN + ".qkv_proj", "blk.{bid}.attn_qkv"),
        (_ATTN + ".output_gate", "blk.{bid}.attn_gate"),
        (_ATTN + ".norm", "blk.{bid}.attn_norm_2"),
        (_ATTN + ".out_proj", "blk.{bid}.attn_output"),
        ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.ffn_norm"),
        ("model.layers.{bid}.block_sparse_moe.gate", "blk.{bid}.ffn_gate_inp"),
    )
    hf_composites: ClassVar[tuple[Composite, ...]] = (_experts, _drop_buffers)

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        md, key = ckpt.metadata, self.key
        alpha = float(get(md, key("residual_scale"), 1.0))
        if not math.isfinite(alpha):
            raise FrinkError(f"{ckpt.path}: {key('residual_scale')} is not finite ({alpha})")
        if not 0 < cfg.head_dim_k <= MAX_HEAD_DIM or cfg.head_dim_k != cfg.head_dim_v:
            raise FrinkError(
                f"{ckpt.path}: bad lightning head size ({key('attention.key_length')} "
                f"{cfg.head_dim_k}, value_length {cfg.head_dim_v})"
            )
        lc = LightningConfig(
            layers=tuple(self._lightning_layers(ckpt, cfg.n_layer)),
            n_head=cfg.n_head,
            head_dim=cfg.head_dim_k,
        )
        ext = cfg.ext
        assert isinstance(ext, MinimaxConfig) and ext.moe is not None
        # The experts are n_ff wide where the file does not say (llama.cpp reads n_ff).
        moe = ext.moe
        if get(md, key("expert_feed_forward_length")) is None:
            moe = dataclasses.replace(moe, n_ff_exp=cfg.n_ff)
        moe = dataclasses.replace(moe, norm_topk=True, gating="softmax")
        return with_ext(cfg, lightning=lc, residual_alpha=alpha, moe=moe)

    def _lightning_layers(self, ckpt: Checkpoint, n_layer: int) -> list[bool]:
        md, key = ckpt.metadata, self.key
        rec = get(md, key("attention.recurrent_layers"))
        if rec is not None:
            layers = [bool(x) for x in list(rec)]
            if len(layers) != n_layer:
                raise FrinkError(
                    f"{ckpt.path}: {key('attention.recurrent_layers')} has {len(layers)} "
                    f"entries for {n_layer} layers"
                )
            return layers
        interval = int(get(md, key("full_attention_interval"), FULL_ATTENTION_INTERVAL))
        if interval <= 0:
            raise FrinkError(f"{ckpt.path}: bad {key('full_attention_interval')} {interval}")
        return [(i + 1) % interval != 0 for i in range(n_layer)]

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        hp = w.hp
        if hp.get("num_key_value_heads") is None:
            hp["num_key_value_heads"] = hp["num_attention_heads"]
        if hp.get("head_dim") is None:
            hp["head_dim"] = int(hp["hidden_size"]) // int(hp["num_attention_heads"])
        super().hf_metadata(w, notes)
        w.u32("expert_count", "num_local_experts")
        w.u32("expert_used_count", "num_experts_per_tok")
        alphas, betas = _residual_factors(hp)
        if len(alphas) != 1 or betas != {1.0}:
            raise FrinkError(
                "config.json: the *_alpha_factor values differ or a *_beta_factor is not 1 "
                f"(alphas {sorted(alphas)}, betas {sorted(betas)}): not supported, as in "
                "llama.cpp's converter"
            )
        w.set("residual_scale", float(next(iter(alphas))))
        w.set("rope.dimension_count", int(hp.get("rotary_dim") or hp["head_dim"]))
        w.set("attention.recurrent_layers", _recurrent_layers(hp))


def _residual_factors(hp: dict[str, Any]) -> tuple[set[float], set[float]]:
    """The residual alphas and betas a config states: the released config's
    layernorm_{full_attention,linear_attention,mlp}_{alpha,beta}, else transformers'
    {full_attn,linear_attn,mlp}_{alpha,beta}_factor (1 where absent)."""
    if "layernorm_mlp_alpha" in hp:
        kinds = ("full_attention", "linear_attention", "mlp")
        return (
            {float(hp.get(f"layernorm_{k}_alpha", 1)) for k in kinds},
            {float(hp.get(f"layernorm_{k}_beta", 1)) for k in kinds},
        )
    kinds = ("full_attn", "linear_attn", "mlp")
    return (
        {float(hp.get(f"{k}_alpha_factor", 1)) for k in kinds},
        {float(hp.get(f"{k}_beta_factor", 1)) for k in kinds},
    )


def _recurrent_layers(hp: dict[str, Any]) -> list[bool]:
    """Per layer, lightning attention: the released config's attn_type_list (1: softmax
    attention), else transformers' layer_types, else its default (the even layers attend)."""
    n = int(hp["num_hidden_layers"])
    listed = hp.get("attn_type_list")
    if isinstance(listed, list):
        if len(listed) != n:
            raise FrinkError(
                f"config.json: attn_type_list has {len(listed)} entries for {n} layers"
            )
        return [int(t) != 1 for t in listed]
    types = hp.get("layer_types")
    if isinstance(types, list):
        if len(types) != n:
            raise FrinkError(f"config.json: layer_types has {len(types)} entries for {n} layers")
        return [t == "linear_attention" for t in types]
    return [bool(i % 2) for i in range(n)]
