"""Model files -> a Checkpoint: GGUF metadata keys plus tensors by GGUF name.

Every format lands in ONE canonical convention, GGUF's: metadata keys as llama.cpp
writes them (`{arch}.block_count`, `tokenizer.ggml.*`, ...) and tensors named and laid
out as in a GGUF file (`blk.3.attn_q.weight`, numpy shape [out, in], Q/K rows in the
order llama.cpp's converter writes them). Nothing downstream knows which file it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import FrinkError


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: [rows(out), cols(in)] for a matrix
    dtype: str  # the stored type as its format names it: "Q4_1", "F32", "BF16", ...


class TensorSource(Protocol):
    def names(self) -> list[str]: ...

    def info(self, name: str) -> TensorInfo: ...

    def load(self, name: str) -> np.ndarray:
        """The tensor as float32 in GGUF layout (dequantized, transforms applied)."""
        ...


@dataclass
class Checkpoint:
    path: Path
    format: str  # "gguf" | "safetensors"
    metadata: dict[str, Any]
    tensors: TensorSource
    # For safetensors directories: where tokenizer.json / tokenizer_config.json live.
    hf_dir: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def arch(self) -> str:
        return str(self.metadata["general.architecture"])


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Open a .gguf file or a Hugging Face safetensors directory."""
    p = Path(path)
    if not p.exists():
        raise FrinkError(f"model not found: {p}")
    if p.is_dir():
        from .safetensors import read_hf_dir

        try:
            return read_hf_dir(p)
        except (ValueError, TypeError, ArithmeticError) as e:
            # A config value of a type or size no field check above anticipated: still the
            # file's fault, so name it rather than show a traceback.
            raise FrinkError(f"{p / 'config.json'}: bad value ({e})"[:300]) from e
    from .jsonfile import open_regular

    try:
        with open_regular(p) as f:
            magic = f.read(4)
    except OSError as e:
        raise FrinkError(f"cannot read {p}: {e.strerror or e}") from None
    if not magic:
        raise FrinkError(f"{p}: empty file, not a model")
    if magic == b"GGUF":
        from .gguf import read_gguf

        return read_gguf(p)
    raise FrinkError(f"{p}: not a GGUF file (bad magic {magic!r}) nor a safetensors directory")
