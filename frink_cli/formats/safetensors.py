"""A Hugging Face safetensors directory -> the same canonical Checkpoint a GGUF gives.

frink holds every model in GGUF's names and layouts, so that nothing downstream knows
where weights came from. This reader therefore does at open/load time what llama.cpp's
converter (convert_hf_to_gguf.py) does at conversion time: it renames tensors, writes
the GGUF metadata keys from config.json, and applies the same per-tensor transforms
(Q/K row permutation for llama, +1 on Gemma norms, ...). Which names, keys and
transforms apply to which architecture is data, in configs/hf_architectures.json; this
module holds the few functions the data names.

The safetensors header is parsed here rather than through the `safetensors` package:
numpy has no bfloat16, and parsing ourselves lets every offset be checked against the
file's length so a truncated download is a FrinkError naming the file, not a crash.
Tensors are read lazily, one at a time, in load().
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FrinkError
from ..resources import config_file
from . import Checkpoint, TensorInfo
from .jsonfile import open_regular, parse_json, read_json

_CONFIG_PATH = config_file("hf_architectures.json")

# The safetensors spec caps the JSON header at 100 MB; a larger length means a corrupt file.
_MAX_HEADER = 100 * 1024 * 1024

# Stored dtype -> (numpy dtype of the raw little-endian words, bytes per element).
_DTYPES: dict[str, tuple[str, int]] = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}
# Other dtypes the safetensors format defines: a header may hold them (their tensors are
# refused when used), and their sizes are needed to check its byte ranges.
_OTHER_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2,
                      "U16": 2, "I32": 4, "U32": 4, "F64": 8, "I64": 8, "U64": 8}


@lru_cache(maxsize=1)
def _tables() -> dict[str, Any]:
    try:
        return json.loads(_CONFIG_PATH.read_text(encoding="utf-8"))
    except OSError as e:  # a packaging bug, not user input, but say what is missing
        raise FrinkError(f"architecture table missing: {_CONFIG_PATH} ({e.strerror})") from e


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
            what = "overlaps the tensor before it" if st.start - data_start < end else (
                "leaves a gap before it")
            raise FrinkError(f"{path}: corrupt safetensors header (tensor data {what}, "
                             f"at byte {st.start})")
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
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise bad(f"shape must be a list of non-negative integers, got {shape!r}"[:200])
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
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


def _is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _is_finite_number(x: Any) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an integer beyond float range
        return False


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
        raise FrinkError(f"{index}: unreadable shard index (needs a weight_map object of file names)")

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
# config.json -> normalized hyperparameters


def _load_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise FrinkError(f"{hf_dir}: not a model directory (no config.json)")
    cfg = read_json(path, "config.json")
    if not isinstance(cfg, dict):
        raise FrinkError(f"{path}: config.json is not a JSON object")
    return cfg


def _hparams(cfg: dict[str, Any], mt: dict[str, Any], tables: dict[str, Any]) -> dict[str, Any]:
    """config.json with transformers' defaults filled in, text_config lifted, rope unified.

    The converter reads config.json through transformers' AutoConfig, which supplies
    defaults for absent keys; the per-model_type defaults in the table stand in for it.
    """
    hp: dict[str, Any] = {}
    text_key = mt.get("text_config")
    if text_key:
        # As the converter does: the text sub-config's keys override the top level's.
        hp.update(tables["model_types"][mt["text_defaults_from"]]["defaults"])
        hp.update(mt.get("defaults", {}))
        text = cfg.get(text_key) or {}
        hp.update({k: v for k, v in cfg.items() if k != text_key})
        hp.update(text)
    else:
        hp.update(mt.get("defaults", {}))
        hp.update(cfg)

    # transformers' attribute_map: a config may spell a key by another name.
    for alias, name in mt.get("aliases", {}).items():
        if alias in hp:
            hp[name] = hp.pop(alias)

    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads"):
        if not _is_uint(hp.get(key)) or hp[key] == 0:
            raise FrinkError(f"config.json: missing or non-integer {key!r} (got {hp.get(key)!r})")
    # Models whose every FFN is routed have no dense width; where a metadata entry needs
    # it, its absence is reported there.
    if "intermediate_size" in hp and not _is_uint(hp["intermediate_size"]):
        raise FrinkError("config.json: non-integer 'intermediate_size'")
    for key in ("num_key_value_heads", "head_dim"):
        if hp.get(key) is not None and (not _is_uint(hp[key]) or hp[key] == 0):
            raise FrinkError(f"config.json: {key!r} must be a positive integer, got {hp[key]!r}")
    if hp.get("num_key_value_heads") is None:
        hp["num_key_value_heads"] = hp["num_attention_heads"]
    if hp.get("head_dim") is None:
        hp["head_dim"] = hp["hidden_size"] // hp["num_attention_heads"]

    # RoPE: transformers >= 5 writes `rope_parameters` (per layer type for Gemma 3);
    # older configs carry `rope_theta` + `rope_scaling` (+ `rope_local_base_freq`).
    rp = hp.get("rope_parameters") or hp.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        raise FrinkError("config.json: rope_parameters / rope_scaling is not an object")
    if "full_attention" in rp or "sliding_attention" in rp:
        full = dict(rp.get("full_attention") or {})
        swa = dict(rp.get("sliding_attention") or {})
    else:
        full = dict(rp)
        swa = {}
        if hp.get("rope_local_base_freq") is not None:
            swa["rope_theta"] = hp["rope_local_base_freq"]
    if full.get("rope_theta") is None:
        full["rope_theta"] = hp.get("rope_theta")
    if "rope_type" not in full and "type" in full:
        full["rope_type"] = full["type"]
    hp["rope_theta"] = full.get("rope_theta")
    hp["rope_theta_swa"] = swa.get("rope_theta") if swa else hp.get("rope_local_base_freq")
    hp["_rope_full"] = full
    return hp


# ---------------------------------------------------------------------------------------
# tensor name mapping and transforms


def _layout(tables: dict[str, Any], name: str) -> dict[str, Any]:
    """A layout with its `"tensors": "<other layout>"` reference and its `extends` resolved:
    an extending layout is its base plus its own entries (lists appended, tables merged), so
    a variant (qwen35moe of qwen35) states only what it adds."""
    raw = dict(tables["layouts"][name])
    lay = _layout(tables, raw.pop("extends")) if "extends" in raw else {}
    if isinstance(raw.get("tensors"), str):
        raw["tensors"] = tables["layouts"][raw["tensors"]]["tensors"]
    for key, value in raw.items():
        if isinstance(value, list) and isinstance(lay.get(key), list):
            lay[key] = lay[key] + [v for v in value if v not in lay[key]]
        elif isinstance(value, dict) and isinstance(lay.get(key), dict):
            lay[key] = {**lay[key], **value}
        else:
            lay[key] = value
    lay["tensors"] = list(lay.get("tensors", [])) + list(lay.pop("tensors_extra", []))
    return lay


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(re.escape(pattern).replace(re.escape("{bid}"), r"(?P<bid>\d+)") + "$")


class _NameMap:
    """HF tensor name -> GGUF name, and GGUF name -> the transforms it gets."""

    def __init__(self, layout: dict[str, Any]):
        self._pairs = [(_compile(hf), gg) for hf, gg in layout["tensors"]]
        # Parameters with no .weight/.bias suffix (e.g. A_log), mapped by their whole name.
        self._whole = [
            (_compile(hf), gg) for hf, gg in layout.get("tensors_whole", {}).items() if not hf.startswith("_")
        ]
        self._transforms = [
            (_compile(gg), list(names))
            for gg, names in layout.get("transforms", {}).items()
            if not gg.startswith("_")
        ]

    def gguf_name(self, hf_name: str) -> str | None:
        for rx, gg in self._whole:
            m = rx.match(hf_name)
            if m:
                bid = m.groupdict().get("bid")
                return gg.replace("{bid}", bid) if bid is not None else gg
        for suffix in (".weight", ".bias"):
            if not hf_name.endswith(suffix):
                continue
            base = hf_name[: -len(suffix)]
            for rx, gg in self._pairs:
                m = rx.match(base)
                if m:
                    bid = m.groupdict().get("bid")
                    return (gg.replace("{bid}", bid) if bid is not None else gg) + suffix
        return None

    def transforms(self, gguf_name: str) -> list[str]:
        for rx, names in self._transforms:
            if rx.match(gguf_name):
                return names
        return []


def _permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half Q/K rows -> llama.cpp's adjacent-pair order, per head.

    Same reordering as the converter's LlamaModel.permute: within each head the rows
    [first half | second half] become interleaved (0, h, 1, h+1, ...).
    """
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass(frozen=True)
class _Plan:
    """How to produce one canonical tensor: its source, shape and transforms."""

    source: _Stored | None  # None: generated (see `generate`)
    shape: tuple[int, ...]
    dtype: str
    transforms: tuple[str, ...]
    generate: Callable[[], np.ndarray] | None = None


