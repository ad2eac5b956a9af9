"""Choosing the next token from logits, with llama.cpp's sampler-chain semantics.

People compare frink's output with llama.cpp's at the same flags, so the same flags must
mean the same thing: the same defaults, the same stage order (llama.cpp's common default:
penalties -> top-k -> top-p -> min-p -> temperature -> dist; its dry, top-n-sigma, typical
and xtc stages are off by default and not offered here), and the same edge cases (which
values switch a stage off, min-p measured on logits before temperature, top-p's
probabilities taken over all candidates left by top-k). The test compares every stage
against llama.cpp's own samplers through llama-cpp-python.

Only the random numbers differ: llama.cpp draws from std::mt19937, frink from NumPy's
seeded Generator, so a seed reproduces frink's own runs, not llama.cpp's.

A constraint (constraint.py: a grammar, a JSON schema, a forced tool call) comes in as
an `allowed` row over the vocabulary and is the chain's first stage: the tokens it rules
out never become candidates, so penalties, top-k, top-p, min-p and temperature all work
on the allowed tokens alone (llama.cpp's grammar sampler has the same effect).

Everything is vectorised over the vocabulary: a 262k-token vocabulary is sampled every
decode step, and a Python loop over it would cost more than a small model's forward pass.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from frink_cli.errors import FrinkError

# llama.cpp's top-p first looks for the cut among this many best candidates, and sorts
# everything only when the nucleus is wider; the result is the same, the cost is not.
_TOP_P_PARTIAL = 256


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings; the defaults are llama.cpp's (common_params_sampling)."""

    temperature: float = 0.8  # <= 0: greedy
    top_k: int = 40  # 0: off
    top_p: float = 0.95  # 1.0: off
    min_p: float = 0.05  # 0.0: off
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = 64  # 0: off, -1: the whole history
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None  # None or -1: a fresh random seed
    # (token id, bias) pairs added to those tokens' logits before every other stage, as
    # llama.cpp's logit-bias sampler heads its chain (OpenAI's logit_bias).
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        # Messages use the CLI's flag names, because that is where bad values come from.
        for flag, value in (
            ("--temp", self.temperature),
            ("--top-p", self.top_p),
            ("--min-p", self.min_p),
            ("--repeat-penalty", self.repeat_penalty),
            ("--frequency-penalty", self.frequency_penalty),
            ("--presence-penalty", self.presence_penalty),
        ):
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise FrinkError(f"{flag} must be a finite number (got {value!r})")
        for flag, value in (
            ("--top-k", self.top_k),
            ("--repeat-last-n", self.repeat_last_n),
        ):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise FrinkError(f"{flag} must be an integer (got {value!r})")
        if self.top_k < 0:
            raise FrinkError(f"--top-k must be >= 0, 0 turns it off (got {self.top_k})")
        if not 0.0 <= self.top_p <= 1.0:
            raise FrinkError(f"--top-p must be in [0, 1], 1 turns it off (got {self.top_p})")
        if not 0.0 <= self.min_p <= 1.0:
            raise FrinkError(f"--min-p must be in [0, 1], 0 turns it off (got {self.min_p})")
        if self.repeat_penalty <= 0.0:
            raise FrinkError(
                f"--repeat-penalty must be > 0, 1 turns it off (got {self.repeat_penalty})"
            )
        if self.repeat_last_n < -1:
            raise FrinkError(
                f"--repeat-last-n must be >= -1 (-1: whole history, 0: off; "
                f"got {self.repeat_last_n})"
            )
        for token, bias in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or token < 0:
                raise FrinkError(f"logit bias: {token!r} is not a token id")
            if not isinstance(bias, numbers.Real) or not math.isfinite(bias):
                raise FrinkError(f"logit bias of token {token} must be a finite number")
        if self.seed is not None:
            if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool):
                raise FrinkError(f"--seed must be an integer (got {self.seed!r})")
            if self.seed < -1:
                raise FrinkError(f"--seed must be >= 0, or -1 for random (got {self.seed})")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Candidates:
    """The tokens still in the running, like llama.cpp's llama_token_data_array.

    `sorted` means ordered by logit, best first; stages that need that order sort only
    when it is not already so, as llama.cpp's do.
    """

    ids: np.ndarray  # int64 token ids
    logits: np.ndarray  # float32, same length
    sorted: bool = False

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def probabilities(self) -> np.ndarray:
        """Softmax over the candidates, rounded as llama.cpp computes it.

        float32 throughout, and the denominator summed sequentially in candidate order
        (a cumsum, not NumPy's pairwise sum): top-p's cut falls where a running float32
        sum crosses p, and over thousands of candidates a differently rounded sum moves
        that cut by a token.
        """
        e = np.exp(self.logits - self.logits.max(), dtype=np.float32)
        return e / np.cumsum(e, dtype=np.float32)[-1]


Stage = Callable[[Candidates], Candidates]


