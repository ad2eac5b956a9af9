"""Architectures: one module each, and the registry that finds them.

An architecture is a subclass of `base.Arch` in its own module here. It states only what
differs from the plain llama-style decoder that `Arch` reads and converts:

- identity: `name` (GGUF general.architecture) and `hf_model_types` (HF config.json
  model_type -> `HfModelType`: transformers' config defaults, text_config, ignored tensors);
- decorations and defaults, as class attributes that become ModelConfig fields:
  `rope_type`, `ffn_act`, `qk_norm`, `post_attn_norm`, `post_ffn_norm`,
  `attn_output_gate`, `swa_pattern`, `rope_base_swa`, `gdn_v_head_order` (a GDN hybrid),
  `moe_every_layer`, `ffn_norm_tensor` (where the pre-FFN norm is stored);
- special cases, as method overrides: `attn_scale_default` (gemma3's 27B), `embd_scale`,
  `check_metadata` (qwen35's IMROPE sections); `config(ckpt)` itself for anything larger
  (call super().config(ckpt) and `dataclasses.replace` the fields you add, e.g. a
  multiplier read from your own GGUF key via `get(ckpt.metadata, self.key("..."))`);
- the HF -> GGUF conversion, as llama.cpp's converter does it: `hf_tensors` (HF module
  name pattern -> GGUF name; `{bid}` = layer index; start from `hf.HF_CORE_TENSORS`),
  `hf_tensors_whole` (parameters without .weight/.bias), `hf_transforms()` (GGUF name
  pattern -> `Transform`s: real functions, see transforms.py), `hf_composites` (functions
  that split or stack tensors: moe.stacked_experts, qwen3next.unzip_qkvz),
  `hf_generated(hp)` (tensors made from the config: llama3 rope factors) and
  `hf_metadata(w, notes)` (extend with super(); write keys with w.u32/w.f32/w.flag/w.set).

Variants subclass their base (qwen3moe from qwen3, qwen35moe from qwen35); pieces several
architectures share live in base.py (GGUF reading), hf.py and hf_plan.py (HF
conversion), transforms.py, moe.py and gdn.py, never copied.

Adding an architecture: write `archs/<name>.py` with its class (the module docstring says
which llama.cpp src/models/*.cpp and transformers class it follows), then add the class
to `_ARCHS` in registry.py. Nothing else in frink names architectures.
"""

from __future__ import annotations

from .base import Arch
from .checkpoint import open_checkpoint, read_hf_dir
from .registry import (
    arch_for,
    arch_for_model_type,
    config_from_checkpoint,
    supported_architectures,
    supported_model_types,
)

__all__ = [
    "Arch",
    "arch_for",
    "arch_for_model_type",
    "config_from_checkpoint",
    "open_checkpoint",
    "read_hf_dir",
    "supported_architectures",
    "supported_model_types",
]
