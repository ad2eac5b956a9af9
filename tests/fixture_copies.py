"""Copies of a fixture with something changed, for tests that need a variant of one: a GGUF
file's metadata or tensors (written by gguf-py, the reference writer), an HF directory's
config.json."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# A tensor's replacement: (data, raw type, or None to let gguf-py type the array).
TensorMap = Callable[[Any], tuple[np.ndarray, Any]]


def copy_gguf(
    src: Path,
    dst: Path,
    changes: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    tensor: TensorMap | None = None,
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """`src` copied to `dst`. changes: metadata key -> value (None removes the key; a
    (value, "TYPE") pair sets it with that GGUFValueType; a new key without one is f32).
    drop: tensors whose names hold one of these are left out. tensor: maps each kept
    gguf-py ReaderTensor to (data, raw type or None). extra: tensors added after them."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    changes = changes or {}
    reader = GGUFReader(src)
    writer = GGUFWriter(str(dst), reader.fields["general.architecture"].contents())

    def typed(value: Any, vtype: Any) -> tuple[Any, Any]:
        if isinstance(value, tuple):
            return value[0], GGUFValueType[value[1]]
        return value, vtype

    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        value, vtype = field.contents(), field.types[0]
        if field.name in changes:
            if changes[field.name] is None:
                continue
            value, vtype = typed(changes[field.name], vtype)
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for key, change in changes.items():
        if change is not None and key not in reader.fields:
            writer.add_key_value(key, *typed(change, GGUFValueType.FLOAT32))
    for t in reader.tensors:
        if any(d in t.name for d in drop):
            continue
        data, raw = tensor(t) if tensor else (np.asarray(t.data), t.tensor_type)
        writer.add_tensor(t.name, data, raw_dtype=raw)
    for name, data in (extra or {}).items():
        writer.add_tensor(name, data)
    write_out(writer)
    return dst


def write_out(writer: Any) -> None:
    """A gguf-py GGUFWriter's header, metadata and tensors written to its file, then closed."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def copy_hf_dir(src: Path, dst: Path, **changes: Any) -> Path:
    """A copy of an HF directory with config.json keys changed."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst
