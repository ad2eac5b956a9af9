"""Text embeddings: a model's last-layer rows pooled into one vector per input.

What happens after the last layer is the model folder's to say. A sentence-transformers
folder lists its modules in `modules.json`: the Transformer (the model itself), then
Pooling (its `config.json`: `cls`, `mean` or `lasttoken`), any Dense layers (a linear map
and an activation, weights in the module's `model.safetensors`) and Normalize (unit
length), applied in that order, as `SentenceTransformer.encode` applies them. A GGUF
file's `{arch}.pooling_type` names its pooling as llama.cpp numbers it (1 mean, 2 cls,
3 last). Without either: an encoder mean-pools, a decoder takes its last token (llama-
server's `--pooling mean` / `last`), and the result is normalized as llama-server does.

Many inputs run in one forward (decoder.hidden_batch): each sequence attends only over its
own rows, so nothing pads and nothing leaks between inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from .errors import FrinkError
from .formats.jsonfile import read_json

POOLINGS = ("mean", "cls", "last")
# llama.cpp's LLAMA_POOLING_TYPE_* numbers (GGUF `{arch}.pooling_type`).
GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}
# Inputs per forward: a batch's rows share one step; more inputs run in several.
BATCH = 32
IDENTITY = "torch.nn.modules.linear.Identity"
_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    IDENTITY: lambda x: x,
    "torch.nn.modules.activation.Tanh": np.tanh,
}


@dataclass
class Dense:
    """A sentence-transformers Dense module: act(x W^T + b)."""

    weight: np.ndarray  # [out, in]
    bias: np.ndarray | None  # [out]
    activation: str

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight.T
        if self.bias is not None:
            y += self.bias
        return np.asarray(_ACTIVATIONS[self.activation](y), np.float32)


@dataclass
class EmbedPlan:
    """How a model's last-layer rows become embeddings: pooling, Dense layers, normalize,
    and the longest input in tokens (max_len; None: the model's context)."""

    pooling: str = "mean"
    dense: list[Dense] = field(default_factory=list)
    normalize: bool = True
    max_len: int | None = None

    def apply(self, rows: np.ndarray) -> np.ndarray:
        """One sequence's rows [T, n_embd] -> its embedding [dim] (f32)."""
        if self.pooling == "cls":
            v = rows[0].copy()
        elif self.pooling == "last":
            v = rows[-1].copy()
        else:
            v = rows.astype(np.float64).mean(axis=0).astype(np.float32)
        for d in self.dense:
            v = d(v[None, :])[0]
        return normalized(v) if self.normalize else v


def normalized(v: np.ndarray) -> np.ndarray:
    """v / max(||v||, 1e-12) over the last axis (torch's F.normalize)."""
    n = np.sqrt(np.sum(v.astype(np.float64) ** 2, axis=-1, keepdims=True))
    return (v / np.maximum(n, 1e-12)).astype(np.float32)


def default_plan(
    encoder: bool, pooling_type: Any = None, dense: Sequence[np.ndarray] = ()
) -> EmbedPlan:
    """The plan of a model with no sentence-transformers modules: a GGUF pooling_type where
    given, else mean for an encoder and the last token for a decoder; then the GGUF's Dense
    matrices (no bias, identity), in order; normalized."""
    if pooling_type is not None and int(pooling_type) in GGUF_POOLING:
        pooling = GGUF_POOLING[int(pooling_type)]
    else:
        pooling = "mean" if encoder else "last"
    layers = [Dense(np.asarray(m, np.float32), None, IDENTITY) for m in dense]
    return EmbedPlan(pooling=pooling, dense=layers)


def check_pooling(pooling: str | None) -> None:
    """A FrinkError naming the option and the choices unless `pooling` is None or one of
    POOLINGS (llama-server's --pooling)."""
    if pooling is not None and pooling not in POOLINGS:
        raise FrinkError(f"--pooling {pooling!r}: one of {', '.join(POOLINGS)}")


def with_pooling(plan: EmbedPlan, pooling: str | None) -> EmbedPlan:
    """`plan` pooled by `pooling` instead (mean, cls or last); None keeps it."""
    check_pooling(pooling)
    return plan if pooling is None else dataclasses.replace(plan, pooling=pooling)


def read_plan(folder: Path, encoder: bool) -> EmbedPlan:
    """The plan a model folder states in its modules.json (default_plan without one)."""
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return default_plan(encoder)
    modules = read_json(modules_path, "modules.json")
    if not isinstance(modules, list):
        raise FrinkError(f"{modules_path}: not a list of modules")
    plan = EmbedPlan(normalize=False)
    for m in modules:
        kind = str(m.get("type", "")) if isinstance(m, dict) else ""
        where = folder / str(m.get("path", "")) if isinstance(m, dict) else folder
        name = kind.rsplit(".", 1)[-1]
        if name == "Transformer":
            plan.max_len = _max_seq_length(where)
        elif name == "Pooling":
            plan.pooling = _pooling(where / "config.json")
        elif name == "Dense":
            plan.dense.append(_dense(where))
        elif name == "Normalize":
            plan.normalize = True
        else:
            raise FrinkError(f"{modules_path}: module {kind!r} is not supported")
    return plan


def _config(path: Path) -> dict[str, Any]:
    data = read_json(path, "module config")
    if not isinstance(data, dict):
        raise FrinkError(f"{path}: not a JSON object")
    return data


def _max_seq_length(where: Path) -> int | None:
    path = where / "sentence_bert_config.json"
    if not path.is_file():
        return None
    n = _config(path).get("max_seq_length")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _pooling(path: Path) -> str:
    """The one pooling mode a Pooling module's config.json switches on."""
    cfg = _config(path)
    if isinstance(cfg.get("pooling_mode"), str):  # newer configs name it
        named = {"cls": "cls", "mean": "mean", "lasttoken": "last"}
        mode = cfg["pooling_mode"]
        if mode not in named:
            raise FrinkError(f"{path}: pooling mode {mode!r} is not supported")
        return named[mode]
    on = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    modes = {
        "pooling_mode_cls_token": "cls",
        "pooling_mode_mean_tokens": "mean",
        "pooling_mode_lasttoken": "last",
    }
    if len(on) != 1 or on[0] not in modes:
        raise FrinkError(f"{path}: pooling {on} is not supported (one of cls, mean, lasttoken)")
    return modes[on[0]]


def _dense(where: Path) -> Dense:
    cfg = _config(where / "config.json")
    act = cfg.get("activation_function", "torch.nn.modules.linear.Identity")
    if act not in _ACTIVATIONS:
        raise FrinkError(f"{where}: Dense activation {act!r} is not supported")
    weights = where / "model.safetensors"
    if not weights.is_file():
        raise FrinkError(f"{where}: a Dense module needs model.safetensors")
    t = load_file(str(weights))
    if "linear.weight" not in t:
        raise FrinkError(f"{weights}: no linear.weight")
    bias = t.get("linear.bias")
    return Dense(
        t["linear.weight"].astype(np.float32),
        None if bias is None else bias.astype(np.float32),
        act,
    )


def embed_ids(decoder: Any, seqs: Sequence[Sequence[int]], plan: EmbedPlan) -> np.ndarray:
    """Token id sequences -> their embeddings [len(seqs), dim], BATCH inputs per forward."""
    out: list[np.ndarray] = []
    for i in range(0, len(seqs), BATCH):
        chunk = [np.asarray(s, dtype=np.int64) for s in seqs[i : i + BATCH]]
        out.extend(plan.apply(rows) for rows in decoder.hidden_batch(chunk))
    return np.stack(out) if out else np.zeros((0, 0), np.float32)
