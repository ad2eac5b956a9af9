"""A pipeline's steps: rank 0 leads, every other rank follows.

Rank 0 runs the program (run, bench, serve: tokenizing, sampling, the engine) with a
`LeadDecoder`: a Decoder whose forward embeds the tokens, runs rank 0's layers, and sends
the hidden rows on with the step's description (which caches, how many rows each, their
lengths, the head wanted). Each following rank (`follow`) receives them from the rank
before, runs its own layers over its own caches with the same decoder loop (its backend's
runs and traced graphs, one submission per run) and sends the rows on; the last rank runs
the head and sends the logits back to rank 0. All messages go to the next rank of the
ring, so each link carries one direction.

A long prompt goes in micro-batches (`LeadDecoder.micro_batch` rows each): rank 0 sends
each part on as soon as its layers are done with it and goes on to the next, so rank r
works on part i while rank r+1 works on part i-1. Every part but the last is marked
`more`: the last rank holds its output (the head's rows, if every row's are wanted) and
answers once, after the last part, so messages flow one way round the ring and rank 0
never sends while the last rank is sending to it.

Caches live where their layers do: a follower keeps one cache per rank-0 cache id, made
on first sight, truncated when rank 0's is shorter (its prompt cache reusing a prefix),
dropped when rank 0's is freed (the ids ride on the next step).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from ..backends.host.linear import sequences
from ..cache import KvCache, SeqBatch
from ..cache.kv_cache import CacheSnapshot
from ..cache.paged import PagePools
from ..decoder import Decoder, step_positions
from ..errors import FrinkError
from .group import Group, PeerLost

STOP, STEP, LEDGERS = 0, 1, 2
SKIP = "skip"  # a part of a prompt whose rows nobody wants back (the head is the last's)
_HEADS = {None: 0, "last": 1, "all": 2, SKIP: 3}
_HEAD_NAMES = {v: k for k, v in _HEADS.items()}
_HEADER = 10  # int64s: op, rows, width, head, batch, n_seqs, n_freed, n_states, more, part
MICRO_BATCH = 64  # prompt rows per part (a GDN chunk: the recurrent parts cut alike)
_SEQ = 5  # int64s per sequence: cache id, n_past, new rows, n_ctx, rewind
SAVE, RESTORE = 0, 1  # recurrent state: (what, cache id, n_past), 3 int64s each
_KEPT_STATES = 8  # saved states a follower keeps per sequence (the engine keeps 4)


@dataclass(frozen=True)
class Step:
    """What a step asks of a stage, as it travels the ring with the rows."""

    op: int
    head: str | None = None
    batch: bool = False
    seqs: tuple[tuple[int, ...], ...] = ()
    freed: tuple[int, ...] = ()
    states: tuple[tuple[int, int, int], ...] = ()  # rank 0's saves and restores, in order
    more: bool = False  # more parts of this prompt follow: the last rank answers after them
    part: int = 0  # which part of the prompt (0: a new step; what was held is stale)


def send_step(group: Group, step: Step, x: np.ndarray | None) -> None:
    rows, width = x.shape if x is not None else (0, 0)
    header = [step.op, rows, width, _HEADS[step.head], step.batch, len(step.seqs)]
    header += [len(step.freed), len(step.states), step.more, step.part]
    group.send(np.array(header, np.int64), group.next)
    body = [v for s in step.seqs for v in s] + list(step.freed)
    body += [v for s in step.states for v in s]
    if body:
        group.send(np.array(body, np.int64), group.next)
    if x is not None and rows:
        group.send(x.astype(np.float32, copy=False), group.next)


def recv_step(group: Group) -> tuple[Step, np.ndarray | None]:
    """The next step and its rows; waits as long as rank 0 takes to send one."""
    op, rows, width, head, batch, n_seqs, n_freed, n_states, more, part = group.recv(
        (_HEADER,), np.int64, group.prev, bounded=False
    ).tolist()
    n_body = n_seqs * _SEQ + n_freed + 3 * n_states
    body = group.recv((n_body,), np.int64, group.prev).tolist() if n_body else []
    seqs = tuple(tuple(body[i * _SEQ : (i + 1) * _SEQ]) for i in range(n_seqs))
    at = n_seqs * _SEQ + n_freed
    freed = tuple(body[n_seqs * _SEQ : at])
    states = tuple((body[i], body[i + 1], body[i + 2]) for i in range(at, n_body, 3))
    step = Step(op, _HEAD_NAMES[head], bool(batch), seqs, freed, states, bool(more), part)
    x = group.recv((rows, width), np.float32, group.prev) if rows else None
    return step, x


def send_rows(group: Group, to: int, x: np.ndarray) -> None:
    group.send(np.array(x.shape, np.int64), to)
    group.send(x.astype(np.float32, copy=False), to)


def recv_rows(group: Group, frm: int) -> np.ndarray:
    shape = tuple(group.recv((2,), np.int64, frm).tolist())
    return group.recv(shape, np.float32, frm)


class LeadCache(KvCache):
    """Rank 0's cache: a saved or restored recurrent state is told to the other ranks
    (with the next step), which save or restore their own layers' state alike."""

    lead: LeadDecoder

    def snapshot(self) -> CacheSnapshot:
        snap = super().snapshot()
        self.lead.tell_state(self, SAVE)
        return snap

    def restore(self, snap: CacheSnapshot) -> None:
        super().restore(snap)
        self.lead.tell_state(self, RESTORE)


