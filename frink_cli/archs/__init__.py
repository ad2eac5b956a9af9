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
  name pattern -> GGUF name; `{bid}` = layer index; start from `base.HF_CORE_TENSORS`),
  `hf_tensors_whole` (parameters without .weight/.bias), `hf_transforms()` (GGUF name
  pattern -> `Transform`s: real functions, see transforms.py), `hf_composites` (functions
  that split or stack tensors: moe.stacked_experts, qwen3next.unzip_qkvz),
  `hf_generated(hp)` (tensors made from the config: llama3 rope factors) and
  `hf_metadata(w, notes)` (extend with super(); write keys with w.u32/w.f32/w.flag/w.set).

Variants subclass their base (qwen3moe from qwen3, qwen35moe from qwen35); pieces several
architectures share live in base.py, transforms.py, moe.py and gdn.py, never copied.

Adding an architecture: write `archs/<name>.py` with its class (the module docstring says
which llama.cpp src/models/*.cpp and transformers class it follows), then add the class
to `_ARCHS` below. Nothing else in frink names architectures.
"""

from __future__ import annotations

from .alibi import Bloom, Mpt
from .base import Arch
from .bitnet import Bitnet
from .deci import Deci
from .falcon_h1 import FalconH1
from .gemma3 import Gemma3
from .gemma4 import Gemma4
from .gpt_oss import GptOss
from .granite import Granite, GraniteMoe
from .granite_hybrid import GraniteHybrid
from .lfm2 import Lfm2, Lfm2Moe
from .llama import Llama
from .mamba import Mamba, Mamba2
from .olmo2 import Olmo2
from .openelm import OpenElm
from .phi3 import Phi3
from .qwen2 import Qwen2
from .qwen3 import Qwen3
from .qwen3moe import Qwen3Moe
from .qwen3next import Qwen3Next
from .qwen35 import Qwen35
from .qwen35moe import Qwen35Moe
from .starcoder2 import Starcoder2
from .talkie import Talkie

# The registry: every supported architecture, one instance each.
_ARCHS: tuple[Arch, ...] = (
    Llama(),
    Qwen2(),
    Qwen3(),
    Qwen3Moe(),
    Gemma3(),
    Gemma4(),
    Qwen35(),
    Qwen35Moe(),
    Qwen3Next(),
    Granite(),
    GraniteMoe(),
    Starcoder2(),
    Bloom(),
    Mpt(),
    Olmo2(),
    Phi3(),
    Bitnet(),
    Talkie(),
    OpenElm(),
    Deci(),
    Mamba(),
    Lfm2(),
    Lfm2Moe(),
    Mamba2(),
    GraniteHybrid(),
    FalconH1(),
    GptOss(),
)
_BY_NAME: dict[str, Arch] = {a.name: a for a in _ARCHS}
_BY_MODEL_TYPE: dict[str, Arch] = {mt: a for a in _ARCHS for mt in a.hf_model_types}


def arch_for(name: str) -> Arch | None:
    """The architecture a GGUF general.architecture names, or None."""
    return _BY_NAME.get(name)


def arch_for_model_type(model_type: str) -> Arch | None:
    """The architecture an HF config.json model_type names, or None."""
    return _BY_MODEL_TYPE.get(model_type)


def supported_architectures() -> list[str]:
    return sorted(_BY_NAME)


def supported_model_types() -> list[str]:
    return sorted(_BY_MODEL_TYPE)


__all__ = [
    "Arch",
    "arch_for",
    "arch_for_model_type",
    "supported_architectures",
    "supported_model_types",
]
