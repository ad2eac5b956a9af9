"""Broken model files, one per way a file can be wrong, for tests/test_bad_inputs.py.

Why this exists: frink promises one clear line for every bad input, and the only way to
hold it to that is to hand it each kind of broken file. Every GGUF here starts from one
small valid llama model written by gguf-py's own GGUFWriter (so the baseline is a file as
llama.cpp's tools write it, not as frink's reader expects it), then either is rewritten
with one thing changed (architecture, a tensor's shape or type, a missing key) or has its
bytes patched (truncation, absurd counts) at offsets found by parsing the valid file with
gguf-py's GGUFReader. Needs numpy and gguf only; every file is a few tens of KB.

Usage: python scripts/make_bad_models.py OUT_DIR     (writes every case, prints the paths)
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter

# A one-layer llama, small enough that the whole file is ~40 KB, with the head layout
# (GQA, head_dim != n_embd / something trivial) of a real model.
N_LAYER = 1
N_EMBD = 32
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 64
N_VOCAB = 64
N_CTX = 128
ARRAY_KEY = "frink.test.array"  # a metadata array whose count the "huge_array" case patches
HUGE = 2**60


def tiny_llama_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """The valid model's tensors, by GGUF name, in numpy order [out, in]."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    t = {"token_embd.weight": w(N_VOCAB, N_EMBD), "output_norm.weight": np.ones(N_EMBD, np.float32)}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = np.ones(N_EMBD, np.float32)
        t[p + "attn_q.weight"] = w(N_HEAD * HEAD_DIM, N_EMBD)
        t[p + "attn_k.weight"] = w(N_HEAD_KV * HEAD_DIM, N_EMBD)
        t[p + "attn_v.weight"] = w(N_HEAD_KV * HEAD_DIM, N_EMBD)
        t[p + "attn_output.weight"] = w(N_EMBD, N_HEAD * HEAD_DIM)
        t[p + "ffn_norm.weight"] = np.ones(N_EMBD, np.float32)
        t[p + "ffn_gate.weight"] = w(N_FF, N_EMBD)
        t[p + "ffn_up.weight"] = w(N_FF, N_EMBD)
        t[p + "ffn_down.weight"] = w(N_EMBD, N_FF)
    return t


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    tensors: dict[str, np.ndarray] | None = None,
    raw_types: dict[str, GGMLQuantizationType] | None = None,
    drop_keys: tuple[str, ...] = (),
    override_keys: dict[str, object] | None = None,
) -> Path:
    """A tiny model as GGUFWriter writes it. `raw_types` stores those tensors' arrays as raw
    bytes of the given quant type; `drop_keys` / `override_keys` change the metadata."""
    tensors = tiny_llama_tensors() if tensors is None else tensors
    raw_types = raw_types or {}
    override_keys = override_keys or {}
    kv: dict[str, object] = {
        f"{arch}.block_count": N_LAYER,
        f"{arch}.context_length": N_CTX,
        f"{arch}.embedding_length": N_EMBD,
        f"{arch}.feed_forward_length": N_FF,
        f"{arch}.attention.head_count": N_HEAD,
        f"{arch}.attention.head_count_kv": N_HEAD_KV,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.rope.dimension_count": HEAD_DIM,
        "tokenizer.ggml.model": "none",
    }
    kv.update(override_keys)
    writer = GGUFWriter(path, arch)
    writer.add_name("frink bad-input fixture")
    for key, value in kv.items():
        if key in drop_keys:
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, int(value))
    writer.add_array(ARRAY_KEY, [1, 2, 3, 4])
    for name, array in tensors.items():
        if name in raw_types:
            qtype = raw_types[name]
            block, type_size = GGML_QUANT_SIZES[qtype]
            rows, cols = array.shape
            raw = np.zeros((rows, cols // block * type_size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class Layout:
    """Byte offsets inside a valid GGUF, read with gguf-py's parser."""

    def __init__(self, path: Path) -> None:
        reader = GGUFReader(path)
        self.size = path.stat().st_size
        self.data_offset = int(reader.data_offset)
        fields = reader.fields
        # The first metadata key starts right after magic, version and the two counts.
        self.first_kv = 4 + 4 + 8 + 8
        arr = fields[ARRAY_KEY]
        # parts: key length, key, value type, element type, count, data...
        self.array_count = int(arr.offset) + sum(p.nbytes for p in arr.parts[:4])
        first_tensor = reader.tensors[0]
        self.tensor_info_start = int(first_tensor.field.offset)
        self.tensor_info: dict[str, int] = {}  # name -> offset of its n_dims field
        for t in reader.tensors:
            self.tensor_info[t.name] = int(t.field.offset) + sum(
                p.nbytes for p in t.field.parts[:2]
            )


def _copy_patched(
    src: Path, dst: Path, patches: list[tuple[int, bytes]] = (), size: int | None = None
) -> Path:
    data = bytearray(src.read_bytes())
    for offset, raw in patches:
        data[offset : offset + len(raw)] = raw
    dst.write_bytes(bytes(data[:size] if size is not None else data))
    return dst


def make_all(out: Path) -> dict[str, Path]:
    """Write every case into `out`; returns name -> path. The "valid" case is the baseline."""
    out.mkdir(parents=True, exist_ok=True)
    valid = write_gguf(out / "valid.gguf")
    lay = Layout(valid)
    q = "blk.0.attn_q.weight"
    q_dims = lay.tensor_info[q]  # n_dims (u32), ne[0..n) (u64 each), type (u32), offset (u64)

    def patched(name: str, patches: list[tuple[int, bytes]] = (), size: int | None = None) -> Path:
        return _copy_patched(valid, out / name, patches, size)

    tensors_wrong_q = tiny_llama_tensors()
    tensors_wrong_q[q] = tensors_wrong_q[q][:-8]  # 24 rows where 4 heads x 8 need 32
    tensors_no_down = {
        k: v for k, v in tiny_llama_tensors().items() if k != "blk.0.ffn_down.weight"
    }

    # A tensor of a feature frink does not carry (mpt's AWQ activation scales, here on a
    # llama): running without it would silently compute another model.
    tensors_unused = dict(
        tiny_llama_tensors(), **{"blk.1.ffn_act.scales": np.ones(N_FF, np.float32)}
    )

    makers: dict[str, Callable[[], Path]] = {
        "valid": lambda: valid,
        "empty": lambda: patched("empty.gguf", size=0),
        "text": lambda: _write(out / "notes.txt", b"just some text, not a model\n"),
        "magic_only": lambda: patched("magic_only.gguf", size=4),
        "bad_version": lambda: patched("bad_version.gguf", [(4, struct.pack("<I", 99))]),
        # Cut inside the metadata key/value section.
        "truncated_metadata": lambda: patched(
            "truncated_metadata.gguf", size=(lay.first_kv + lay.tensor_info_start) // 2
        ),
        # Cut inside a metadata value (the array), past the header's up-front size check.
        "truncated_value": lambda: patched("truncated_value.gguf", size=lay.array_count + 8 + 6),
        # Cut inside the tensor-info table (after all metadata, before the data).
        "truncated_tensor_info": lambda: patched("truncated_tensor_info.gguf", size=q_dims + 6),
        # Cut halfway through the tensor data.
        "truncated_data": lambda: patched(
            "truncated_data.gguf", size=(lay.data_offset + lay.size) // 2
        ),
        "huge_tensor_count": lambda: patched(
            "huge_tensor_count.gguf", [(8, struct.pack("<Q", HUGE))]
        ),
        "huge_kv_count": lambda: patched("huge_kv_count.gguf", [(16, struct.pack("<Q", HUGE))]),
        "huge_string": lambda: patched(
            "huge_string.gguf", [(lay.first_kv, struct.pack("<Q", HUGE))]
        ),
        "huge_array": lambda: patched(
            "huge_array.gguf", [(lay.array_count, struct.pack("<Q", HUGE))]
        ),
        # attn_q claims 2**40 x 2**40 elements: its data would lie far past the end.
        "huge_dims": lambda: patched(
            "huge_dims.gguf", [(q_dims + 4, struct.pack("<QQ", 2**40, 2**40))]
        ),
        "many_dims": lambda: patched("many_dims.gguf", [(q_dims, struct.pack("<I", 1000))]),
        "unknown_tensor_type": lambda: patched(
            "unknown_tensor_type.gguf", [(q_dims + 4 + 2 * 8, struct.pack("<I", 9999))]
        ),
        # Same length, so every later offset stays valid.
        "no_architecture": lambda: _replace_bytes(
            valid, out / "no_architecture.gguf", b"general.architecture", b"general.architecturX"
        ),
        "unknown_arch": lambda: write_gguf(out / "unknown_arch.gguf", arch="foo"),
        "missing_key": lambda: write_gguf(
            out / "missing_key.gguf", drop_keys=("llama.block_count",)
        ),
        "bad_key_type": lambda: write_gguf(
            out / "bad_key_type.gguf", override_keys={"llama.block_count": "three"}
        ),
        "bad_tokenizer": lambda: write_gguf(
            out / "bad_tokenizer.gguf", override_keys={"tokenizer.ggml.model": "bogus"}
        ),
        "bad_head_counts": lambda: write_gguf(
            out / "bad_head_counts.gguf", override_keys={"llama.attention.head_count_kv": 3}
        ),
        "wrong_shape": lambda: write_gguf(out / "wrong_shape.gguf", tensors=tensors_wrong_q),
        "missing_tensor": lambda: write_gguf(out / "missing_tensor.gguf", tensors=tensors_no_down),
        "unused_tensor": lambda: write_gguf(out / "unused_tensor.gguf", tensors=tensors_unused),
        # Q8_1 is an activation format: gguf-py has no dequantizer for it, so neither has frink.
        "undequantizable": lambda: write_gguf(
            out / "undequantizable.gguf", raw_types={q: GGMLQuantizationType.Q8_1}
        ),
    }
    return {name: make() for name, make in makers.items()}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _replace_bytes(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    assert len(old) == len(new)
    data = src.read_bytes()
    assert data.count(old) == 1, f"{old!r} occurs {data.count(old)} times"
    dst.write_bytes(data.replace(old, new))
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    for case, file in make_all(Path(sys.argv[1])).items():
        print(f"{case:<24} {file}")
