"""The serving engine: continuous batching over a fixed set of sequence slots.

Why a scheduler of its own: a decode token is bound by the weight bytes it streams, so
the sequences of several clients stepping together (Decoder.step_batch: ONE forward over
all their rows) cost little more than one. Between steps, finished and disconnected jobs
leave, waiting ones are admitted, and a new job's prompt is fed in chunks of at most
`prefill_chunk` rows per step beside the decode rows of the running ones, so their
streams keep flowing while it prefills.

Each slot keeps its cache (and the ids it holds) after its job ends: the next job placed
there keeps the longest common prefix of its prompt and those ids and feeds only the
rest (a conversation's next turn re-sends its history). A recurrent layer's state cannot
be rolled back, so for such models the state is saved at the end of every prompt and of
every answer, and a later job resumes from the longest saved point within its prefix.

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

With a `drafter` (speculative.py: `frink serve --spec ngram` or `-md`), each decoding job
without a constraint feeds its next token and a draft in its step, and keeps the drafts the
target agrees with (speculative.verify): greedy answers are the plain ones token for token,
sampled ones keep their distribution. Models with recurrent layers decode plainly: their
state cannot be taken back to a kept draft within a step. So does `--spec mtp`: its head
reads the target's hidden states, which the batched step does not hand out.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..cache import CacheSnapshot, KvCache
from ..channels import FINAL, ChannelSplit, is_harmony
from ..constraint import Constraint
from ..decoder import Decoder
from ..errors import FrinkError, Unavailable
from ..sampling import Sampler, SamplingParams, token_logprob
from ..speculative import Drafter, SpecParams, verify
from ..tokenizer import Tokenizer
from .stops import StopText

# Saved recurrent states per slot (end of prompt, end of answer, for the last few jobs).
_SNAPSHOTS = 4


class QueueFull(Exception):
    """More jobs waiting than the engine takes: the caller should retry later."""


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" (end of generation or a stop string) | "length" (max_tokens, context)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens reused from a slot's cache
    first_token_seconds: float  # submit -> first sampled token
    tokens: tuple[int, ...] = ()  # the answer's ids (end-of-generation token excluded)
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    decode_seconds: float = 0.0  # first sampled token -> the end of the answer
    drafted_tokens: int = 0  # speculative decoding: tokens drafted for the answer
    accepted_tokens: int = 0  # and how many of them the target kept


class Observer(Protocol):
    """What the engine tells about its jobs (serve/metrics.py)."""

    def finished(self, finish: Finish) -> None:
        """A job ended with its answer (not a failed or cancelled one). Called on the
        engine's thread between steps: it must be cheap and must not raise."""


