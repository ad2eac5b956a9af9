"""GGUF files -> Checkpoint: a bounds-checked header parser over a memory map.

The bytes are interpreted with gguf-py's own tables (value types, quant block sizes) and
dequantized by gguf-py's `dequantize`, so tensors mean exactly what llama.cpp means by
them. The header is parsed here rather than by gguf-py's GGUFReader for two reasons:
GGUFReader builds a memmap view per array element, which takes ~19 s on Gemma 3's 262k-token
vocabulary (this parser: well under a second), and it trusts the file, so a truncated or
corrupt file reads past the end or allocates absurd arrays. Here every count, length and
offset is checked against the file length before it is used.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.constants import GGUFValueType
from gguf.quants import dequantize

from ..errors import FrinkError
from . import Checkpoint, TensorInfo

_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}
_STRUCT = {t: "<" + {"u1": "B", "i1": "b", "u2": "H", "i2": "h", "u4": "I", "i4": "i",
                      "f4": "f", "u8": "Q", "i8": "q", "f8": "d"}[d[1:]] for t, d in _SCALARS.items()}
_MAX_DIMS = 4
_DEFAULT_ALIGNMENT = 32


class _Cursor:
    """Reads little-endian values from the map, refusing to step past its end."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise FrinkError(
                f"{self.path}: truncated or corrupt GGUF file ({what} at byte {self.pos} needs "
                f"{n} bytes, file has {self.size})"
            )

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # llama.cpp keeps such strings as bytes; surrogateescape round-trips them.
            return raw.decode("utf-8", errors="surrogateescape")

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.scalar("<I", what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise FrinkError(f"{self.path}: corrupt GGUF file ({what} has unknown type {raw})") from None

    def value(self, vtype: GGUFValueType, what: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            etype = self.value_type(what)
            count = self.scalar("<Q", what)
            if etype == GGUFValueType.STRING:
                self.need(count * 8, what)  # each string has at least its length
                return [self.string(what) for _ in range(count)]
            if etype == GGUFValueType.ARRAY:
                self.need(count * 12, what)
                return [self.value(GGUFValueType.ARRAY, what) for _ in range(count)]
            dtype = np.dtype(_SCALARS[etype])
            self.need(count * dtype.itemsize, what)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += count * dtype.itemsize
            if etype == GGUFValueType.BOOL:
                arr = arr.astype(bool)
            # Small arrays read best as lists (rope sections, layer patterns); the big ones
            # (token scores and types) stay numpy.
            return arr.tolist() if count <= 64 else arr
        v = self.scalar(_STRUCT[vtype], what)
        if vtype == GGUFValueType.BOOL:
            return bool(v)
        if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            return float(v)
        return int(v)


class GgufTensors:
    """Tensor source over the memory map: nothing is read until load() asks."""

    def __init__(self, path: Path, buf: mmap.mmap, entries: dict[str, tuple]) -> None:
        self._path = path
        self._buf = buf
        self._entries = entries  # name -> (qtype, numpy shape, absolute offset, n_bytes)

    def names(self) -> list[str]:
        return list(self._entries)

    def info(self, name: str) -> TensorInfo:
        qtype, shape, _, _ = self._entry(name)
        return TensorInfo(name, shape, qtype.name)

    def raw(self, name: str) -> tuple[GGMLQuantizationType, tuple[int, ...], np.ndarray]:
        """The stored bytes (uint8 view of the map), for backends that keep quantized weights."""
        qtype, shape, offset, n_bytes = self._entry(name)
        return qtype, shape, np.frombuffer(self._buf, dtype=np.uint8, count=n_bytes, offset=offset)

    def load(self, name: str) -> np.ndarray:
        qtype, shape, _, _ = self._entry(name)
        _, _, data = self.raw(name)
        block, type_size = GGML_QUANT_SIZES[qtype]
        rows = data.reshape(-1, shape[-1] // block * type_size)
        try:
            out = dequantize(rows, qtype)
        except NotImplementedError as e:
            raise FrinkError(
                f"{self._path}: tensor {name} has type {qtype.name}, which frink cannot dequantize"
            ) from e
        return np.ascontiguousarray(out.reshape(shape), dtype=np.float32)

    def _entry(self, name: str) -> tuple:
        try:
            return self._entries[name]
        except KeyError:
            raise FrinkError(f"{self._path}: no tensor named {name}") from None


def read_gguf(path: Path) -> Checkpoint:
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise FrinkError(f"{path}: empty file, not a GGUF model") from None
    cur = _Cursor(buf, path)
    magic = bytes(buf[:4])
    if magic != b"GGUF":
        raise FrinkError(f"{path}: not a GGUF file (bad magic {magic!r})")
    cur.pos = 4
    version = cur.scalar("<I", "version")
    if version not in (2, 3):
        raise FrinkError(f"{path}: unsupported GGUF version {version}")
    n_tensors = cur.scalar("<Q", "tensor count")
    n_kv = cur.scalar("<Q", "metadata count")
    cur.need(n_kv * 12 + n_tensors * 24, "the header's metadata and tensor table")

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("a metadata key")
        vtype = cur.value_type(f"metadata {key!r}")
        metadata[key] = cur.value(vtype, f"metadata {key!r}")
    if "general.architecture" not in metadata:
        raise FrinkError(f"{path}: GGUF file has no general.architecture")

    infos = []
    for _ in range(n_tensors):
        name = cur.string("a tensor name")
        n_dims = cur.scalar("<I", f"tensor {name}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise FrinkError(f"{path}: corrupt GGUF file (tensor {name} has {n_dims} dimensions)")
        cur.need(8 * n_dims, f"tensor {name}")
        ne = list(struct.unpack_from(f"<{n_dims}Q", buf, cur.pos))
        cur.pos += 8 * n_dims
        raw_type = cur.scalar("<I", f"tensor {name}")
        offset = cur.scalar("<Q", f"tensor {name}")
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise FrinkError(f"{path}: tensor {name} has unknown tensor type {raw_type}") from None
        infos.append((name, ne, qtype, offset))

    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1):
        raise FrinkError(f"{path}: corrupt GGUF file (alignment {alignment})")
    data_start = -(-cur.pos // alignment) * alignment

    entries: dict[str, tuple] = {}
    for name, ne, qtype, offset in infos:
        block, type_size = GGML_QUANT_SIZES[qtype]
        if any(n <= 0 for n in ne) or ne[0] % block:
            raise FrinkError(
                f"{path}: tensor {name} has shape {ne}, not whole {qtype.name} blocks of {block}"
            )
        n_bytes = int(np.prod(ne, dtype=object)) // block * type_size
        start = data_start + offset
        if start + n_bytes > cur.size:
            raise FrinkError(
                f"{path}: truncated file: tensor {name} needs bytes {start}..{start + n_bytes}, "
                f"file has {cur.size}"
            )
        entries[name] = (qtype, tuple(reversed(ne)), start, n_bytes)
    return Checkpoint(path=path, format="gguf", metadata=metadata, tensors=GgufTensors(path, buf, entries))
