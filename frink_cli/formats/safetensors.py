"""A Hugging Face safetensors directory, read: tensor headers, shards, tensors and config.json.

This module only reads. Turning what it reads into the canonical (GGUF-convention)
Checkpoint, as llama.cpp's converter (convert_hf_to_gguf.py) does at conversion time
(renaming tensors, writing the GGUF metadata keys from config.json, applying the
per-tensor transforms), is the architectures' job: frink_cli/archs/hf_plan.py and each
architecture's module.

The safetensors header is parsed here rather than through the `safetensors` package:
numpy has no bfloat16, and parsing ourselves lets every offset be checked against the
file's length so a truncated download is a FrinkError naming the file, not a crash.
Tensors are read lazily, one at a time, by `read_stored`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FrinkError
from .jsonfile import open_regular, parse_json, read_json

# The safetensors spec caps the JSON header at 100 MB; a larger length means a corrupt file.
_MAX_HEADER = 100 * 1024 * 1024

# Stored dtype -> (numpy dtype of the raw little-endian words, bytes per element).
_DTYPES: dict[str, tuple[str, int]] = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}
# Other dtypes the safetensors format defines: a header may hold them (their tensors are
# refused when used), and their sizes are needed to check its byte ranges.
_OTHER_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "I32": 4,
    "U32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}


# ---------------------------------------------------------------------------------------
# safetensors files


@dataclass(frozen=True)
class _Stored:
    """Where one tensor's bytes are and how they are typed, straight from a file header."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def _read_header(path: Path) -> dict[str, _Stored]:
    """Parse one .safetensors header, as strictly as the safetensors library does: the
    entries must tile the data area exactly (no gaps, no overlaps, nothing left over),
    each with a whole-number shape whose size matches its byte range."""
    try:
        size = path.stat().st_size
        with open_regular(path) as f:
            head = f.read(8)
            if len(head) < 8:
                raise FrinkError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise FrinkError(
                    f"{path}: truncated or corrupt safetensors file "
                    f"(header of {n} bytes, file of {size} bytes)"
                )
            raw = f.read(n)
    except OSError as e:
        raise FrinkError(f"{path}: cannot read safetensors file ({e.strerror})") from e
    if not raw.startswith(b"{"):
        raise FrinkError(f"{path}: corrupt safetensors header (does not start with '{{')")
    header = parse_json(raw, f"{path} (safetensors header)")
    if not isinstance(header, dict):
        raise FrinkError(f"{path}: corrupt safetensors header (not a JSON object)")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FrinkError(f"{path}: corrupt safetensors header (__metadata__ must map to strings)")

    data_start = 8 + n
    data_len = size - data_start
    out: dict[str, _Stored] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _header_entry(path, name, entry, data_start, data_len)
    # The library's rule: sorted by offset, each tensor starts where the previous ended and
    # the last ends at the end of the file; anything else is a corrupt or shifted header.
    end = 0
    for st in sorted(out.values(), key=lambda s: (s.start, s.nbytes)):
        if st.start - data_start != end:
            what = (
                "overlaps the tensor before it"
                if st.start - data_start < end
                else ("leaves a gap before it")
            )
            raise FrinkError(
                f"{path}: corrupt safetensors header (tensor data {what}, at byte {st.start})"
            )
        end += st.nbytes
    if end != data_len:
        raise FrinkError(
            f"{path}: corrupt safetensors header (its tensors cover {end} bytes of data, "
            f"the file holds {data_len})"
        )
    _library_check(path)
    return out


def _header_entry(path: Path, name: str, entry: Any, data_start: int, data_len: int) -> _Stored:
    def bad(why: str) -> FrinkError:
        return FrinkError(f"{path}: corrupt safetensors entry for tensor {name!r} ({why})")

    if not isinstance(entry, dict):
        raise bad("not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad("dtype must be a string")
    if not isinstance(shape, list) or not all(is_uint(d) for d in shape):
        raise bad(f"shape must be a list of non-negative integers, got {shape!r}"[:200])
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(is_uint, offsets))):
        raise bad("data_offsets must be two non-negative integers")
    begin, end = offsets
    if begin > end:
        raise bad(f"data_offsets {begin} > {end}")
    if end > data_len:
        raise FrinkError(
            f"{path}: truncated safetensors file: tensor {name!r} ends at byte "
            f"{data_start + end}, file has {data_start + data_len}"
        )
    width = _DTYPES[dtype][1] if dtype in _DTYPES else _OTHER_DTYPE_BYTES.get(dtype)
    if width is None:
        raise bad(f"unknown dtype {dtype!r}")
    if end - begin != math.prod(shape) * width:
        raise FrinkError(
            f"{path}: corrupt safetensors entry for tensor {name!r}: {end - begin} bytes "
            f"for shape {list(shape)} of {dtype}"
        )
    return _Stored(path, dtype, tuple(shape), data_start + begin, end - begin)


