"""The token loop: prefill the prompt, then sample and decode one token at a time.

Timings and counts land in a GenerationStats the caller owns, so the CLI's stats line and
--json read the same numbers. Stops at an end-of-generation token (not yielded), at
max_tokens, when the context is full, or when a constraint's grammar can only end
("grammar").
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from .constraint import Constraint
from .decoder import Decoder
from .errors import FrinkError
from .sampling import Sampler


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    stop_reason: str = ""
    token_ids: list[int] = field(default_factory=list)
    # Speculative decoding (speculative.py): tokens drafted, and how many the target kept.
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generate_tps(self) -> float:
        return self.generated_tokens / self.generate_seconds if self.generate_seconds else 0.0


def finite_logits(logits: np.ndarray) -> np.ndarray:
    """The NaN guard: sampling from non-finite logits yields garbage (greedy picks token 0
    or nothing), so stop and say what usually causes it."""
    if not np.isfinite(logits).all():
        raise FrinkError(
            "the model produced non-finite logits (NaN or Inf): its weights or its metadata "
            "(rope base, norm epsilon, scales) are likely corrupt; --check-tensors scans the "
            "weights"
        )
    return logits


def check_prompt(decoder: Decoder, prompt_ids: Sequence[int], n_ctx: int) -> None:
    """FrinkError (one line) for a prompt that cannot start a generation: empty, as long
    as the context, or holding ids outside the model's embedding."""
    n_prompt = len(prompt_ids)
    if n_prompt == 0:
        raise FrinkError("empty prompt: nothing to condition on (the model adds no BOS)")
    if n_prompt >= n_ctx:
        raise FrinkError(
            f"prompt is {n_prompt} tokens, too long for a context of {n_ctx} (raise -c/--ctx-size)"
        )
    n_vocab = decoder.cfg.n_vocab
    if min(prompt_ids) < 0 or max(prompt_ids) >= n_vocab:
        # A tokenizer larger than the embedding (a broken or mismatched model directory).
        bad = next(i for i in prompt_ids if not 0 <= i < n_vocab)
        raise FrinkError(
            f"prompt token id {bad} is outside the model's {n_vocab} embedding rows "
            "(the tokenizer does not match the weights)"
        )


def generate_tokens(
    decoder: Decoder,
    prompt_ids: Sequence[int],
    sampler: Sampler,
    *,
    max_tokens: int,
    n_ctx: int,
    eog_ids: frozenset[int] = frozenset(),
    stats: GenerationStats | None = None,
    constraint: Constraint | None = None,
) -> Iterator[int]:
    stats = stats if stats is not None else GenerationStats()
    check_prompt(decoder, prompt_ids, n_ctx)
    n_prompt = len(prompt_ids)
    cache = decoder.new_cache(n_ctx)
    history = list(prompt_ids)
    t0 = time.perf_counter()
    logits = finite_logits(decoder.prefill(np.asarray(prompt_ids), cache)[-1])
    stats.prompt_tokens = n_prompt
    stats.prompt_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        for i in range(max_tokens):
            allowed = constraint.allowed() if constraint is not None else None
            token = sampler.sample(logits, history, allowed)
            if token in eog_ids:
                stats.stop_reason = "eog"
                return
            if constraint is not None:
                constraint.accept(token)
            history.append(token)
            stats.token_ids.append(token)
            stats.generated_tokens += 1
            yield token
            if constraint is not None and constraint.finished:
                stats.stop_reason = "grammar"
                return
            if i == max_tokens - 1:
                break  # the last token's own logits would never be read: no step for it
            if cache.n_past >= n_ctx:
                stats.stop_reason = "context"
                return
            logits = finite_logits(decoder.step(np.asarray([token]), cache)[-1])
        stats.stop_reason = "length"
    finally:
        stats.generate_seconds = time.perf_counter() - t0
