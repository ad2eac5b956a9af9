"""A serve job's speculative round (engine.py runs it in the batched step): the draft it
feeds after its next token, and the verification of the rows that came back.

Why apart from the engine: the round's bookkeeping (which ids the cache holds, which it
must be fed again) is the same whatever drafts, and is the part that differs between
attention layers (rejected rows truncated) and recurrent ones (the state saved before the
step restored, the kept ids replayed at the head of the job's next step: `Running.replay`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..speculative import Drafter, SpecParams, verify
from .jobs import Running, Slot


def fed(r: Running) -> int:
    """The positions r's ids fill: its cache's, and the ids it feeds again."""
    return r.slot.cache.n_past + len(r.replay)


def job_drafter(
    slot: Slot, make: Callable[[int], Drafter | None] | None, spec: SpecParams | None, n_ctx: int
) -> Drafter | None:
    """A drafter for a job placed in `slot` (make(n_ctx) builds one): a fresh one, or for
    an MTP head (which reads the hidden states of the rows before the draft) the slot's
    own, which has observed every row the slot's cache holds."""
    if make is None:
        return None
    if spec is None or not spec.mtp:
        return make(n_ctx)
    if slot.drafter is None:
        slot.drafter = make(n_ctx)
    return slot.drafter


def draft(r: Running, spec: SpecParams | None, n_ctx: int) -> list[int]:
    """The tokens to verify after r's next one: none without a drafter, or where the
    answer or the context has no room for them. Ids fed again share the step's rows, so a
    step never verifies more than draft_max + 1."""
    if r.drafter is None or spec is None:
        return []
    room = min(
        spec.draft_max - len(r.replay),
        r.job.max_tokens - r.generated - 1,
        n_ctx - fed(r) - 2,
    )
    least = max(spec.draft_min, 1)
    out = r.drafter.draft(r.history, room) if room >= least else []
    return out if len(out) >= least else []


def verify_rows(r: Running, ids: list[int], rows: np.ndarray) -> tuple[list[int], int]:
    """ids: r's next token and its draft, just fed; rows: the logits after each. The
    tokens the target emits (the kept drafts, then its own) and how many drafts it kept;
    r's cache and ids taken back to them (recurrent layers: to the state saved before the
    step, `r.replay` the ids to feed again)."""
    proposals = ids[1:]
    history = list(r.history)
    tokens: list[int] = []
    for i, row in enumerate(rows):
        proposed = proposals[i] if i < len(proposals) else None
        if proposed is None:
            tok = r.sampler.sample(row, history)
        else:
            tok = verify(r.sampler, row, history, proposed)
        tokens.append(tok)
        history.append(tok)
        if tok != proposed:
            break
    kept = len(tokens) - 1
    keep = r.slot.cache.n_past - len(proposals) + kept
    if r.snap is not None and kept < len(proposals):
        r.slot.cache.restore(r.snap)
        r.replay = r.slot.tokens[r.snap.n_past : keep]
        keep = r.snap.n_past
    else:
        r.slot.cache.truncate(keep)
    r.snap = None
    del r.slot.tokens[keep:]
    return tokens, kept