class SafetensorsSource:
    """TensorSource over a safetensors directory; transforms are applied in load()."""

    def __init__(self, plans: dict[str, _Plan], hp: dict[str, Any]):
        self._plans = plans
        self._n_head = int(hp["num_attention_heads"])
        self._n_head_kv = int(hp["num_key_value_heads"])
        # Gated delta net head layout, for the value-head reorder (0 where absent).
        self._n_k = int(hp.get("linear_num_key_heads") or 0)
        self._n_v = int(hp.get("linear_num_value_heads") or 0)
        self._hd_k = int(hp.get("linear_key_head_dim") or 0)
        self._hd_v = int(hp.get("linear_value_head_dim") or 0)

    def names(self) -> list[str]:
        return list(self._plans)

    def info(self, name: str) -> TensorInfo:
        p = self._plan(name)
        return TensorInfo(name, p.shape, p.dtype)

    def load(self, name: str) -> np.ndarray:
        p = self._plan(name)
        if p.generate is not None:
            return p.generate()
        assert p.source is not None
        w = _read_f32(p.source)
        for t in p.transforms:
            w = self._apply(t, w, p)
        return np.ascontiguousarray(w, dtype=np.float32)

    def _v_tiled(self, w: np.ndarray, axis: int, head_dim: int) -> np.ndarray:
        return _v_heads_tiled(w, axis, self._n_k, self._n_v, head_dim)

    def _plan(self, name: str) -> _Plan:
        try:
            return self._plans[name]
        except KeyError:
            raise FrinkError(f"no tensor named {name!r} in this checkpoint") from None

    def _apply(self, transform: str, w: np.ndarray, p: _Plan) -> np.ndarray:
        if transform == "permute_q":
            return _permute_rows(w, self._n_head)
        if transform == "permute_k":
            return _permute_rows(w, self._n_head_kv)
        if transform == "add_one":
            # In float32, as transformers' Gemma3RMSNorm computes (1 + w.float()).
            return w + np.float32(1.0)
        if transform == "truncate_vocab":
            return w[: p.shape[0]]
        if transform == "neg_exp":
            return -np.exp(w)
        if transform == "squeeze":
            return w.reshape(p.shape)
        if transform == "v_tiled_scalars":  # one entry (or row) per value head
            return self._v_tiled(w, 0, 1)
        if transform == "v_tiled_rows":  # hd_v rows per value head
            return self._v_tiled(w, 0, self._hd_v)
        if transform == "v_tiled_cols":  # hd_v columns per value head (out_proj)
            return self._v_tiled(w, 1, self._hd_v)
        if transform == "v_tiled_qkv_rows":  # rows [q | k | v]: only the v part has value heads
            qk = 2 * self._n_k * self._hd_k
            return np.concatenate([w[:qk], self._v_tiled(w[qk:], 0, self._hd_v)])
        raise AssertionError(f"unknown transform {transform!r} in hf_architectures.json")


