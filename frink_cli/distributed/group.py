"""The ranks of a pipeline: MLX's distributed group, as `mlx.launch` starts it.

There is no transport of frink's own here: every message is an `mx.distributed` send,
recv or all_gather of an array, over MLX's ring backend (TCP between the hostfile's
addresses; it listens only on those). A message is one `mx.eval`. A peer that stops or a
link that drops makes MLX fail the pending operation ("connection to a peer was lost");
that becomes one FrinkError naming the peer, so a rank never hangs on a dead neighbour.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..errors import FrinkError, Unavailable


class PeerLost(Unavailable):
    """A neighbouring rank stopped, or the link to it dropped."""


class Group:
    """This process's place in the ring: its rank, the group's size, and array messages to
    and from the other ranks (numpy in, numpy out)."""

    def __init__(self) -> None:
        try:
            self.g = mx.distributed.init(strict=True, backend="ring")
        except RuntimeError as e:
            raise FrinkError(f"pipeline: cannot join the ring: {e}") from e
        self.rank = self.g.rank()
        self.size = self.g.size()

    @property
    def next(self) -> int:
        return (self.rank + 1) % self.size

    @property
    def prev(self) -> int:
        return (self.rank - 1) % self.size

    def _lost(self, peer: int, e: RuntimeError) -> PeerLost:
        return PeerLost(
            f"pipeline: rank {peer} stopped or its link dropped (seen by rank {self.rank}: {e})"
        )

    def send(self, a: np.ndarray, to: int) -> None:
        try:
            mx.eval(mx.distributed.send(mx.array(np.ascontiguousarray(a)), to, group=self.g))
        except RuntimeError as e:
            raise self._lost(to, e) from e

    def recv(self, shape: tuple[int, ...], dtype: type, frm: int) -> np.ndarray:
        kind = mx.int64 if dtype is np.int64 else mx.uint8 if dtype is np.uint8 else mx.float32
        try:
            a = mx.distributed.recv(shape, kind, frm, group=self.g)
            mx.eval(a)
        except RuntimeError as e:
            raise self._lost(frm, e) from e
        return np.array(a, copy=True)

    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, in rank order (an all_gather: every rank calls it)."""
        try:
            sizes = mx.distributed.all_gather(mx.array([len(data)], mx.int64), group=self.g)
            mx.eval(sizes)
            width = int(np.array(sizes).max())
            row = np.zeros(width, np.uint8)
            row[: len(data)] = np.frombuffer(data, np.uint8)
            rows = mx.distributed.all_gather(mx.array(row)[None], group=self.g)
            mx.eval(rows)
        except RuntimeError as e:
            raise PeerLost(f"pipeline: a rank stopped before the start check: {e}") from e
        got = np.array(rows)
        return [got[r, : int(n)].tobytes() for r, n in enumerate(np.array(sizes).tolist())]
