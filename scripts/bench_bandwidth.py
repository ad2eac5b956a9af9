"""What a real model's decode streams, per kernel type, against what the machine can read.

    python scripts/bench_bandwidth.py MODEL.gguf [--steps 32] [--threads N]

Decodes `steps` tokens (after a 16-token prompt) with the compiled dots timed per weight
type: each call's W bytes over its wall time, summed per type, gives the achieved GB/s of
that type's kernel during decode. Beside it, the machine's read bandwidth: N threads (all
cores by default, as the kernels use) each reading its share of a 1 GiB buffer, best of 5.
The ratio is the share of the machine's bandwidth each kernel type reaches. FRINK_NATIVE_ISA
picks the kernel variant as usual; quote figures from a quiet machine only.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

import frink_cli
from frink_cli.quant import kernels


class _TimedTypes:
    """The compiled kernels with `dots` timed and its W bytes counted per weight type."""

    def __init__(self, native: object) -> None:
        self.native = native
        self.seconds: dict[int, float] = defaultdict(float)
        self.bytes: dict[int, int] = defaultdict(int)

    def dots(self, qtype: int, w: object, *args: object) -> object:
        t0 = time.perf_counter()
        try:
            return self.native.dots(qtype, w, *args)  # type: ignore[attr-defined]
        finally:
            self.seconds[qtype] += time.perf_counter() - t0
            self.bytes[qtype] += memoryview(w).nbytes  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self.native, name)


def machine_read_gbs(threads: int, size: int = 1 << 30, rounds: int = 5) -> float:
    """GB/s of `threads` threads each reading its share of a `size`-byte buffer (the
    largest of its int64s: one compare a word, so the read sets the pace; a float64 sum's
    pairwise adds held a Zen 5 to 35 of its 45 GB/s. NumPy releases the GIL), best of
    `rounds`."""
    buf = np.ones(size // 8, dtype=np.int64)
    parts = np.array_split(buf, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(rounds):
            t0 = time.perf_counter()
            list(pool.map(np.max, parts))
            best = min(best, time.perf_counter() - t0)
    return size / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=kernels.current_threads())
    args = ap.parse_args()
    if kernels._NATIVE is None:
        raise SystemExit(f"no compiled kernels: {kernels._WHY}")
    machine = machine_read_gbs(args.threads)
    timed = _TimedTypes(kernels._NATIVE)
    dec = frink_cli.load(args.model).decoder
    cache = dec.new_cache(16 + args.steps + 1)
    rng = np.random.default_rng(0)
    with kernels.threads(args.threads):
        dec.step(rng.integers(5, dec.cfg.n_vocab, 16), cache)
        kernels._NATIVE = timed
        t0 = time.perf_counter()
        for _ in range(args.steps):
            dec.step(rng.integers(5, dec.cfg.n_vocab, 1), cache)
        wall = time.perf_counter() - t0
    print(f"{kernels.kernel_path()}, {args.threads} threads: machine read {machine:.1f} GB/s")
    per_token = sum(timed.bytes.values()) / args.steps / 1e6
    print(f"decode {args.steps / wall:.1f} tok/s; per token {per_token:.0f} MB in dots")
    print("| type | MB per token | ms per token | GB/s | of the machine's |")
    print("| --- | --: | --: | --: | --: |")
    in_panels = int(timed.native.PANELS)  # type: ignore[attr-defined]  # W in panels: type | flag
    for qt in sorted(timed.bytes, key=lambda q: -timed.bytes[q]):
        mb = timed.bytes[qt] / args.steps / 1e6
        ms = timed.seconds[qt] / args.steps * 1e3
        gbs = timed.bytes[qt] / timed.seconds[qt] / 1e9
        name = GGMLQuantizationType(qt & ~in_panels).name + (" in panels" if qt & in_panels else "")
        print(f"| {name} | {mb:.0f} | {ms:.2f} | {gbs:.1f} | {gbs / machine:.0%} |")


if __name__ == "__main__":
    main()
