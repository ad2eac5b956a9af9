"""Reading LoRA adapter files against a base model: a GGUF adapter as llama.cpp's
convert_lora_to_gguf.py writes it, or a PEFT directory (adapter_config.json +
adapter_model.safetensors).

Either becomes a model.lora.LoraAdapter whose pairs are named in the base's GGUF
convention, with B's rows in the base's row order (a PEFT adapter's Q/K rows permuted as
the converter permutes the base's). Everything is checked against the base's headers
before any tensor is read: the architecture, every target's name and shape, the rank,
each A beside its B. A target frink does not adapt (embeddings, experts, norms) is refused
by name rather than dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint, read_gguf_file
from ..formats.jsonfile import read_json
from ..formats.safetensors import StoredTensor, read_header, read_stored
from ..model.config import ModelConfig
from ..model.lora import LoraAdapter
from .hf_plan import HfNames, Transform
from .registry import arch_for

# The base tensors an adapter may target: the layers' dense projections and the LM head.
_TARGETS = re.compile(
    r"(blk\.\d+\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up|ffn_down)"
    r"|output)\.weight$"
)
# A rank past this is no low-rank adapter (and would size an allocation from a header).
MAX_RANK = 4096

# Target name -> [lora_a's name, lora_b's name] (None: not seen yet).
Pairs = dict[str, list[Any]]


def read_adapter(path: str | Path, scale: float, base: Checkpoint, cfg: ModelConfig) -> LoraAdapter:
    """The adapter at `path` (a .gguf file or a PEFT directory) checked against `base`, at
    user scale `scale` (FrinkError naming the file and what does not fit)."""
    p = Path(path)
    if not p.exists():
        raise FrinkError(f"LoRA adapter not found: {p}")
    if p.is_dir():
        return _read_peft(p, scale, base, cfg)
    return _read_gguf(p, scale, base)


def _read_gguf(p: Path, scale: float, base: Checkpoint) -> LoraAdapter:
    ad = read_gguf_file(p)
    meta = ad.metadata
    if meta.get("general.type") not in (None, "adapter") or meta.get("adapter.type") != "lora":
        raise FrinkError(
            f"{p}: not a LoRA adapter (general.type={meta.get('general.type')!r}, "
            f"adapter.type={meta.get('adapter.type')!r})"
        )
    arch = meta.get("general.architecture")
    if arch != base.arch:
        raise FrinkError(f"{p}: a LoRA adapter for {arch!r}, the model is {base.arch!r}")
    alpha = meta.get("adapter.lora.alpha", 0.0)
    if not isinstance(alpha, (int, float)) or not np.isfinite(alpha):
        raise FrinkError(f"{p}: adapter.lora.alpha is not a number ({alpha!r})")
    pairs: Pairs = {}
    for name in ad.tensors.names():
        for suffix, i in ((".lora_a", 0), (".lora_b", 1)):
            if name.endswith(suffix):
                pairs.setdefault(name[: -len(suffix)], [None, None])[i] = name
                break
        else:
            raise FrinkError(f"{p}: tensor {name!r} is not a LoRA pair's lora_a / lora_b")
    shapes = {
        t: (tuple(ad.tensors.info(a).shape), tuple(ad.tensors.info(b).shape))
        for t, (a, b) in pairs.items()
        if a is not None and b is not None
    }
    rank = _check_pairs(p, pairs, shapes, base)
    loaded = {
        t: (_f32(ad.tensors.load(a)), _f32(ad.tensors.load(b))) for t, (a, b) in pairs.items()
    }
    return LoraAdapter(str(p), float(alpha), rank, loaded, scale)


def _check_pairs(
    p: Path,
    pairs: Pairs,
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]],
    base: Checkpoint,
) -> int:
    """Every pair complete, aimed at a base matrix frink adapts, A [r, in] and B [out, r]
    against its [out, in], one rank in 1..MAX_RANK for all: the rank, else FrinkError."""
    if not pairs:
        raise FrinkError(f"{p}: a LoRA adapter with no tensors")
    names = set(base.tensors.names())
    ranks = set()
    for target, (a, b) in sorted(pairs.items()):
        if a is None or b is None:
            missing = "lora_a" if a is None else "lora_b"
            raise FrinkError(f"{p}: {target} has no {missing} beside its pair")
        if not _TARGETS.match(target):
            raise FrinkError(f"{p}: LoRA target {target} is not one frink adapts")
        if target not in names:
            raise FrinkError(f"{p}: LoRA target {target} is not in the model {base.path}")
        out_in = tuple(base.tensors.info(target).shape)
        sa, sb = shapes[target]
        r = sa[0] if len(sa) == 2 else -1
        if len(out_in) != 2 or sa != (r, out_in[1]) or sb != (out_in[0], r):
            raise FrinkError(
                f"{p}: LoRA pair for {target} has shapes A {list(sa)}, B {list(sb)}; the "
                f"model's matrix is {list(out_in)} (an adapter for another model?)"
            )
        if not 1 <= r <= min(MAX_RANK, *out_in):
            raise FrinkError(f"{p}: LoRA rank {r} on {target} is out of range")
        ranks.add(r)
    if len(ranks) != 1:
        raise FrinkError(f"{p}: LoRA pairs of several ranks {sorted(ranks)} are not supported")
    return ranks.pop()


def _f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


# ---------------------------------------------------------------------------------------
# PEFT directories

_PEFT_PREFIX = "base_model.model."
_PEFT_REFUSED = {
    "use_dora": "DoRA",
    "modules_to_save": "modules_to_save (full weights beside the adapter)",
    "rank_pattern": "rank_pattern (per-module ranks)",
    "alpha_pattern": "alpha_pattern (per-module alphas)",
    "fan_in_fan_out": "fan_in_fan_out",
    "layers_to_transform": "layers_to_transform",
    "lora_bias": "lora_bias",
    "target_parameters": "target_parameters (adapted parameters, not modules)",
    "trainable_token_indices": "trainable_token_indices",
    "layer_replication": "layer_replication",
    "alora_invocation_tokens": "aLoRA (alora_invocation_tokens)",
}


def _peft_config(d: Path) -> dict[str, Any]:
    path = d / "adapter_config.json"
    conf = read_json(path, "adapter config") if path.is_file() else None
    if not isinstance(conf, dict):
        raise FrinkError(f"{d}: not a PEFT adapter directory (no adapter_config.json object)")
    if conf.get("peft_type", "LORA") != "LORA":
        raise FrinkError(f"{path}: peft_type {conf.get('peft_type')!r} is not LORA")
    for key, what in _PEFT_REFUSED.items():
        if conf.get(key):
            raise FrinkError(f"{path}: {what} is not supported")
    if conf.get("bias", "none") != "none":
        raise FrinkError(f"{path}: bias={conf.get('bias')!r} is not supported (only 'none')")
    for key in ("r", "lora_alpha"):
        v = conf.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise FrinkError(f"{path}: {key} is not a number ({v!r})")
    return conf


def _read_peft(d: Path, scale: float, base: Checkpoint, cfg: ModelConfig) -> LoraAdapter:
    conf = _peft_config(d)
    weights = d / "adapter_model.safetensors"
    if not weights.is_file():
        raise FrinkError(f"{d}: no adapter_model.safetensors")
    arch = arch_for(base.arch)
    if arch is None or not arch.hf_tensors:
        raise FrinkError(f"{d}: PEFT adapters are not read for {base.arch!r} models")
    names = HfNames(arch)
    stored = read_header(weights)
    pairs: Pairs = {}
    hf_of: dict[str, tuple[StoredTensor | None, StoredTensor | None]] = {}
    for key, st in stored.items():
        m = re.fullmatch(r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
        if m is None or not m.group(1).startswith(_PEFT_PREFIX):
            raise FrinkError(f"{weights}: tensor {key!r} is not a LoRA pair's lora_A / lora_B")
        target = names.gguf_name(m.group(1)[len(_PEFT_PREFIX) :] + ".weight")
        if target is None:
            raise FrinkError(f"{weights}: LoRA target {m.group(1)!r} has no tensor in the model")
        i = 0 if m.group(2) == "A" else 1
        pairs.setdefault(target, [None, None])[i] = key
        pair = list(hf_of.get(target, (None, None)))
        pair[i] = st
        hf_of[target] = (pair[0], pair[1])
    shapes = {t: (tuple(a.shape), tuple(b.shape)) for t, (a, b) in hf_of.items() if a and b}
    rank = _check_pairs(weights, pairs, shapes, base)
    if rank != conf["r"]:
        raise FrinkError(
            f"{d}: the tensors' rank {rank} is not adapter_config.json's r {conf['r']}"
        )
    hp = _base_hparams(cfg)
    loaded = {}
    for target, (a, b) in hf_of.items():
        assert a is not None and b is not None  # _check_pairs refused incomplete pairs
        rows = _rows_as_base(weights, target, read_stored(b), names.transforms(target), hp)
        loaded[target] = (_f32(read_stored(a)), _f32(rows))
    return LoraAdapter(
        str(d), float(conf["lora_alpha"]), rank, loaded, scale, bool(conf.get("use_rslora"))
    )


def _base_hparams(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json values a row transform reads, from the base's config."""
    return {
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head_kv,
        "hidden_size": cfg.n_embd,
        "head_dim": cfg.head_dim_k,
    }


