"""A decode step of 1 sequence against 8 sequences on one model, alternated: the whole
step and the time inside the quantized kernels' dots (what batching pays for).

    python scripts/bench_step_rows.py MODEL.gguf [--rounds 6] [--steps 8]

Each sequence has a 32-token prompt; each round times `steps` decode steps of the first
sequence alone, then of all 8 in one step_batch (the serve engine's batched step). The
medians over the rounds after the first are printed, with 8 / 1 and the 8 sequences'
throughput over one sequence's. FRINK_NATIVE_ISA picks the kernel variant as usual.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import frink_cli
from frink_cli.quant import kernels


class _TimedDots:
    """The compiled kernels with `dots` timed (everything else passed through)."""

    def __init__(self, native: object) -> None:
        self.native, self.spent = native, 0.0

    def dots(self, *args: object) -> object:
        t0 = time.perf_counter()
        try:
            return self.native.dots(*args)  # type: ignore[attr-defined]
        finally:
            self.spent += time.perf_counter() - t0

    def __getattr__(self, name: str) -> object:
        return getattr(self.native, name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    if kernels._NATIVE is None:
        raise SystemExit(f"no compiled kernels: {kernels._WHY}")
    timed = _TimedDots(kernels._NATIVE)
    kernels._NATIVE = timed
    dec = frink_cli.load(args.model).decoder
    rng = np.random.default_rng(0)
    vocab = dec.cfg.n_vocab
    caches = [dec.new_cache(32 + args.steps + 1) for _ in range(8)]
    for c in caches:
        dec.step(rng.integers(5, vocab, 32), c)
    res: dict[int, list[tuple[float, float]]] = {1: [], 8: []}
    for _ in range(args.rounds):
        for k in (1, 8):
            for c in caches[:k]:
                c.truncate(32)
            timed.spent = 0.0
            t0 = time.perf_counter()
            for _ in range(args.steps):
                dec.step_batch([(rng.integers(5, vocab, 1), c) for c in caches[:k]])
            res[k].append(((time.perf_counter() - t0) / args.steps, timed.spent / args.steps))
    one, eight = (np.median(np.array(res[k][1:]), axis=0) for k in (1, 8))
    for k, (step, dots) in ((1, one), (8, eight)):
        print(f"{k} rows: step {step * 1e3:.1f} ms, dots {dots * 1e3:.1f} ms")
    print(
        f"8 rows / 1 row: step {eight[0] / one[0]:.2f}x, dots {eight[1] / one[1]:.2f}x; "
        f"throughput 8 sequences / 1: {8 * one[0] / eight[0]:.2f}x"
    )


if __name__ == "__main__":
    main()
