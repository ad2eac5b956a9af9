"""GGUF files -> Checkpoint: a bounds-checked header parser over a memory map.

The bytes are interpreted with gguf-py's own tables (value types, quant block sizes) and
dequantized by gguf-py's `dequantize` (ggml_quants.py: the few types gguf-py names but
cannot dequantize, Q1_0), so tensors mean exactly what llama.cpp means by them. The
header is parsed here rather than by gguf-py's GGUFReader for two reasons: GGUFReader
builds a memmap view per array element, which takes ~19 s on Gemma 3's 262k-token
vocabulary (this parser: well under a second), and it trusts the file, so a truncated or
corrupt file reads past the end or allocates absurd arrays. Here every count, length and
offset is checked against the file length before it is used.
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.constants import GGUFValueType
from gguf.quants import dequantize

from ..errors import FrinkError
from .checkpoint import Checkpoint, TensorInfo
from .ggml_quants import DEQUANTIZERS
from .jsonfile import open_regular

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
_STRUCT = {
    t: "<"
    + {
        "u1": "B",
        "i1": "b",
        "u2": "H",
        "i2": "h",
        "u4": "I",
        "i4": "i",
        "f4": "f",
        "u8": "Q",
        "i8": "q",
        "f8": "d",
    }[d[1:]]
    for t, d in _SCALARS.items()
}
_MAX_DIMS = 4
_DEFAULT_ALIGNMENT = 32
# llama.cpp reads no nested arrays at all; gguf-py writes them. One level of nesting is
# accepted, more is a crafted file (and recursion without end).
_MAX_ARRAY_DEPTH = 2
_U64 = struct.Struct("<Q")

_INTS = frozenset(
    {
        GGUFValueType.UINT8,
        GGUFValueType.INT8,
        GGUFValueType.UINT16,
        GGUFValueType.INT16,
        GGUFValueType.UINT32,
        GGUFValueType.INT32,
        GGUFValueType.UINT64,
        GGUFValueType.INT64,
    }
)
_FLOATS = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})
# The type each key frink reads must have, as llama.cpp's get_key insists (it takes no
# bool for a count and no number for a string). Keys are given without the "{arch}."
# prefix where they carry one. Kinds: uint, num, str, bool, and "arr:" + an element kind;
# "a|b" accepts either.
_KEY_KINDS: dict[str, str] = {
    **{
        k: "uint"
        for k in (
            "block_count",
            "context_length",
            "embedding_length",
            "attention.key_length",
            "attention.value_length",
            "rope.dimension_count",
            "attention.sliding_window",
            "expert_count",
            "expert_used_count",
            "expert_feed_forward_length",
            "expert_shared_feed_forward_length",
            "nextn_predict_layers",
            "full_attention_interval",
            "ssm.conv_kernel",
            "ssm.state_size",
            "ssm.group_count",
            "ssm.time_step_rank",
            "ssm.inner_size",
            "general.alignment",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
            "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.fim_pad_token_id",
            "tokenizer.ggml.fim_rep_token_id",
            "tokenizer.ggml.fim_sep_token_id",
            "tokenizer.ggml.prefix_token_id",
            "tokenizer.ggml.suffix_token_id",
            "tokenizer.ggml.middle_token_id",
        )
    },
    **{
        k: "uint|arr:uint"
        for k in ("feed_forward_length", "attention.head_count", "attention.head_count_kv")
    },
    **{
        k: "num"
        for k in (
            "attention.layer_norm_rms_epsilon",
            "attention.layer_norm_epsilon",
            "rope.freq_base",
            "rope.freq_base_swa",
            "rope.scaling.factor",
            "attention.scale",
            "final_logit_softcapping",
            "attn_logit_softcapping",
        )
    },
    **{
        k: "str"
        for k in (
            "general.architecture",
            "general.name",
            "tokenizer.ggml.model",
            "tokenizer.ggml.pre",
            "tokenizer.chat_template",
            "rope.scaling.type",
        )
    },
    **{
        k: "bool"
        for k in (
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_eos_token",
            "tokenizer.ggml.add_space_prefix",
            "expert_weights_norm",
        )
    },
    "tokenizer.ggml.tokens": "arr:str",
    "tokenizer.ggml.merges": "arr:str",
    "tokenizer.ggml.scores": "arr:num",
    "tokenizer.ggml.token_type": "arr:uint",
    "rope.dimension_sections": "arr:uint",
    "attention.sliding_window_pattern": "uint|arr:uint|arr:bool",
    "attention.recurrent_layers": "arr:uint|arr:bool",
}
_KIND_NAMES = {
    "uint": "a non-negative integer",
    "num": "a number",
    "str": "a string",
    "bool": "a bool",
    "arr:str": "an array of strings",
    "arr:num": "an array of numbers",
    "arr:uint": "an array of non-negative integers",
    "arr:bool": "an array of bools",
}


class _Cursor:
    """Reads little-endian values from the map, refusing to step past its end."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path
        self.elem_type: GGUFValueType | None = None  # of the last array value() read

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
        except UnicodeDecodeError as e:
            # GGUF strings are UTF-8 by the spec; text that is not would reach the tokenizer,
            # the template engine and the terminal as something else.
            raise FrinkError(
                f"{self.path}: {what} is not valid UTF-8 (byte {e.start} of {n})"
            ) from None

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings in a row (an array's): string() for each, in one loop that names
        the element only when one is refused (a vocabulary's strings are most of opening a
        model)."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                break
            (n,) = unpack(buf, pos)
            end = pos + 8 + n
            if end > size:
                break
            try:
                append(buf[pos + 8 : end].decode("utf-8"))
            except UnicodeDecodeError:
                break
            pos = end
        self.pos = pos
        while len(out) < count:  # the string that stopped the loop, refused by string()
            out.append(self.string(f"{what}[{len(out)}]"))
        return out

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.scalar("<I", what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise FrinkError(
                f"{self.path}: corrupt GGUF file ({what} has unknown type {raw})"
            ) from None

    def value(self, vtype: GGUFValueType, what: str, depth: int = 0) -> Any:
        """The value, and for arrays the element type (None for scalars)."""
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            if depth >= _MAX_ARRAY_DEPTH:
                raise FrinkError(
                    f"{self.path}: corrupt GGUF file ({what} nests arrays more than "
                    f"{_MAX_ARRAY_DEPTH} deep)"
                )
            etype = self.value_type(what)
            count = self.scalar("<Q", what)
            self.elem_type = etype
            if etype == GGUFValueType.STRING:
                self.need(count * 8, what)  # each string has at least its length
                return self.strings(count, what)
            if etype == GGUFValueType.ARRAY:
                self.need(count * 12, what)
                out = [self.value(GGUFValueType.ARRAY, what, depth + 1) for _ in range(count)]
                self.elem_type = etype
                return out
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

    def __init__(self, path: Path, buf: mmap.mmap, entries: dict[str, tuple], fd: int) -> None:
        self._path = path
        self._buf = buf
        self._fd = fd
        self._entries = entries  # name -> (qtype, numpy shape, absolute offset, n_bytes)

    def __del__(self) -> None:
        # At interpreter shutdown module globals (os, contextlib too) may already be None:
        # hence the AttributeError and TypeError, and no contextlib.suppress here.
        try:  # noqa: SIM105 - contextlib may be gone by then (see above)
            os.close(self._fd)
        except (OSError, AttributeError, TypeError):
            pass

    def _still_there(self, end: int) -> None:
        # A read of the map past a shrunken file's end is SIGBUS, which no Python code can
        # catch; checking the size first turns the common case into an error.
        if os.fstat(self._fd).st_size < end:
            raise FrinkError(f"{self._path}: the file shrank while frink was reading it")

    def names(self) -> list[str]:
        return list(self._entries)

    def info(self, name: str) -> TensorInfo:
        qtype, shape, _, _ = self._entry(name)
        return TensorInfo(name, shape, qtype.name)

    def raw(self, name: str) -> tuple[GGMLQuantizationType, tuple[int, ...], np.ndarray]:
        """The stored bytes (uint8 view of the map), for backends that keep quantized weights."""
        qtype, shape, offset, n_bytes = self._entry(name)
        self._still_there(offset + n_bytes)
        return qtype, shape, np.frombuffer(self._buf, dtype=np.uint8, count=n_bytes, offset=offset)

    def blocks(self, name: str) -> tuple[GGMLQuantizationType, tuple[int, ...], np.ndarray]:
        """The stored bytes, read into memory of their own (uint8, flat): the host keeps
        weights in their blocks this way, and a file truncated under the run is an error
        here rather than a SIGBUS when a kernel reads the map."""
        qtype, shape, offset, n_bytes = self._entry(name)
        return qtype, shape, self._pread(name, offset, n_bytes)

    def span(self, name: str) -> tuple[GGMLQuantizationType, tuple[int, ...], int, int]:
        """(type, shape, absolute offset, byte count) of a tensor's bytes in the file: a
        reader that streams parts of a tensor later (model/expert_cache.py) keeps these."""
        qtype, shape, offset, n_bytes = self._entry(name)
        return qtype, shape, offset, n_bytes

    def read_at(self, offset: int, n_bytes: int) -> np.ndarray:
        """n_bytes of the file from offset (inside a tensor span() gave), into memory of
        their own (uint8, flat); a short read is a FrinkError, never a SIGBUS."""
        return self._pread(f"at byte {offset}", offset, n_bytes)

    def will_need(self, ranges: list[tuple[int, int]]) -> None:
        """Ask the kernel to read these (offset, byte count) ranges ahead, all at once
        (madvise WILLNEED on the map), so the preads that follow find them in the page
        cache: one batch of I/O for a layer's chosen experts."""
        page = mmap.PAGESIZE
        for offset, n_bytes in ranges:
            start = offset - offset % page
            try:
                self._buf.madvise(mmap.MADV_WILLNEED, start, offset + n_bytes - start)
            except (OSError, ValueError):  # advice only: the pread reads regardless
                return

    def load(self, name: str) -> np.ndarray:
        qtype, shape, offset, n_bytes = self._entry(name)
        return self._dequantize(name, qtype, self._pread(name, offset, n_bytes), shape)

    def load_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a 2-D tensor, dequantized: a caller filling a large matrix
        in its own layout (the embedding, held column-major) reads it a slice at a time, so
        load never holds the file's blocks, a dequantized copy and the final array at once."""
        qtype, shape, offset, _ = self._entry(name)
        if len(shape) != 2 or not 0 <= start <= stop <= shape[0]:
            raise ValueError(f"rows [{start}, {stop}) of tensor {name} {list(shape)}")
        block, type_size = GGML_QUANT_SIZES[qtype]
        row_bytes = shape[1] // block * type_size
        data = self._pread(name, offset + start * row_bytes, (stop - start) * row_bytes)
        return self._dequantize(name, qtype, data, (stop - start, shape[1]))

    def _pread(self, name: str, offset: int, n_bytes: int) -> np.ndarray:
        # pread, not the map: a file truncated under the run gives a short read here.
        data = np.empty(n_bytes, dtype=np.uint8)
        view, done = data.data, 0  # ndarray.data: the array's memoryview
        while done < n_bytes:  # one call reads at most ~2 GiB on Linux
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise FrinkError(
                    f"{self._path}: the file shrank while frink was reading it (tensor {name})"
                )
            done += got
        return data

    def _dequantize(
        self, name: str, qtype: GGMLQuantizationType, data: np.ndarray, shape: tuple[int, ...]
    ) -> np.ndarray:
        block, type_size = GGML_QUANT_SIZES[qtype]
        rows = data.reshape(-1, shape[-1] // block * type_size)
        own = DEQUANTIZERS.get(qtype)  # a type gguf-py names but cannot dequantize (Q1_0)
        try:
            out = own(rows) if own is not None else dequantize(rows, qtype)
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


def _check_kind(
    path: Path,
    md: dict[str, Any],
    key: str,
    vtype: GGUFValueType,
    etype: GGUFValueType | None,
    arch: str | None,
) -> None:
    """Refuse a value whose type is not the one its key requires (_KEY_KINDS)."""
    short = key[len(arch) + 1 :] if arch and key.startswith(arch + ".") else key
    spec = _KEY_KINDS.get(short) if short != key or "." in key else None
    if spec is None:
        return
    value = md[key]
    for kind in spec.split("|"):
        t, whole = (etype, False) if kind.startswith("arr:") else (vtype, True)
        if kind.startswith("arr:") and vtype != GGUFValueType.ARRAY:
            continue
        base = kind.removeprefix("arr:")
        if base == "str" and t == GGUFValueType.STRING:
            return
        if base == "bool" and t == GGUFValueType.BOOL:
            return
        if base == "num" and t in _INTS | _FLOATS:
            return
        if base == "uint" and t in _INTS:
            values = [value] if whole else value
            if len(values) == 0 or min(values) >= 0:
                return
    shown = (
        repr(value)[:60]
        if vtype != GGUFValueType.ARRAY
        else (f"array of {etype.name if etype is not None else '?'}")
    )
    raise FrinkError(
        f"{path}: metadata {key!r} has type {vtype.name} ({shown}); expected "
        + " or ".join(_KIND_NAMES[k] for k in spec.split("|"))
    )


def read_gguf(path: Path) -> Checkpoint:
    """The GGUF file at `path` as a Checkpoint: its metadata (every value's kind checked
    against what llama.cpp expects of the key) and its tensors, mapped, each one's bytes
    checked to lie whole and alone inside the file; a FrinkError naming the fault for a
    file that is not a well-formed GGUF."""
    with open_regular(path) as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise FrinkError(f"{path}: empty file, not a GGUF model") from None
        # Kept for os.pread in load(): reads that end in an error, not SIGBUS, if the file
        # shrinks under the run.
        fd = os.dup(f.fileno())
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
    metadata = _read_metadata(cur, path, n_kv)
    infos = _read_tensor_table(cur, path, n_tensors)
    entries = _place_tensors(cur, path, metadata, infos)
    return Checkpoint(
        path=path, format="gguf", metadata=metadata, tensors=GgufTensors(path, buf, entries, fd)
    )


def _read_metadata(cur: _Cursor, path: Path, n_kv: int) -> dict[str, Any]:
    """The n_kv metadata pairs at the cursor, each value's kind checked for its key."""
    metadata: dict[str, Any] = {}
    types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
    for _ in range(n_kv):
        key = cur.string("a metadata key")
        if key in metadata:
            # llama.cpp refuses this too: which of the two values would be meant?
            raise FrinkError(f"{path}: corrupt GGUF file (metadata key {key!r} appears twice)")
        vtype = cur.value_type(f"metadata {key!r}")
        cur.elem_type = None
        metadata[key] = cur.value(vtype, f"metadata {key!r}")
        types[key] = (vtype, cur.elem_type)
    if "general.architecture" not in metadata:
        raise FrinkError(f"{path}: GGUF file has no general.architecture")
    arch = metadata["general.architecture"]
    for key, (vtype, etype) in types.items():
        _check_kind(path, metadata, key, vtype, etype, arch if isinstance(arch, str) else None)
    return metadata


_TensorInfo = tuple[str, list[int], GGMLQuantizationType, int]  # name, ne, type, offset


def _read_tensor_table(cur: _Cursor, path: Path, n_tensors: int) -> list[_TensorInfo]:
    """The n_tensors entries of the tensor table at the cursor."""
    infos = []
    seen: set[str] = set()
    for _ in range(n_tensors):
        name = cur.string("a tensor name")
        if name in seen:
            raise FrinkError(f"{path}: corrupt GGUF file (tensor {name} appears twice)")
        seen.add(name)
        n_dims = cur.scalar("<I", f"tensor {name}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise FrinkError(f"{path}: corrupt GGUF file (tensor {name} has {n_dims} dimensions)")
        cur.need(8 * n_dims, f"tensor {name}")
        ne = list(struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos))
        cur.pos += 8 * n_dims
        raw_type = cur.scalar("<I", f"tensor {name}")
        offset = cur.scalar("<Q", f"tensor {name}")
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise FrinkError(f"{path}: tensor {name} has unknown tensor type {raw_type}") from None
        infos.append((name, ne, qtype, offset))
    return infos


def _place_tensors(
    cur: _Cursor, path: Path, metadata: dict[str, Any], infos: list[_TensorInfo]
) -> dict[str, tuple]:
    """Per tensor (type, shape, start, n_bytes) in the file, the data section starting at
    the first multiple of the alignment past the cursor; refused unless each tensor's bytes
    are aligned, whole blocks, inside the file, and shared with no other tensor."""
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)  # a uint: checked above
    if alignment <= 0 or alignment & (alignment - 1):
        raise FrinkError(f"{path}: corrupt GGUF file (alignment {alignment})")
    data_start = -(-cur.pos // alignment) * alignment

    entries: dict[str, tuple] = {}
    for name, ne, qtype, offset in infos:
        if offset % alignment:
            raise FrinkError(
                f"{path}: corrupt GGUF file (tensor {name} data at offset {offset}, not a "
                f"multiple of the alignment {alignment})"
            )
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
    # Two tensors sharing bytes is a crafted or corrupt table (llama.cpp lays them out
    # one after another); one of them would read the other's weights.
    spans = sorted((e[2], e[2] + e[3], n) for n, e in entries.items())
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            raise FrinkError(
                f"{path}: corrupt GGUF file (tensors {first} and {second} share bytes)"
            )
    return entries