def is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _library_check(path: Path) -> None:
    """The safetensors library's own header validation, as a second opinion on ours."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:  # a dependency, but the checks above stand on their own
        return
    try:
        with safe_open(str(path), framework="numpy"):
            pass
    except SafetensorError as e:
        raise FrinkError(f"{path}: the safetensors library rejects the header ({e})") from None
    except Exception:  # noqa: BLE001 - e.g. a dtype numpy cannot hold; ours read it
        return


def _index_dir(hf_dir: Path) -> dict[str, _Stored]:
    """All tensors of the directory, single-file or sharded."""
    single = hf_dir / "model.safetensors"
    index = hf_dir / "model.safetensors.index.json"
    if single.is_file():
        return _read_header(single)
    if not index.is_file():
        raise FrinkError(
            f"{hf_dir}: no model.safetensors nor model.safetensors.index.json in the directory"
        )
    data = read_json(index, "shard index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise FrinkError(
            f"{index}: unreadable shard index (needs a weight_map object of file names)"
        )

    headers: dict[str, dict[str, _Stored]] = {}
    out: dict[str, _Stored] = {}
    for name, shard in weight_map.items():
        if shard not in headers:
            shard_path = hf_dir / shard
            if Path(shard).name != shard or not shard_path.is_file():
                raise FrinkError(f"{shard_path}: shard listed in {index.name} is missing")
            headers[shard] = _read_header(shard_path)
        stored = headers[shard].get(name)
        if stored is None:
            raise FrinkError(f"{hf_dir / shard}: tensor {name!r} listed in {index.name} is absent")
        out[name] = stored
    return out


def _read_f32(stored: _Stored) -> np.ndarray:
    """One stored tensor as float32 (bf16 widened by shifting it into a float32's top half)."""
    np_dtype, _ = _DTYPES[stored.dtype]
    try:
        with open(stored.file, "rb") as f:
            f.seek(stored.start)
            raw = f.read(stored.nbytes)
    except OSError as e:
        raise FrinkError(f"{stored.file}: cannot read ({e.strerror})") from e
    if len(raw) != stored.nbytes:
        raise FrinkError(
            f"{stored.file}: truncated safetensors file (changed since it was opened?)"
        )
    words = np.frombuffer(raw, dtype=np_dtype).reshape(stored.shape)
    if stored.dtype == "BF16":
        return (words.astype(np.uint32) << 16).view(np.float32)
    return words.astype(np.float32)


# ---------------------------------------------------------------------------------------
# config.json


def load_config(hf_dir: Path) -> dict[str, Any]:
    """The directory's config.json as a dict (FrinkError if absent or not an object)."""
    path = hf_dir / "config.json"
    if not path.is_file():
        raise FrinkError(f"{hf_dir}: not a model directory (no config.json)")
    cfg = read_json(path, "config.json")
    if not isinstance(cfg, dict):
        raise FrinkError(f"{path}: config.json is not a JSON object")
    return cfg


# What the HF planning builds from (archs/hf_plan.py): every stored tensor of a directory,
# one stored tensor and its float32 reader, and the dtypes that reader takes.
StoredTensor = _Stored
read_stored = _read_f32
index_dir = _index_dir
read_header = _read_header
READ_DTYPES = frozenset(_DTYPES)


def read_stored_half(st: _Stored, i: int, axis: int) -> np.ndarray:
    """Half i (0 or 1) of a stored tensor cut in two along `axis`, as a contiguous array
    (a fused gate/up tensor's gate or up rows)."""
    return np.ascontiguousarray(np.split(_read_f32(st), 2, axis=axis)[i])
