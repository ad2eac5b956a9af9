"""What a client's request is to the serving engine (Job), what it gets back when it ends
(Finish), and who hears of finished jobs (Observer); and the engine's own records of a
sequence slot (Slot) and of a job it runs (Running). engine.py runs them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..cache import CacheSnapshot, KvCache
from ..channels import ChannelSplit
from ..constraint import Constraint
from ..sampling import Sampler, SamplingParams
from ..speculative import Drafter
from .stops import StopText


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
class Slot:
    cache: KvCache
    tokens: list[int] = field(default_factory=list)  # the ids the cache holds, in order
    snapshots: list[CacheSnapshot] = field(default_factory=list)
    last_used: float = 0.0
    job: Running | None = None
    lora: tuple[float, ...] = ()  # the LoRA scales the cached rows were computed with
    # A drafter that reads the target's hidden states (an MTP head): the slot's own, which
    # observes every row the slot's cache takes, so a resumed prefix's states are in it.
    drafter: Drafter | None = None


@dataclass
class Running:
    job: Job
    slot: Slot
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
    # Recurrent layers: the state before a verify step (taken back to it when a draft is
    # rejected), and the ids fed since that the next step feeds again (kept, not in it).
    snap: CacheSnapshot | None = None
    replay: list[int] = field(default_factory=list)
    lora: tuple[float, ...] = ()  # its LoRA scales, fixed at admission
    # Paged: its cache starts from the prefix index before its first rows are fed.
    attach: bool = False
    published: int = 0  # full pages of its rows indexed so far
    parting: int = 0  # a stateful model's: where its prompt parts from an indexed one (0: none)
    preempted: int = 0  # times its pages were taken back (it is recomputed)
