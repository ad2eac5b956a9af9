"""A Hugging Face safetensors directory -> the same canonical Checkpoint a GGUF gives.

frink holds every model in GGUF's names and layouts, so that nothing downstream knows
where weights came from. This reader therefore does at open/load time what llama.cpp's
converter (convert_hf_to_gguf.py) does at conversion time: it renames tensors, writes
the GGUF metadata keys from config.json, and applies the same per-tensor transforms
(Q/K row permutation for llama, +1 on Gemma norms, ...). Which names, keys and
transforms apply to which architecture is each architecture's own module (frink_cli/archs/);
this module is the generic machinery: headers, shards, dtypes, config.json with its
defaults, and applying an architecture's name map, transforms and composites.

The safetensors header is parsed here rather than through the `safetensors` package:
numpy has no bfloat16, and parsing ourselves lets every offset be checked against the
file's length so a truncated download is a FrinkError naming the file, not a crash.
Tensors are read lazily, one at a time, in load().
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FrinkError
from . import Checkpoint, TensorInfo
from .jsonfile import open_regular, parse_json, read_json

if TYPE_CHECKING:  # only for hints: archs imports this module, not the other way round
    from ..archs.base import Arch

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


def is_finite_number(x: Any) -> bool:
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
# config.json -> normalized hyperparameters


def _load_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise FrinkError(f"{hf_dir}: not a model directory (no config.json)")
    cfg = read_json(path, "config.json")
    if not isinstance(cfg, dict):
        raise FrinkError(f"{path}: config.json is not a JSON object")
    return cfg


@dataclass(frozen=True)
class HfModelType:
    """How to read the config.json of one HF `model_type` (an architecture module holds one
    per model_type it serves).

    defaults: transformers' config defaults for keys a config.json may leave out (the
    converter reads configs through AutoConfig, which fills them in). text_config: the
    sub-config holding the language model of a multimodal checkpoint. strip: substrings
    removed from tensor names (`language_model.`); ignore: name prefixes not read (vision
    tower, MTP head), reported once as `ignored_note`. aliases: transformers' attribute_map.
    """

    defaults: Mapping[str, Any] = field(default_factory=dict)
    text_config: str | None = None
    strip: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    ignored_note: str = "ignored"
    aliases: Mapping[str, str] = field(default_factory=dict)


def _hparams(cfg: dict[str, Any], mt: HfModelType) -> dict[str, Any]:
    """config.json with transformers' defaults filled in, text_config lifted, rope unified.

    The converter reads config.json through transformers' AutoConfig, which supplies
    defaults for absent keys; the model_type's defaults stand in for it.
    """
    hp: dict[str, Any] = dict(mt.defaults)
    if mt.text_config:
        # As the converter does: the text sub-config's keys override the top level's.
        text = cfg.get(mt.text_config) or {}
        hp.update({k: v for k, v in cfg.items() if k != mt.text_config})
        hp.update(text)
    else:
        hp.update(cfg)

    # transformers' attribute_map: a config may spell a key by another name.
    for alias, name in mt.aliases.items():
        if alias in hp:
            hp[name] = hp.pop(alias)

    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads"):
        if not is_uint(hp.get(key)) or hp[key] == 0:
            raise FrinkError(f"config.json: missing or non-integer {key!r} (got {hp.get(key)!r})")
    # Models whose every FFN is routed have no dense width; where a metadata entry needs
    # it, its absence is reported there.
    if "intermediate_size" in hp and not is_uint(hp["intermediate_size"]):
        raise FrinkError("config.json: non-integer 'intermediate_size'")
    for key in ("num_key_value_heads", "head_dim"):
        if hp.get(key) is not None and (not is_uint(hp[key]) or hp[key] == 0):
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
# applying an architecture's map: names, transforms, composites


# What arch modules build plans from (archs/*.py): a stored tensor and its float32 reader.
StoredTensor = _Stored
read_stored = _read_f32


def read_stored_half(st: _Stored, i: int, axis: int) -> np.ndarray:
    """Half i (0 or 1) of a stored tensor cut in two along `axis`, as a contiguous array
    (a fused gate/up tensor's gate or up rows)."""
    return np.ascontiguousarray(np.split(_read_f32(st), 2, axis=axis)[i])


# A composite's input: stripped HF name -> (name in the files, where it is stored).
Kept = dict[str, tuple[str, _Stored]]


@dataclass(frozen=True)
class Transform:
    """One step the converter applies to a tensor: `apply(w, hp, shape)` gives the new
    array, `shape(shape, hp)` the shape it will have (known before anything is read).
    hp: the normalized config.json (see _hparams); shape: the tensor's final shape."""

    apply: Callable[[np.ndarray, dict[str, Any], tuple[int, ...]], np.ndarray]
    shape: Callable[[tuple[int, ...], dict[str, Any]], tuple[int, ...]] = lambda s, hp: s


@dataclass(frozen=True)
class Plan:
    """How to produce one canonical tensor: its source, shape and transforms."""

    source: _Stored | None  # None: generated (see `generate`)
    shape: tuple[int, ...]
    dtype: str
    transforms: tuple[Transform, ...] = ()
    generate: Callable[[], np.ndarray] | None = None


def check_dtype(hf_name: str, st: _Stored) -> None:
    if st.dtype not in _DTYPES:
        raise FrinkError(
            f"{st.file}: tensor {hf_name!r} has dtype {st.dtype}; only F32, F16 and BF16 are read"
        )


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(re.escape(pattern).replace(re.escape("{bid}"), r"(?P<bid>\d+)") + "$")


def _fill(pattern: str, m: re.Match[str]) -> str:
    bid = m.groupdict().get("bid")
    return pattern.replace("{bid}", bid) if bid is not None else pattern


class _NameMap:
    """HF tensor name -> GGUF name, and GGUF name -> the transforms it gets, from an
    architecture's patterns (`{bid}` = layer index)."""

    def __init__(self, arch: Arch):
        self._pairs = [(_compile(hf), gg) for hf, gg in arch.hf_tensors]
        # Parameters with no .weight/.bias suffix (e.g. A_log), mapped by their whole name.
        self._whole = [(_compile(hf), gg) for hf, gg in arch.hf_tensors_whole]
        self._transforms = [(_compile(gg), tuple(ts)) for gg, ts in arch.hf_transforms().items()]

    def gguf_name(self, hf_name: str) -> str | None:
        for rx, gg in self._whole:
            m = rx.match(hf_name)
            if m:
                return _fill(gg, m)
        for suffix in (".weight", ".bias"):
            if not hf_name.endswith(suffix):
                continue
            base = hf_name[: -len(suffix)]
            for rx, gg in self._pairs:
                m = rx.match(base)
                if m:
                    return _fill(gg, m) + suffix
        return None

    def transforms(self, gguf_name: str) -> tuple[Transform, ...]:
        for rx, ts in self._transforms:
            if rx.match(gguf_name):
                return ts
        return ()


class SafetensorsSource:
    """TensorSource over a safetensors directory; transforms are applied in load()."""

    def __init__(self, plans: dict[str, Plan], hp: dict[str, Any]):
        self._plans = plans
        self._hp = hp

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
            w = t.apply(w, self._hp, p.shape)
        return np.ascontiguousarray(w, dtype=np.float32)

    def _plan(self, name: str) -> Plan:
        try:
            return self._plans[name]
        except KeyError:
            raise FrinkError(f"no tensor named {name!r} in this checkpoint") from None


# ---------------------------------------------------------------------------------------


def read_hf_dir(path: Path) -> Checkpoint:
    """Open a Hugging Face model directory as a canonical (GGUF-convention) Checkpoint."""
    # Imported here, not at the top: archs imports this module (its Plan, Transform and
    # HfModelType types), so a top-level import would be a cycle. The direction is
    # archs -> formats; the reader only looks the architecture up when it runs.
    from ..archs import arch_for_model_type, supported_model_types

    hf_dir = Path(path)
    cfg = _load_config(hf_dir)
    model_type = cfg.get("model_type")
    arch = arch_for_model_type(model_type) if isinstance(model_type, str) else None
    if arch is None:
        raise FrinkError(
            f"{hf_dir / 'config.json'}: unsupported architecture model_type={model_type!r} "
            f"(supported: {', '.join(supported_model_types())})"
        )
    assert isinstance(model_type, str)
    mt = arch.hf_model_types[model_type]
    hp = _hparams(cfg, mt)
    hp["_hf_dir"] = hf_dir  # for transforms that read beside the weights (vocab size)
    notes: list[str] = []

    stored = _index_dir(hf_dir)
    # Every layer holds tensors: a layer count beyond the tensor count is a broken config,
    # refused before anything loops over (or allocates per) layer.
    if hp["num_hidden_layers"] > len(stored):
        raise FrinkError(
            f"{hf_dir / 'config.json'}: num_hidden_layers {hp['num_hidden_layers']} does not fit "
            f"the directory's {len(stored)} tensors"
        )
    names = _NameMap(arch)
    plans: dict[str, Plan] = {}
    n_ignored = 0
    kept: Kept = {}
    for hf_name, st in stored.items():
        if mt.ignore and hf_name.startswith(mt.ignore):
            n_ignored += 1
            continue
        name = hf_name
        for s in mt.strip:
            name = name.replace(s, "")
        # Buffers some exporters save; the converter skips them too.
        if name.endswith((".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")):
            continue
        kept[name] = (hf_name, st)
    # Tensors that become several GGUF tensors, or several that become one.
    for composite in arch.hf_composites:
        plans.update(composite(kept, hp))
    for name, (hf_name, st) in kept.items():
        gg = names.gguf_name(name)
        if gg is None:
            raise FrinkError(f"{st.file}: tensor {hf_name!r} has no GGUF name for {arch.name}")
        if gg in plans:
            raise FrinkError(f"{st.file}: tensor {hf_name!r} duplicates {gg!r}")
        check_dtype(hf_name, st)
        transforms = names.transforms(gg)
        shape = st.shape
        for t in transforms:
            shape = t.shape(shape, hp)
        plans[gg] = Plan(st, shape, st.dtype, transforms)
    if n_ignored:
        notes.append(f"{mt.ignored_note} ({n_ignored} tensors)")

    if "token_embd.weight" not in plans:
        raise FrinkError(f"{hf_dir}: no token embedding (model.embed_tokens.weight) found")
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
    extra = {
        gg: Plan(None, data.shape, "F32", (), data.copy)
        for gg, data in arch.hf_generated(hp).items()
    }
    plans = {**extra, **plans}

    meta: dict[str, Any] = {"general.architecture": arch.name, **arch.hf_gguf_metadata(hp, notes)}
    return Checkpoint(
        path=hf_dir,
        format="safetensors",
        metadata=meta,
        tensors=SafetensorsSource(plans, hp),
        hf_dir=hf_dir,
        notes=notes,
    )
