"""LoRA adapters as the weights carry them: unmerged, beside the base matrix they adapt.

A LoRA adapter adds `s * B (A x)` to a linear's output, where A is [r, in], B [out, r] and
s the user's scale times the adapter's own factor (alpha / r; alpha / sqrt(r) with
rsLoRA; llama.cpp's 1 where alpha is 0). The base matrix is left as it is (a quantized
base stays in its blocks): each `Linear` a targeted tensor's rows live in holds a
`LoraPart` per adapter (model/linear.py), and the host's linear op adds the low-rank
product (backends/host/lora.py); metal carries the same product in its traced graph,
the scales an input of it (backends/mlx/lora.py). An adapter's scale may change while the
model runs (a server's /lora-adapters): every part reads it from its `LoraAdapter`, and a
step may scale each of its sequences differently (`adapter_scales`, a server's
per-request `lora`). Merged at load instead (`--lora-merge`, `merge=True`), an adapted
Linear's rows become f32 with `s * B A` added once: faster, the scales then fixed.

Adapters are named in the base's GGUF convention ("blk.0.attn_q.weight"); reading one
from a file and checking it against the base is archs/lora_files.py's job.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import numpy as np

from ..errors import FrinkError
from .linear import Linear, dequantized


@dataclass(eq=False)
class LoraAdapter:
    """One adapter: its (A, B) pair per adapted tensor of the base, by GGUF tensor name,
    and its scales. `scale` is the user's (--lora-scaled; 0 leaves the adapter loaded but
    off); the product is scaled by `scale * factor`. Compared by identity: a request names
    an adapter by its index in the model's list."""

    path: str
    alpha: float
    rank: int
    pairs: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (A [r, in], B [out, r]) f32
    scale: float = 1.0
    rslora: bool = False
    # The pairs' names some Linear of the loaded model carries (with_lora): a name left out
    # once every layer has loaded targets a matrix no linear multiplies (unattached()).
    attached: set[str] = field(default_factory=set)

    def unattached(self) -> list[str]:
        return sorted(set(self.pairs) - self.attached)

    @property
    def factor(self) -> float:
        """The adapter's own multiplier: alpha / r (PEFT; llama.cpp's `get_scale`), alpha /
        sqrt(r) with rsLoRA, 1 where alpha is 0 (llama.cpp's convention)."""
        if not self.alpha:
            return 1.0
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


@dataclass(frozen=True, eq=False)
class LoraPart:
    """One adapter's pair on the rows [row0, row0 + B's rows) of a (possibly fused) Linear."""

    adapter: LoraAdapter
    row0: int
    a: np.ndarray  # [r, in] f32, C-contiguous
    b: np.ndarray  # [rows, r] f32, C-contiguous


@dataclass
class LoraSet:
    """The adapters a model was loaded with, in order (a request's `lora` ids index it)."""

    adapters: list[LoraAdapter] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.adapters)

    def targets(self) -> set[str]:
        return {name for ad in self.adapters for name in ad.pairs}


def check_attached(adapters: Sequence[LoraAdapter]) -> None:
    """FrinkError naming an adapter's pairs that no Linear of the loaded model carries
    (call once every layer has loaded)."""
    for ad in adapters:
        missing = ad.unattached()
        if missing:
            raise FrinkError(
                f"{ad.path}: LoRA targets that no linear of the model multiplies: "
                + ", ".join(missing[:4])
            )


# Per sequence of the step (in row order): the scale each adapter gets there (an adapter
# absent from a mapping: scale 0). None outside adapter_scales: every adapter's own scale.
_scales: ContextVar[tuple[Mapping[LoraAdapter, float], ...] | None] = ContextVar(
    "frink_lora_scales", default=None
)


@contextmanager
def adapter_scales(per_sequence: Sequence[Mapping[LoraAdapter, float]]) -> Iterator[None]:
    """The linears of the step run inside scale each adapter per sequence as these say."""
    token = _scales.set(tuple(per_sequence))
    try:
        yield
    finally:
        _scales.reset(token)


def sequence_scales() -> tuple[Mapping[LoraAdapter, float], ...] | None:
    """The step's per-sequence scales (adapter_scales), or None: the adapters' own."""
    return _scales.get()


def merged(lin: Linear) -> Linear:
    """lin with its parts' `s * B A` added to its rows at their current scales: an f32 copy
    of the matrix (a quantized one dequantized), no parts left, `merged` set."""
    if not lin.lora:
        return lin
    w = np.array(dequantized(lin.w), np.float32, copy=True)  # never the base's own rows
    for part in lin.lora:
        s = np.float32(part.adapter.scale * part.adapter.factor)
        if s:
            w[part.row0 : part.row0 + part.b.shape[0]] += s * (part.b @ part.a)
    return replace(lin, w=w, lora=(), merged=True)


def with_lora(lin: Linear, adapters: Sequence[LoraAdapter], merge: bool = False) -> Linear:
    """lin with a LoraPart for every adapter pair on one of its source tensors (lin itself
    where none applies), at the rows that source's rows take in lin; merge: those parts
    added into its matrix instead (merged())."""
    if not adapters or not lin.sources:
        return lin
    counts = lin.source_rows or ((lin.shape[0],) if len(lin.sources) == 1 else ())
    if len(counts) != len(lin.sources):
        return lin  # rows of unknown extent: its pairs stay unattached (refused at load)
    parts: list[LoraPart] = list(lin.lora)
    row0 = 0
    for name, rows in zip(lin.sources, counts):
        for ad in adapters:
            pair = ad.pairs.get(name)
            if pair is not None:
                parts.append(LoraPart(ad, row0, pair[0], pair[1]))
                ad.attached.add(name)
        row0 += rows
    if len(parts) == len(lin.lora):
        return lin
    out = replace(lin, lora=tuple(parts))
    return merged(out) if merge else out


def attach(obj: Any, adapters: Sequence[LoraAdapter], merge: bool = False) -> Any:
    """obj (a layer's weights, a dataclass of Linears and arrays, or a Linear) with every
    Linear whose sources an adapter targets carrying that adapter's parts (merge: added
    into its matrix, with_lora)."""
    if not adapters or obj is None:
        return obj
    if isinstance(obj, Linear):
        return with_lora(obj, adapters, merge)
    if is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in fields(obj):
            v = getattr(obj, f.name)
            new = attach(v, adapters, merge)
            if new is not v:
                changes[f.name] = new
        return replace(obj, **changes) if changes else obj
    return obj
