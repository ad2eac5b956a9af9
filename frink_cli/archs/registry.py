"""The registry: every supported architecture, one instance each, found by name, and the
ModelConfig a checkpoint gets from its architecture."""

from __future__ import annotations

from typing import Any

from ..errors import FrinkError
from ..formats import Checkpoint
from ..model.config import ModelConfig
from ..model.validate import validate_config
from .alibi import Bloom, Mpt
from .base import Arch
from .bert import Bert
from .bitnet import Bitnet
from .deci import Deci
from .deepseek2 import Deepseek2
from .falcon_h1 import FalconH1
from .gemma3 import Gemma3
from .gemma4 import Gemma4
from .gemma_embedding import GemmaEmbedding
from .gpt_oss import GptOss
from .granite import Granite, GraniteMoe
from .granite_hybrid import GraniteHybrid
from .lfm2 import Lfm2, Lfm2Moe
from .llama import Llama
from .llama4 import Llama4
from .mamba import Mamba, Mamba2
from .mimo2 import Mimo2
from .minimax import Minimax
from .mpnet import Mpnet
from .nomic_bert import NomicBert
from .olmo2 import Olmo2
from .openelm import OpenElm
from .phi3 import Phi3
from .plamo2 import Plamo2
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
    Llama4(),
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
    # deepseek2 (issue 31)
    Deepseek2(),
    # minimax-01 (issue 31)
    Minimax(),
    Mamba2(),
    GraniteHybrid(),
    # plamo2 (issue 31)
    Plamo2(),
    FalconH1(),
    GptOss(),
    # mimo2 (issue 31)
    Mimo2(),
    Bert(),
    NomicBert(),
    Mpnet(),
    GemmaEmbedding(),
)
_BY_NAME: dict[str, Arch] = {a.name: a for a in _ARCHS}
# model_type -> the architectures serving it, asked in registry order (Arch.hf_claims).
_BY_MODEL_TYPE: dict[str, list[Arch]] = {}
for _arch in _ARCHS:
    for _mt in _arch.hf_model_types:
        _BY_MODEL_TYPE.setdefault(_mt, []).append(_arch)


def arch_for(name: str) -> Arch | None:
    """The architecture a GGUF general.architecture names, or None."""
    return _BY_NAME.get(name)


def arch_for_model_type(model_type: str, config: dict[str, Any] | None = None) -> Arch | None:
    """The architecture an HF config.json model_type names (of several, the first that
    claims `config`), or None."""
    for arch in _BY_MODEL_TYPE.get(model_type, ()):
        if config is None or arch.hf_claims(config):
            return arch
    return None


def registered_archs() -> tuple[Arch, ...]:
    """Every registered architecture, in registry order."""
    return _ARCHS


def supported_architectures() -> list[str]:
    return sorted(_BY_NAME)


def supported_model_types() -> list[str]:
    return sorted(_BY_MODEL_TYPE)


def config_from_checkpoint(ckpt: Checkpoint) -> ModelConfig:
    """The checkpoint's ModelConfig, read by its architecture's module (frink_cli/archs)."""
    arch = arch_for(ckpt.arch)
    if arch is None:
        raise FrinkError(
            f"{ckpt.path}: unknown architecture {ckpt.arch!r} "
            f"(frink supports: {', '.join(supported_architectures())})"
        )
    try:
        cfg = arch.config(ckpt)
    except (ValueError, TypeError, ArithmeticError) as e:
        # Metadata of the wrong type (a string where a count belongs, an array where a
        # scalar does) is a corrupt file, not a bug: name the file and the complaint.
        raise FrinkError(f"{ckpt.path}: bad model metadata ({e})") from e
    validate_config(cfg, str(ckpt.path), ckpt)
    return cfg