class LeadDecoder(Decoder):
    """Rank 0's decoder: its own layers here, the rest on the ranks after it; the logits
    (or, without a head, the last layer's rows) come back from the last rank."""

    def __init__(self, *args, group: Group, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group = group
        self._ids: weakref.WeakKeyDictionary[KvCache, int] = weakref.WeakKeyDictionary()
        self._next_id = 1
        self._freed: list[int] = []
        self._states: list[tuple[int, int, int]] = []
        self.closed = False
        self.micro_batch = MICRO_BATCH  # a prompt's rows per part (the whole step: 0)
        self._spent = 0.0  # this step's compute so far, over its parts
        # Called with the error when a rank is lost (pipeline.py: a server stops itself).
        self.on_lost: Callable[[PeerLost], None] | None = None

    def _cache_id(self, cache: KvCache) -> int:
        cid = self._ids.get(cache)
        if cid is None:
            cid = self._ids[cache] = self._next_id
            self._next_id += 1
            weakref.finalize(cache, self._freed.append, cid)
        return cid

    def new_cache(self, n_ctx: int, rewind: int = 0, pool: PagePools | None = None) -> KvCache:
        """A cache whose steps the other stages follow (a pipeline is never paged: the
        serve engine's paging.refusal names it)."""
        assert pool is None, "a pipeline's caches are not paged"
        cache = LeadCache(
            self.cfg, n_ctx, types=self.cache_types, rewind=rewind, layers=self.layers
        )
        cache.lead = self
        return cache

    def tell_state(self, cache: KvCache, what: int) -> None:
        if cache.has_recurrent_state:
            self._states.append((what, self._cache_id(cache), cache.n_past))

    def _forward(
        self, ids: np.ndarray, cache: KvCache | SeqBatch, head: str | None
    ) -> tuple[np.ndarray, bool]:
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        if T == 0:
            return np.zeros((0, self.cfg.residual_width), np.float32), False
        if self.closed:
            raise FrinkError("pipeline: the other ranks were stopped")
        cache.check_room(T)
        # One sequence's prompt goes in parts (a batch's rows stay one step).
        size = self.micro_batch if self.micro_batch > 0 and not isinstance(cache, SeqBatch) else T
        cuts = list(range(0, T, size)) + [T]
        self._spent = 0.0
        try:
            for part, (a, b) in enumerate(zip(cuts, cuts[1:])):
                more = b < T
                wanted = (SKIP if head == "last" else head) if more else head
                self._send_part(ids[a:b], cache, Step(STEP, wanted, more=more, part=part))
            out = recv_rows(self.group, self.group.prev)
        except PeerLost as e:
            self.closed = True  # nothing more can be sent; close() has nothing to stop
            if self.on_lost is not None:
                self.on_lost(e)
            raise
        return out, head is not None

    def _send_part(self, ids: np.ndarray, cache: KvCache | SeqBatch, step: Step) -> None:
        """Rank 0's layers over `ids` (the whole step, or one part of a prompt), then the
        rows on to rank 1 with `step` completed (its caches, freed ids, saved states); the
        cache moves past them."""
        T = len(ids)
        cache.check_room(T)
        positions = step_positions(cache, T)
        t0 = time.perf_counter()
        x = self.host.embed(ids, positions)
        x, _ = self.run_layers(x, positions, cache, None)
        # The others run about as many layers each, on every part sent so far: waits
        # beyond a multiple of that are a frozen rank (group.py's watchdog).
        self._spent += time.perf_counter() - t0
        self.group.expect(self._spent)
        parts = cache.caches if isinstance(cache, SeqBatch) else [cache]
        counts = cache.counts if isinstance(cache, SeqBatch) else [T]
        seqs = tuple(
            (self._cache_id(c), c.n_past, n, c.n_ctx, c.rewind) for c, n in zip(parts, counts)
        )
        # Emptied in place: each cache's finalizer holds this very list's append.
        freed = tuple(self._freed)
        del self._freed[: len(freed)]
        states, self._states = tuple(self._states), []
        batch = isinstance(cache, SeqBatch)
        step = replace(step, batch=batch, seqs=seqs, freed=freed, states=states)
        send_step(self.group, step, x)
        cache.commit(T)

    def ledgers(self) -> list[dict]:
        """Every following rank's ledger summary, in rank order (rank 0's is its own)."""
        send_step(self.group, Step(LEDGERS), None)
        got = recv_rows(self.group, self.group.prev)
        return [json.loads(b) for b in got.astype(np.uint8).tobytes().decode().splitlines()]

    def close(self) -> None:
        """Stop the following ranks (they exit their loop); waits for the last one's word."""
        if self.closed:
            return
        self.closed = True
        send_step(self.group, Step(STOP), None)
        recv_rows(self.group, self.group.prev)


def ledger_summary(decoder: Decoder, rank: int) -> dict:
    backend = decoder.backend
    ledger = backend.ledger if backend is not None else None
    layers = decoder.layers
    return {
        "rank": rank,
        "layers": [layers.start, layers.stop],
        "submissions": dict(ledger.submissions) if ledger is not None else {},
        "refusals": dict(ledger.refusals) if ledger is not None else {},
        "failures": dict(ledger.failures) if ledger is not None else {},
    }


class Follower:
    """A following rank: its decoder (its own layers) and its caches, by rank 0's ids."""

    def __init__(self, decoder: Decoder, group: Group) -> None:
        self.decoder = decoder
        self.group = group
        self.caches: dict[int, KvCache] = {}
        self.saved: dict[int, dict[int, CacheSnapshot]] = {}  # per cache id, by n_past
        self.last = group.rank == group.size - 1
        self.held: list[np.ndarray] = []  # the last rank's output of a prompt's parts so far
        self.steps = 0  # steps (a prompt's parts each) this rank ran

    def _cache(self, cid: int, n_past: int, n_ctx: int, rewind: int) -> KvCache:
        c = self.caches.get(cid)
        if c is None or c.n_past < n_past:
            if c is not None or n_past:
                raise FrinkError(
                    f"pipeline: rank {self.group.rank} holds {c.n_past if c else 0} rows of a "
                    f"sequence rank 0 has {n_past} of"
                )
            c = self.caches[cid] = self.decoder.new_cache(n_ctx, rewind)
        if c.n_past > n_past:
            c.truncate(n_past)  # rank 0's is shorter: its prompt cache reused a prefix
        return c

    def _state(self, what: int, cid: int, n_past: int) -> None:
        """Save or restore this rank's part of a sequence's recurrent state, as rank 0 did."""
        cache, saved = self.caches.get(cid), self.saved.setdefault(cid, {})
        if what == SAVE and cache is not None and cache.n_past == n_past:
            saved[n_past] = cache.snapshot()
            for old in sorted(saved)[:-_KEPT_STATES]:
                del saved[old]
        elif what == RESTORE and cache is not None and n_past in saved:
            cache.restore(saved[n_past])
        elif what == RESTORE:
            raise FrinkError(f"pipeline: rank {self.group.rank} has no saved state at {n_past}")

    def step(self, step: Step, x: np.ndarray) -> np.ndarray:
        """This rank's layers over x (and the head, on the last rank)."""
        for cid in step.freed:
            self.caches.pop(cid, None)
            self.saved.pop(cid, None)
        for what, cid, n_past in step.states:
            self._state(what, cid, n_past)
        parts = [self._cache(cid, n, n_ctx, rewind) for cid, n, _, n_ctx, rewind in step.seqs]
        counts = [s[2] for s in step.seqs]
        cache: KvCache | SeqBatch = SeqBatch(parts, counts) if step.batch else parts[0]
        T = len(x)
        cache.check_room(T)
        positions = step_positions(cache, T)
        dec = self.decoder
        head = step.head if self.last and step.head != SKIP else None
        # As rank 0's Decoder.step_batch_rows: a batch's linears see each sequence's rows.
        with sequences(counts) if step.batch else nullcontext():
            out, is_logits = dec.run_layers(x, positions, cache, head)
        if head is not None and not is_logits:
            if head == "last":
                out = out[[s - 1 for s in np.cumsum(counts).tolist()]]
            rows = [1] * len(out) if head == "last" else counts
            with sequences(rows) if step.batch else nullcontext():
                out = dec.logits(out)
        cache.commit(T)
        return out

    def run(self) -> None:
        """Follow rank 0's steps until it stops the pipeline."""
        group = self.group
        spent = 0.0  # compute over the parts of this step so far
        while True:
            step, x = recv_step(group)
            if step.op == STEP and x is not None:
                if step.part == 0:  # a new step: nothing held or spent is its
                    self.held, spent = [], 0.0
                t0 = time.perf_counter()
                out = self.step(step, x)
                self.steps += 1
                spent += time.perf_counter() - t0
                group.expect(spent)
                if not self.last:
                    send_step(group, step, out)
                    continue
                if step.head != SKIP:
                    self.held.append(out)
                if not step.more:
                    send_rows(group, group.next, np.concatenate(self.held))
                    self.held = []
            elif step.op == LEDGERS:
                self._pass_ledgers(step)
            else:
                if self.last:
                    send_rows(group, group.next, np.zeros((0, 0), np.float32))
                else:
                    send_step(group, step, None)
                return

    def _pass_ledgers(self, step: Step) -> None:
        """Each rank adds its ledger summary to those before it; the last sends all to 0."""
        group = self.group
        before = recv_rows(group, group.prev) if group.rank > 1 else np.zeros((1, 0), np.float32)
        lines = before.astype(np.uint8).tobytes()
        mine = dict(ledger_summary(self.decoder, group.rank), steps=self.steps)
        lines += (json.dumps(mine) + "\n").encode()
        rows = np.frombuffer(lines, np.uint8).astype(np.float32)[None]
        if self.last:
            send_rows(group, group.next, rows)
        else:
            send_step(group, step, None)
            send_rows(group, group.next, rows)
