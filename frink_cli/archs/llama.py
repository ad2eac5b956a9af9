"""Llama (and Mistral): the plain pre-norm decoder every other architecture decorates.

Follows llama.cpp's src/models/llama.cpp and transformers' LlamaForCausalLM; the
converter registers MistralForCausalLM on the same LlamaModel class, so HF `mistral`
becomes GGUF `llama` too. Its one conversion step: llama.cpp applies NORMAL
(adjacent-pair) rope where HF rotates halves, so Q/K rows are interleaved per head.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import FrinkError
from .base import Arch
from .hf import MetadataWriter, hf_sliding_window_note, hf_types
from .hf_plan import Transform


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half Q/K rows -> llama.cpp's adjacent-pair order, per head.

    Same reordering as the converter's LlamaModel.permute: within each head the rows
    [first half | second half] become interleaved (0, h, 1, h+1, ...).
    """
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


PERMUTE_Q = Transform(lambda w, hp, shape: permute_rows(w, int(hp["num_attention_heads"])))
PERMUTE_K = Transform(lambda w, hp, shape: permute_rows(w, int(hp["num_key_value_heads"])))


def llama3_rope_factors(rp: dict[str, Any], head_dim: int) -> np.ndarray | None:
    """The rope_freqs tensor the converter generates for rope_type "llama3".

    The four fields that define the scaling are required, as transformers' rope check
    requires them: a config missing one describes no particular model (the converter's
    fallbacks are Llama 3.1's values, which another model's would not be)."""
    if rp.get("rope_type") != "llama3":
        return None

    def field(name: str) -> float:
        v = rp.get(name)
        if v is None:
            raise FrinkError(f"config.json: llama3 rope scaling without {name}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise FrinkError(
                f"config.json: llama3 rope scaling's {name} must be a positive number "
                f"(got {v!r:.40})"
            )
        return float(v)

    base = float(rp.get("rope_theta") or 10000.0)
    factor = field("factor")
    low = field("low_freq_factor")
    high = field("high_freq_factor")
    old_ctx = field("original_max_position_embeddings")
    if high <= low:
        raise FrinkError(
            "config.json: llama3 rope scaling needs high_freq_factor > low_freq_factor "
            f"(got {high:g} and {low:g})"
        )
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    wavelen = 2 * math.pi / freqs.astype(np.float64)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = np.empty(len(freqs), dtype=np.float64)
    for i, wl in enumerate(wavelen):
        if wl < high_wavelen:
            out[i] = 1.0
        elif wl > low_wavelen:
            out[i] = factor
        else:
            smooth = (old_ctx / wl - low) / (high - low)
            out[i] = 1.0 / ((1 - smooth) / factor + smooth)
    return out.astype(np.float32)


class Llama(Arch):
    name = "llama"
    hf_model_types = hf_types("llama", "mistral")
    hf_llama3_rope_freqs = True

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return {
            "blk.{bid}.attn_q.weight": (PERMUTE_Q,),
            "blk.{bid}.attn_q.bias": (PERMUTE_Q,),
            "blk.{bid}.attn_k.weight": (PERMUTE_K,),
            "blk.{bid}.attn_k.bias": (PERMUTE_K,),
        }

    def hf_generated(self, hp: dict[str, Any]) -> dict[str, np.ndarray]:
        # For rope_type llama3 the converter writes the per-frequency scaling as a tensor.
        factors = llama3_rope_factors(hp["_rope_full"], int(hp["head_dim"]))
        return {} if factors is None else {"rope_freqs.weight": factors}

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        w.u32("rope.dimension_count", "head_dim")
        hf_sliding_window_note(self.name, w.hp, notes)
