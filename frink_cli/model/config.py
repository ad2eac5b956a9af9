"""ModelConfig: the globals of a model and every decoration, read from canonical metadata.

The decoder is one loop over layers; what differs between architectures is data. Each
decoration llama.cpp's graph builders apply (QK norm, post norms, GeGLU, embedding scale,
sliding windows with their own rope base, logit softcap...) is an explicit field here,
filled from the GGUF keys and the per-architecture table in configs/architectures.json.
`layer_shape(l)` says what layer l is, so the host body and every backend ask one place.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import FrinkError
from ..formats import Checkpoint
from ..resources import config_file



@lru_cache(maxsize=1)
def architecture_table() -> dict[str, dict[str, Any]]:
    raw = json.loads(config_file("architectures.json").read_text())
    defaults = raw["_defaults"]
    return {k: {**defaults, **v} for k, v in raw.items() if not k.startswith("_")}


def supported_architectures() -> list[str]:
    return sorted(architecture_table())


@dataclass(frozen=True)
class LayerShape:
    """What layer l is. Backends decide eligibility from this alone."""

    mixer: str  # "attention"
    ffn: str  # "dense"
    window: int | None  # sliding-window width (keys q - k < window are visible), None = full
    rope_base: float
    rope_scale: float  # position multiplier (1 / linear scaling factor)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope_type: str  # "norm" (adjacent pairs, llama) | "neox" (halves)
    rope_dim: int  # leading dims of each head that rotate
    rope_base: float
    rope_scale: float
    rope_base_swa: float
    attn_scale: float  # multiplies q before q.k
    sliding_window: int | None
    swa_layers: tuple[bool, ...]
    ffn_act: str  # "silu" | "gelu_tanh"
    qk_norm: bool
    post_attn_norm: bool
    post_ffn_norm: bool
    embd_scale: float | None
    final_logit_softcap: float | None
    attn_logit_softcap: float | None
    tied_embeddings: bool
    has_rope_freqs: bool  # per-dimension frequency factors (llama 3.x "rope_freqs.weight")

    def layer_shape(self, layer: int) -> LayerShape:
        swa = self.swa_layers[layer]
        return LayerShape(
            mixer="attention",
            ffn="dense",
            window=self.sliding_window if swa else None,
            rope_base=self.rope_base_swa if swa else self.rope_base,
            rope_scale=1.0 if swa else self.rope_scale,
        )

    def layer_pattern(self) -> str:
        """A compact summary such as 'SWA x5 ATTN x1 (x3)' for `frink info`."""
        names = ["SWA" if s else "ATTN" for s in self.swa_layers]
        out: list[str] = []
        for n in names:
            if out and out[-1][0] == n:
                out[-1] = (n, out[-1][1] + 1)
            else:
                out.append((n, 1))
        return " ".join(f"{n} x{c}" for n, c in out)


def _get(md: dict[str, Any], key: str, default: Any = None, *, required: bool = False) -> Any:
    if key in md:
        return md[key]
    if required:
        raise FrinkError(f"model metadata is missing {key}")
    return default


def _per_layer_int(value: Any, n_layer: int, key: str) -> int:
    """GGUF allows per-layer arrays for head counts; frink's dense graph needs one value."""
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        vals = {int(v) for v in list(value)}
        if len(vals) != 1:
            raise FrinkError(f"{key} varies per layer ({sorted(vals)}), which frink does not support")
        return vals.pop()
    return int(value)


def config_from_checkpoint(ckpt: Checkpoint) -> ModelConfig:
    try:
        return _config_from_checkpoint(ckpt)
    except (ValueError, TypeError) as e:
        # Metadata of the wrong type (a string where a count belongs, an array where a
        # scalar does) is a corrupt file, not a bug: name the file and the complaint.
        raise FrinkError(f"{ckpt.path}: bad model metadata ({e})") from e


