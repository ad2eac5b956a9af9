"""HF -> GGUF planning: how a Hugging Face directory becomes a canonical Checkpoint.

llama.cpp's converter (convert_hf_to_gguf.py) renames tensors, writes the GGUF metadata
keys from config.json and applies per-tensor transforms (Q/K row permutation for llama,
+1 on Gemma norms, ...) at conversion time; frink does the same at open/load time. Which
names, keys and transforms apply to which architecture is each architecture's own module;
this module is the generic machinery: config.json with its defaults (`hparams`), the
name map, and a `Plan` per canonical tensor, applied lazily by `PlannedTensors.load`.
formats/safetensors.py reads the files; nothing here touches bytes itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint, TensorInfo
from ..formats.safetensors import READ_DTYPES, StoredTensor, index_dir, is_uint, read_stored

if TYPE_CHECKING:  # only for hints: base.py imports this module
    from .base import Arch


def is_finite_number(x: Any) -> bool:
    """x is an int or float (not a bool) of finite value: a config.json number check."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an integer beyond float range
        return False


def hp_value(hp: Mapping[str, Any], key: str, default: Any, kind: str) -> Any:
    """config.json's hp[key] (`default` where absent; None means required), checked as
    `kind`: "uint" (a non-negative integer, returned as int) or "number" (a finite number,
    returned as float). Anything else is refused by name."""
    value: Any = hp.get(key)
    if value is None and default is not None:
        return default
    if kind == "uint" and is_uint(value):
        return int(value)
    if kind == "number" and is_finite_number(value):
        return float(value)
    what = "a non-negative integer" if kind == "uint" else "a finite number"
    raise FrinkError(f"config.json: {key!r} must be {what}, got {value!r:.40}")


@dataclass(frozen=True)
class HfModelType:
    """How to read the config.json of one HF `model_type` (an architecture module holds one
    per model_type it serves).

    defaults: transformers' config defaults for keys a config.json may leave out (the
    converter reads configs through AutoConfig, which fills them in). text_config: the
    sub-config holding the language model of a multimodal checkpoint. strip: substrings
    removed from tensor names (`language_model.`); ignore: name prefixes not read (vision
    tower, MTP head), reported once as `ignored_note`. aliases: transformers' attribute_map.
    rename(name, num_hidden_layers): a stripped name as the converter's filter_tensors
    renames it before its tensor map (e.g. MTP blocks as the layers after the trunk).
    """

    defaults: Mapping[str, Any] = field(default_factory=dict)
    text_config: str | None = None
    strip: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    ignored_note: str = "ignored"
    aliases: Mapping[str, str] = field(default_factory=dict)
    rename: Callable[[str, int], str] | None = None


def hparams(cfg: dict[str, Any], mt: HfModelType) -> dict[str, Any]:
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


# A composite's input: stripped HF name -> (name in the files, where it is stored).
Kept = dict[str, tuple[str, StoredTensor]]


@dataclass(frozen=True)
class Transform:
    """One step the converter applies to a tensor: `apply(w, hp, shape)` gives the new
    array, `shape(shape, hp)` the shape it will have (known before anything is read).
    hp: the normalized config.json (see hparams); shape: the tensor's final shape."""

    apply: Callable[[np.ndarray, dict[str, Any], tuple[int, ...]], np.ndarray]
    shape: Callable[[tuple[int, ...], dict[str, Any]], tuple[int, ...]] = lambda s, hp: s


@dataclass(frozen=True)
class Plan:
    """How to produce one canonical tensor: its source, shape and transforms."""

    source: StoredTensor | None  # None: generated (see `generate`)
    shape: tuple[int, ...]
    dtype: str
    transforms: tuple[Transform, ...] = ()
    generate: Callable[[], np.ndarray] | None = None


def check_dtype(hf_name: str, st: StoredTensor) -> None:
    """FrinkError unless the stored tensor's dtype is one the reader widens to float32."""
    if st.dtype not in READ_DTYPES:
        raise FrinkError(
            f"{st.file}: tensor {hf_name!r} has dtype {st.dtype}; only F32, F16 and BF16 are read"
        )


def pop_matching(
    kept: Kept, pattern: re.Pattern[str]
) -> Iterator[tuple[re.Match[str], str, StoredTensor]]:
    """Each kept tensor whose name `pattern` matches, popped from `kept` with its dtype
    checked: (the match, its HF name, the stored tensor)."""
    for name in [n for n in kept if pattern.match(n)]:
        m = pattern.match(name)
        assert m is not None  # the names were picked by this match
        hf_name, st = kept.pop(name)
        check_dtype(hf_name, st)
        yield m, hf_name, st


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


