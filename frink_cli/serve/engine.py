"""The serving engine: continuous batching over a fixed set of sequence slots.

Why a scheduler of its own: a decode token is bound by the weight bytes it streams, so
the sequences of several clients stepping together (Decoder.step_batch: ONE forward over
all their rows) cost little more than one. Between steps, finished and disconnected jobs
leave, waiting ones are admitted, and a new job's prompt is fed in chunks of at most
`prefill_chunk` rows per step beside the decode rows of the running ones, so their
streams keep flowing while it prefills.

Paged (serve/paging.py: host-body models, MLA's latent rows too): the slots' caches
are page tables over one pool per layer kind (recurrent layers' state kept per sequence,
indexed where prompts and answers end); a job starts from the longest prefix of its ids that
any job computed (shared pages), looked up just before its first rows are fed, once no
other job is still feeding a prompt sharing a page of its ids (whose pages are then in); jobs
are admitted by free pages, the slots capping how many run; when a step finds the pool
short, the newest job is preempted (its pages freed; its prompt and answer so far
recomputed later, in chunks, which gives its rows the same bits) and the step goes on.

Otherwise each slot keeps its cache (and the ids it holds) after its job ends: the next
job placed there keeps the longest common prefix of its prompt and those ids and feeds
only the rest (a conversation's next turn re-sends its history). A recurrent layer's state
cannot be rolled back, so for such models the state is saved at the end of every prompt
and of every answer, and a later job resumes from the longest saved point within its prefix.

One thread (`run`) owns the decoder and every cache; submit() and cancel() are safe from
any thread. A job reports through its `emit` callback, called on the engine's thread:
("text", str) pieces (each answer token's ("logprob", TokenLogprob) before its text, when
the job asks), then ("done", Finish), ("error", message), or ("stopped", message) when
stop() ended it unfinished. A job with `channels` on
a harmony model (gpt-oss) gets its final channel as "text" and the others (analysis,
commentary) as ("reasoning", str) pieces; with `tool_calls` too, a message addressed to
a function comes as "text", its markers spelled, for the tool-call parser.

An Observer (the server's metrics) hears of every finished job, on the engine's thread,
once per job: nothing is measured per token.

With a `drafter` (speculative.py: `frink serve --spec ngram`, `-md` or `--spec mtp`), each
decoding job without a constraint feeds its next token and a draft in its step, and keeps
the drafts the target agrees with (speculative.verify): greedy answers are the plain ones
token for token, sampled ones keep their distribution. Attention rows of rejected drafts
are truncated. Recurrent layers, as `frink run` does it: the job's state is saved before
its verify step; after a rejection it is restored and the ids kept since (the fed token
and the kept drafts) are fed again at the head of the job's next step, which drafts only
what room that leaves within draft_max (so a verify step never holds more than
draft_max + 1 rows, and no extra forward is run). An MTP head (`--spec mtp`) reads the
target's hidden states: the step hands them out for the rows of every slot whose drafter
reads them, and that drafter, kept on the slot, observes them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from ..cache import KvCache
from ..cache.paged import PAGE, PoolFull
from ..channels import FINAL, ChannelSplit, is_harmony
from ..decoder import Decoder
from ..errors import FrinkError, Unavailable
from ..sampling import Sampler, token_logprob
from ..speculative import Drafter, SpecParams
from ..tokenizer import Tokenizer
from . import drafting
from .jobs import Finish, Job, Observer, QueueFull, Running, Slot
from .paging import EnginePages, refusal
from .stops import StopText

__all__ = ["Engine", "Finish", "Job", "Observer", "QueueFull", "common_prefix"]

# Saved recurrent states per slot (end of prompt, end of answer, for the last few jobs).
_SNAPSHOTS = 4


def _shared(slot: Slot, prompt: Sequence[int], lora: tuple[float, ...]) -> int:
    """The prompt's prefix the slot's cache holds, computed under the same LoRA scales."""
    return common_prefix(slot.tokens, prompt) if slot.lora == lora else 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


class Engine:
    def __init__(
        self,
        decoder: Decoder,
        tokenizer: Tokenizer | None,
        *,
        n_parallel: int = 4,
        n_ctx: int = 4096,
        prefill_chunk: int = 128,
        max_queue: int = 64,
        drafter: Callable[[int], Drafter | None] | None = None,
        spec: SpecParams | None = None,
        kv_pool: int = 0,
        paged: bool = True,
    ) -> None:
        """drafter(n_ctx): a fresh drafter for one job (Model.drafter), with `spec` its
        settings; None: plain decoding. kv_pool: the paged cache's rows (0: n_parallel x
        n_ctx, the slot caches' total); paged False, or a model paging.refusal names, keeps
        a whole-context cache per slot (`paging_refusal` says why)."""
        if n_parallel < 1 or prefill_chunk < 1 or max_queue < 0:
            raise FrinkError("--parallel, --prefill-chunk must be >= 1 and --queue >= 0")
        self.decoder = decoder
        self.tok = tokenizer  # None: token ids in and out only (answers carry no text)
        self.eog = tokenizer.eog_ids if tokenizer is not None else frozenset()
        self.n_ctx = n_ctx
        self.prefill_chunk = prefill_chunk
        self.max_queue = max_queue
        self.spec = spec if drafter is not None else None
        # (a recurrent model's restore takes back the replayed rows and the draft's: at
        # most draft_max + 1 rows, as drafting.draft's room keeps them)
        self.rewind = self.spec.draft_max + 1 if self.spec is not None else 0
        self.paging_refusal = refusal(decoder, n_ctx) if paged else "--kv-slots asks for it"
        self.pages = (
            EnginePages(decoder, n_parallel, kv_pool, n_ctx, prefill_chunk, self.rewind)
            if self.paging_refusal is None
            else None
        )
        self._preempted: deque[Running] = deque()  # taken out for pages, to run again
        self.preemptions = 0
        self.slots = [Slot(self._new_cache()) for _ in range(n_parallel)]
        self.recurrent = self.slots[0].cache.has_recurrent_state
        self.drafter = drafter
        self.drafted = self.accepted = 0  # speculative decoding's tokens, all jobs together
        self.replayed = 0  # ids fed again after a recurrent state was restored
        self._waiting: deque[Job] = deque()
        self._lock = threading.Condition()
        self._stopping = False
        self.steps = 0  # forwards run (for tests and the bench)
        self.observer: Observer | None = None

    # --- any thread -----------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue a job (prompt already checked to fit the context); QueueFull when the
        queue is at its limit."""
        if not job.prompt:
            raise FrinkError("empty prompt: nothing to condition on")
        if len(job.prompt) >= self.n_ctx:
            raise FrinkError(
                f"prompt is {len(job.prompt)} tokens, too long for a context of {self.n_ctx}"
            )
        n_lora = len(self.decoder.lora)
        if job.lora is not None and any(not 0 <= i < n_lora for i in job.lora):
            raise FrinkError(f"lora: an adapter id out of range (the model has {n_lora})")
        with self._lock:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            free = sum(s.job is None for s in self.slots)
            if len(self._waiting) >= self.max_queue + free:
                raise QueueFull(f"{len(self._waiting)} requests are already waiting")
            self._waiting.append(job)
            self._lock.notify()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()

    @property
    def busy(self) -> int:
        return sum(s.job is not None for s in self.slots)

    @property
    def waiting(self) -> int:
        return len(self._waiting) + len(self._preempted)

    @property
    def cells_used(self) -> int:
        """KV cache cells holding a position, over every slot (a finished job's cells stay
        for the next prompt that shares its prefix; paged: the busiest pool's pages in use,
        the indexed ones too). Read from any thread: a snapshot."""
        if self.pages is not None:
            return self.pages.rows_used
        return sum(s.cache.n_past for s in self.slots)

    # --- the engine's thread --------------------------------------------------------------

    def run(self) -> None:
        """Step until stop(); every job still known then ends with a "stopped" event."""
        try:
            # A request's answer does not depend on what else is being served: every few
            # rows go through the one kernel whose sums ignore the batch (backends/host/linear.py).
            self._loop()
        finally:
            self.decoder.end_thread()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._stopping or self._waiting or self._preempted) and not (
                    self._any_running()
                ):
                    self._lock.wait()
                if self._stopping:
                    break
                self._admit()
            self._drop_cancelled()
            running = [s.job for s in self.slots if s.job is not None]
            if running:
                self._step(running)
        with self._lock:
            jobs = list(self._waiting) + [s.job.job for s in self.slots if s.job is not None]
            jobs += [r.job for r in self._preempted]
            self._waiting.clear()
            self._preempted.clear()
        for job in jobs:
            if not job.cancelled.is_set():
                job.emit("stopped", "the server is shutting down")
        for s in self.slots:
            s.job = None

    def _any_running(self) -> bool:
        return any(s.job is not None for s in self.slots)

    def _admit(self) -> None:
        """Waiting jobs into free slots (under the lock): each into the free slot sharing
        the longest prefix with its prompt, least recently used among equals. Paged: a
        preempted job first, and each only when the pool has its prompt's pages."""
        while self._waiting or self._preempted:
            free = [s for s in self.slots if s.job is None]
            if not free or (self._preempted and not self._resume(self._preempted[0], free)):
                return
            if self._preempted or not self._waiting:
                continue
            job = self._waiting[0]
            if job.cancelled.is_set():
                self._waiting.popleft()
                continue
            lora = self._lora_scales(job)
            if self.pages is not None and not self.pages.fits(job.prompt, lora):
                if self._any_running():
                    return  # it waits for pages
                self._waiting.popleft()
                job.emit("error", f"the KV pool ({self.pages.capacity} tokens, --kv-pool) "
                         f"cannot hold a prompt of {len(job.prompt)} tokens")  # fmt: skip
                continue
            self._waiting.popleft()
            slot = max(free, key=lambda s: (_shared(s, job.prompt, lora), -s.last_used))
            reuse = job.cache_prompt and slot.lora == lora and self.pages is None
            cached = self._reuse(slot, job.prompt if reuse else [])
            drafter = drafting.job_drafter(slot, self.drafter, self.spec, self.n_ctx)
            slot.lora = lora
            slot.job = Running(
                job=job,
                slot=slot,
                sampler=Sampler(job.params, self.decoder.cfg.n_vocab),
                text=StopText(self.tok, job.stop, job.spell),
                pending=job.prompt[cached:],
                history=list(job.prompt),
                cached=cached,
                split=ChannelSplit(self.tok, calls=job.tool_calls)
                if job.channels and self.tok is not None and is_harmony(self.tok)
                else None,
                drafter=drafter if job.constraint is None else None,
                lora=lora,
                attach=self.pages is not None and job.cache_prompt,
            )

    def _resume(self, r: Running, free: list[Slot]) -> bool:
        """A preempted job back into a free slot, if the pool has its pages (or nothing
        else runs); whether it went."""
        assert self.pages is not None
        if self._any_running() and not self.pages.fits(r.history, r.lora):
            return False
        self._preempted.popleft()
        r.slot = slot = min(free, key=lambda s: s.last_used)
        slot.job, slot.lora = r, r.lora
        return True

    def _lora_scales(self, job: Job) -> tuple[float, ...]:
        """The scale of each of the model's LoRA adapters for `job`, fixed at admission."""
        adapters = self.decoder.lora
        if job.lora is None:
            return tuple(ad.scale for ad in adapters)
        return tuple(float(job.lora.get(i, 0.0)) for i in range(len(adapters)))

    def _reuse(self, slot: Slot, prompt: list[int]) -> int:
        """Rewind the slot's cache to the longest prefix of `prompt` it can resume from (at
        least one prompt id is left to feed: its logits pick the first token); how many."""
        cache = slot.cache
        keep = max(0, min(common_prefix(slot.tokens, prompt), len(prompt) - 1))
        try:
            if keep == cache.n_past:
                pass
            elif not self.recurrent:
                cache.truncate(keep)
            else:
                saved = [s for s in slot.snapshots if s.n_past <= keep]
                if saved:
                    snap = max(saved, key=lambda s: s.n_past)
                    cache.restore(snap)
                    keep = snap.n_past
                else:
                    keep = 0
                    cache.truncate(0)
        except FrinkError:  # a sliding window past its rows, say: start over
            keep = 0
            cache.truncate(0)
        del slot.tokens[keep:]
        slot.snapshots = [s for s in slot.snapshots if s.n_past <= keep]
        return keep

    def _drop_cancelled(self) -> None:
        for s in self.slots:
            if s.job is not None and s.job.job.cancelled.is_set():
                self._release(s)

    def _release(self, slot: Slot) -> None:
        if self.pages is not None:  # its rows stay indexed; its table lets go
            self.pages.publish(slot.cache, slot.tokens, slot.lora, partial=True)
            slot.cache.truncate(0)
            slot.tokens.clear()
        elif (
            self.recurrent
            and slot.cache.n_past
            and (not slot.snapshots or slot.snapshots[-1].n_past != slot.cache.n_past)
        ):
            self._save(slot)
        slot.job = None
        slot.last_used = time.perf_counter()
        with self._lock:
            self._lock.notify()

    def _save_point(self, r: Running) -> None:
        """r's state indexed (paged) or saved in its slot at its cache's end: a point a later
        prompt sharing its ids resumes from."""
        if self.pages is None:
            self._save(r.slot)
        else:
            self.pages.publish(r.slot.cache, r.slot.tokens, r.lora, partial=True)

    def _save(self, slot: Slot) -> None:
        slot.snapshots.append(slot.cache.snapshot())
        del slot.snapshots[:-_SNAPSHOTS]

    def _step(self, running: list[Running]) -> None:
        """One forward: every decoding job's next row, then prompt chunks within the
        prefill budget, oldest job first."""
        feeds: list[tuple[Running, list[int]]] = []
        budget = self.prefill_chunk
        for r in running:
            if r.next_id is not None:
                feeds.append((r, [*r.replay, r.next_id, *drafting.draft(r, self.spec, self.n_ctx)]))
        for r in sorted(running, key=lambda r: r.job.submitted):
            if r.attach and budget > 0 and not self._shares_a_prompt_in_flight(r, running):
                self._attach(r)
            if r.next_id is None and r.pending and budget > 0 and not r.attach:
                # A whole chunk or none (the oldest prompt always gets one): a prompt is cut
                # where it would be alone, so its rows, and its answer, are the same.
                take = r.pending[: self.prefill_chunk]
                at = r.slot.cache.n_past
                if at < r.parting < at + len(take):  # a chunk ends where it parts
                    take = take[: r.parting - at]
                if len(take) > budget and budget < self.prefill_chunk:
                    continue
                budget -= len(take)
                feeds.append((r, take))
        if self.pages is not None:
            feeds = self._make_room(feeds)
        if not feeds:
            return
        # The rows whose logits a job reads: its next token's and its draft's.
        tails = [len(ids) - len(r.replay) if r.next_id is not None else 1 for r, ids in feeds]
        verifying = [r.next_id is not None and t > 1 for (r, _), t in zip(feeds, tails)]
        starts = [r.slot.cache.n_past for r, _ in feeds]
        for (r, _), d in zip(feeds, verifying):
            if d and self.recurrent:
                r.snap = r.slot.cache.snapshot()
        adapters = self.decoder.lora
        lora = [dict(zip(adapters, r.slot.lora)) for r, _ in feeds] if adapters else None
        try:
            logits, hidden = self.decoder.step_batch_rows(
                [(np.asarray(ids, dtype=np.int64), r.slot.cache) for r, ids in feeds],
                tails,
                lora,
                [r.slot.drafter is not None for r, _ in feeds],
            )
        except Exception as e:  # noqa: BLE001 - one bad step must not take the server down
            # A model that cannot run any more (a lost pipeline rank) answers as a stop.
            kind = "stopped" if isinstance(e, Unavailable) else "error"
            for r, _ in feeds:
                self._fail(r, f"generation failed: {type(e).__name__}: {e}", kind)
            return
        self.steps += 1
        for (r, ids), rows, drafted, h, start in zip(feeds, logits, verifying, hidden, starts):
            r.slot.tokens.extend(ids)
            if h is not None and r.slot.drafter is not None:
                r.slot.drafter.observe(start, h)
            replayed, r.replay = len(r.replay), []
            self.replayed += replayed
            if self.pages is not None and r.slot.cache.n_past // PAGE > r.published:
                # As pages fill (a prompt's with its window pages, an answer's without).
                self.pages.publish(r.slot.cache, r.slot.tokens, r.lora, windows=r.next_id is None)
                r.published = r.slot.cache.n_past // PAGE
            if drafted:
                self._verify(r, ids[replayed:], rows)
                continue
            row = rows[-1]
            if r.next_id is None:
                del r.pending[: len(ids)]
                if r.parting and r.slot.cache.n_past == r.parting:
                    self._save_point(r)  # where the next prompt sharing it resumes
                    r.parting = 0
                if r.pending:
                    continue  # more prompt to feed: no token yet
                if self.recurrent:  # the end of a prompt: where a next turn resumes
                    self._save_point(r)
            r.next_id = None
            self._advance(r, row)

    def _attach(self, r: Running) -> None:
        """Paged: r's cache from the longest indexed prefix of its ids (its prompt, or for a
        preempted job its prompt and answer so far), before its first rows are fed."""
        assert self.pages is not None
        r.attach = False
        cached = self.pages.attach(r.slot.cache, r.history, r.lora)
        r.slot.tokens = r.history[:cached]
        r.pending = r.history[cached:]
        r.published = cached // PAGE
        r.parting = self.pages.parting(r.history, r.lora, cached)
        if not r.preempted:
            r.cached = cached

    def _shares_a_prompt_in_flight(self, r: Running, running: list[Running]) -> bool:
        """Whether another job still feeding its prompt shares a page or more of r's ids:
        r then waits for those pages (indexed as they fill) rather than compute them too."""
        return (
            self.pages is not None
            and not self.pages.stateful
            and any(
                q is not r
                and q.pending
                and q.next_id is None
                and not q.attach
                and common_prefix(q.history, r.history) >= PAGE
                for q in running
            )
        )

    def _make_room(self, feeds: list[tuple[Running, list[int]]]) -> list[tuple[Running, list[int]]]:
        """Paged: each feed's pages taken before the step; while the pool is short, the
        newest running job is preempted (its pages freed, the job queued to be recomputed),
        or a job alone that does not fit fails. The feeds that remain."""
        while feeds:
            try:
                for r, ids in feeds:
                    r.slot.cache.reserve(r.slot.cache.n_past + len(ids))
                return feeds
            except PoolFull:
                running = [s.job for s in self.slots if s.job is not None]
                victim = max(running, key=lambda r: r.job.submitted)
                if len(running) == 1:
                    assert self.pages is not None
                    self._fail(victim, f"the KV pool ({self.pages.capacity} tokens, --kv-pool) "
                               "cannot hold this sequence")  # fmt: skip
                else:
                    self._preempt(victim)
                feeds = [f for f in feeds if f[0] is not victim]
        return feeds

    def _preempt(self, r: Running) -> None:
        """r's pages freed and r queued to run again: its prompt and answer so far (whose
        last id is the token it was to feed next) recomputed, then it goes on."""
        self.preemptions += 1
        r.preempted += 1
        r.slot.cache.truncate(0)
        r.slot.tokens.clear()
        r.slot.job = None
        r.pending, r.next_id, r.attach = list(r.history), None, True
        r.replay, r.snap = [], None
        self._preempted.append(r)

    def _verify(self, r: Running, ids: list[int], rows: np.ndarray) -> None:
        """ids: r's next token and its draft; rows: the logits after each. The tokens the
        target emits sent on (drafting.verify_rows), the counters kept."""
        try:
            tokens, kept = drafting.verify_rows(r, ids, rows)
        except FrinkError as e:  # a cache that cannot go back (refused before it moved)
            self._fail(r, f"speculative decoding: {e}")
            return
        self.drafted += len(ids) - 1
        self.accepted += kept
        r.drafted += len(ids) - 1
        r.accepted += kept
        r.published = min(r.published, r.slot.cache.n_past // PAGE)
        for tok, row in zip(tokens, rows):
            r.next_id = None
            self._advance(r, row, tok)
            if r.next_id is None:  # the answer ended (or failed, or was cancelled)
                return

    def _new_cache(self) -> KvCache:
        pool = self.pages.pools if self.pages is not None else None
        return self.decoder.new_cache(self.n_ctx, rewind=self.rewind, pool=pool)

    def _advance(self, r: Running, logits: np.ndarray, chosen: int | None = None) -> None:
        """The job's next token (sampled from logits, or `chosen` by verification) sent on,
        or its answer ended."""
        job = r.job
        if job.cancelled.is_set():
            self._release(r.slot)
            return
        if not np.isfinite(logits).all():
            self._fail(r, "the model produced non-finite logits (NaN or Inf)")
            return
        if r.first_token is None:
            r.first_token = time.perf_counter()
        constraint = job.constraint
        try:
            allowed = constraint.allowed() if constraint is not None else None
            token = r.sampler.sample(logits, r.history, allowed) if chosen is None else chosen
            if token in self.eog and not job.ignore_eos:
                self._finish(r, "stop")
                return
            if constraint is not None:
                constraint.accept(token)
        except FrinkError as e:  # a grammar that cannot go on
            self._fail(r, str(e))
            return
        r.history.append(token)
        r.generated += 1
        if job.logprobs is not None:
            job.emit("logprob", token_logprob(logits, token, job.logprobs))
        piece, stopped = (
            r.text.push(token) if r.split is None else self._channels(r, r.split.push(token))
        )
        if piece:
            job.emit("text", piece)
        if stopped or (constraint is not None and constraint.finished):
            self._finish(r, "stop")
        elif r.generated >= job.max_tokens or drafting.fed(r) >= self.n_ctx:
            # (the context must hold the token fed next, so a full one ends here)
            self._finish(r, "length")
        else:
            r.next_id = token

    def _channels(self, r: Running, parts: list[tuple[str, str]]) -> tuple[str, bool]:
        """A harmony answer's pieces: the final channel's through the stop strings (the
        text to send, and whether one was reached), the others sent as "reasoning"."""
        sent = ""
        for channel, text in parts:
            if channel != FINAL:
                r.job.emit("reasoning", text)
                continue
            piece, stopped = r.text.push_text(text)
            sent += piece
            if stopped:
                return sent, True
        return sent, False

    def _finish(self, r: Running, reason: str) -> None:
        if r.split is not None and not r.text.stopped:
            piece, _ = self._channels(r, r.split.flush())
            if piece:
                r.job.emit("text", piece)
        if reason != "stop" or not r.text.stopped:
            tail = r.text.flush()
            if tail:
                r.job.emit("text", tail)
        now = time.perf_counter()
        first = r.first_token or now
        answer = tuple(r.history[len(r.job.prompt) :])
        done = Finish(
            reason,
            len(r.job.prompt),
            r.generated,
            r.cached,
            first - r.job.submitted,
            answer,
            r.text.hit,
            now - first,
            r.drafted,
            r.accepted,
        )
        if self.observer is not None:  # first: counted before the client hears of it
            self.observer.finished(done)
        r.job.emit("done", done)
        self._release(r.slot)

    def _fail(self, r: Running, message: str, kind: str = "error") -> None:
        # The cache may hold a half-written step: that slot starts over.
        r.slot.cache.truncate(0)  # (paged: its pages go back to the pool)
        r.slot.cache = self._new_cache()
        r.slot.tokens.clear()
        r.slot.snapshots.clear()
        r.slot.drafter = None  # (it observed the rows of the cache let go)
        if not r.job.cancelled.is_set():
            r.job.emit(kind, message)
        r.slot.job = None
