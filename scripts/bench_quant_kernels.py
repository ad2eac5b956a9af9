"""Decode-kernel speed of the quantized host kernels (frink_cli/quant) per GGUF type.

    python scripts/bench_quant_kernels.py [--types Q4_0,Q8_0] [--threads 1,2] [--quick]
    python scripts/bench_quant_kernels.py --small     # dots / matmul by T
    python scripts/bench_quant_kernels.py --batch     # a 1.5B's decode step, 1 row vs 8

For each type and weight shape (SmolLM2-135M's and Llama-3.2-1B's matrices) it times
`dots` at T = 1 against NumPy's f32 GEMV of the same matrix (the yardstick: what the
host body does today), both on the same thread count, and prints the GB/s of the
quantized bytes read and the time ratio quantized / f32 (below 1: the quantized kernel is
faster). Times are the minimum over interleaved repeats, so another process on the machine
slows both sides alike; quote ratios, not absolute numbers, from a shared machine.

Weights are random blocks with finite scales (speed does not depend on the values).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from threadpoolctl import threadpool_limits

from frink_cli.quant import kernels
from frink_cli.quant.blocks import KERNEL_TYPES, QuantMatrix

SHAPES = {
    "SmolLM2-135M": [(576, 576), (1536, 576), (576, 1536), (49152, 576)],
    "Llama-3.2-1B": [(2048, 2048), (8192, 2048), (2048, 8192)],
}
# A decode step's matrices of Qwen2.5-Coder-1.5B (q/o, k/v, gate/up, down) for --batch.
QWEN_1_5B = [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960)]
# Byte offsets of each type's f16 fields in a block (gguf-py's dequantize_blocks), set to
# finite values so no scale is a NaN or a denormal.
HALVES = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
}


def random_weights(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> QuantMatrix:
    if qtype in (T.F16, T.BF16):
        f = rng.standard_normal((rows, cols), dtype=np.float32)
        if qtype == T.F16:
            data = f.astype(np.float16).view(np.uint8)
        else:
            data = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return QuantMatrix(data.reshape(rows, 2 * cols), qtype, rows, cols)
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * (cols // block), size), dtype=np.uint8)
    for off in HALVES[qtype]:
        h = rng.uniform(1e-3, 1e-1, len(blocks)).astype(np.float16)
        blocks[:, off : off + 2] = h.view(np.uint8).reshape(-1, 2)
    return QuantMatrix(blocks.reshape(rows, -1), qtype, rows, cols)


def best_times(fns: dict[str, Callable[[], object]], seconds: float) -> dict[str, float]:
    """Minimum time per call of each fn, over short samples taken in blocks, the fns taking
    turns block by block. Blocks, not alternate calls: OpenMP's and OpenBLAS's idle workers
    spin-wait for a while after each call, and two pools taking turns call by call on two
    cores measure each other's spinning (a 2-thread GEMV read 10x slower that way)."""
    for f in fns.values():
        f()
    best = dict.fromkeys(fns, float("inf"))
    rounds = 3
    for _ in range(rounds):
        for name, f in fns.items():
            end = time.perf_counter() + seconds / rounds / len(fns)
            while time.perf_counter() < end:
                n, t0 = 0, time.perf_counter()
                while True:
                    f()
                    n += 1
                    el = time.perf_counter() - t0
                    if el > 3e-4:  # short samples: a preempted one is discarded, not averaged
                        break
                best[name] = min(best[name], el / n)
    return best


