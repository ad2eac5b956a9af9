"""The serve engine's speculative decoding against plain, in one process: forwards (batched
steps) per answer token, the rows fed again after a recurrent state was restored, and
wall time, plain and speculative alternated.

    python scripts/bench_spec_engine.py MODEL [--spec ngram|mtp|self] [--jobs 4]
        [--tokens 32] [--rounds 2] [--draft-max 4]

`self`: the model drafts for itself (every draft kept: the bound of what speculation can
save); ngram / mtp as `frink serve --spec`. Prompts are token ids: blocks of the model's
first ids said twice (prompt lookup finds the repeat), so a model without a tokenizer
runs too. Greedy; every speculative answer is checked against the plain one.
"""

from __future__ import annotations

import argparse
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

import frink_cli
from frink_cli.sampling import SamplingParams
from frink_cli.serve.engine import Engine, Job
from frink_cli.speculative import ModelDrafter, SpecParams


def _answers(engine: Engine, prompts: list[list[int]], n: int) -> list[tuple[int, ...]]:
    done: queue.Queue = queue.Queue()

    def emitter(i: int) -> Callable[[str, object], None]:
        return lambda kind, x: done.put((i, kind, x))

    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0.0)
        engine.submit(Job(p, params, n, (), emitter(i), ignore_eos=True))
    out: dict[int, tuple[int, ...]] = {}
    while len(out) < len(prompts):
        i, kind, x = done.get(timeout=600)
        if kind == "done":
            out[i] = x.tokens
        elif kind in ("error", "stopped"):
            raise SystemExit(f"job {i}: {x}")
    return [out[i] for i in range(len(prompts))]


def _run(model, args, spec: SpecParams | None) -> dict:
    def drafter(n_ctx: int):
        if args.spec == "self":
            return ModelDrafter(model.decoder, n_ctx, spec)
        return model.drafter(n_ctx)

    if spec is not None and args.spec != "self":
        model.speculate(spec)
    engine = Engine(
        model.decoder,
        model.tokenizer,
        n_parallel=args.jobs,
        n_ctx=512,
        drafter=drafter if spec is not None else None,
        spec=spec,
        paged=False,
    )
    t = threading.Thread(target=engine.run, daemon=True)
    t.start()
    try:
        t0 = time.perf_counter()
        answers = _answers(engine, args.prompts, args.tokens)
        wall = time.perf_counter() - t0
    finally:
        engine.stop()
        t.join(60)
        model.speculate(None)
    return {
        "answers": answers,
        "wall": wall,
        "forwards": engine.steps,
        "drafted": engine.drafted,
        "accepted": engine.accepted,
        "replayed": engine.replayed,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--spec", default="ngram", choices=["ngram", "mtp", "self"])
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=4)
    args = ap.parse_args()
    model = frink_cli.load(args.model)
    ids = np.random.default_rng(0).integers(0, model.n_vocab, 64).tolist()
    args.prompts = [ids[a : a + 6 + 5 * j] * 2 for j, a in enumerate(range(args.jobs))]
    spec = SpecParams(draft_max=args.draft_max, p_min=0.0, mtp=args.spec == "mtp")
    for rnd in range(args.rounds):
        plain, fast = _run(model, args, None), _run(model, args, spec)
        if fast["answers"] != plain["answers"]:
            raise SystemExit("speculative answers differ from plain ones")
        tokens = sum(len(a) for a in plain["answers"])
        print(
            f"round {rnd}: {tokens} tokens; plain {plain['forwards']} forwards "
            f"{plain['wall']:.2f} s; --spec {args.spec} {fast['forwards']} forwards "
            f"{fast['wall']:.2f} s ({plain['wall'] / fast['wall']:.2f}x), drafted "
            f"{fast['drafted']}, accepted {fast['accepted']}, ids fed again {fast['replayed']}"
        )


if __name__ == "__main__":
    main()
