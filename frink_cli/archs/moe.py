"""The sparse mixture-of-experts half of an architecture's HF conversion, shared by every
MoE architecture (qwen3moe, qwen35moe, qwen3next): the router and shared-expert tensor
names, the stacked experts, the expert metadata keys -- as the converter's Qwen2MoeModel
and Qwen3NextModel write them. Reading them back from GGUF is in base.Arch._moe_config.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from ..errors import FrinkError
from ..formats.safetensors import StoredTensor, read_stored, read_stored_half
from .hf import MetadataWriter
from .hf_plan import Kept, Plan, check_dtype, pop_matching

HF_ROUTER: tuple[tuple[str, str], ...] = (
    ("model.layers.{bid}.mlp.gate", "blk.{bid}.ffn_gate_inp"),
)
# The always-on shared expert and its sigmoid gate (qwen3next, qwen35moe).
HF_SHARED_EXPERT: tuple[tuple[str, str], ...] = (
    ("model.layers.{bid}.mlp.shared_expert_gate", "blk.{bid}.ffn_gate_inp_shexp"),
    ("model.layers.{bid}.mlp.shared_expert.gate_proj", "blk.{bid}.ffn_gate_shexp"),
    ("model.layers.{bid}.mlp.shared_expert.up_proj", "blk.{bid}.ffn_up_shexp"),
    ("model.layers.{bid}.mlp.shared_expert.down_proj", "blk.{bid}.ffn_down_shexp"),
)


def hf_moe_metadata(w: MetadataWriter, *, shared: bool, norm_topk: bool) -> None:
    """The expert keys. shared: the config may state a shared expert's width.
    norm_topk: carry norm_topk_prob as expert_weights_norm (transformers honours it)."""
    w.u32("expert_count", "num_experts")
    w.u32("expert_used_count", "num_experts_per_tok")
    w.u32("expert_feed_forward_length", "moe_intermediate_size")
    if shared:
        w.u32("expert_shared_feed_forward_length", "shared_expert_intermediate_size", True)
    if norm_topk:
        w.flag("expert_weights_norm", "norm_topk_prob")


def stacked_experts(kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """Per-expert matrices -> one [n_expert, ...] tensor per kind, as the converter stacks
    them (Qwen2MoeModel.modify_tensors); also transformers' fused in-memory form
    (experts.gate_up_proj [E, 2*ff, d], experts.down_proj [E, d, ff])."""
    per_expert = re.compile(
        r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$"
    )
    plans = stack_per_expert(kept, per_expert, {"gate": "gate", "up": "up", "down": "down"})
    return plans | _fused_experts(kept)


def stack_per_expert(
    kept: Kept, pattern: re.Pattern[str], kinds: dict[str, str]
) -> dict[str, Plan]:
    """Per-expert matrices named by `pattern` (groups: layer, expert, kind) stacked into one
    [n_expert, ...] tensor per kind, named blk.{layer}.ffn_{kinds[kind]}_exps.weight."""
    plans: dict[str, Plan] = {}
    groups: dict[tuple[str, str], dict[int, tuple[str, Any]]] = {}
    for name in [n for n in kept if pattern.match(n)]:
        m = pattern.match(name)
        assert m is not None
        groups.setdefault((m.group(1), kinds[m.group(3)]), {})[int(m.group(2))] = kept.pop(name)
    for (bid, kind), experts in groups.items():
        n = len(experts)
        if sorted(experts) != list(range(n)):
            raise FrinkError(f"layer {bid}: {kind}_proj experts are not numbered 0..{n - 1}")
        sources = [experts[e] for e in range(n)]
        for hf_name, st in sources:
            check_dtype(hf_name, st)
            if st.shape != sources[0][1].shape:
                raise FrinkError(
                    f"{st.file}: tensor {hf_name!r} has shape {list(st.shape)}, unlike expert 0"
                )
        stored = [st for _, st in sources]
        plans[f"blk.{bid}.ffn_{kind}_exps.weight"] = Plan(
            None,
            (n, *stored[0].shape),
            stored[0].dtype,
            (),
            functools.partial(_read_stack, stored),
        )
    return plans


def _fused_experts(kept: Kept) -> dict[str, Plan]:
    """transformers' fused in-memory experts (gate_up_proj [E, 2*ff, d], down_proj)."""
    plans: dict[str, Plan] = {}
    fused = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up|down)_proj(\.weight)?$")
    for m, hf_name, st in pop_matching(kept, fused):
        bid = m.group(1)
        if m.group(2) == "down":
            plans[f"blk.{bid}.ffn_down_exps.weight"] = Plan(st, st.shape, st.dtype, ())
            continue
        if len(st.shape) != 3 or st.shape[1] % 2:
            raise FrinkError(
                f"{st.file}: tensor {hf_name!r} has shape {list(st.shape)}, expected [E, 2*ff, d]"
            )
        e, ff2, d = st.shape
        for i, kind in enumerate(("gate", "up")):
            plans[f"blk.{bid}.ffn_{kind}_exps.weight"] = Plan(
                None,
                (e, ff2 // 2, d),
                st.dtype,
                (),
                functools.partial(read_stored_half, st, i, 1),
            )
    return plans


def _read_stack(stored: list[StoredTensor]) -> np.ndarray:
    """One expert tensor per stored source, stacked on a new leading axis."""
    return np.stack([read_stored(x) for x in stored])
