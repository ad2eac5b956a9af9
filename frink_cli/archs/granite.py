"""IBM Granite 3.x: the llama layer with four multipliers (`granite`), and with a sparse
MoE FFN on every layer plus an optional ungated shared expert (`granitemoe`).

Follows llama.cpp's src/models/granite.cpp (granitemoe builds the same graph) and
transformers' GraniteForCausalLM, GraniteMoeForCausalLM and GraniteMoeSharedForCausalLM;
the converter (conversion/granite.py) is llama's (Q/K rows permuted for NORMAL rope) with:

- `{arch}.embedding_scale` (embedding_multiplier): the token embeddings are multiplied by
  it (llama.cpp's build_inp_embd; the tied output head uses the unscaled matrix);
- `{arch}.residual_scale` (residual_multiplier): both branch outputs, attention and FFN,
  are multiplied by it before their residual adds;
- `{arch}.attention.scale` (attention_multiplier): the q.k scale itself, replacing
  1/sqrt(head_dim) (llama.cpp falls back to 1/sqrt(head_dim) when the key is absent);
- `{arch}.logit_scale` (logits_scaling): the logits are divided by it. llama.cpp requires
  the key, so a file without it is refused here too.
The converter writes each key only when the config's value is truthy (transformers'
defaults are all 1.0), and ignores a config head_dim (head_dim = hidden / heads).

GraniteMoE's router is a softmax over the top-k router logits (transformers), which is
llama.cpp's softmax over all experts renormalized over the top k. Its experts are stored
fused: block_sparse_moe.input_linear [E, 2*ff, d] (gate rows, then up rows) is split by the
converter into ffn_gate_exps and ffn_up_exps; output_linear [E, d, ff] is ffn_down_exps.
Its expert width is feed_forward_length (intermediate_size); no expert width key is
written. GraniteMoeShared (same GGUF arch) adds shared_mlp, an always-on SwiGLU added to
the routed output with no gate: input_linear [2*sff, d] -> ffn_gate_shexp + ffn_up_shexp,
output_linear -> ffn_down_shexp, width `{arch}.expert_shared_feed_forward_length`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..formats.safetensors import read_stored_half
from ..model.config import ModelConfig
from .base import get
from .decoder import decoder_ext, with_ext
from .hf import Composite, MetadataWriter, hf_types
from .hf_plan import Kept, Plan, pop_matching
from .llama import Llama


class Granite(Llama):
    name = "granite"
    hf_model_types = hf_types("granite")

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        md = ckpt.metadata
        cfg = super().config(ckpt)
        logit_scale = get(md, self.key("logit_scale"), required=True)
        if not logit_scale or not np.isfinite(float(logit_scale)):
            raise FrinkError(
                f"{ckpt.path}: bad model metadata ({self.key('logit_scale')} = {logit_scale})"
            )

        def scale(key: str) -> float | None:
            # llama.cpp: absent or 0 means no scaling (and 1 scales by nothing).
            value = float(get(md, self.key(key), 0.0) or 0.0)
            return None if value in (0.0, 1.0) else value

        return with_ext(
            cfg,
            embd_scale=scale("embedding_scale"),
            residual_scale=scale("residual_scale"),
            logit_scale=None if float(logit_scale) == 1.0 else float(logit_scale),
        )

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        hp = w.hp
        # The converter pops head_dim for granite: llama.cpp's granite has hidden / heads.
        natural = int(hp["hidden_size"]) // int(hp["num_attention_heads"])
        if int(hp.get("head_dim") or natural) != natural:
            notes.append(
                f"config head_dim={hp['head_dim']} ignored for granite "
                f"(uses {natural}, as llama.cpp)"
            )
        hp["head_dim"] = natural
        super().hf_metadata(w, notes)
        del w.meta[w.key("attention.key_length")], w.meta[w.key("attention.value_length")]
        # Written only when truthy, as the converter does.
        for key, src in (
            ("attention.scale", "attention_multiplier"),
            ("embedding_scale", "embedding_multiplier"),
            ("residual_scale", "residual_multiplier"),
            ("logit_scale", "logits_scaling"),
        ):
            if hp.get(src):
                w.f32(key, src)


def split_fused_glu(kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """GraniteMoE's fused gate|up tensors -> separate GGUF gate and up tensors, as the
    converter's GraniteMoeModel.modify_tensors splits them (first half gate, second up):
    block_sparse_moe.input_linear [E, 2*ff, d] -> ffn_{gate,up}_exps [E, ff, d];
    shared_mlp.input_linear [2*sff, d] -> ffn_{gate,up}_shexp (or, in a model with no
    routed experts, the dense ffn_gate / ffn_up)."""
    plans: dict[str, Plan] = {}
    has_experts = bool(hp.get("num_local_experts"))
    fused = re.compile(
        r"model\.layers\.(\d+)\.(block_sparse_moe|shared_mlp)\.input_linear\.weight$"
    )
    for m, hf_name, st in pop_matching(kept, fused):
        bid, routed = m.group(1), m.group(2) == "block_sparse_moe"
        ff = int(hp["intermediate_size"] if routed else hp.get("shared_intermediate_size") or 0)
        if len(st.shape) != (3 if routed else 2) or st.shape[-2] != 2 * ff:
            raise FrinkError(
                f"{st.file}: tensor {hf_name!r} has shape {list(st.shape)}, expected "
                f"{'[E, ' if routed else '['}2*{ff}, d]"
            )
        suffix = "_exps" if routed else ("_shexp" if has_experts else "")
        for i, kind in enumerate(("gate", "up")):
            plans[f"blk.{bid}.ffn_{kind}{suffix}.weight"] = Plan(
                None,
                (*st.shape[:-2], ff, st.shape[-1]),
                st.dtype,
                (),
                functools.partial(read_stored_half, st, i, -2),
            )
    if not has_experts:
        down = re.compile(r"model\.layers\.(\d+)\.shared_mlp\.output_linear\.weight$")
        for m, _, st in pop_matching(kept, down):
            plans[f"blk.{m.group(1)}.ffn_down.weight"] = Plan(st, st.shape, st.dtype, ())
    return plans


class GraniteMoe(Granite):
    name = "granitemoe"
    hf_model_types = hf_types("granitemoe", "granitemoeshared")
    hf_tensors = Granite.hf_tensors + (
        ("model.layers.{bid}.block_sparse_moe.router.layer", "blk.{bid}.ffn_gate_inp"),
        ("model.layers.{bid}.block_sparse_moe.output_linear", "blk.{bid}.ffn_down_exps"),
        ("model.layers.{bid}.shared_mlp.output_linear", "blk.{bid}.ffn_down_shexp"),
    )
    hf_composites: ClassVar[tuple[Composite, ...]] = (split_fused_glu,)

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        moe = decoder_ext(cfg).moe
        if moe is None:
            return cfg
        # llama.cpp's granite graph: experts as wide as feed_forward_length, the top k
        # renormalized (build_moe_ffn norm_w = true), the shared expert added ungated.
        moe = dataclasses.replace(moe, n_ff_exp=cfg.n_ff, norm_topk=True, shared_gate=False)
        return with_ext(cfg, moe=moe)

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        if w.hp.get("num_local_experts"):
            w.u32("expert_count", "num_local_experts")
            w.u32("expert_used_count", "num_experts_per_tok")
        if w.hp.get("shared_intermediate_size"):
            w.u32("expert_shared_feed_forward_length", "shared_intermediate_size")