@dataclass
class Job:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    emit: Callable[[str, object], None]
    ignore_eos: bool = False  # generate past end-of-generation tokens (benchmarks)
    # False: the prompt is computed afresh, not resumed from a slot's cached prefix. Reuse
    # is exact math but not the same float sums (a resumed prompt's last rows are fed in
    # other chunks than a fresh one's), so only a fresh prompt is reproducible bit for bit.
    cache_prompt: bool = True
    # A chat answer of a harmony model (gpt-oss): split by channel (channels.ChannelSplit).
    channels: bool = False
    # None: no log probabilities; k: before each answer token's text, a ("logprob",
    # sampling.TokenLogprob) event with its k most likely alternatives.
    logprobs: int | None = None
    # A grammar over the answer (constraint.py): its mask comes before every sampler
    # stage, and the answer ends ("stop") when the grammar can only end.
    constraint: Constraint | None = None
    # Control tokens the answer's text spells by name (a tool-call format's markers).
    spell: frozenset[int] = frozenset()
    # Tools were offered (with `channels`): a harmony call is passed on as "text", spelled
    # for the tool-call parser (channels.ChannelSplit's `calls`), not as reasoning.
    tool_calls: bool = False
    # LoRA scales by adapter id (the model's adapter order; an id left out: scale 0), as
    # llama-server's per-request `lora`; None: the adapters' global scales at admission.
    lora: dict[int, float] | None = None
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Leave at the next step (a client went away); no further events are sent."""
        self.cancelled.set()


@dataclass
class _Slot:
    cache: KvCache
    tokens: list[int] = field(default_factory=list)  # the ids the cache holds, in order
    snapshots: list[CacheSnapshot] = field(default_factory=list)
    last_used: float = 0.0
    job: _Running | None = None
    lora: tuple[float, ...] = ()  # the LoRA scales the cached rows were computed with


@dataclass
class _Running:
    job: Job
    slot: _Slot
    sampler: Sampler
    text: StopText
    pending: list[int]  # prompt ids still to feed
    history: list[int]  # prompt and answer so far (the sampler's penalties read it)
    cached: int
    generated: int = 0
    first_token: float | None = None
    next_id: int | None = None  # the sampled token the next step feeds
    split: ChannelSplit | None = None  # a harmony chat answer's channels (Job.channels)
    drafter: Drafter | None = None  # speculative decoding's, for this job alone
    drafted: int = 0
    accepted: int = 0


def _shared(slot: _Slot, prompt: Sequence[int], lora: tuple[float, ...]) -> int:
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
    ) -> None:
        """drafter(n_ctx): a fresh drafter for one job (Model.drafter), with `spec` its
        settings; None: plain decoding."""
        if n_parallel < 1 or prefill_chunk < 1 or max_queue < 0:
            raise FrinkError("--parallel, --prefill-chunk must be >= 1 and --queue >= 0")
        self.decoder = decoder
        self.tok = tokenizer  # None: token ids in and out only (answers carry no text)
        self.eog = tokenizer.eog_ids if tokenizer is not None else frozenset()
        self.n_ctx = n_ctx
        self.prefill_chunk = prefill_chunk
        self.max_queue = max_queue
        self.spec = spec if drafter is not None else None
        self.rewind = self.spec.draft_max if self.spec is not None else 0
        self.slots = [_Slot(self._new_cache()) for _ in range(n_parallel)]
        self.recurrent = self.slots[0].cache.has_recurrent_state
        # (Every MTP head frink reads sits on a model with recurrent layers anyway.)
        mtp = spec is not None and spec.mtp
        self.drafter = drafter if not self.recurrent and not mtp else None
        self.drafted = self.accepted = 0  # speculative decoding's tokens, all jobs together
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
        return len(self._waiting)

    @property
    def cells_used(self) -> int:
        """KV cache cells holding a position, over every slot (a finished job's cells stay
        for the next prompt that shares its prefix). Read from any thread: a snapshot."""
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
                while not self._stopping and not self._waiting and not self._any_running():
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
            self._waiting.clear()
        for job in jobs:
            if not job.cancelled.is_set():
                job.emit("stopped", "the server is shutting down")
        for s in self.slots:
            s.job = None

    def _any_running(self) -> bool:
        return any(s.job is not None for s in self.slots)

    def _admit(self) -> None:
        """Waiting jobs into free slots (under the lock): each into the free slot sharing
        the longest prefix with its prompt, least recently used among equals."""
        while self._waiting:
            job = self._waiting[0]
            if job.cancelled.is_set():
                self._waiting.popleft()
                continue
            free = [s for s in self.slots if s.job is None]
            if not free:
                return
            self._waiting.popleft()
            lora = self._lora_scales(job)
            slot = max(free, key=lambda s: (_shared(s, job.prompt, lora), -s.last_used))
            reuse = job.cache_prompt and slot.lora == lora
            cached = self._reuse(slot, job.prompt if reuse else [])
            slot.lora = lora
            slot.job = _Running(
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
                drafter=self.drafter(self.n_ctx)
                if self.drafter is not None and job.constraint is None
                else None,
            )

    def _lora_scales(self, job: Job) -> tuple[float, ...]:
        """The scale of each of the model's LoRA adapters for `job`, fixed at admission."""
        adapters = self.decoder.lora
        if job.lora is None:
            return tuple(ad.scale for ad in adapters)
        return tuple(float(job.lora.get(i, 0.0)) for i in range(len(adapters)))

    def _reuse(self, slot: _Slot, prompt: list[int]) -> int:
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

    def _release(self, slot: _Slot) -> None:
        if (
            self.recurrent
            and slot.cache.n_past
            and (not slot.snapshots or slot.snapshots[-1].n_past != slot.cache.n_past)
        ):
            self._save(slot)
        slot.job = None
        slot.last_used = time.perf_counter()
        with self._lock:
            self._lock.notify()

    def _save(self, slot: _Slot) -> None:
        slot.snapshots.append(slot.cache.snapshot())
        del slot.snapshots[:-_SNAPSHOTS]

    def _step(self, running: list[_Running]) -> None:
        """One forward: every decoding job's next row, then prompt chunks within the
        prefill budget, oldest job first."""
        feeds: list[tuple[_Running, list[int]]] = []
        budget = self.prefill_chunk
        for r in running:
            if r.next_id is not None:
                feeds.append((r, [r.next_id, *self._draft(r)]))
        for r in sorted(running, key=lambda r: r.job.submitted):
            if r.next_id is None and r.pending and budget > 0:
                # A whole chunk or none (the oldest prompt always gets one): a prompt is cut
                # where it would be alone, so its rows, and its answer, are the same.
                take = r.pending[: self.prefill_chunk]
                if len(take) > budget and budget < self.prefill_chunk:
                    continue
                budget -= len(take)
                feeds.append((r, take))
        if not feeds:
            return
        drafting = [r.next_id is not None and len(ids) > 1 for r, ids in feeds]
        adapters = self.decoder.lora
        lora = [dict(zip(adapters, r.slot.lora)) for r, _ in feeds] if adapters else None
        try:
            logits = self.decoder.step_batch_rows(
                [(np.asarray(ids, dtype=np.int64), r.slot.cache) for r, ids in feeds],
                drafting,
                lora,
            )
        except Exception as e:  # noqa: BLE001 - one bad step must not take the server down
            # A model that cannot run any more (a lost pipeline rank) answers as a stop.
            kind = "stopped" if isinstance(e, Unavailable) else "error"
            for r, _ in feeds:
                self._fail(r, f"generation failed: {type(e).__name__}: {e}", kind)
            return
        self.steps += 1
        for (r, ids), rows, drafted in zip(feeds, logits, drafting):
            r.slot.tokens.extend(ids)
            if drafted:
                self._verify(r, ids[1:], rows)
                continue
            row = rows[-1]
            if r.next_id is None:
                del r.pending[: len(ids)]
                if r.pending:
                    continue  # more prompt to feed: no token yet
                if self.recurrent:
                    self._save(r.slot)  # the end of a prompt: where a next turn resumes
            r.next_id = None
            self._advance(r, row)

    def _draft(self, r: _Running) -> list[int]:
        """The tokens to verify after r's next one: none without a drafter, or where the
        answer or the context has no room for them."""
        if r.drafter is None or self.spec is None:
            return []
        room = min(
            self.spec.draft_max,
            r.job.max_tokens - r.generated - 1,
            self.n_ctx - r.slot.cache.n_past - 2,
        )
        least = max(self.spec.draft_min, 1)
        draft = r.drafter.draft(r.history, room) if room >= least else []
        return draft if len(draft) >= least else []

    def _verify(self, r: _Running, draft: list[int], rows: np.ndarray) -> None:
        """rows: the logits after r's next token and after each drafted one. The tokens the
        target emits (the kept drafts, then its own), the cache taken back to them."""
        history = list(r.history)
        tokens: list[int] = []
        for i, row in enumerate(rows):
            proposed = draft[i] if i < len(draft) else None
            if proposed is None:
                tok = r.sampler.sample(row, history)
            else:
                tok = verify(r.sampler, row, history, proposed)
            tokens.append(tok)
            history.append(tok)
            if tok != proposed:
                break
        kept = len(tokens) - 1
        self.drafted += len(draft)
        self.accepted += kept
        r.drafted += len(draft)
        r.accepted += kept
        keep = r.slot.cache.n_past - len(draft) + kept
        r.slot.cache.truncate(keep)
        del r.slot.tokens[keep:]
        for tok, row in zip(tokens, rows):
            r.next_id = None
            self._advance(r, row, tok)
            if r.next_id is None:  # the answer ended (or failed, or was cancelled)
                return

    def _new_cache(self) -> KvCache:
        return self.decoder.new_cache(self.n_ctx, rewind=self.rewind)

    def _advance(self, r: _Running, logits: np.ndarray, chosen: int | None = None) -> None:
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
        elif r.generated >= job.max_tokens or r.slot.cache.n_past >= self.n_ctx:
            # (the context must hold the token fed next, so a full one ends here)
            self._finish(r, "length")
        else:
            r.next_id = token

    def _channels(self, r: _Running, parts: list[tuple[str, str]]) -> tuple[str, bool]:
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

    def _finish(self, r: _Running, reason: str) -> None:
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

    def _fail(self, r: _Running, message: str, kind: str = "error") -> None:
        # The cache may hold a half-written step: that slot starts over.
        r.slot.cache = self._new_cache()
        r.slot.tokens.clear()
        r.slot.snapshots.clear()
        if not r.job.cancelled.is_set():
            r.job.emit(kind, message)
        r.slot.job = None
