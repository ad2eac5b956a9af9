"""What a mixer needs to run over one step: the sequences a multi-sequence step holds, and
`each_sequence`, which runs the part of a mixer that reads or writes history once per
sequence."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..ops import A, Ops


class At(NamedTuple):
    """Where a layer runs in this step, as the backend gives it: the positions (`pos`, the
    backend's step context), the layer's cache view (`kv`) and its rope (`rope`)."""

    pos: Any
    kv: Any
    rope: Any


@dataclass(frozen=True)
class SeqRows:
    """One sequence's share of a multi-sequence step, as each_sequence reads it: its layer
    state (a host cache slot, a backend's device state), its positions (the backend's `pos`
    for it), and its rows [start, stop) of the step."""

    kv: Any
    pos: Any
    start: int
    stop: int


class BatchSlot:
    """Layer l's state over a multi-sequence step: the `kv` the composition is given (the
    host's from cache.SeqBatch, a backend's from its device state)."""

    def __init__(self, sequences: list[SeqRows]) -> None:
        self.sequences = sequences


def each_sequence(ops: Ops[A], kv: Any, pos: Any, core: Callable[..., A], *rows: A | None) -> A:
    """core(kv, pos, *rows) -> its output rows: a mixer's part that reads or writes the
    sequence's history (K/V rows, recurrent state). Over a multi-sequence step (a
    BatchSlot) it runs once per sequence, on that sequence's rows, slot and positions, and
    the outputs are stacked back in row order; everything row-wise around it (the linears)
    runs over all the step's rows at once. A None row argument passes as None."""
    seqs = getattr(kv, "sequences", None)
    if seqs is None:
        return core(kv, pos, *rows)
    outs = [
        core(s.kv, s.pos, *(None if r is None else r[s.start : s.stop] for r in rows)) for s in seqs
    ]
    return outs[0] if len(outs) == 1 else ops.concat(outs, axis=0)