def _v_heads_tiled(w: np.ndarray, axis: int, n_k: int, n_v: int, head_dim: int) -> np.ndarray:
    """Value heads from grouped order (the r = n_v / n_k heads of key head 0, then of key
    head 1, ...) to tiled order (value head j of every key head, then j + 1, ...), along
    `axis` -- the converter's _LinearAttentionVReorderBase._reorder_v_heads. After it, value
    head h reads key head h % n_k."""
    if n_k == n_v:
        return w
    w = np.moveaxis(w, axis, 0)
    rest = w.shape[1:]
    w = w.reshape(n_k, n_v // n_k, head_dim, *rest).swapaxes(0, 1).reshape(n_v * head_dim, *rest)
    return np.moveaxis(w, 0, axis)


def _n_vocab_real(hf_dir: Path, rows: int) -> int:
    """Rows of token_embd the converter keeps for Gemma 3 (it drops out-of-vocab rows).

    With tokenizer.model the converter's SentencePiece vocab is padded to vocab_size, so
    nothing is dropped; with only tokenizer.json it keeps len(vocab) + len(added_tokens).
    """
    if (hf_dir / "tokenizer.model").is_file():
        return rows
    tok = hf_dir / "tokenizer.json"
    if not tok.is_file():
        return rows
    data = read_json(tok, "tokenizer.json")
    try:
        n = len(data["model"]["vocab"]) + len(data.get("added_tokens") or [])
    except (KeyError, TypeError, AttributeError) as e:
        raise FrinkError(f"{tok}: unreadable tokenizer.json (no model.vocab: {e})") from None
    return min(rows, n)


def _llama3_rope_factors(hp: dict[str, Any]) -> np.ndarray | None:
    """The rope_freqs tensor the converter generates for rope_type "llama3"."""
    rp = hp["_rope_full"]
    if rp.get("rope_type") != "llama3":
        return None
    base = float(rp.get("rope_theta") or 10000.0)
    dim = int(hp["head_dim"])
    factor = float(rp.get("factor", 8.0))
    low = float(rp.get("low_freq_factor", 1.0))
    high = float(rp.get("high_freq_factor", 4.0))
    old_ctx = float(rp.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    wavelen = 2 * math.pi / freqs.astype(np.float64)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = np.empty(len(freqs), dtype=np.float64)
    for i, wl in enumerate(wavelen):
        if wl < high_wavelen:
            out[i] = 1.0
        elif wl > low_wavelen:
            out[i] = factor
        else:
            smooth = (old_ctx / wl - low) / (high - low)
            out[i] = 1.0 / ((1 - smooth) / factor + smooth)
    return out.astype(np.float32)


_GENERATORS: dict[str, Callable[[dict[str, Any]], np.ndarray | None]] = {
    "llama3_rope_freqs": _llama3_rope_factors,
}


# ---------------------------------------------------------------------------------------
# metadata


def _f32(x: Any) -> float:
    # GGUF stores these as float32; round here so both formats give the same numbers.
    return float(np.float32(x))


def _put(meta: dict[str, Any], arch: str, entry: dict[str, Any], hp: dict[str, Any]) -> None:
    value = hp.get(entry["from"])
    if value is None:
        if entry.get("optional"):
            return
        raise FrinkError(f"config.json: missing {entry['from']!r}")
    key = entry["key"].replace("{arch}", arch)
    # Checked by type, not coerced: "3" or true where a count belongs is a broken config.
    kind = entry["type"]
    ok = (isinstance(value, bool) if kind == "bool" else _is_uint(value) if kind == "u32"
          else _is_finite_number(value))
    if not ok:
        expected = {"bool": "true or false", "u32": "a non-negative integer"}.get(
            kind, "a finite number")
        raise FrinkError(f"config.json: {entry['from']!r} must be {expected}, got {value!r}"[:300])
    if kind == "bool":
        meta[key] = value
    else:
        meta[key] = value if kind == "u32" else _f32(value)


def _layer_is_swa(hp: dict[str, Any]) -> list[bool]:
    """Per layer: sliding-window attention? From layer_types, else the period pattern."""
    n = int(hp["num_hidden_layers"])
    types = hp.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return [t == "sliding_attention" for t in types]
    if hp.get("sliding_window") is None:
        return [False] * n
    period = hp.get("sliding_window_pattern") or hp.get("_sliding_window_pattern") or 6
    return [(i + 1) % int(period) != 0 for i in range(n)]


def _rule_rope_scaling(
    meta: dict[str, Any], arch: str, hp: dict[str, Any], notes: list[str]
) -> None:
    rp = hp["_rope_full"]
    generated = hp["_generated"]
    rope_type = rp.get("rope_type")
    if rope_type in (None, "default"):
        return
    factor = rp.get("factor")
    if rope_type == "linear":
        if factor is not None:
            meta[f"{arch}.rope.scaling.type"] = "linear"
            meta[f"{arch}.rope.scaling.factor"] = _f32(factor)
    elif rope_type == "yarn":
        if factor is not None:
            meta[f"{arch}.rope.scaling.type"] = "yarn"
            meta[f"{arch}.rope.scaling.factor"] = _f32(factor)
            orig = rp.get("original_max_position_embeddings")
            if orig is None:
                raise FrinkError(
                    "config.json: yarn rope scaling without original_max_position_embeddings"
                )
            meta[f"{arch}.rope.scaling.original_context_length"] = int(orig)
            for src, key in (
                ("extrapolation_factor", "yarn_ext_factor"),
                ("attention_factor", "yarn_attn_factor"),
                ("attn_factor", "yarn_attn_factor"),
                ("beta_fast", "yarn_beta_fast"),
                ("beta_slow", "yarn_beta_slow"),
            ):
                if rp.get(src) is not None and f"{arch}.rope.scaling.{key}" not in meta:
                    meta[f"{arch}.rope.scaling.{key}"] = _f32(rp[src])
    elif rope_type == "llama3" and "llama3_rope_freqs" in generated:
        pass  # expressed as the generated rope_freqs.weight tensor
    else:
        raise FrinkError(f"config.json: unsupported rope scaling type {rope_type!r} for {arch}")


def _rule_gemma3_attention(
    meta: dict[str, Any], arch: str, hp: dict[str, Any], notes: list[str]
) -> None:
    # llama.cpp hard-codes Gemma 3's layer pattern (every 6th layer global) and its
    # attention scale (1/sqrt(head_dim)); HF configs state both. These keys carry the HF
    # values in llama.cpp's own key names (llama.cpp reads sliding_window_pattern as a
    # per-layer bool array when present, and attention.scale is its query-scale key).
    swa = _layer_is_swa(hp)
    meta[f"{arch}.attention.sliding_window_pattern"] = swa
    if any(swa):
        if hp.get("sliding_window") is None:
            raise FrinkError("config.json: sliding layers but no sliding_window")
        meta[f"{arch}.attention.sliding_window"] = int(hp["sliding_window"])
    if hp.get("query_pre_attn_scalar") is not None:
        meta[f"{arch}.attention.scale"] = _f32(float(hp["query_pre_attn_scalar"]) ** -0.5)


def _rule_sliding_window_note(
    meta: dict[str, Any], arch: str, hp: dict[str, Any], notes: list[str]
) -> None:
    # llama.cpp's llama/qwen2/qwen3 graphs have no sliding window; neither does frink's
    # canonical form for them. Say so when the HF config asks for one.
    sw = hp.get("sliding_window")
    types = hp.get("layer_types") or []
    uses = "sliding_attention" in types if types else sw is not None
    if hp.get("use_sliding_window") is False:
        uses = False
    if uses and sw is not None and sw < int(hp.get("max_position_embeddings") or 0):
        notes.append(
            f"config sliding_window={sw} is not applied ({arch} attends to the full context, "
            f"as llama.cpp does)"
        )


def _rule_gdn_hybrid(meta: dict[str, Any], arch: str, hp: dict[str, Any], notes: list[str]) -> None:
    # Qwen3.5 / Qwen3-Next, as the converter's Qwen3NextModel.set_gguf_parameters writes them.
    n = int(hp["num_hidden_layers"])
    interval = int(hp.get("full_attention_interval") or 4)
    types = hp.get("layer_types")
    if isinstance(types, list):
        if len(types) != n:
            raise FrinkError(f"config.json: layer_types has {len(types)} entries for {n} layers")
        recurrent = [t == "linear_attention" for t in types]
    else:  # transformers' default: every interval-th layer attends
        recurrent = [(i + 1) % interval != 0 for i in range(n)]
    meta[f"{arch}.attention.recurrent_layers"] = recurrent
    meta[f"{arch}.full_attention_interval"] = interval
    meta[f"{arch}.ssm.inner_size"] = int(hp["linear_value_head_dim"]) * int(hp["linear_num_value_heads"])
    # Partial rope: transformers' default factor for these models is 0.25.
    factor = hp["_rope_full"].get("partial_rotary_factor", hp.get("partial_rotary_factor", 0.25))
    meta[f"{arch}.rope.dimension_count"] = int(int(hp["head_dim"]) * float(factor))


def _rule_imrope_sections(meta: dict[str, Any], arch: str, hp: dict[str, Any], notes: list[str]) -> None:
    # The converter always writes Qwen3.5's interleaved-mrope sections, defaulting to
    # transformers' [11, 11, 10]; padded to four entries as llama.cpp reads them.
    sections = [int(x) for x in hp["_rope_full"].get("mrope_section") or [11, 11, 10]]
    meta[f"{arch}.rope.dimension_sections"] = (sections + [0] * 4)[:4]


def _rule_moe_every_layer(meta: dict[str, Any], arch: str, hp: dict[str, Any], notes: list[str]) -> None:
    # transformers' Qwen3MoeDecoderLayer makes layer i dense when i is in mlp_only_layers or
    # (i + 1) is not a multiple of decoder_sparse_step. llama.cpp's qwen3moe requires a
    # router on every layer (and the converter has no name for a dense FFN there).
    n = int(hp["num_hidden_layers"])
    only = hp.get("mlp_only_layers") or []
    step = int(hp.get("decoder_sparse_step") or 1)
    dense = [i for i in range(n) if i in only or (i + 1) % step != 0]
    if dense:
        what = f"mlp_only_layers {list(only)}" if only else f"decoder_sparse_step {step}"
        raise FrinkError(
            f"config.json: {what} makes layers {dense} dense; {arch} with dense FFN layers "
            "is not supported (llama.cpp's qwen3moe has a router on every layer)"
        )


_RULES: dict[str, Callable[[dict[str, Any], str, dict[str, Any], list[str]], None]] = {
    "rope_scaling": _rule_rope_scaling,
    "gemma3_attention": _rule_gemma3_attention,
    "sliding_window_note": _rule_sliding_window_note,
    "gdn_hybrid": _rule_gdn_hybrid,
    "imrope_sections": _rule_imrope_sections,
    "moe_every_layer": _rule_moe_every_layer,
}


def _check_dtype(hf_name: str, st: _Stored) -> None:
    if st.dtype not in _DTYPES:
        raise FrinkError(
            f"{st.file}: tensor {hf_name!r} has dtype {st.dtype}; only F32, F16 and BF16 are read"
        )


def _composite_qwen3next_qkvz(
    kept: dict[str, tuple[str, _Stored]], hp: dict[str, Any], plans: dict[str, _Plan]
) -> None:
    """in_proj_qkvz -> attn_qkv + attn_gate, as the converter's Qwen3NextModel splits it.

    HF stores the rows per key head: [q (hd_k), k (hd_k), v (r*hd_v), z (r*hd_v)] for each of
    the n_k key heads (r = n_v / n_k). GGUF holds all q rows, all k, all v (value heads
    grouped), then z separately.
    """
    rx = re.compile(r"model\.layers\.(\d+)\.linear_attn\.in_proj_qkvz\.weight$")
    n_k, n_v = int(hp["linear_num_key_heads"]), int(hp["linear_num_value_heads"])
    hk, hv = int(hp["linear_key_head_dim"]), int(hp["linear_value_head_dim"])
    r = n_v // n_k
    group = 2 * hk + 2 * r * hv
    for name in [n for n in kept if rx.match(n)]:
        hf_name, st = kept.pop(name)
        _check_dtype(hf_name, st)
        bid = rx.match(name).group(1)  # type: ignore[union-attr]
        if len(st.shape) != 2 or st.shape[0] != n_k * group:
            raise FrinkError(f"{st.file}: tensor {hf_name!r} has shape {list(st.shape)}, expected [{n_k * group}, n_embd]")
        d = st.shape[1]

        def split(st: _Stored = st, d: int = d) -> tuple[np.ndarray, np.ndarray]:
            w = _read_f32(st).reshape(n_k, group, d)
            q, k = w[:, :hk], w[:, hk : 2 * hk]
            v, z = w[:, 2 * hk : 2 * hk + r * hv], w[:, 2 * hk + r * hv :]
            qkv = np.concatenate([q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d)])
            return np.ascontiguousarray(qkv), np.ascontiguousarray(z.reshape(-1, d))

        plans[f"blk.{bid}.attn_qkv.weight"] = _Plan(
            None, (2 * n_k * hk + n_v * hv, d), st.dtype, (), lambda f=split: f()[0]
        )
        plans[f"blk.{bid}.attn_gate.weight"] = _Plan(None, (n_v * hv, d), st.dtype, (), lambda f=split: f()[1])


def _composite_stacked_experts(
    kept: dict[str, tuple[str, _Stored]], hp: dict[str, Any], plans: dict[str, _Plan]
) -> None:
    """Per-expert matrices -> one [n_expert, ...] tensor per kind, as the converter stacks
    them (Qwen2MoeModel.modify_tensors); also transformers' fused in-memory form
    (experts.gate_up_proj [E, 2*ff, d], experts.down_proj [E, d, ff])."""
    per_expert = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
    groups: dict[tuple[str, str], dict[int, tuple[str, _Stored]]] = {}
    for name in [n for n in kept if per_expert.match(n)]:
        m = per_expert.match(name)
        assert m is not None
        groups.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = kept.pop(name)
    for (bid, kind), experts in groups.items():
        n = len(experts)
        if sorted(experts) != list(range(n)):
            raise FrinkError(f"layer {bid}: {kind}_proj experts are not numbered 0..{n - 1}")
        sources = [experts[e] for e in range(n)]
        for hf_name, st in sources:
            _check_dtype(hf_name, st)
            if st.shape != sources[0][1].shape:
                raise FrinkError(f"{st.file}: tensor {hf_name!r} has shape {list(st.shape)}, unlike expert 0")
        stored = [st for _, st in sources]
        plans[f"blk.{bid}.ffn_{kind}_exps.weight"] = _Plan(
            None, (n, *stored[0].shape), stored[0].dtype, (),
            lambda s=stored: np.stack([_read_f32(x) for x in s]),
        )

    fused = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up|down)_proj(\.weight)?$")
    for name in [n for n in kept if fused.match(n)]:
        m = fused.match(name)
        assert m is not None
        hf_name, st = kept.pop(name)
        _check_dtype(hf_name, st)
        bid = m.group(1)
        if m.group(2) == "down":
            plans[f"blk.{bid}.ffn_down_exps.weight"] = _Plan(st, st.shape, st.dtype, ())
            continue
        if len(st.shape) != 3 or st.shape[1] % 2:
            raise FrinkError(f"{st.file}: tensor {hf_name!r} has shape {list(st.shape)}, expected [E, 2*ff, d]")
        e, ff2, d = st.shape
        for i, kind in enumerate(("gate", "up")):
            plans[f"blk.{bid}.ffn_{kind}_exps.weight"] = _Plan(
                None, (e, ff2 // 2, d), st.dtype, (),
                lambda st=st, i=i: np.ascontiguousarray(np.split(_read_f32(st), 2, axis=1)[i]),
            )


_COMPOSITES: dict[str, Callable[[dict[str, tuple[str, _Stored]], dict[str, Any], dict[str, _Plan]], None]] = {
    "qwen3next_qkvz": _composite_qwen3next_qkvz,
    "stacked_experts": _composite_stacked_experts,
}


# ---------------------------------------------------------------------------------------


def read_hf_dir(path: Path) -> Checkpoint:
    """Open a Hugging Face model directory as a canonical (GGUF-convention) Checkpoint."""
    hf_dir = Path(path)
    cfg = _load_config(hf_dir)
    tables = _tables()
    model_type = cfg.get("model_type")
    mt = tables["model_types"].get(model_type) if isinstance(model_type, str) else None
    if mt is None:
        known = ", ".join(sorted(tables["model_types"]))
        raise FrinkError(
            f"{hf_dir / 'config.json'}: unsupported architecture model_type={model_type!r} "
            f"(supported: {known})"
        )
    arch: str = mt["arch"]
    layout = _layout(tables, mt["layout"])
    hp = _hparams(cfg, mt, tables)
    notes: list[str] = []

    stored = _index_dir(hf_dir)
    # Every layer holds tensors: a layer count beyond the tensor count is a broken config,
    # refused before anything loops over (or allocates per) layer.
    if hp["num_hidden_layers"] > len(stored):
        raise FrinkError(
            f"{hf_dir / 'config.json'}: num_hidden_layers {hp['num_hidden_layers']} does not fit "
            f"the directory's {len(stored)} tensors"
        )
    names = _NameMap(layout)
    strip = list(mt.get("strip_substrings", []))
    ignore = tuple(mt.get("ignore_prefixes", []))
    plans: dict[str, _Plan] = {}
    n_ignored = 0
    kept: dict[str, tuple[str, _Stored]] = {}  # stripped name -> (name in the files, where)
    for hf_name, st in stored.items():
        if ignore and hf_name.startswith(ignore):
            n_ignored += 1
            continue
        name = hf_name
        for s in strip:
            name = name.replace(s, "")
        # Buffers some exporters save; the converter skips them too.
        if name.endswith((".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")):
            continue
        kept[name] = (hf_name, st)
    # Tensors that become several GGUF tensors, or several that become one.
    for composite in layout.get("composites", []):
        _COMPOSITES[composite](kept, hp, plans)
    for name, (hf_name, st) in kept.items():
        gg = names.gguf_name(name)
        if gg is None:
            raise FrinkError(f"{st.file}: tensor {hf_name!r} has no GGUF name for {arch}")
        if gg in plans:
            raise FrinkError(f"{st.file}: tensor {hf_name!r} duplicates {gg!r}")
        if st.dtype not in _DTYPES:
            raise FrinkError(
                f"{st.file}: tensor {hf_name!r} has dtype {st.dtype}; only F32, F16 and BF16 are read"
            )
        transforms = tuple(names.transforms(gg))
        shape = tuple(d for d in st.shape if d != 1) if "squeeze" in transforms else st.shape
        plans[gg] = _Plan(st, shape, st.dtype, transforms)
    if n_ignored:
        notes.append(f"{mt.get('ignored_note', 'ignored')} ({n_ignored} tensors)")

    if "token_embd.weight" not in plans:
        raise FrinkError(f"{hf_dir}: no token embedding (model.embed_tokens.weight) found")
    emb = plans["token_embd.weight"]
    if "truncate_vocab" in emb.transforms:
        rows = _n_vocab_real(hf_dir, emb.shape[0])
        plans["token_embd.weight"] = _Plan(
            emb.source, (rows, *emb.shape[1:]), emb.dtype, emb.transforms
        )
    hp["n_vocab"] = plans["token_embd.weight"].shape[0]

    # GGUF says "tied" by having no output.weight; transformers ties on the config flag.
    if hp.get("tie_word_embeddings") and "output.weight" in plans:
        del plans["output.weight"]
        notes.append(
            "tie_word_embeddings: lm_head.weight in the files ignored, output = token_embd"
        )
    elif not hp.get("tie_word_embeddings") and "output.weight" not in plans:
        notes.append("no lm_head.weight although tie_word_embeddings is false: output = token_embd")

    # Tensors the converter synthesizes from the config (e.g. llama3 rope factors).
    hp["_generated"] = {v for k, v in layout.get("generated", {}).items() if not k.startswith("_")}
    extra: dict[str, _Plan] = {}
    for gg, maker in layout.get("generated", {}).items():
        if gg.startswith("_"):
            continue
        data = _GENERATORS[maker](hp)
        if data is not None:
            extra[gg] = _Plan(None, data.shape, "F32", (), lambda d=data: d.copy())
    plans = {**extra, **plans}

    meta: dict[str, Any] = {"general.architecture": arch}
    # Keyed by GGUF key: a layout's own entry replaces the shared set's (e.g. an optional
    # feed_forward_length where every FFN is routed).
    meta_entries = {e["key"]: e for e in tables["metadata_sets"][layout["metadata"]]}
    meta_entries.update({e["key"]: e for e in layout.get("metadata_extra", [])})
    for entry in meta_entries.values():
        _put(meta, arch, entry, hp)
    for rule in layout.get("rules", []):
        _RULES[rule](meta, arch, hp, notes)

    return Checkpoint(
        path=hf_dir,
        format="safetensors",
        metadata=meta,
        tensors=SafetensorsSource(plans, hp),
        hf_dir=hf_dir,
        notes=notes,
    )