def _rows_as_base(
    where: Path, target: str, b: np.ndarray, ts: tuple[Transform, ...], hp: dict[str, Any]
) -> np.ndarray:
    """B with its rows reordered as the converter reorders the base matrix's rows (Q/K's
    rope permutation). A transform that is not a reordering of rows cannot carry over to B:
    refused by name."""
    if not ts:
        return b
    probe = np.arange(b.shape[0], dtype=np.float32)[:, None]
    try:
        for t in ts:
            probe = t.apply(probe, hp, probe.shape)
            b = t.apply(b, hp, b.shape)
    except (KeyError, ValueError) as e:
        raise FrinkError(f"{where}: cannot carry {target}'s conversion over to LoRA ({e})") from e
    order = np.asarray(probe).reshape(-1)
    if order.shape[0] != b.shape[0] or not np.array_equal(np.sort(order), np.arange(b.shape[0])):
        raise FrinkError(f"{where}: {target}'s conversion is not a row order; LoRA cannot follow")
    return b


def read_adapters(
    specs: Sequence[tuple[str | Path, float]],
    base: Checkpoint,
    cfg: ModelConfig,
    apply: bool = True,
) -> list[LoraAdapter]:
    """Each (path, scale) read as read_adapter does; apply=False loads them at scale 0
    (llama.cpp's --lora-init-without-apply: set later, e.g. by a server's /lora-adapters)."""
    adapters = [read_adapter(path, float(scale), base, cfg) for path, scale in specs]
    if not apply:
        for ad in adapters:
            ad.scale = 0.0
    return adapters
