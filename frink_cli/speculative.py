"""Speculative decoding: draft several tokens cheaply, verify them in one target step.

Decode on a CPU streams every weight once per token; a step of k + 1 rows costs little more
than a step of one, so k drafted tokens that the target agrees with come almost free.

Drafters (`Drafter`):
- `NgramDrafter` (prompt_lookup.py; prompt lookup, llama.cpp's `--spec-type ngram-simple`):
  the continuation of an earlier occurrence of the history's last tokens, with the edits
  learned from rejected drafts applied. It needs no second model and pays where the
  answer repeats the prompt (code edits, quoting, extraction).
- `ModelDrafter` (llama.cpp's `-md`): a smaller model with the target's vocabulary, greedy,
  its own cache kept in step with the history; it stops drafting when its best token's
  probability falls below `p_min` (llama.cpp's `--draft-p-min`), halved while the target
  keeps making its doubtful picks (draft_gate.py). Its head scores the
  first `draft_vocab` ids and the generation's own tokens only (draft_vocab.py). With
  `--spec ngram` it decodes speculatively itself (staged speculation): prompt lookup
  proposes how its draft goes on, one step of the draft model verifies the proposal, and
  the proposed tokens it picks itself cost no step of their own; the drafts are its own
  greedy picks all the same.
- `MtpDrafter` (mtp.py; `--spec mtp`): the file's multi-token-prediction head, fed the
  target's hidden states.

Verification (`speculative_tokens`): the target runs the drafted tokens in one step with
logits for every row. Greedy: a drafted token is kept while it is the target's own pick,
so the output is plain decoding's token for token (the host body's rows are batch
invariant: a row's logits do not depend on the rows beside it). Sampling: speculative
rejection sampling with a point-mass draft: the draft x is kept with probability p(x) under
the sampler's final distribution p, else a token is drawn from p with x removed, so each
output token is distributed exactly as plain sampling's. After the first rejected draft
the target's own token is emitted; when every draft is kept, so is one more (the bonus).

Caches go back to the last kept token: attention rows are truncated (sliding windows keep
`draft_max` rows more for it); a model with recurrent layers is restored from a snapshot
taken before the verify step, and the kept tokens fed again.
A constraint (grammar, schema) is not combined with speculation: the caller decodes plainly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .cache.kv_cache import CacheSnapshot, KvCache
from .decoder import PREFILL_ROWS, Decoder
from .draft_gate import ConfidenceGate
from .draft_vocab import DraftVocab
from .errors import FrinkError
from .generate import GenerationStats, check_prompt, finite_logits
from .sampling import Sampler
from .tokenizer import Tokenizer

SPEC_TYPES = ("draft", "ngram", "mtp")


@dataclass(frozen=True)
class SpecParams:
    """How much to draft (llama.cpp's --draft-max / --draft-min / --draft-p-min), and the
    n-gram sizes prompt lookup matches (prompt_lookup.py: at least ngram_min tokens; its
    occurrences ranked by how far back they match, up to ngram_max)."""

    draft_max: int = 16
    draft_min: int = 0
    p_min: float = 0.75
    draft_vocab: int = 32768  # a draft model's head: the first ids scored (0: all of them)
    ngram_min: int = 3
    ngram_max: int = 64
    mtp: bool = False  # draft with the file's MTP head (--spec mtp), not by prompt lookup
    lookup: bool = False  # with a draft model: its steps take lookup's proposals (ngram -md)

    def __post_init__(self) -> None:
        if not 1 <= self.draft_max <= 256:
            raise FrinkError(f"--draft-max must be 1..256, got {self.draft_max}")
        if not 0 <= self.draft_min <= self.draft_max:
            raise FrinkError(
                f"--draft-min must be 0..--draft-max ({self.draft_max}), got {self.draft_min}"
            )
        if self.draft_vocab < 0:
            raise FrinkError(
                f"--draft-vocab must be 0 (every token) or more, got {self.draft_vocab}"
            )
        if not 0.0 <= self.p_min <= 1.0:
            raise FrinkError(f"--draft-p-min must be in [0, 1], got {self.p_min}")
        if not 1 <= self.ngram_min <= self.ngram_max <= 64:
            raise FrinkError(
                f"n-gram sizes must satisfy 1 <= min <= max <= 64, got {self.ngram_min}.."
                f"{self.ngram_max}"
            )


class Drafter(Protocol):
    # Whether it reads the target's hidden states (an MTP head): speculative_tokens then
    # hands it every target step's rows after the final norm (observe).
    reads_hidden: bool

    def observe(self, start: int, hidden: np.ndarray) -> None:
        """The target's hidden states (after its final norm) at positions start.."""

    def prepare(self, prompt: Sequence[int]) -> None:
        """Take in the prompt before generation starts (a draft model's own prefill, which
        belongs to the prompt's time, not the answer's)."""

    def draft(self, history: Sequence[int], n: int) -> list[int]:
        """At most n tokens likely to follow `history` (every token so far)."""


class BlindDrafter:
    """A drafter that reads no hidden state of the target."""

    reads_hidden = False

    def observe(self, start: int, hidden: np.ndarray) -> None:
        pass


class ModelDrafter(BlindDrafter):
    """Greedy drafts from a smaller model, its cache kept in step with the history; with a
    `lookup` drafter (prompt lookup), its steps verify lookup's proposals (staged)."""

    def __init__(
        self, decoder: Decoder, n_ctx: int, params: SpecParams, lookup: Drafter | None = None
    ) -> None:
        self.decoder = decoder
        self.n_ctx = n_ctx
        self.params = params
        self.lookup = lookup
        self.cache: KvCache | None = None
        self.fed: list[int] = []  # the tokens the cache holds, in order
        self._snap: CacheSnapshot | None = None  # recurrent drafts: at the history's end
        self.vocab = DraftVocab.for_decoder(decoder, params.draft_vocab)
        self._seen = 0  # tokens of the history the vocabulary has seen
        self._history: list[int] = []  # the history this round drafts after
        self.gate = ConfidenceGate(params.p_min)

    def prepare(self, prompt: Sequence[int]) -> None:
        if self.lookup is not None:
            self.lookup.prepare(prompt)
        self._catch_up(prompt)

    def draft(self, history: Sequence[int], n: int) -> list[int]:
        if n <= 0:
            return []
        self.gate.judge(history)
        self._history = list(history)
        return self._draft_from(*self._catch_up(history), n)

    def _draft_from(self, ids: np.ndarray | None, logits: np.ndarray, n: int) -> list[int]:
        """Greedy drafts from the next token's (ids, logits), up to n, stopping where the
        gate does (a pick under p_min, or half of it while trusted). Each pick is fed with
        lookup's proposal of what follows it, if any, in one step: the proposed tokens this
        model picks itself (its logits at each row) are drafted without a step of their
        own, and the rows after the last one it picks are taken back."""
        drafted: list[int] = []
        self.gate.begin(len(self.fed))
        cache = self._cache()
        while True:
            best = int(np.argmax(logits))
            tok = best if ids is None else int(ids[best])
            if not self.gate.admit(tok, logits):
                break
            drafted.append(tok)
            if len(drafted) == n:
                break
            proposal: list[int] = []
            if self.lookup is not None and not cache.has_recurrent_state:
                proposal = self.lookup.draft([*self._history, *drafted], n - len(drafted))
            if not proposal:
                ids, logits = self._feed([tok], cache)
                self.fed.append(tok)
                continue
            start = cache.n_past  # the row of tok
            ids, rows = self._feed_rows([tok, *proposal], cache)
            self.fed.append(tok)
            done = False
            for row, proposed in zip(rows, proposal):
                best = int(np.argmax(row))
                if (best if ids is None else int(ids[best])) != proposed:
                    break
                if not self.gate.admit(proposed, row):
                    done = True
                    break
                drafted.append(proposed)
                self.fed.append(proposed)
                if len(drafted) == n:
                    done = True
                    break
            logits = rows[len(self.fed) - start - 1]  # the pick after the last one fed
            cache.truncate(len(self.fed))
            if done:
                break
        return drafted

    def _cache(self) -> KvCache:
        if self.cache is None:
            self.cache = self.decoder.new_cache(self.n_ctx, rewind=self.params.draft_max)
        return self.cache

    def _feed(self, ids: Sequence[int], cache: KvCache) -> tuple[np.ndarray | None, np.ndarray]:
        """Feed ids at the cache's end: (None, the last row's logits over every token), or
        with a draft vocabulary (its ids, the logits over them)."""
        if self.vocab is None:
            return None, self.decoder.prefill(np.asarray(ids), cache)[-1]
        if len(ids) > PREFILL_ROWS:  # a long prompt in bounded steps; its head once
            self.decoder.prefill(np.asarray(ids[:-1]), cache)
            ids = ids[-1:]
        vocab, logits = self.vocab.logits(self.decoder.hidden(np.asarray(ids), cache)[-1:])
        return vocab, logits[-1]

    def _feed_rows(
        self, ids: Sequence[int], cache: KvCache
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """Feed ids at the cache's end: _feed's (ids, logits) with the logits of every row."""
        if self.vocab is None:
            return None, self.decoder.step(np.asarray(ids), cache, all_logits=True)
        return self.vocab.logits(self.decoder.hidden(np.asarray(ids), cache))

    def _catch_up(self, history: Sequence[int]) -> tuple[np.ndarray | None, np.ndarray]:
        """Feed what the cache lacks of `history` (at least its last token); _feed's
        (ids, logits) after it."""
        if self.vocab is not None:
            self.vocab.see(history[self._seen :])
            self._seen = len(history)
        cache = self._cache()
        keep = 0
        for a, b in zip(self.fed, history):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(history) - 1)
        if keep < len(self.fed):
            if not cache.has_recurrent_state:
                cache.truncate(keep)
            elif self._snap is not None and self._snap.n_past <= keep:
                cache.restore(self._snap)
                keep = self._snap.n_past
            else:
                self.cache = cache = self.decoder.new_cache(self.n_ctx, self.params.draft_max)
                keep = 0
        out = self._feed(history[keep:], cache)
        self.fed = list(history)
        self._snap = cache.snapshot() if cache.has_recurrent_state else None
        return out


# The host kernels multiply a step's rows by the weights in tiles of up to 8 rows, a tile
# of 2-4 rows costing what 4 do (quant/native_kdots.h's kd_tile_rows): a verify step of
# 17 rows pays a whole pass over the weights for its last row, one of 16 does not.
VERIFY_ROWS_STEP = 4


def tiled_room(room: int) -> int:
    """The drafts to ask for where `room` fit: the most whose verify step (the drafts and
    the token before them) is a whole number of VERIFY_ROWS_STEP rows, or room itself
    where it is too short for one."""
    rows = (room + 1) // VERIFY_ROWS_STEP * VERIFY_ROWS_STEP
    return rows - 1 if rows else room


def check_same_vocab(target: Tokenizer, draft: Tokenizer, draft_name: str) -> None:
    """FrinkError naming the draft model unless its tokens are the target's, id for id."""
    if draft.n_vocab != target.n_vocab:
        raise FrinkError(
            f"draft model {draft_name}: its vocabulary has {draft.n_vocab} tokens, the "
            f"target's {target.n_vocab}; speculative decoding needs the same vocabulary"
        )
    for i in range(target.n_vocab):
        if draft.token_bytes(i) != target.token_bytes(i) or (
            draft.token_text(i) != target.token_text(i)
        ):
            raise FrinkError(
                f"draft model {draft_name}: token {i} is {draft.token_text(i)!r}, the "
                f"target's is {target.token_text(i)!r}; speculative decoding needs the same "
                "vocabulary"
            )


def verify(sampler: Sampler, logits: np.ndarray, history: Sequence[int], proposed: int) -> int:
    """The token the target emits where `proposed` was drafted: proposed itself when kept.
    Greedy: the target's pick. Sampling: proposed with probability p(proposed), else a draw
    from p without it (speculative rejection sampling against a point-mass draft)."""
    if sampler.params.greedy:
        return sampler.sample(logits, history)
    ids, probs = sampler.distribution(logits, history)
    hit = np.flatnonzero(ids == proposed)
    p = float(probs[hit[0]]) if hit.size else 0.0
    if sampler.rng.random() < p:
        return proposed
    rest = probs.copy()
    if hit.size:
        rest[hit[0]] = 0.0
    weights = np.cumsum(rest)
    if weights[-1] <= 0.0:  # p was 1 but for rounding: nothing else can be drawn
        return proposed
    # side="right": the first candidate whose running mass passes u, never the removed one.
    i = int(np.searchsorted(weights, sampler.rng.random() * weights[-1], side="right"))
    return int(ids[min(i, len(ids) - 1)])


def _target_step(
    decoder: Decoder, ids: Sequence[int], cache: KvCache, drafter: Drafter, rows: str
) -> np.ndarray:
    """The target's step over ids: logits for rows "all", the "last" or "none" (a
    replay); a drafter that reads hidden states gets this step's."""
    if not drafter.reads_hidden and rows != "none":
        return decoder.step(np.asarray(ids), cache, all_logits=rows == "all")
    start = cache.n_past
    x = decoder.hidden(np.asarray(ids), cache)
    drafter.observe(start, decoder.host.final_norm(x))
    if rows == "none":
        return x[:0]
    return decoder.logits(x if rows == "all" else x[-1:])


def speculative_tokens(
    decoder: Decoder,
    prompt_ids: Sequence[int],
    sampler: Sampler,
    drafter: Drafter,
    params: SpecParams,
    *,
    max_tokens: int,
    n_ctx: int,
    eog_ids: frozenset[int] = frozenset(),
    stats: GenerationStats | None = None,
) -> Iterator[int]:
    """generate_tokens' contract (the same stops and stats), decoding speculatively;
    stats also count the drafted tokens and the ones kept.

    Each round feeds the newest token (emitted, not yet fed) and its draft in one target
    step, as llama.cpp's server does: the kept drafts and the target's next token come
    out of it, and the next round feeds that token with the next draft."""
    stats = stats if stats is not None else GenerationStats()
    check_prompt(decoder, prompt_ids, n_ctx)
    cache = decoder.new_cache(n_ctx, rewind=params.draft_max)
    history = list(prompt_ids)
    t0 = time.perf_counter()
    rows = _target_step(decoder, prompt_ids, cache, drafter, "last")
    drafter.prepare(prompt_ids)
    stats.prompt_tokens = len(prompt_ids)
    stats.prompt_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    draft: list[int] = []
    snap: CacheSnapshot | None = None
    try:
        while True:
            kept = 0
            for i, row in enumerate(rows):
                proposed = draft[i] if i < len(draft) else None
                row = finite_logits(row)
                if proposed is None:
                    tok = sampler.sample(row, history)
                else:
                    tok = verify(sampler, row, history, proposed)
                if tok in eog_ids:
                    stats.stop_reason = "eog"
                    return
                history.append(tok)
                stats.token_ids.append(tok)
                stats.generated_tokens += 1
                yield tok
                if tok != proposed:
                    break
                kept += 1
                if stats.generated_tokens >= max_tokens:
                    break
            stats.accepted_tokens += kept
            if stats.generated_tokens >= max_tokens:
                break  # the last token's own logits would never be read: no step for it
            if kept < len(draft):  # take back the rejected drafts
                if snap is not None:  # recurrent layers: the state before the step, then
                    cache.restore(snap)  # the fed token and the kept drafts again
                    _target_step(decoder, history[snap.n_past : -1], cache, drafter, "none")
                else:
                    cache.truncate(len(history) - 1)
            room = tiled_room(
                min(
                    params.draft_max,
                    max_tokens - stats.generated_tokens - 1,
                    n_ctx - cache.n_past - 1,
                )
            )
            least = max(params.draft_min, 1)
            draft = drafter.draft(history, room) if room >= least else []
            if len(draft) < least:
                draft = []
            if cache.n_past + 1 + len(draft) > n_ctx:
                stats.stop_reason = "context"
                return
            snap = cache.snapshot() if draft and cache.has_recurrent_state else None
            stats.drafted_tokens += len(draft)
            every = "all" if draft else "last"
            rows = _target_step(decoder, [history[-1], *draft], cache, drafter, every)
        stats.stop_reason = "length"
    finally:
        stats.generate_seconds = time.perf_counter() - t0
