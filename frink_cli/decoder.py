"""The decoder loop: one forward step over a batch of new tokens, through runs of layers.

For each layer it asks the backend (if any) for a run; refused layers run on the host
body. The cache is checked for room before any layer writes, and committed only after
the last layer, so a step that fails leaves the cache as it was.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np

from .backends import Backend, HeadBackend, LaunchFailed, Refusal
from .backends.host.body import HostBody
from .backends.host.linear import ThreadChoice, few_rows, sequences, step_threads
from .cache import KvCache, SeqBatch
from .cache.kv_types import F32_CACHE, CacheTypes
from .cache.paged import PagePools
from .model.config import ModelConfig
from .model.lora import LoraAdapter, adapter_scales
from .model.weights import LayerStore, ModelWeights

# Rows a prompt is fed in per step by prefill() (llama.cpp's default n_ubatch): a long
# prompt's activations ([rows, ffn width] per layer) stay bounded whatever its length.
PREFILL_ROWS = 512


def step_positions(cache: KvCache | SeqBatch, T: int) -> np.ndarray:
    """The positions of a step's T new rows: after the cache's, or each sequence's own."""
    if isinstance(cache, SeqBatch):
        return cache.positions()
    return np.arange(cache.n_past, cache.n_past + T)


class Decoder:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights,
        backend: Backend | None = None,
        cache_types: CacheTypes = F32_CACHE,
        layers: range | None = None,
    ) -> None:
        """`layers`: the layers this decoder runs, all by default; a pipeline stage
        (frink_cli/distributed) runs a contiguous part, and loads and uploads only that."""
        self.cfg = cfg
        self.layers = layers if layers is not None else range(cfg.n_layer)
        self.cache_types = cache_types  # every cache new_cache makes
        self.host = HostBody(cfg, weights)
        self.backend = backend
        # BLAS threads for one-row steps, chosen by timing them (backends/host/linear.py); and for
        # prefill layers, per (kind of layer, batch size): a repeated prompt size (bench,
        # a server's fixed chunks) keeps what its earlier steps learned.
        self.decode_threads = ThreadChoice()
        self.hidden_threads = ThreadChoice()  # one-row steps without the head (hidden())
        self.prefill_threads: dict[tuple, ThreadChoice] = {}
        self.batch_threads: dict[int, ThreadChoice] = {}  # multi-sequence decode, per size
        # The LoRA adapters the weights carry (model/lora.py), in load order: a server's
        # jobs scale them per sequence (step_batch_rows' `lora`).
        self.lora: list[LoraAdapter] = []
        if backend is not None:
            if self.layers == range(cfg.n_layer):
                backend.bind(weights)
            else:
                backend.bind(weights, self.layers)
            if isinstance(weights.layers, LayerStore):
                self._settle_layers(weights.layers, backend, self.layers)

    @staticmethod
    def _settle_layers(layers: LayerStore, backend: Backend, own: range) -> None:
        """Host copies for exactly the layers the host body will run: those the backend
        holds whole are released (a launch failing after admission reloads them from the
        checkpoint, once), every other one of `own` is loaded now, not on its first token."""
        resident = getattr(backend, "resident_layers", None)
        held = resident() if resident is not None else set()
        for i in own:
            if i in held:
                layers.release(i)
            else:
                layers[i]

    def end_thread(self) -> None:
        """The calling thread is done with this decoder (a server's engine thread, at its
        end): the backend frees what it keeps per thread."""
        if self.backend is not None:
            self.backend.end_thread()

    def new_cache(self, n_ctx: int, rewind: int = 0, pool: PagePools | None = None) -> KvCache:
        """An empty cache of n_ctx positions that can step back rewind + 1 tokens, holding
        rows and state for this decoder's layers only (its attention rows in `pool`'s
        pages where given: cache/paged.py)."""
        return KvCache(
            self.cfg, n_ctx, types=self.cache_types, rewind=rewind, layers=self.layers, pools=pool
        )

    def new_pool(self, n_pages: int, n_ctx: int) -> PagePools:
        """Page pools of n_pages pages each, one per layer kind of this decoder's layers
        within a context of n_ctx (cache/paged.py), in its cache types."""
        return PagePools(self.cfg, n_pages, self.cache_types, n_ctx, self.layers)

    def hidden(self, ids: np.ndarray, cache: KvCache) -> np.ndarray:
        """Run new tokens `ids` at the cache's next positions; the last layer's output."""
        # A one-row step without its head is timed on its own thread choice (units alike).
        choice = self.hidden_threads if len(ids) == 1 else None
        n = choice.choose() if choice is not None else None
        t0 = time.perf_counter()
        with step_threads(n, few_rows([len(ids)])):
            # The residual stream (without the skip stream that rides beside it).
            out = self._forward(ids, cache, None)[0][:, : self.cfg.n_embd]
        if choice is not None and n is not None:
            choice.record(n, time.perf_counter() - t0)
        return out

    def hidden_batch(self, seqs: list[np.ndarray]) -> list[np.ndarray]:
        """Several sequences, each from a fresh cache, in one forward -> each one's last
        layer rows [len(seq), n_embd] as the head reads them (final norm: an embedding's
        input). A sequence attends only over its own rows: none is padded, none sees
        another."""
        n_ctx = max(len(s) for s in seqs)
        if len(seqs) == 1:
            return [self.host.final_norm(self.hidden(seqs[0], self.new_cache(n_ctx)))]
        batch = SeqBatch([self.new_cache(n_ctx) for _ in seqs], [len(s) for s in seqs])
        with step_threads(None, few_rows(batch.counts)), sequences(batch.counts):
            x, _ = self._forward(np.concatenate(seqs), batch, None)
            x = self.host.final_norm(x)
        return [x[a:b] for a, b in zip(batch.starts, batch.stops)]

    def _forward(
        self, ids: np.ndarray, cache: KvCache | SeqBatch, head: str | None
    ) -> tuple[np.ndarray, bool]:
        """(output, is_logits). With head "last"/"all", a backend whose run reaches the last
        layer and that `runs_head` returns the logits from the same submission. `cache` is
        one sequence's, or a SeqBatch: several sequences' rows in one forward (its head
        "last": each sequence's last row's logits, in the batch's order)."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        if T == 0:
            return np.zeros((0, self.cfg.residual_width), np.float32), False
        cache.check_room(T)
        positions = step_positions(cache, T)
        x = self.host.embed(ids, positions)
        x, is_logits = self.run_layers(x, positions, cache, head)
        cache.commit(T)
        return x, is_logits

    def run_layers(
        self, x: np.ndarray, positions: np.ndarray, cache: KvCache | SeqBatch, head: str | None
    ) -> tuple[np.ndarray, bool]:
        """This decoder's layers (`self.layers`) over the rows x at `positions`: each run a
        backend takes, the rest on the host body -> (output, is_logits), as _forward says.
        The cache is checked for room before and committed after, by the caller."""
        T = len(x)
        batch = isinstance(cache, SeqBatch)
        kind = "batch" if batch else "decode" if T == 1 else "prefill"
        choices = None
        # Prompt rows are timed layer by layer; a batch of decode rows (one per sequence)
        # was chosen for as a whole by step_batch, and a layer's choice would override it.
        decode_rows = isinstance(cache, SeqBatch) and max(cache.counts) == 1
        if T > 1 and not decode_rows:
            if len(self.prefill_threads) > 64:  # many prompt sizes: keep the table small
                self.prefill_threads.clear()
            choices = self.prefill_threads
        backend = self.backend
        layer = self.layers.start
        while layer < self.layers.stop:
            plan = backend.plan(kind, layer, T, cache, positions=positions) if backend else None
            if backend is None or plan is None or isinstance(plan, Refusal):
                if backend is not None and isinstance(plan, Refusal):
                    backend.ledger.refuse(plan.reason)
                x = self._host_layer(layer, x, positions, cache, choices)
                layer += 1
            else:
                try:
                    if (
                        head
                        and plan.stop == self.cfg.n_layer
                        and getattr(backend, "runs_head", False)
                    ):
                        # runs_head is HeadBackend's: this backend runs the head too.
                        with_head = cast(HeadBackend, backend)
                        return with_head.run_head(plan, x, positions, cache, head == "all"), True
                    x = backend.run(plan, x, positions, cache)
                except LaunchFailed as e:
                    # The backend wrote no cache row before failing: the host body runs
                    # the same layers from the same x.
                    backend.ledger.fail(str(e))
                    for failed in range(plan.start, plan.stop):
                        x = self._host_layer(failed, x, positions, cache, choices)
                layer = plan.stop
        return x, False

    def _host_layer(
        self,
        layer: int,
        x: np.ndarray,
        positions: np.ndarray,
        cache: KvCache | SeqBatch,
        choices: dict[tuple, ThreadChoice] | None,
    ) -> np.ndarray:
        if choices is None:
            return self.host.layer(layer, x, positions, cache)
        s = self.host.shapes[layer]
        key = (s.mixer, s.ffn, len(x))  # (a window changes little of a layer's cost)
        choice = choices.get(key) or choices.setdefault(key, ThreadChoice.for_prefill())
        n = choice.choose()
        t0 = time.perf_counter()
        rows = cache.counts if isinstance(cache, SeqBatch) else [len(x)]
        with step_threads(n, few_rows(rows)):
            x = self.host.layer(layer, x, positions, cache)
        choice.record(n, time.perf_counter() - t0)
        return x

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        return self.host.logits(hidden)

    def step(self, ids: np.ndarray, cache: KvCache, all_logits: bool = False) -> np.ndarray:
        """Feed ids; logits for every row (all_logits) or for the last row only, [rows, V]."""
        if len(ids) != 1:
            return self._step(ids, cache, all_logits)
        # A whole decode step (layers and LM head) is what the thread choice is timed on.
        n = self.decode_threads.choose()
        t0 = time.perf_counter()
        with step_threads(n, few=True):
            out = self._step(ids, cache, all_logits)
        self.decode_threads.record(n, time.perf_counter() - t0)
        return out

    def prefill(self, ids: np.ndarray, cache: KvCache) -> np.ndarray:
        """Feed a prompt in steps of at most PREFILL_ROWS rows; the last row's logits
        [1, V], as step() gives them. The host body gives a row the same bits in any cut
        (batch invariance), so this is one step's answer in bounded memory."""
        ids = np.asarray(ids)
        last = max(0, len(ids) - PREFILL_ROWS)  # the last step's rows start here
        for a in range(0, last, PREFILL_ROWS):
            self._forward(ids[a : min(a + PREFILL_ROWS, last)], cache, None)
        return self.step(ids[last:], cache)

    def step_batch(self, steps: list[tuple[np.ndarray, KvCache]]) -> np.ndarray:
        """One forward over several sequences' new rows, each (ids, its cache); the logits
        after each sequence's last row, [len(steps), V]. The row-wise work (every linear,
        the FFN, the lm head) runs once over all rows: decode reads each weight once for
        the whole batch."""
        if len(steps) == 1:
            ids, cache = steps[0]
            return self.step(ids, cache)
        return np.concatenate(self.step_batch_rows(steps, [1] * len(steps))[0])

    def step_batch_rows(
        self,
        steps: list[tuple[np.ndarray, KvCache]],
        tails: Sequence[int],
        lora: Sequence[Mapping[LoraAdapter, float]] | None = None,
        hidden: Sequence[bool] | None = None,
    ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        """step_batch, with each sequence's logits [tails[i], V] for the last tails[i] rows
        it fed (speculative decoding verifies a draft: 1 + its length), and where `hidden`
        says so its hidden states after the final norm for every row it fed (an MTP head's
        input; else None). lora: each sequence's scale per adapter (else every adapter's
        own scale)."""
        hidden = hidden if hidden is not None else [False] * len(steps)
        if lora is None:
            return self._step_batch_rows(steps, tails, hidden)
        with adapter_scales(lora):
            return self._step_batch_rows(steps, tails, hidden)

    def _step_batch_rows(
        self, steps: list[tuple[np.ndarray, KvCache]], tails: Sequence[int], hidden: Sequence[bool]
    ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        if len(steps) == 1 and tails[0] in (1, len(steps[0][0])) and not hidden[0]:
            ids, cache = steps[0]
            return [self.step(ids, cache, all_logits=tails[0] > 1)], [None]
        batch = SeqBatch([c for _, c in steps], [len(ids) for ids, _ in steps])
        ids = np.concatenate([np.asarray(i, dtype=np.int64) for i, _ in steps])
        # The head's rows: each sequence's last tails[i].
        picks = [list(range(b - t, b)) for b, t in zip(batch.stops, tails)]
        # A batch of decode rows (one per sequence) is timed as a whole, per batch size
        # (eight rows are GEMMs that may want BLAS's threads where one row did not); a
        # batch with prompt rows is timed layer by layer, as a prefill is.
        choice = None
        if batch.n_rows == len(steps):
            choice = self.batch_threads.get(len(steps))
            if choice is None:
                choice = self.batch_threads[len(steps)] = ThreadChoice(start_wide=True)
        n = choice.choose() if choice is not None else None
        t0 = time.perf_counter()
        several = any(t > 1 for t in tails)
        # (hidden states asked: the host runs the head, from the rows it hands out)
        head = None if any(hidden) else "all" if several else "last"
        # The host's linears multiply each sequence's rows as they would alone (graph.
        # linear.product), so a sequence's logits do not depend on its batch.
        with step_threads(n, few_rows(batch.counts)):
            with sequences(batch.counts):
                x, is_logits = self._forward(ids, batch, head)
            normed: list[np.ndarray | None] = [
                self.host.final_norm(x[a:b, : self.cfg.n_embd]) if h else None
                for a, b, h in zip(batch.starts, batch.stops, hidden)
            ]
            if is_logits and not several:  # the backend's head took the last rows
                picks = [[i] for i in range(len(steps))]
            elif not is_logits:  # only the picked rows need the head: its input is cut
                with sequences([len(p) for p in picks]):
                    x = self.logits(x[[i for p in picks for i in p]])
                flat = np.cumsum([0, *(len(p) for p in picks)]).tolist()
                picks = [list(range(a, b)) for a, b in zip(flat, flat[1:])]
            out = [x[p] for p in picks]
        if choice is not None and n is not None:
            choice.record(n, time.perf_counter() - t0)
        return out, normed

    def _step(self, ids: np.ndarray, cache: KvCache, all_logits: bool) -> np.ndarray:
        x, is_logits = self._forward(ids, cache, "all" if all_logits else "last")
        if is_logits:
            return x
        return self.logits(x if all_logits else x[-1:])
