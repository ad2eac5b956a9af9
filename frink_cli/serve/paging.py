"""The serve engine's paged KV cache: page pools (cache/paged.py: one per layer kind, a
windowed kind's pages given back as they leave the window) for every running sequence, and
a prefix index (cache/prefix.py) over every prefix computed so far.

A job's cache starts from the longest indexed prefix of its ids (shared pages, copied at
its first own row), looked up when its first prompt rows are about to be fed, so a job
admitted while another computes the same system prompt finds that prompt's pages. Full
pages are indexed as they fill, and a finished job's pages (its last, partly filled one
too) stay indexed (least recently used ones given back when a pool needs pages). A job is
admitted when every pool has the pages its prompt needs beyond its indexed prefix (a
windowed pool: at most its window's and one prompt chunk's); when a pool runs out mid-step
the engine preempts its newest job and recomputes it later.

A model with recurrent layers pages its attention layers and keeps each sequence's
recurrent state in its cache, as the slot engine does. A prefix needs the state at its end,
so its states are indexed where prompts and answers end (references: a step never writes
a state in place), and a job resumes only from such a point (a conversation's next turn).
A job whose prompt parts from an indexed one further on than it resumes (a system prompt
shared with an earlier job, another question after it) cuts its prompt's chunks there and
saves its state at that row too: the jobs after it sharing the prefix resume there.

Paged: host-body models (MLA's latent rows too, in the full-attention pool), except those
`unpaged_reason` names (no rows to page). Others keep the slot engine's per-slot caches,
and `refusal` says why (the server prints it at start).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from ..cache import KvCache
from ..cache.kv_cache import keeps_recurrent_state
from ..cache.paged import PAGE, unpaged_reason
from ..cache.prefix import PrefixIndex
from ..decoder import Decoder
from ..errors import FrinkError


def refusal(decoder: Decoder, n_ctx: int) -> str | None:
    """Why the engine keeps per-slot caches for this decoder (None: it pages)."""
    if decoder.backend is not None:
        return f"the {decoder.backend.name} backend's mirrors follow per-slot caches"
    if decoder.layers != range(decoder.cfg.n_layer):
        return "a pipeline stage holds only some layers"
    return unpaged_reason(decoder.cfg, n_ctx)


# The recurrent states the prefix index keeps a slot (llama-server keeps 8 context
# checkpoints a slot): a job saves two or three (its prompt's end, where it parts from an
# indexed prompt, its answer's end).
STATES_PER_SLOT = 8


class EnginePages:
    """Pools of ceil(n_tokens / PAGE) pages each and their index; counts prefix hits."""

    def __init__(
        self, decoder: Decoder, n_slots: int, n_tokens: int, n_ctx: int, chunk: int, rewind: int
    ):
        """n_slots: the engine's (a stateful model's index keeps STATES_PER_SLOT recurrent
        states for each); n_tokens: the pools' rows (0: n_slots whole contexts); n_ctx:
        the sequences' context (what a window is shorter than); chunk: the most prompt rows
        a step feeds a sequence, rewind: the tokens beyond one it may step back (what a
        windowed table holds at most, with its window)."""
        n_tokens = n_tokens or n_slots * n_ctx
        try:
            self.pools = decoder.new_pool(-(-n_tokens // PAGE), n_ctx)
        except MemoryError as e:
            raise FrinkError(
                f"--kv-pool: a KV pool of {n_tokens} tokens cannot be allocated ({e})"
            ) from None
        # A recurrent state summarises its whole prefix: saved where prompts and answers end.
        self.stateful = keeps_recurrent_state(decoder.cfg)
        self.index = PrefixIndex(self.pools, self.stateful, STATES_PER_SLOT * n_slots)
        self._in_flight = -(-(chunk + rewind + 1) // PAGE) + 1
        self.hits = 0  # jobs that started from indexed pages
        self.hit_tokens = 0  # prompt tokens they did not compute

    def attach(self, cache: KvCache, ids: Sequence[int], salt: Hashable) -> int:
        """`cache` (emptied) starts from the longest indexed prefix of ids, leaving at least
        one id to feed (its logits pick the next token); how many ids it holds."""
        cache.truncate(0)
        pages, keep, state = self.index.lookup(ids, salt, most=len(ids) - 1)
        if keep <= 0:
            return 0
        cache.adopt(pages, keep, state)
        self.hits += 1
        self.hit_tokens += keep
        return keep

    def parting(self, ids: Sequence[int], salt: Hashable, resumed: int) -> int:
        """A stateful model's job resumed at `resumed`: the row where its ids part from the
        longest indexed prefix, if that is further on (and before its last id), else 0.
        The job saves its state there as it feeds its prompt, so the next prompt sharing
        that prefix (a system prompt, another question after it) resumes there, not at 0."""
        if not self.stateful:
            return 0
        at = self.index.matched(ids, salt)
        return at if resumed < at < len(ids) else 0

    def publish(
        self,
        cache: KvCache,
        ids: Sequence[int],
        salt: Hashable,
        partial: bool = False,
        windows: bool = True,
    ) -> None:
        """Index the full pages of the rows `cache` holds (ids[r] at row r), and with
        `partial` (a prompt's or a job's end) its last page's rows too, with the recurrent
        state there (a stateful model's only points to resume from). `windows` False (an
        answer's pages as they fill): not the windowed pools' pages, which the sequence
        gives back as its window moves on (a later turn resumes at the answer's end)."""
        pages = [t.pages for t in cache.tables]
        state = cache.snapshot() if partial and self.stateful else None
        self.index.publish(ids, pages, cache.n_past, salt, partial, state, windows)

    def fits(self, ids: Sequence[int], salt: Hashable) -> bool:
        """Whether every pool has the pages ids need beyond their indexed prefix (and one
        more, for the answer's first rows; a windowed pool at most its window's and a
        step's)."""
        held = self.index.lookup(ids, salt).rows // PAGE * PAGE
        need = -(-(len(ids) - held) // PAGE) + 1
        for pool in self.pools:
            span = pool.span
            cap = need if span is None else min(need, -(-span.size // PAGE) + self._in_flight)
            if cap > pool.available():
                return False
        return True

    @property
    def rows_used(self) -> int:
        """Rows of the busiest pool's pages in use (the indexed ones too)."""
        return max(pool.used for pool in self.pools) * PAGE

    @property
    def capacity(self) -> int:
        """Rows each pool holds."""
        return self.pools.n_pages * PAGE

    def describe(self) -> str:
        """What pages and what does not, for the start-up line."""
        kinds = "; ".join(
            f"{pool.kind}: {len(pool.k)} layer{'s' * (len(pool.k) != 1)}"
            + (f", {pool.latent} of latent (MLA) rows" if pool.latent else "")
            + ("" if pool.span is None else ", pages past it given back")
            for pool in self.pools
        )
        line = f"paged KV cache: pools of {self.capacity} tokens ({kinds})"
        if not self.stateful:
            return line + ", shared by prefix"
        return line + (
            "; recurrent layers keep a state per sequence, saved where prompts and answers "
            "end and where a prompt parts from an indexed one: a prefix is shared from those "
            "points"
        )
