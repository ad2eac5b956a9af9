"""A draft model's head over part of the vocabulary (`--draft-vocab N`): the first N token
ids and every id the generation has shown (its prompt and the tokens since).

Why: a draft model's output projection streams every vocabulary row once per drafted token.
Qwen2.5-Coder-0.5B's is 152k rows, 145 MB of the ~400 it reads per token, so drafting
spends a quarter of its time scoring tokens it almost never proposes. The target verifies
every draft, so the output is plain decoding's whatever the draft proposes: a draft limited
to likely tokens costs acceptance only where the target's pick lies outside them (FR-Spec,
EAGLE-3's draft vocabulary). A byte-pair vocabulary numbers its tokens in merge order, so
its first ids are its most frequent ones; the generation's own tokens are added as they
appear, so an answer in rarer tokens (another script, the prompt's identifiers) widens the
set instead of losing every draft.

The first N rows are a view of the file's matrix (no copy); the ids beyond them are
gathered into a small matrix of their own, re-gathered when new ones appear.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .decoder import Decoder
from .model.linear import Linear
from .quant import kernels
from .quant.blocks import PANEL_ROWS, QuantMatrix, QuantRows


class DraftVocab:
    """The head's rows for the first `n_first` ids and the ids seen beyond them."""

    def __init__(self, decoder: Decoder, head: Linear, n_first: int) -> None:
        self.decoder = decoder
        self.head = head
        self.n_first = n_first
        self.first = self._rows(np.arange(n_first), view=True)
        self.extra: list[int] = []  # ids >= n_first seen, in the order first seen
        self._held: set[int] = set()
        self._gathered: Linear | None = None  # the head's rows for `extra`
        self._ids = np.arange(n_first)

    @classmethod
    def for_decoder(cls, decoder: Decoder, n_first: int) -> DraftVocab | None:
        """The draft vocabulary of n_first ids for decoder's head, or None where it would
        be the whole head (n_first 0 or at least the vocabulary), or the head is not one
        f32 matrix or one matrix of the file's blocks run by the host (then every row is
        scored)."""
        head = getattr(decoder.host.w, "output", None)
        if not isinstance(head, Linear) or head.lora or decoder.backend is not None:
            return None  # (a backend's head runs where its layers do)
        w = head.w
        if isinstance(w, QuantRows) and len(w.parts) != 1:
            return None
        if not isinstance(w, QuantRows) and (w.ndim != 2 or w.dtype != np.float32):
            return None
        if not 0 < n_first < w.shape[0]:
            return None
        return cls(decoder, head, n_first)

    def _rows(self, ids: np.ndarray, view: bool = False) -> Linear:
        """The head cut to rows `ids` (view: they are the first len(ids), read in place)."""
        w, b = self.head.w, self.head.b
        n = len(ids)
        if isinstance(w, QuantRows):
            m = w.parts[0]
            if view and (not m.panels or n % PANEL_ROWS == 0):
                part = m.row_slice(0, n)
            else:
                part = kernels.in_panels(QuantMatrix(kernels.file_rows(m, ids), m.qtype, n, m.cols))
            cut: np.ndarray | QuantRows = QuantRows((part,))
        else:
            cut = w[:n] if view else np.ascontiguousarray(w[ids])
        return Linear(cut, None if b is None else np.ascontiguousarray(b[ids]))

    def see(self, ids: Iterable[int]) -> None:
        """Score these ids too from now on (those beyond the first n_first)."""
        rows = self.head.w.shape[0]
        new = [i for i in dict.fromkeys(int(t) for t in ids) if self.n_first <= i < rows]
        new = [i for i in new if i not in self._held]
        if not new:
            return
        self.extra.extend(new)
        self._held.update(new)
        extra = np.asarray(self.extra, dtype=np.int64)
        self._gathered = self._rows(extra)
        self._ids = np.concatenate([np.arange(self.n_first), extra])

    def logits(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, logits [rows, len(ids)]) for the last layer's rows `hidden`: the head over
        the held ids only, logits[:, i] the score of token ids[i]. (The head is applied to
        the first ids' rows and to the gathered ones apart: its steps after the product,
        a scale or a softcap, are per logit.)"""
        host = self.decoder.host
        first = host.logits_over(hidden, self.first)
        if self._gathered is None:
            return self._ids, first
        return self._ids, np.concatenate([first, host.logits_over(hidden, self._gathered)], 1)
