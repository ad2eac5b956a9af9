"""Gemma 3: GeGLU FFN, sandwich norms (post-attention and post-FFN), QK norm, embeddings
scaled by sqrt(n_embd), and five sliding-window layers (their own rope base) per global one.

Follows llama.cpp's src/models/gemma3.cpp and transformers' Gemma3ForCausalLM (text) /
Gemma3ForConditionalGeneration (multimodal: only the language model is read). Gemma3RMSNorm
scales by (1 + w), so every norm weight is stored +1; the converter trims token_embd to the
tokenizer's real vocabulary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

from ..errors import FrinkError
from .base import Arch
from .hf import HF_CORE_TENSORS, HF_QK_NORM_TENSORS, MetadataWriter, f32, hf_type, multimodal
from .hf_plan import HfModelType, Transform
from .transforms import ONE_CENTERED_NORMS, add_one


def _n_vocab_real(hf_dir: Path, rows: int) -> int:
    """Rows of token_embd the converter keeps for Gemma 3 (it drops out-of-vocab rows).

    With tokenizer.model the converter's SentencePiece vocab is padded to vocab_size, so
    nothing is dropped; with only tokenizer.json it keeps len(vocab) + len(added_tokens).
    """
    if (hf_dir / "tokenizer.model").is_file():
        return rows
    tok = hf_dir / "tokenizer.json"
    if not tok.is_file():
        return rows
    try:
        data = json.loads(tok.read_text(encoding="utf-8"))
        n = len(data["model"]["vocab"]) + len(data.get("added_tokens") or [])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FrinkError(f"{tok}: unreadable tokenizer.json ({e})") from e
    return min(rows, n)


TRUNCATE_VOCAB = Transform(
    lambda w, hp, shape: w[: shape[0]],
    lambda s, hp: (_n_vocab_real(hp["_hf_dir"], s[0]), *s[1:]),
)


def _layer_is_swa(hp: dict[str, Any]) -> list[bool]:
    """Per layer: sliding-window attention? From layer_types, else the period pattern."""
    n = int(hp["num_hidden_layers"])
    types = hp.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return [t == "sliding_attention" for t in types]
    if hp.get("sliding_window") is None:
        return [False] * n
    period = hp.get("sliding_window_pattern") or hp.get("_sliding_window_pattern") or 6
    return [(i + 1) % int(period) != 0 for i in range(n)]


# The multimodal checkpoint's vision tower and projector (not read).
_TOWERS = (
    "vision_tower.",
    "multi_modal_projector.",
    "vision_model.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)


_TEXT = hf_type("gemma3_text")


# The sandwich norms around attention and the FFN (the FFN's pre-norm is ffn_norm).
GEMMA_NORM_TENSORS: tuple[tuple[str, str], ...] = (
    ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.post_attention_norm"),
    ("model.layers.{bid}.pre_feedforward_layernorm", "blk.{bid}.ffn_norm"),
    ("model.layers.{bid}.post_feedforward_layernorm", "blk.{bid}.post_ffw_norm"),
)


class GemmaArch(Arch):
    """What Gemma 3 and Gemma 4 share: neox rope, GeGLU (tanh), QK norm, the sandwich
    norms, and embeddings scaled by sqrt(n_embd)."""

    rope_type = "neox"
    ffn_act = "gelu_tanh"
    qk_norm = True
    post_attn_norm = True
    post_ffn_norm = True
    hf_tensors = HF_CORE_TENSORS + HF_QK_NORM_TENSORS + GEMMA_NORM_TENSORS

    def embd_scale(self, n_embd: int) -> float | None:
        return math.sqrt(n_embd)


class Gemma3(GemmaArch):
    name = "gemma3"
    hf_model_types: ClassVar[dict[str, HfModelType]] = {
        "gemma3_text": _TEXT,
        "gemma3": multimodal(_TEXT, _TOWERS, "vision tower and multimodal projector weights"),
    }
    swa_pattern = 6
    rope_base_swa = 10000.0

    @classmethod
    def hf_claims(cls, config: dict[str, Any]) -> bool:
        # A bidirectional gemma3_text is EmbeddingGemma (archs/gemma_embedding.py).
        return config.get("use_bidirectional_attention") is not True

    def attn_scale_default(self, n_layer: int, n_embd: int, n_head: int, head_dim_k: int) -> float:
        if n_layer == 62:
            # Gemma 3 27B scales by n_embd / n_head (its query_pre_attn_scalar), as
            # llama.cpp does (it recognizes the 27B by its 62 layers).
            return 1.0 / math.sqrt(n_embd / n_head)
        return super().attn_scale_default(n_layer, n_embd, n_head, head_dim_k)

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        norms = (*ONE_CENTERED_NORMS, "blk.{bid}.ffn_norm", "blk.{bid}.post_ffw_norm")
        return {"token_embd.weight": (TRUNCATE_VOCAB,), **add_one(norms)}

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        hp = w.hp
        w.f32("final_logit_softcapping", "final_logit_softcapping", optional=True)
        w.f32("attn_logit_softcapping", "attn_logit_softcapping", optional=True)
        w.f32("rope.freq_base_swa", "rope_theta_swa", optional=True)
        # llama.cpp hard-codes Gemma 3's layer pattern (every 6th layer global) and its
        # attention scale (1/sqrt(head_dim)); HF configs state both. These keys carry the HF
        # values in llama.cpp's own key names (llama.cpp reads sliding_window_pattern as a
        # per-layer bool array when present, and attention.scale is its query-scale key).
        swa = _layer_is_swa(hp)
        w.set("attention.sliding_window_pattern", swa)
        if any(swa):
            if hp.get("sliding_window") is None:
                raise FrinkError("config.json: sliding layers but no sliding_window")
            w.set("attention.sliding_window", int(hp["sliding_window"]))
        if hp.get("query_pre_attn_scalar") is not None:
            w.set("attention.scale", f32(float(hp["query_pre_attn_scalar"]) ** -0.5))
