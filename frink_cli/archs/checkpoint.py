"""Opening a model: a GGUF file, or a Hugging Face directory converted as it is read.

`open_checkpoint` is the one entry point for both. A GGUF file is read by formats/; a
directory's config.json names its model_type, the registry gives the architecture, and
hf_plan.py plans its tensors and metadata in GGUF's convention.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import FrinkError
from ..formats import Checkpoint, read_gguf_file
from ..formats.safetensors import load_config
from .hf_plan import plan_hf_dir
from .registry import arch_for_model_type, supported_model_types


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Open a .gguf file or a Hugging Face safetensors directory (FrinkError naming the
    file for anything missing, unreadable or malformed)."""
    p = Path(path)
    if not p.exists():
        raise FrinkError(f"model not found: {p}")
    if not p.is_dir():
        return read_gguf_file(p)
    try:
        return read_hf_dir(p)
    except (ValueError, TypeError, ArithmeticError) as e:
        # A config value of a type or size no field check above anticipated: still the
        # file's fault, so name it rather than show a traceback.
        raise FrinkError(f"{p / 'config.json'}: bad value ({e})"[:300]) from e


def read_hf_dir(path: Path) -> Checkpoint:
    """Open a Hugging Face model directory as a canonical (GGUF-convention) Checkpoint."""
    hf_dir = Path(path)
    cfg = load_config(hf_dir)
    model_type = cfg.get("model_type")
    arch = arch_for_model_type(model_type, cfg) if isinstance(model_type, str) else None
    if arch is None:
        raise FrinkError(
            f"{hf_dir / 'config.json'}: unsupported architecture model_type={model_type!r} "
            f"(supported: {', '.join(supported_model_types())})"
        )
    assert isinstance(model_type, str)
    return plan_hf_dir(hf_dir, cfg, arch, model_type)
