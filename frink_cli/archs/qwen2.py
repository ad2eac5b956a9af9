"""Qwen2: llama's layer with NeoX (rotate-half) rope and Q/K/V biases.

Follows llama.cpp's src/models/qwen2.cpp and transformers' Qwen2ForCausalLM. Because
llama.cpp's qwen2 graph rotates halves as HF does, the converter leaves Q/K rows as they
are: tensors map by name alone.
"""

from __future__ import annotations

from .base import Arch
from .hf import MetadataWriter, hf_sliding_window_note, hf_types


class Qwen2(Arch):
    name = "qwen2"
    hf_model_types = hf_types("qwen2")
    rope_type = "neox"

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        hf_sliding_window_note(self.name, w.hp, notes)
