"""The canonical checkpoint every reader produces: GGUF metadata keys plus tensors by GGUF name."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np


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