class HfNames:
    """An architecture's HF -> GGUF tensor names for a tensor outside a model directory (a
    PEFT adapter's targets): the strips of every model_type it serves, then the name map."""

    def __init__(self, arch: Arch):
        self._names = _NameMap(arch)
        self._strips = tuple({s for mt in arch.hf_model_types.values() for s in mt.strip})

    def gguf_name(self, hf_name: str) -> str | None:
        for s in self._strips:
            hf_name = hf_name.replace(s, "")
        return self._names.gguf_name(hf_name)

    def transforms(self, gguf_name: str) -> tuple[Transform, ...]:
        return self._names.transforms(gguf_name)


class PlannedTensors:
    """TensorSource over planned tensors: each read from its safetensors file (or generated)
    and transformed in load(), one at a time."""

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
        w = read_stored(p.source)
        for t in p.transforms:
            w = t.apply(w, self._hp, p.shape)
        return np.ascontiguousarray(w, dtype=np.float32)

    def _plan(self, name: str) -> Plan:
        try:
            return self._plans[name]
        except KeyError:
            raise FrinkError(f"no tensor named {name!r} in this checkpoint") from None


# ---------------------------------------------------------------------------------------


def plan_hf_dir(hf_dir: Path, cfg: dict[str, Any], arch: Arch, model_type: str) -> Checkpoint:
    """The canonical (GGUF-convention) Checkpoint of an HF directory whose config.json is
    `cfg`, served by `arch` under `model_type`: tensors planned, metadata written."""
    mt = arch.hf_model_types[model_type]
    hp = hparams(cfg, mt)
    hp["_hf_dir"] = hf_dir  # for transforms that read beside the weights (vocab size)
    notes: list[str] = []

    stored = index_dir(hf_dir)
    # Every layer holds tensors: a layer count beyond the tensor count is a broken config,
    # refused before anything loops over (or allocates per) layer.
    if hp["num_hidden_layers"] > len(stored):
        raise FrinkError(
            f"{hf_dir / 'config.json'}: num_hidden_layers {hp['num_hidden_layers']} does not fit "
            f"the directory's {len(stored)} tensors"
        )
    kept, n_ignored = _kept(stored, mt, int(hp["num_hidden_layers"]))
    plans = _planned(arch, kept, hp)
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
    # Blocks planned after the trunk: multi-token-prediction blocks a rename put there.
    hp["_blocks_past_trunk"] = _blocks_past(plans, int(hp["num_hidden_layers"]))

    meta: dict[str, Any] = {"general.architecture": arch.name, **arch.hf_gguf_metadata(hp, notes)}
    return Checkpoint(
        path=hf_dir,
        format="safetensors",
        metadata=meta,
        tensors=PlannedTensors(plans, hp),
        hf_dir=hf_dir,
        notes=notes,
    )


_BLOCK = re.compile(r"blk\.(\d+)\.")


def _blocks_past(names: Iterator[str] | dict[str, Plan], n_layer: int) -> int:
    """How many blocks the GGUF names hold after the first n_layer."""
    found = {int(m.group(1)) for name in names if (m := _BLOCK.match(name))}
    return max((i + 1 - n_layer for i in found if i >= n_layer), default=0)


def _kept(stored: dict[str, StoredTensor], mt: HfModelType, n_layer: int) -> tuple[Kept, int]:
    """The stored tensors the language model uses, by stripped (and renamed) name, and how
    many the model_type ignores (vision tower, MTP head)."""
    n_ignored = 0
    kept: Kept = {}
    for hf_name, st in stored.items():
        if mt.ignore and hf_name.startswith(mt.ignore):
            n_ignored += 1
            continue
        name = hf_name
        for s in mt.strip:
            name = name.replace(s, "")
        if mt.rename is not None:
            name = mt.rename(name, n_layer)
        # Buffers some exporters save; the converter skips them too.
        if name.endswith((".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")):
            continue
        kept[name] = (hf_name, st)
    return kept, n_ignored


def _planned(arch: Arch, kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """GGUF name -> Plan for every kept tensor: composites first, then the name map."""
    names = _NameMap(arch)
    plans: dict[str, Plan] = {}
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
    return plans
