"""frink's side of `frink bench`: the decoder loop timed as llama-bench times llama.cpp,
with the backend's ledger read around each sample; the sampled (free / JSON-schema) tests
and the greedy pair (plain / speculative) from the bench's code-edit prompt."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np

from ..constraint import Constraint, Grammar, compile_constraint
from ..errors import FrinkError
from ..generate import GenerationStats, generate_tokens
from ..quant import kernels
from ..sampling import Sampler, SamplingParams
from ..speculative import speculative_tokens
from .cases import SPEC_PROMPT, BenchTest, Sample


class FrinkRunner:
    """frink's decoder loop, with the active backend's ledger read around each sample."""

    runner = "frink"

    def __init__(self, model: Any, n_threads: int) -> None:
        self.model = model
        self.name = model.backend_name
        self.decoder = model.decoder
        self.n_threads = n_threads
        self._constraint: Constraint | None = None

    def _fresh_constraint(self) -> Constraint:
        """The bench schema's constraint in its start state (compiled once)."""
        if self._constraint is None:
            if self.model.tokenizer is None:
                raise FrinkError("--constrained needs the model's tokenizer")
            grammar = Grammar.json_schema(BENCH_SCHEMA, "--constrained")
            self._constraint = compile_constraint(self.model.tokenizer, grammar)[0]
        return self._constraint.copy()

    def threads(self, test: BenchTest) -> int:
        """Threads the test ran with (-t sets them)."""
        with kernels.threads(self.n_threads):
            n = kernels.current_threads()
        # Decode rows: where the decoder's timed choice (backends/host/linear.py) settled.
        return min(n, self.decoder.decode_threads.current) if test.n_gen else n

    def run(self, test: BenchTest, ids: np.ndarray) -> Sample:
        with kernels.threads(self.n_threads):
            return self._run(test, ids)

    def _run(self, test: BenchTest, ids: np.ndarray) -> Sample:
        if test.decode in ("greedy", "spec"):
            return self._generated(test)
        dec = self.decoder
        d = test.n_depth
        # The context exists before the clock starts, as llama.cpp's does.
        cache = dec.new_cache(test.n_ctx)
        cache.reserve(test.n_ctx)
        if d:
            dec.prefill(ids[:d], cache)  # in llama.cpp's ubatch of rows, as llama.cpp does
        ledger = getattr(dec.backend, "ledger", None)
        if ledger is not None:
            ledger.reset()
        experts = self.model.expert_cache
        seen = None if experts is None else replace(experts.stats)
        mask_seconds = 0.0
        if test.decode:
            seconds, mask_seconds = self._sampled(test, ids, cache)
        else:
            t0 = time.perf_counter()
            if test.n_prompt:
                dec.step(ids[d : d + test.n_prompt], cache)
            else:
                for i in range(d, d + test.n_gen):
                    dec.step(ids[i : i + 1], cache)
            seconds = time.perf_counter() - t0
        sample = Sample(seconds, mask_seconds)
        if ledger is not None:
            sample.submissions = Counter(ledger.submissions)
            sample.refusals = Counter(ledger.refusals)
            sample.failures = Counter(getattr(ledger, "failures", {}))
        if experts is not None and seen is not None:
            now = experts.stats
            sample.experts = (
                now.hits - seen.hits,
                now.misses - seen.misses,
                now.bytes_read - seen.bytes_read,
            )
        return sample

    def _sampled(self, test: BenchTest, ids: np.ndarray, cache: Any) -> tuple[float, float]:
        """(seconds, of which in the mask) for test.n_gen tokens each sampled greedily
        from the model's logits, masked for a "json" test; a grammar that ends starts
        again, so every token of the test is under it."""
        dec = self.decoder
        sampler = Sampler(SamplingParams(temperature=0.0), self.model.n_vocab)
        constraint = self._fresh_constraint() if test.decode == "json" else None
        d = test.n_depth
        logits = dec.step(ids[d : d + 1], cache)[-1]  # untimed: the first token's logits
        in_mask = 0.0
        t0 = time.perf_counter()
        for _ in range(test.n_gen):
            allowed = None
            if constraint is not None:
                m0 = time.perf_counter()
                allowed = constraint.allowed()
                in_mask += time.perf_counter() - m0
            token = sampler.sample(logits, (), allowed)
            if constraint is not None:
                m0 = time.perf_counter()
                if token in self.model.tokenizer.eog_ids or constraint.finished:
                    constraint = self._fresh_constraint()
                else:
                    constraint.accept(token)
                in_mask += time.perf_counter() - m0
            logits = dec.step(np.asarray([token]), cache)[-1]
        return time.perf_counter() - t0, in_mask

    def _generated(self, test: BenchTest) -> Sample:
        """test.n_gen tokens generated greedily from SPEC_PROMPT (end-of-generation does
        not stop them), plainly ("greedy") or speculatively ("spec"); the prompt is not
        timed."""
        if self.model.tokenizer is None:
            raise FrinkError("--spec / -md in bench needs the model's tokenizer")
        ids = self.model.prompt_ids(SPEC_PROMPT)
        n_ctx = len(ids) + test.n_gen + 1
        sampler = Sampler(SamplingParams(temperature=0.0), self.model.n_vocab)
        stats = GenerationStats()
        drafter = self.model.drafter(n_ctx) if test.decode == "spec" else None
        if drafter is not None:
            spec = self.model.speculation[0]
            tokens = speculative_tokens(
                self.decoder,
                ids,
                sampler,
                drafter,
                spec,
                max_tokens=test.n_gen,
                n_ctx=n_ctx,
                stats=stats,
            )
        else:
            tokens = generate_tokens(
                self.decoder, ids, sampler, max_tokens=test.n_gen, n_ctx=n_ctx, stats=stats
            )
        for _ in tokens:
            pass
        return Sample(
            stats.generate_seconds, drafted=stats.drafted_tokens, accepted=stats.accepted_tokens
        )

    def close(self) -> None:
        pass


# A JSON schema long enough that a greedy answer stays under it for a tg test (objects,
# strings, numbers, enums, an array), restarting when it ends.
BENCH_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 40},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "role": {"enum": ["admin", "user", "guest"]},
                    "bio": {"type": "string", "maxLength": 200},
                },
                "required": ["name", "age", "role", "bio"],
            },
        }
    },
    "required": ["people"],
}