def _config_from_checkpoint(ckpt: Checkpoint) -> ModelConfig:
    md = ckpt.metadata
    arch = ckpt.arch
    table = architecture_table()
    if arch not in table:
        raise FrinkError(
            f"{ckpt.path}: unknown architecture {arch!r} (frink supports: {', '.join(supported_architectures())})"
        )
    a = table[arch]

    def key(name: str) -> str:
        return f"{arch}.{name}"

    n_layer = int(_get(md, key("block_count"), required=True))
    n_embd = int(_get(md, key("embedding_length"), required=True))
    n_head = _per_layer_int(_get(md, key("attention.head_count"), required=True), n_layer, "head_count")
    n_head_kv = _per_layer_int(_get(md, key("attention.head_count_kv"), n_head), n_layer, "head_count_kv")
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise FrinkError(f"bad head counts: {n_head} query heads, {n_head_kv} KV heads")
    head_dim_k = int(_get(md, key("attention.key_length"), n_embd // n_head))
    head_dim_v = int(_get(md, key("attention.value_length"), head_dim_k))
    n_ff = _per_layer_int(_get(md, key("feed_forward_length"), required=True), n_layer, "feed_forward_length")

    names = set(ckpt.tensors.names())
    # Every layer holds at least one tensor, so a block count above the tensor count is a
    # corrupt header; checking here keeps per-layer lists (swa_layers, info) from
    # allocating billions of entries.
    if not 0 < n_layer <= len(names):
        raise FrinkError(f"{ckpt.path}: block_count {n_layer} does not fit the file's {len(names)} tensors")
    sizes = {"embedding_length": n_embd, "attention.key_length": head_dim_k,
             "attention.value_length": head_dim_v, "feed_forward_length": n_ff}
    for what, value in sizes.items():
        if value <= 0:
            raise FrinkError(f"{ckpt.path}: bad model metadata ({arch}.{what} = {value})")
    if "token_embd.weight" not in names:
        raise FrinkError(f"{ckpt.path}: no token_embd.weight tensor")
    n_vocab = ckpt.tensors.info("token_embd.weight").shape[0]

    # Linear rope scaling only; other schemes change the frequencies in ways not carried yet.
    scaling_type = str(_get(md, key("rope.scaling.type"), "none"))
    factor = float(_get(md, key("rope.scaling.factor"), 0.0) or 0.0)
    if scaling_type not in ("none", "linear") and factor not in (0.0, 1.0):
        raise FrinkError(f"rope scaling type {scaling_type!r} is not supported")
    rope_scale = 1.0 / factor if factor > 0 else 1.0

    sliding_window = _get(md, key("attention.sliding_window"))
    sliding_window = int(sliding_window) if sliding_window else None
    swa_layers = [False] * n_layer
    if sliding_window:
        pattern = _get(md, key("attention.sliding_window_pattern"), a["swa_pattern"])
        if isinstance(pattern, (list, tuple)) or hasattr(pattern, "tolist"):
            swa_layers = [bool(x) for x in list(pattern)][:n_layer]
            if len(swa_layers) != n_layer:
                raise FrinkError(f"sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
        else:
            # llama.cpp's rule: in each group of n layers, all but the last use the window.
            n = int(pattern or 0)
            swa_layers = [n == 0 or (i % n < n - 1) for i in range(n_layer)]

    if a["attn_scale_rule"] == "gemma3" and n_layer == 62:
        # Gemma 3 27B scales by n_embd / n_head (its query_pre_attn_scalar), as llama.cpp does.
        default_scale = 1.0 / math.sqrt(n_embd / n_head)
    else:
        default_scale = 1.0 / math.sqrt(head_dim_k)
    attn_scale = float(_get(md, key("attention.scale"), default_scale))

    embd_scale = math.sqrt(n_embd) if a["embd_scale"] == "sqrt_n_embd" else None

    def positive_or_none(v: Any) -> float | None:
        return float(v) if v else None

    return ModelConfig(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ff=n_ff,
        n_vocab=n_vocab,
        n_ctx_train=int(_get(md, key("context_length"), 4096)),
        norm_eps=float(_get(md, key("attention.layer_norm_rms_epsilon"), 1e-5)),
        rope_type=a["rope_type"],
        rope_dim=int(_get(md, key("rope.dimension_count"), head_dim_k)),
        rope_base=float(_get(md, key("rope.freq_base"), 10000.0)),
        rope_scale=rope_scale,
        rope_base_swa=float(_get(md, key("rope.freq_base_swa"), a["rope_base_swa"] or _get(md, key("rope.freq_base"), 10000.0))),
        attn_scale=attn_scale,
        sliding_window=sliding_window,
        swa_layers=tuple(swa_layers),
        ffn_act=a["ffn_act"],
        qk_norm=bool(a["qk_norm"]),
        post_attn_norm=bool(a["post_attn_norm"]),
        post_ffn_norm=bool(a["post_ffn_norm"]),
        embd_scale=embd_scale,
        final_logit_softcap=positive_or_none(_get(md, key("final_logit_softcapping"))),
        attn_logit_softcap=positive_or_none(_get(md, key("attn_logit_softcapping"))),
        tied_embeddings="output.weight" not in names,
        has_rope_freqs="rope_freqs.weight" in names,
    )
