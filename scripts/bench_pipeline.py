"""Memory and speed of a pipeline over 1, 2, 4... ranks of MLX's ring on this machine.

    python scripts/bench_pipeline.py MODEL [--ranks 1,2,4] [--backend numpy] [-p 64] [-n 32]
                                     [--micro-batch 64]

For each rank count, starts the ranks as `mlx.launch --backend ring` does (loopback;
one rank: a plain process). Each rank loads its stage, rank 0 runs a prompt of -p tokens
and -n greedy decode steps, and every rank reports its peak RSS and the seconds it spent
computing (its layers, the head) against the whole decode. The communication share is
rank 0's decode time less the ranks' compute, over rank 0's decode time. Prints a
markdown table. --micro-batch N: rank 0 sends the prompt on in parts of N rows, so the
ranks overlap on it (0: the whole prompt as one step; one rank is never cut). Every
run (one rank too) has OMP_WAIT_POLICY=PASSIVE: ranks sharing a machine's cores must
not spin while they wait. On a shared machine the times are noisy; the RSS is not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def rank_main(args: argparse.Namespace, out: Path) -> None:
    """One rank: load, (rank 0) prompt + decode, write this rank's numbers."""
    from frink_cli.api import load
    from frink_cli.decoder import Decoder
    from frink_cli.distributed import launched
    from frink_cli.distributed.pipeline import load_stage
    from frink_cli.distributed.stage import LeadDecoder

    busy = [0.0]
    run_layers = Decoder.run_layers
    logits = Decoder.logits

    def timed(f):
        """f, its time added to busy on one-row (decode) calls."""

        def wrapper(self, x, *a, **k):
            t0 = time.perf_counter()
            try:
                return f(self, x, *a, **k)
            finally:
                if len(x) == 1:
                    busy[0] += time.perf_counter() - t0

        return wrapper

    Decoder.run_layers = timed(run_layers)  # type: ignore[method-assign]
    Decoder.logits = timed(logits)  # type: ignore[method-assign]
    rank = int(os.environ.get("MLX_RANK", "0")) if launched() else 0
    t0 = time.perf_counter()
    model, backend = args.model, args.backend
    n_prompt, n_gen = args.n_prompt, args.n_gen
    model_ = load_stage(model, backend) if launched() else load(model, backend=backend)
    loaded = time.perf_counter() - t0
    row: dict = {"rank": rank, "load_s": loaded}
    if model_ is not None:
        dec = model_.decoder
        if isinstance(dec, LeadDecoder):
            dec.micro_batch = args.micro_batch
        rng = np.random.default_rng(0)
        ids = rng.integers(0, model_.n_vocab, n_prompt)
        cache = dec.new_cache(n_prompt + n_gen + 1)
        t0 = time.perf_counter()
        lg = dec.step(ids, cache)
        row["prompt_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(n_gen):
            lg = dec.step(np.array([int(np.argmax(lg[-1]))]), cache)
        row["decode_s"] = time.perf_counter() - t0
        if isinstance(dec, LeadDecoder):
            dec.close()
    row["compute_decode_s"] = busy[0]  # this rank's compute over the decode steps
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (out / f"{rank}.json").write_text(json.dumps(row))


def measure(args: argparse.Namespace, n: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        # Waiting ranks must not spin their OpenMP threads on the cores the busy one needs.
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_WAIT_POLICY="PASSIVE")
        argv = [sys.executable, __file__, args.model, "--backend", args.backend]
        argv += ["-p", str(args.n_prompt), "-n", str(args.n_gen), "--rank-out", tmp]
        argv += ["--micro-batch", str(args.micro_batch)]
        if n > 1:
            ring = out / "ring.json"
            ring.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in _ports(n)]))
            env.update(MLX_HOSTFILE=str(ring))
        procs = [
            subprocess.Popen(argv, env=dict(env, MLX_RANK=str(r)) if n > 1 else env)
            for r in range(n)
        ]
        for p in procs:
            if p.wait() != 0:
                raise SystemExit(f"a rank failed (exit {p.returncode})")
        return [json.loads((out / f"{r}.json").read_text()) for r in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("-p", "--n-prompt", type=int, default=64)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--rank-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_out:
        rank_main(args, Path(args.rank_out))
        return
    print("| ranks | peak RSS per rank (MiB) | max / 1 rank | pp t/s | tg t/s | ms/token | comm |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    single = None
    for n in [int(x) for x in args.ranks.split(",")]:
        rows = measure(args, n)
        rss = [r["peak_rss_mib"] for r in rows]
        single = single or max(rss)
        lead = rows[0]
        # Each rank's compute during rank 0's decode (a follower does nothing else then).
        compute = sum(r["compute_decode_s"] for r in rows)
        comm = max(0.0, lead["decode_s"] - compute) / lead["decode_s"]
        print(
            f"| {n} | {', '.join(f'{x:.0f}' for x in rss)} | {max(rss) / single:.2f} "
            f"| {args.n_prompt / lead['prompt_s']:.1f} | {args.n_gen / lead['decode_s']:.2f} "
            f"| {1000 * lead['decode_s'] / args.n_gen:.0f} | {comm:.0%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