def _sort(c: Candidates) -> Candidates:
    if c.sorted:
        return c
    # Stable, so equal logits keep token order: the lower id first, as greedy picks it.
    order = np.argsort(-c.logits, kind="stable")
    return Candidates(c.ids[order], c.logits[order], sorted=True)


def apply_penalties(
    logits: np.ndarray, history: Sequence[int], params: SamplingParams
) -> np.ndarray:
    """Repeat, frequency and presence penalties over the last repeat_last_n tokens.

    `logits` is a full-vocabulary float32 row (the chain's first stage sees all tokens);
    a penalised copy is returned. As llama.cpp: the repeat penalty applies once per
    distinct recent token however often it occurs, dividing a positive logit and
    multiplying a non-positive one (dividing a negative logit would make the token MORE
    likely); the frequency penalty scales with the count.
    """
    n = params.repeat_last_n
    if n == 0 or (
        params.repeat_penalty == 1.0
        and params.frequency_penalty == 0.0
        and params.presence_penalty == 0.0
    ):
        return logits
    recent = np.asarray(history[-n:] if n > 0 else history, dtype=np.int64).reshape(-1)
    # Ids outside the vocabulary match no candidate, as in llama.cpp.
    recent = recent[(recent >= 0) & (recent < logits.shape[0])]
    if recent.size == 0:
        return logits
    tokens, counts = np.unique(recent, return_counts=True)
    x = logits[tokens]
    rp = np.float32(params.repeat_penalty)
    x = np.where(x <= 0, x * rp, x / rp).astype(np.float32)
    x -= counts.astype(np.float32) * np.float32(params.frequency_penalty) + np.float32(
        params.presence_penalty
    )
    out = logits.copy()
    out[tokens] = x
    return out


def top_k(c: Candidates, k: int) -> Candidates:
    """Keep the k best logits, sorted best first (k <= 0: off)."""
    if k <= 0:
        return c
    k = min(k, len(c))
    if c.sorted:
        return Candidates(c.ids[:k], c.logits[:k], sorted=True)
    if k < len(c):
        part = np.argpartition(-c.logits, k - 1)[:k]
        c = Candidates(c.ids[part], c.logits[part])
    return _sort(c)


def top_p(c: Candidates, p: float) -> Candidates:
    """Keep the smallest best-first prefix whose probability mass reaches p (p >= 1: off).

    The probabilities are over all current candidates; the cut includes the token that
    crosses p. If rounding keeps the running sum below p, everything stays, as in llama.cpp.
    """
    if p >= 1.0:
        return c
    probs = c.probabilities()
    k = _TOP_P_PARTIAL
    # Unsorted: look for the cut among the best k, widening k until it is found, so a
    # large vocabulary is sorted in full only when the nucleus really is that wide.
    while not c.sorted and 4 * k < len(c):
        best = np.argpartition(-c.logits, k - 1)[:k]
        best = best[np.argsort(-c.logits[best], kind="stable")]
        cum = np.cumsum(probs[best], dtype=np.float32)
        reached = np.flatnonzero(cum >= np.float32(p))
        if reached.size:
            sel = best[: int(reached[0]) + 1]
            return Candidates(c.ids[sel], c.logits[sel], sorted=True)
        k *= 8
    if not c.sorted:
        order = np.argsort(-c.logits, kind="stable")
        c, probs = Candidates(c.ids[order], c.logits[order], sorted=True), probs[order]
    cum = np.cumsum(probs, dtype=np.float32)
    reached = np.flatnonzero(cum >= np.float32(p))
    last = int(reached[0]) + 1 if reached.size else len(c)
    return Candidates(c.ids[:last], c.logits[:last], sorted=True)


def min_p(c: Candidates, p: float) -> Candidates:
    """Keep tokens with probability >= p * (best probability), judged on logits (p <= 0: off)."""
    if p <= 0.0 or len(c) == 0:
        return c
    threshold = np.float32(c.logits.max()) + np.log(np.float32(p))
    keep = c.logits >= threshold
    if not keep.any():  # only if p > 1; llama.cpp then keeps the best token alone
        keep[int(np.argmax(c.logits))] = True
    return Candidates(c.ids[keep], c.logits[keep], sorted=c.sorted)


def temperature(c: Candidates, t: float) -> Candidates:
    """Divide logits by t; t <= 0 leaves only the best candidate (t == 1: unchanged)."""
    if t == 1.0 or len(c) == 0:
        return c
    if t <= 0.0:
        best = int(np.argmax(c.logits))  # first of equals, as llama.cpp's scan keeps it
        return Candidates(c.ids[best : best + 1], c.logits[best : best + 1], sorted=True)
    return Candidates(c.ids, (c.logits / np.float32(t)).astype(np.float32), sorted=c.sorted)


