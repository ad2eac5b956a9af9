"""The ranks of a pipeline: MLX's distributed group, as `mlx.launch` starts it.

There is no transport of frink's own here: every message is an `mx.distributed` send,
recv or all_gather of an array, over MLX's ring backend (TCP between the hostfile's
addresses; it listens only on those). A message is one `mx.eval`. A peer that stops or a
link that drops makes MLX fail the pending operation ("connection to a peer was lost");
that becomes one FrinkError naming the peer, so a rank never hangs on a dead neighbour.

A peer that is alive but frozen (stopped, swapping, wedged) fails nothing: MLX would wait
on it forever. So every message runs on one ring thread while the caller waits at most
`patience` seconds for it (the watchdog); past that the group is broken and the caller
gets a PeerLost naming the frozen rank (a rank on this host found stopped, else the
peer waited on). `patience` is set per step by whoever knows how long the step should
take (stage.py: a floor plus a multiple of this rank's own compute); a follower's wait
for rank 0's next step, which may come at any time, is unbounded.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

import mlx.core as mx
import numpy as np

from ..errors import FrinkError, Unavailable

T = TypeVar("T")

# The least time any message may take before its peer is called frozen (seconds);
# FRINK_PIPELINE_PATIENCE overrides it. Beyond it a message may take PATIENCE_FACTOR
# times what the step's compute took on this rank, per other rank.
PATIENCE_FLOOR = 5.0
PATIENCE_FACTOR = 10.0


class PeerLost(Unavailable):
    """A neighbouring rank stopped, froze, or the link to it dropped."""


def patience_floor() -> float:
    try:
        return max(0.1, float(os.environ.get("FRINK_PIPELINE_PATIENCE", PATIENCE_FLOOR)))
    except ValueError:
        return PATIENCE_FLOOR


def _stopped(pid: int) -> bool:
    """Whether process `pid` (on this host) is stopped (SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class Group:
    """This process's place in the ring: its rank, the group's size, and array messages to
    and from the other ranks (numpy in, numpy out), each watched (see the module)."""

    def __init__(self) -> None:
        try:
            self.g = mx.distributed.init(strict=True, backend="ring")
        except RuntimeError as e:
            raise FrinkError(f"pipeline: cannot join the ring: {e}") from e
        self.rank = self.g.rank()
        self.size = self.g.size()
        self.floor = patience_floor()
        self.patience = self.floor
        self.broken: PeerLost | None = None
        # A daemon thread: one stuck on a frozen peer must not keep the process alive.
        self._ops: queue.Queue[tuple[Callable[[], object], cf.Future]] = queue.Queue()
        threading.Thread(target=self._serve_ops, name="frink-ring", daemon=True).start()
        me = json.dumps([socket.gethostname(), os.getpid()]).encode()
        self.peers = [tuple(json.loads(b)) for b in self.gather_bytes(me)]

    @property
    def next(self) -> int:
        return (self.rank + 1) % self.size

    @property
    def prev(self) -> int:
        return (self.rank - 1) % self.size

    def expect(self, compute_s: float) -> None:
        """This rank's step took compute_s: the others' parts should take about as long."""
        self.patience = self.floor + PATIENCE_FACTOR * (self.size - 1) * compute_s

    def _lost(self, peer: int, e: RuntimeError) -> PeerLost:
        return PeerLost(
            f"pipeline: rank {peer} stopped or its link dropped (seen by rank {self.rank}: {e})"
        )

    def _frozen(self, peer: int, waited: float) -> PeerLost:
        host = socket.gethostname()
        stopped = [r for r, (h, pid) in enumerate(self.peers) if h == host and _stopped(pid)]
        who = f"rank {stopped[0]}" if stopped else f"rank {peer}"
        return PeerLost(
            f"pipeline: {who} froze: no answer in {waited:.1f} s (seen by rank {self.rank})"
        )

    def _watched(self, op: Callable[[], T], peer: int, bounded: bool = True) -> T:
        """op() on the ring thread; PeerLost if it fails, or outlasts the patience."""
        if self.broken is not None:
            raise self.broken
        wait = self.patience if bounded else None
        future: cf.Future[T] = cf.Future()
        self._ops.put((op, future))
        try:
            return future.result(timeout=wait)
        except cf.TimeoutError:
            self.broken = self._frozen(peer, wait or 0.0)
        except RuntimeError as e:
            self.broken = self._lost(peer, e)
        raise self.broken

    def _serve_ops(self) -> None:
        while True:
            op, future = self._ops.get()
            try:
                future.set_result(op())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(e)

    def send(self, a: np.ndarray, to: int) -> None:
        arr = mx.array(np.ascontiguousarray(a))
        self._watched(lambda: mx.eval(mx.distributed.send(arr, to, group=self.g)), to)

    def recv(
        self, shape: tuple[int, ...], dtype: type, frm: int, bounded: bool = True
    ) -> np.ndarray:
        """An array from rank `frm`; `bounded=False`: wait as long as it takes (a follower
        waiting for rank 0's next step)."""
        kind = mx.int64 if dtype is np.int64 else mx.uint8 if dtype is np.uint8 else mx.float32

        def op() -> np.ndarray:
            a = mx.distributed.recv(shape, kind, frm, group=self.g)
            mx.eval(a)
            return np.array(a, copy=True)

        return self._watched(op, frm, bounded)

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
