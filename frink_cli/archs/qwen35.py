"""Qwen3.5 (dense): the gated-delta-net hybrid with a dense FFN.

Follows llama.cpp's src/models/qwen35.cpp and transformers' Qwen3_5ForCausalLM /
Qwen3_5ForConditionalGeneration (multimodal: only the language model is read). Two things
set it apart from qwen3next: the full-attention layers' rope is IMROPE (interleaved
multi-section; for text equal to NeoX on rope.dimension_count dims, which check_metadata
makes sure of), and the converter (_LinearAttentionVReorderBase) reorders value heads from
grouped to tiled so value head h reads key head h % n_k, ggml's broadcast.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from .base import get
from .gdn import GdnHybrid, hf_text_type
from .hf import MetadataWriter, multimodal
from .hf_plan import HfModelType, Transform
from .transforms import NEG_EXP, SQUEEZE


def v_heads_tiled(w: np.ndarray, axis: int, n_k: int, n_v: int, head_dim: int) -> np.ndarray:
    """Value heads from grouped order (the r = n_v / n_k heads of key head 0, then of key
    head 1, ...) to tiled order (value head j of every key head, then j + 1, ...), along
    `axis` -- the converter's _LinearAttentionVReorderBase._reorder_v_heads. After it, value
    head h reads key head h % n_k."""
    if n_k == n_v:
        return w
    w = np.moveaxis(w, axis, 0)
    rest = w.shape[1:]
    w = w.reshape(n_k, n_v // n_k, head_dim, *rest).swapaxes(0, 1).reshape(n_v * head_dim, *rest)
    return np.moveaxis(w, 0, axis)


def _tiled(axis: int, per_head: str | None, skip_qk: bool = False) -> Transform:
    """The value-head reorder along `axis`, each head `per_head` (an hp key; None: one
    entry). skip_qk: rows [q | k | v] where only the v part has value heads."""

    def apply(w: np.ndarray, hp: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
        n_k, n_v = int(hp["linear_num_key_heads"]), int(hp["linear_num_value_heads"])
        head_dim = int(hp[per_head]) if per_head else 1
        if not skip_qk:
            return v_heads_tiled(w, axis, n_k, n_v, head_dim)
        qk = 2 * n_k * int(hp["linear_key_head_dim"])
        return np.concatenate([w[:qk], v_heads_tiled(w[qk:], axis, n_k, n_v, head_dim)])

    return Transform(apply)


V_TILED_SCALARS = _tiled(0, None)  # one entry (or row) per value head
V_TILED_ROWS = _tiled(0, "linear_value_head_dim")
V_TILED_COLS = _tiled(1, "linear_value_head_dim")  # out_proj's columns
V_TILED_QKV_ROWS = _tiled(0, "linear_value_head_dim", skip_qk=True)

_TEXT = hf_text_type("qwen3_5_text")
_VISION_IGNORED = ("model.visual.", "visual.")
_VISION_NOTE = "vision tower"


class Qwen35(GdnHybrid):
    name = "qwen35"
    hf_model_types: ClassVar[dict[str, HfModelType]] = {
        "qwen3_5_text": _TEXT,
        "qwen3_5": multimodal(_TEXT, _VISION_IGNORED, _VISION_NOTE),
    }
    gdn_v_head_order = "tiled"
    hf_tensors = GdnHybrid.hf_tensors + (
        ("model.layers.{bid}.linear_attn.in_proj_qkv", "blk.{bid}.attn_qkv"),
        ("model.layers.{bid}.linear_attn.in_proj_z", "blk.{bid}.attn_gate"),
        ("model.layers.{bid}.linear_attn.in_proj_b", "blk.{bid}.ssm_beta"),
        ("model.layers.{bid}.linear_attn.in_proj_a", "blk.{bid}.ssm_alpha"),
    )

    def check_metadata(self, ckpt: Checkpoint, rope_dim: int) -> None:
        """qwen35's rope is llama.cpp's interleaved multi-section (IMROPE) rope. For text
        the temporal, height and width positions are all the token's position, so it is NeoX
        rope on rope_dim dims -- unless a rotated pair falls in the fourth section, which
        llama.cpp gives position 0 for text. No released model does; refuse such a file
        rather than guess."""
        sections = get(ckpt.metadata, self.key("rope.dimension_sections"))
        if sections is None:
            raise FrinkError(
                f"{ckpt.path}: model metadata is missing {ckpt.arch}.rope.dimension_sections"
            )
        sec = [int(x) for x in list(sections)][:4] + [0] * 4
        total = sum(sec[:4])
        if total <= 0:
            raise FrinkError(f"{ckpt.path}: bad rope.dimension_sections {list(sections)}")
        for i in range(rope_dim // 2):
            sector = i % total
            if not sector < 3 * sec[sector % 3]:
                raise FrinkError(
                    f"{ckpt.path}: rope.dimension_sections {list(sections)} give rope pair {i} "
                    "the fourth (extra) position, which frink does not support"
                )

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return super().hf_transforms() | {
            "blk.{bid}.ssm_a": (NEG_EXP, V_TILED_SCALARS),
            "blk.{bid}.ssm_dt.bias": (V_TILED_SCALARS,),
            "blk.{bid}.ssm_beta.weight": (V_TILED_SCALARS,),
            "blk.{bid}.ssm_alpha.weight": (V_TILED_SCALARS,),
            "blk.{bid}.attn_qkv.weight": (V_TILED_QKV_ROWS,),
            "blk.{bid}.ssm_conv1d.weight": (SQUEEZE, V_TILED_QKV_ROWS),
            "blk.{bid}.attn_gate.weight": (V_TILED_ROWS,),
            "blk.{bid}.ssm_out.weight": (V_TILED_COLS,),
        }

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        # The converter always writes Qwen3.5's interleaved-mrope sections, defaulting to
        # transformers' [11, 11, 10]; padded to four entries as llama.cpp reads them.
        sections = [int(x) for x in w.hp["_rope_full"].get("mrope_section") or [11, 11, 10]]
        w.set("rope.dimension_sections", (sections + [0] * 4)[:4])
