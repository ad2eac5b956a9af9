"""Model files -> a Checkpoint: GGUF metadata keys plus tensors by GGUF name.

Every format lands in ONE canonical convention, GGUF's: metadata keys as llama.cpp
writes them (`{arch}.block_count`, `tokenizer.ggml.*`, ...) and tensors named and laid
out as in a GGUF file (`blk.3.attn_q.weight`, numpy shape [out, in], Q/K rows in the
order llama.cpp's converter writes them). Nothing downstream knows which file it came from.

This package only reads files: GGUF files whole (`read_gguf_file`), and a safetensors
directory's headers, tensors and config.json (`safetensors`). Turning a Hugging Face
directory into GGUF names and metadata needs the architecture registry, so opening a model
of either kind is `frink_cli.archs.open_checkpoint`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import FrinkError
from .checkpoint import Checkpoint, TensorInfo, TensorSource
from .gguf import read_gguf
from .jsonfile import open_regular


def read_gguf_file(p: Path) -> Checkpoint:
    """Open a model file that must be a GGUF (FrinkError naming the file otherwise)."""
    try:
        with open_regular(p) as f:
            magic = f.read(4)
    except OSError as e:
        raise FrinkError(f"cannot read {p}: {e.strerror or e}") from None
    if not magic:
        raise FrinkError(f"{p}: empty file, not a model")
    if magic == b"GGUF":
        return read_gguf(p)
    raise FrinkError(f"{p}: not a GGUF file (bad magic {magic!r}) nor a safetensors directory")


__all__ = ["Checkpoint", "TensorInfo", "TensorSource", "read_gguf_file"]
