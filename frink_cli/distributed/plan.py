"""Which layers each rank of a pipeline runs, and the start check that every rank agrees.

A model's layers are cut into one contiguous run per rank: in proportion to
`--layer-split` (llama.cpp's tensor-split spelling: "3,1" gives the first rank three
quarters), else so that each rank's share of the file's bytes follows its physical memory:
the first rank also holds the token embedding and the last the output head (the same table
again when the two are tied), so by default the end ranks take fewer layers. Each rank
reads only its own tensors.

Before any token, every rank's model file digest, frink version, backend and split are
gathered and compared: a mismatch is one FrinkError naming the ranks that differ.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .. import __version__
from ..errors import FrinkError
from ..formats.checkpoint import TensorInfo, TensorSource
from ..model.config import ModelConfig
from .group import Group

_LAYER = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class StagePlan:
    """One rank's part of the model: its layers, and whether it embeds / runs the head."""

    rank: int
    size: int
    layers: range
    splits: tuple[range, ...]

    @property
    def ends(self) -> tuple[bool, bool]:
        return self.rank == 0, self.rank == self.size - 1

    def reads(self, tensor: str) -> bool:
        """Whether this stage must read `tensor` (the others' layers and ends it skips)."""
        m = _LAYER.match(tensor)
        if m:
            return int(m.group(1)) in self.layers
        if tensor.startswith("token_embd.weight"):
            return self.ends[0]
        if tensor.startswith("output.weight"):
            return self.ends[1]
        return True


def parse_split(text: str, size: int) -> list[float]:
    """--layer-split "a,b,...": one non-negative weight per rank, not all zero."""
    try:
        weights = [float(p) for p in text.split(",")]
    except ValueError:
        raise FrinkError(f"--layer-split {text!r}: expected numbers separated by commas") from None
    if len(weights) != size or min(weights) < 0 or sum(weights) <= 0:
        raise FrinkError(
            f"--layer-split {text!r}: needs {size} non-negative weights (one per rank), "
            "not all zero"
        )
    return weights


def split_layers(n_layer: int, weights: list[float]) -> tuple[range, ...]:
    """Contiguous runs of layers in proportion to `weights` (largest remainders), each rank
    given at least one layer when there are enough."""
    if n_layer < len(weights):
        raise FrinkError(f"pipeline: {len(weights)} ranks for a model of {n_layer} layers")
    total = sum(weights)
    exact = [n_layer * w / total for w in weights]
    counts = [max(1, int(e)) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: int(exact[i]) - exact[i])
    i = 0
    while sum(counts) < n_layer:
        counts[order[i % len(order)]] += 1
        i += 1
    while sum(counts) > n_layer:
        big = max(range(len(counts)), key=lambda j: counts[j] - exact[j])
        counts[big] -= 1
    runs, start = [], 0
    for n in counts:
        runs.append(range(start, start + n))
        start += n
    return tuple(runs)


def stored_bytes(info: TensorInfo) -> float:
    """A tensor's bytes as the file stores it (4 per weight for a type gguf-py does not
    size: it is held dequantized)."""
    n = math.prod(info.shape)
    try:
        elems, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[info.dtype]]
    except KeyError:
        return 4.0 * n
    return n * nbytes / elems


def memory_shares(cfg: ModelConfig, tensors: TensorSource, mems: list[float]) -> list[float]:
    """Per rank, how many layers' worth of bytes it should run (split_layers' weights), so
    that its layers plus the ends it holds (the embedding on the first rank, the head on
    the last) follow its memory `mems[r]` over the whole file."""
    per_layer = [0.0] * cfg.n_layer
    ends: dict[str, float] = {}
    for name in tensors.names():
        size = stored_bytes(tensors.info(name))
        m = _LAYER.match(name)
        if m and int(m.group(1)) < cfg.n_layer:
            per_layer[int(m.group(1))] += size
        else:
            ends[name] = size
    layer = sum(per_layer) / cfg.n_layer or 1.0
    first = ends.get("token_embd.weight", 0.0)
    last = ends.get("output.weight", first)  # tied: the head reads the embedding table
    total = sum(per_layer) + first + last
    weights = []
    for r, mem in enumerate(mems):
        held = (first if r == 0 else 0.0) + (last if r == len(mems) - 1 else 0.0)
        weights.append(max(total * mem / sum(mems) - held, 0.0) / layer)
    return weights if sum(weights) > 0 else mems


def _memory() -> float:
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1.0


def file_digest(path: Path) -> str:
    """A digest of the model's bytes (a directory: every file's name and bytes)."""
    h = hashlib.blake2b(digest_size=16)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(16 << 20):
                h.update(chunk)
    return h.hexdigest()


def plan_stages(
    group: Group,
    cfg: ModelConfig,
    path: Path,
    tensors: TensorSource,
    backend: str,
    layer_split: str | None,
) -> StagePlan:
    """This rank's stage, after every rank's identity and split were compared."""
    mems = [json.loads(b) for b in group.gather_bytes(json.dumps(_memory()).encode())]
    if layer_split:
        weights = parse_split(layer_split, group.size)
    else:
        weights = memory_shares(cfg, tensors, mems)
    splits = split_layers(cfg.n_layer, weights)
    mine = {
        "frink version": __version__,
        "model file": file_digest(path),
        "backend": backend,
        "layer split": [[r.start, r.stop] for r in splits],
    }
    everyone = [json.loads(b) for b in group.gather_bytes(json.dumps(mine).encode())]
    for key, value in everyone[0].items():
        differ = [r for r, theirs in enumerate(everyone) if theirs[key] != value]
        if differ:
            raise FrinkError(
                f"pipeline: rank(s) {', '.join(map(str, differ))} differ from rank 0 in "
                f"{key} ({everyone[differ[0]][key]} vs {value}); start every rank alike"
            )
    return StagePlan(group.rank, group.size, splits[group.rank], splits)
