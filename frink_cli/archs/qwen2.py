"""Qwen2: llama's layer with NeoX (rotate-half) rope and Q/K/V biases.

Follows llama.cpp's src/models/qwen2.cpp and transformers' Qwen2ForCausalLM. Because
llama.cpp's qwen2 graph rotates halves as HF does, the converter leaves Q/K rows as they
are: tensors map by name alone.
"""

from __future__ import annotations

from typing import ClassVar

from .base import Arch
from .hf import MetadataWriter, hf_sliding_window_note, hf_type
from .hf_plan import HfModelType


class Qwen2(Arch):
    name = "qwen2"
    hf_model_types: ClassVar[dict[str, HfModelType]] = {
        "qwen2": hf_type("qwen2"),
    }
    rope_type = "neox"

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        hf_sliding_window_note(self.name, w.hp, notes)
