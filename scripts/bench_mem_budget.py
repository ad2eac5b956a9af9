#!/usr/bin/env python3
"""--mem-budget on a MoE file bigger than the budget: one run's prompt logits and decode
speed, for docs/performance.md. Run it once per configuration, each in its own process (a
memory cgroup around the bounded ones):

    python scripts/bench_mem_budget.py FILE OUT.npz [--budget GB|auto] [--llama-cpp] [--fed]

Writes the prompt's logits (every row), the decode's tokens (greedy, or --fed's fixed ids),
the decode tokens/s and the expert cache's counts to OUT.npz (frink), or llama-cpp-python's
(its default mmap load, f32 KV) with --llama-cpp. --compare A.npz B.npz compares two
outputs' logits row by row (max difference, top-1 agreement; rows that do not match are
refused, never broadcast). The prompt is fixed token ids (the synthetic files have no
tokenizer).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

PROMPT = [1, 17, 42, 99, 3, 250, 7, 128]
# --fed: the decode steps are fed these ids, not the greedy choice (a random synthetic
# model's greedy text loops on one token, and so on the same experts: the cache would
# only ever hit); all below 256, the smallest synthetic vocabulary.
FED = np.random.default_rng(1).integers(0, 256, 4096).tolist()


def _next(step: int, row: np.ndarray, fed: bool) -> int:
    """The id decode step `step` feeds: FED's, or the greedy choice after `row`."""
    return int(FED[step]) if fed else int(row.argmax())


def frink_run(path: Path, budget: str | None, n_gen: int, fed: bool) -> dict:
    import frink_cli

    t0 = time.perf_counter()
    m = frink_cli.load(path, mem_budget=budget)
    load_s = time.perf_counter() - t0
    dec = m.decoder
    cache = dec.new_cache(len(PROMPT) + n_gen + 1)
    logits = dec.step(np.asarray(PROMPT), cache, all_logits=True)
    tokens = [_next(0, logits[-1], fed)]
    c = m.expert_cache
    before = (c.stats.hits, c.stats.misses, c.stats.bytes_read) if c else (0, 0, 0)
    t0 = time.perf_counter()
    for i in range(n_gen):
        tokens.append(_next(i + 1, dec.step(np.asarray(tokens[-1:]), cache)[-1], fed))
    seconds = time.perf_counter() - t0
    out = {"logits": logits, "tokens": tokens, "tps": n_gen / seconds, "load_s": load_s}
    if c is not None:
        hits, misses, read = (
            c.stats.hits - before[0],
            c.stats.misses - before[1],
            c.stats.bytes_read - before[2],
        )
        out |= {"hit_rate": hits / max(1, hits + misses), "bytes_per_token": read / n_gen}
        out["cache_gib"] = c.capacity / 2**30
    return out


def llama_cpp_run(path: Path, n_gen: int, fed: bool) -> dict:
    import llama_cpp

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, type_k=0, type_v=0, verbose=False)
    load_s = time.perf_counter() - t0
    llm.eval(PROMPT)
    logits = np.asarray(llm.scores[: len(PROMPT)], np.float32)
    tokens = [_next(0, logits[-1], fed)]
    t0 = time.perf_counter()
    for i in range(n_gen):
        llm.eval(tokens[-1:])
        tokens.append(_next(i + 1, llm.scores[llm.n_tokens - 1], fed))
    seconds = time.perf_counter() - t0
    return {"logits": logits, "tokens": tokens, "tps": n_gen / seconds, "load_s": load_s}


def compare(x: np.ndarray, y: np.ndarray) -> dict:
    """Two runs' prompt logits [rows, V], row by row (never broadcast: the rows must match)."""
    if x.shape != y.shape:
        raise SystemExit(f"logits of shapes {x.shape} and {y.shape}: not the same prompt rows")
    return {
        "identical": bool(np.array_equal(x, y)),
        "max_abs_diff": float(np.abs(x - y).max()),
        "max_diff_of_scale": float(np.abs(x - y).max() / np.abs(y).max()),
        "top1_same_rows": f"{int((x.argmax(-1) == y.argmax(-1)).sum())} of {len(x)}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget", default=None, help="GiB or auto (default: frink's default)")
    ap.add_argument("--llama-cpp", action="store_true")
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--fed", action="store_true", help="decode fixed random ids, not greedy")
    ap.add_argument("--compare", action="store_true", help="file and out are two results")
    a = ap.parse_args()
    if a.compare:
        print(json.dumps(compare(np.load(a.file)["logits"], np.load(a.out)["logits"])))
        return
    if a.llama_cpp:
        r = llama_cpp_run(a.file, a.n, a.fed)
    else:
        r = frink_run(a.file, a.budget, a.n, a.fed)
    np.savez(a.out, **{k: np.asarray(v) for k, v in r.items()})
    print(json.dumps({k: v for k, v in r.items() if k != "logits"}))


if __name__ == "__main__":
    main()
