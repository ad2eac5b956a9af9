"""IBM Granite 4.0-H (`granitehybrid`): Mamba-2 layers and attention layers in one stack,
each followed by Granite's FFN, with Granite's four multipliers.

Follows llama.cpp's src/models/granite-hybrid.cpp and transformers'
GraniteMoeHybridForCausalLM. A layer is Mamba-2 where the GGUF's per-layer
attention.head_count_kv is 0 (llama.cpp's is_recr), else attention. The attention layers
use no rope when rope.scaling.finetuned is false (NoPE: the converter writes that for every
hybrid Granite, whatever position_embedding_type says). Every layer's FFN is GraniteMoE's
(experts at feed_forward_length, renormalized top k, the shared expert added ungated), or,
with no experts, shared_mlp as the dense FFN. The residual multiplier scales the mamba
branch as it does the attention branch.

The HF side is the converter's GraniteHybridModel: GraniteMoe's metadata and tensors, the
Mamba-2 mixer's from the mamba_* config keys (Mamba2Model's transforms: A = -exp(A_log)
and D as [n_head, 1], the norm per group), head_count_kv as a per-layer array with 0 on the
mamba layers, context_length 2**20 and rope.scaling.finetuned false.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.attention import AttentionSpec
from ..graph.blocks.mamba import MambaConfig
from ..model.config import LayerShape, ModelConfig
from .base import get
from .decoder import with_ext
from .granite import GraniteMoe
from .hf import MetadataWriter, hf_types
from .hf_plan import Transform
from .mamba import MAMBA2_TRANSFORMS, MambaStackConfig
from .mamba_hybrid import (
    MIXER_MODULES,
    MIXER_WHOLE,
    mamba2_config,
    mamba2_metadata,
    zero_kv_layers,
)


@dataclass(frozen=True)
class GraniteHybridConfig(MambaStackConfig):
    """Mamba-2 layers between attention layers that may rotate nothing (NoPE)."""

    # The attention layers rotate nothing and see no positions (rope.scaling.finetuned
    # false, llama.cpp's has_rope off).
    no_rope: bool = False

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        spec = super().make_attention_spec(cfg, shape)
        return dataclasses.replace(spec, rotates=not self.no_rope)


class GraniteHybrid(GraniteMoe):
    name = "granitehybrid"
    hf_model_types = hf_types("granitemoehybrid")
    hf_tensors = GraniteMoe.hf_tensors + MIXER_MODULES
    hf_tensors_whole: ClassVar[tuple[tuple[str, str], ...]] = MIXER_WHOLE
    zero_kv_recurrent = True
    ext_class = GraniteHybridConfig

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        md, key = ckpt.metadata, self.key
        recurrent = zero_kv_layers(self, ckpt, cfg)
        mamba: MambaConfig | None = None
        if any(recurrent):
            mamba = dataclasses.replace(mamba2_config(self, ckpt), layers=recurrent)
        # llama.cpp: rope.scaling.finetuned is granite's rope switch, true when absent.
        rope = bool(get(md, key("rope.scaling.finetuned"), True))
        return with_ext(cfg, mamba=mamba, no_rope=not rope)

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return {**super().hf_transforms(), **MAMBA2_TRANSFORMS}

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # As the converter's GraniteHybridModel.set_gguf_parameters writes them.
        hp = w.hp
        super().hf_metadata(w, notes)
        if "num_local_experts" in hp and not hp["num_local_experts"]:
            # A dense Granite 4.0-H: the converter writes the config's 0 experts and pins the
            # used count to 0 (the config keeps a leftover num_experts_per_tok).
            w.set("expert_count", 0)
            w.set("expert_used_count", 0)
        n_layer = int(hp["num_hidden_layers"])
        types = hp.get("layer_types") or hp.get("layers_block_type")
        if types is None:
            raise FrinkError("config.json: granitemoehybrid needs layer_types")
        if len(types) != n_layer:
            raise FrinkError(f"config.json: layer_types has {len(types)} entries, not {n_layer}")
        # Released configs say "mamba" / "attention"; transformers saves its own spelling.
        attn = [t in ("attention", "full_attention") for t in types]
        d = int(hp["hidden_size"])
        inner = int(hp.get("mamba_expand") or 2) * d
        mamba2_metadata(w, inner, int(hp.get("mamba_n_heads") or 128))
        kv = int(hp.get("num_key_value_heads") or hp["num_attention_heads"])
        w.set("attention.head_count_kv", [kv if a else 0 for a in attn])
        if hp.get("attn_rotary_emb"):
            w.set("rope.dimension_count", int(hp["attn_rotary_emb"]))
        use_rope = all(attn)
        w.set("rope.scaling.finetuned", use_rope)
        if not use_rope:
            w.set("context_length", 1 << 20)
            if hp.get("position_embedding_type") == "rope":
                notes.append(
                    "position_embedding_type rope is not applied: llama.cpp's converter "
                    "turns rope off for every hybrid Granite"
                )