class Sampler:
    """Picks the next token from a row of logits and the token history.

    `history` is every token so far, prompt included, as llama.cpp's CLI feeds its
    sampler, so repetition of the prompt is penalised too. The sampler holds no token
    state of its own; only its random generator advances.
    """

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        if n_vocab <= 0:
            raise ValueError(f"n_vocab must be positive, got {n_vocab}")
        if any(token >= n_vocab for token, _ in params.logit_bias):
            raise FrinkError(f"logit bias: a token id is not in this vocabulary of {n_vocab}")
        self.params = params
        self._bias: tuple[np.ndarray, np.ndarray] | None = None
        if params.logit_bias:
            ids, biases = zip(*params.logit_bias)
            self._bias = (np.asarray(ids, np.int64), np.asarray(biases, np.float32))
        self.n_vocab = n_vocab
        seed = None if params.seed is None or params.seed == -1 else int(params.seed)
        self.rng = np.random.default_rng(seed)

    def _penalised(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        row = np.asarray(logits)
        if row.shape != (self.n_vocab,):
            raise ValueError(f"expected logits of shape ({self.n_vocab},), got {row.shape}")
        # astype copies, so the caller's logits are never modified.
        row = row.astype(np.float32)
        if self._bias is not None:
            np.add.at(row, self._bias[0], self._bias[1])  # (a repeated id adds each bias)
        return apply_penalties(row, history, self.params)

    def _candidates(
        self, logits: np.ndarray, history: Sequence[int], allowed: np.ndarray | None = None
    ) -> Candidates:
        row = self._penalised(logits, history)
        if allowed is None:
            return Candidates(np.arange(self.n_vocab, dtype=np.int64), row)
        ids = np.flatnonzero(self._check_allowed(allowed))
        return Candidates(ids, row[ids])

    def _check_allowed(self, allowed: np.ndarray) -> np.ndarray:
        if allowed.shape != (self.n_vocab,) or allowed.dtype != np.bool_:
            raise ValueError(f"expected a bool mask of shape ({self.n_vocab},)")
        if not allowed.any():
            raise FrinkError("the constraint allows no token here (the grammar cannot go on)")
        return allowed

    def stages(self) -> list[tuple[str, Stage]]:
        """The filter chain after penalties, in llama.cpp's order, as (name, stage)."""
        p = self.params
        return [
            ("top_k", lambda c: top_k(c, p.top_k)),
            ("top_p", lambda c: top_p(c, p.top_p)),
            ("min_p", lambda c: min_p(c, p.min_p)),
            ("temperature", lambda c: temperature(c, p.temperature)),
        ]

    def trace(
        self, logits: np.ndarray, history: Sequence[int], allowed: np.ndarray | None = None
    ) -> list[tuple[str, Candidates]]:
        """The candidates after each stage, the constraint's mask and penalties first: for
        tests and diagnostics."""
        c = self._candidates(logits, history, allowed)
        out = [("penalties", c)]
        for name, stage in self.stages():
            c = stage(c)
            out.append((name, c))
        return out

    def distribution(
        self, logits: np.ndarray, history: Sequence[int], allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The final (token ids, probabilities) that a sample is drawn from."""
        c = self.trace(logits, history, allowed)[-1][1]
        return c.ids, self._final_probs(c)

    @staticmethod
    def _final_probs(c: Candidates) -> np.ndarray:
        # As llama.cpp's dist: float32 exponentials, summed in double.
        e = np.exp(c.logits - c.logits.max(), dtype=np.float32).astype(np.float64)
        return e / e.sum()

    def sample(
        self, logits: np.ndarray, history: Sequence[int], allowed: np.ndarray | None = None
    ) -> int:
        """The next token id, among the `allowed` ones when a constraint gives them (a
        bool row over the vocabulary)."""
        if self.params.greedy:
            # Every filter keeps the best token, so greedy is the argmax after penalties
            # (the first of equals, as llama.cpp's greedy scan); skipping the sorts
            # matters on a large vocabulary.
            row = self._penalised(logits, history)
            if allowed is not None:
                row[~self._check_allowed(allowed)] = -np.inf
            return int(np.argmax(row))
        c = self._candidates(logits, history, allowed)
        for _, stage in self.stages():
            c = stage(c)
        weights = np.cumsum(self._final_probs(c))
        # One draw per token even when one candidate is left, as llama.cpp does, so the
        # random stream depends only on the step. The pick is the first candidate whose
        # running mass reaches u: the same inverse-CDF walk as llama.cpp's dist sampler.
        u = self.rng.random() * weights[-1]
        i = int(np.searchsorted(weights, u, side="left"))
        return int(c.ids[min(i, len(c) - 1)])


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log probability under the model, and the k most likely tokens'
    (best first): what an API's `logprobs` reports for each answer token."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprob(logits: np.ndarray, token: int, k: int) -> TokenLogprob:
    """Log softmax of the raw logits (before temperature and penalties, vLLM's default
    meaning), in float64, at `token` and at the k best tokens (ties: the lower id)."""
    z = logits.astype(np.float64)
    m = float(z.max())
    lse = m + math.log(float(np.exp(z - m).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, z.size)
        best = np.argpartition(-z, k - 1)[:k]
        best = best[np.lexsort((best, -z[best]))]  # by logit, then by id
        top = tuple((int(i), float(z[i]) - lse) for i in best)
    return TokenLogprob(int(token), float(z[token]) - lse, top)