def decode_table(types: list[T], threads: list[int], seconds: float) -> None:
    rng = np.random.default_rng(0)
    print(f"kernels: {kernels.kernel_path()}")
    print(
        f"{'type':7} {'model':13} {'shape':>11} {'thr':>3} {'GB/s':>6} {'x f32':>6} "
        f"{'us':>8} {'f32 us':>8} {'f32 GB/s':>8}"
    )
    for qtype in types:
        for model, shapes in SHAPES.items():
            for rows, cols in shapes:
                if cols % GGML_QUANT_SIZES[qtype][0]:
                    continue  # no whole blocks (a K-quant of SmolLM2's 576 columns)
                w = random_weights(qtype, rows, cols, rng)
                wf = kernels.dequantize_rows(w)
                x = rng.standard_normal((1, cols), dtype=np.float32)
                xv = x[0]
                y = np.empty((1, rows), np.float32)
                fns = {"q": partial(kernels.dots, x, w, y), "f": partial(np.matmul, wf, xv)}
                for n in threads:
                    with kernels.threads(n), threadpool_limits(n, "blas"):
                        t = best_times(fns, seconds)
                    gbs = w.nbytes / t["q"] / 1e9
                    print(
                        f"{qtype.name:7} {model:13} {rows:>5}x{cols:<5} {n:>3} {gbs:6.1f} "
                        f"{t['q'] / t['f']:6.2f} {t['q'] * 1e6:8.1f} {t['f'] * 1e6:8.1f} "
                        f"{wf.nbytes / t['f'] / 1e9:8.1f}",
                        flush=True,
                    )


def small_table(types: list[T], threads: list[int], seconds: float) -> None:
    """Which kernel wins at which T: the numbers behind kernels.SMALL_T."""
    rng = np.random.default_rng(1)
    rows, cols = 2048, 2048
    print(f"{rows}x{cols}: us per call (dots / matmul)")
    for qtype in types:
        w = random_weights(qtype, rows, cols, rng)
        for n in threads:
            for t in (1, 2, 3, 4, 6, 8, 12, 16, 32):
                x = rng.standard_normal((t, cols), dtype=np.float32)
                with kernels.threads(n), threadpool_limits(n, "blas"):
                    r = best_times(
                        {
                            "dots": partial(kernels.dots, x, w),
                            "matmul": partial(kernels.matmul, x, w),
                        },
                        seconds,
                    )
                print(
                    f"{qtype.name:7} thr {n} T {t:>3}: "
                    + "  ".join(f"{k} {v * 1e6:8.1f}" for k, v in r.items()),
                    flush=True,
                )


def _step(ws: list[QuantMatrix], xs: list[np.ndarray]) -> None:
    for w, x in zip(ws, xs, strict=True):
        kernels.dots(x, w)


def batch_table(types: list[T], threads: list[int], seconds: float) -> None:
    """A decode step's dots (Qwen2.5-Coder-1.5B's matrices) for 1 row of x and for 8 (a
    server's batch): GB/s of the blocks read, and what 8 rows cost against 1."""
    rng = np.random.default_rng(2)
    print(f"kernels: {kernels.kernel_path()}; Qwen2.5-Coder-1.5B's matrices, one layer")
    for qtype in types:
        ws = [random_weights(qtype, rows, cols, rng) for rows, cols in QWEN_1_5B]
        nbytes = sum(w.nbytes for w in ws)
        xs = {t: [rng.standard_normal((t, w.cols), dtype=np.float32) for w in ws] for t in (1, 8)}

        for n in threads:
            with kernels.threads(n):
                r = best_times(
                    {"1": partial(_step, ws, xs[1]), "8": partial(_step, ws, xs[8])}, seconds
                )
            one, eight = r["1"], r["8"]
            print(
                f"{qtype.name:7} thr {n}: 1 row {one * 1e6:8.1f} us {nbytes / one / 1e9:5.1f} GB/s"
                f"   8 rows {eight * 1e6:8.1f} us ({eight / one:.2f}x)",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=",".join(t.name for t in KERNEL_TYPES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--seconds", type=float, default=1.2, help="timing per measurement")
    ap.add_argument("--small", action="store_true", help="the T sweep instead")
    ap.add_argument("--batch", action="store_true", help="1 row against 8, a 1.5B's step")
    args = ap.parse_args()
    types = [T[name] for name in args.types.split(",")]
    threads = [int(n) for n in args.threads.split(",")]
    if args.small:
        small_table(types, threads, args.seconds)
    elif args.batch:
        batch_table(types, threads, args.seconds)
    else:
        decode_table(types, threads, args.seconds)


if __name__ == "__main__":
    main()
