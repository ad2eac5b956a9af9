#!/usr/bin/env python3
"""--mem-budget on a MoE file bigger than the budget: one run's prompt logits and decode
speed, for docs/performance.md. Run it once per configuration, each in its own process (a
memory cgroup around the bounded ones):

    python scripts/bench_mem_budget.py FILE OUT.npz [--budget GB|auto] [--llama-cpp]

Writes the prompt's logits, the greedy decode's tokens, the decode tokens/s and the expert
cache's counts to OUT.npz (frink), or llama-cpp-python's (its default mmap load, f32 KV) with
--llama-cpp. Compare two outputs' logits with --compare A.npz B.npz. The prompt is fixed
token ids (the synthetic files have no tokenizer).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

PROMPT = [1, 17, 42, 99, 3, 250, 7, 128]


def frink_run(path: Path, budget: str | None, n_gen: int) -> dict:
    import frink_cli

    t0 = time.perf_counter()
    m = frink_cli.load(path, mem_budget=budget)
    load_s = time.perf_counter() - t0
    dec = m.decoder
    cache = dec.new_cache(len(PROMPT) + n_gen + 1)
    logits = dec.step(np.asarray(PROMPT), cache, all_logits=True)
    tokens = [int(logits[-1].argmax())]
    c = m.expert_cache
    before = (c.stats.hits, c.stats.misses, c.stats.bytes_read) if c else (0, 0, 0)
    t0 = time.perf_counter()
    for _ in range(n_gen):
        tokens.append(int(dec.step(np.asarray(tokens[-1:]), cache)[-1].argmax()))
    seconds = time.perf_counter() - t0
    out = {"logits": logits, "tokens": tokens, "tps": n_gen / seconds, "load_s": load_s}
    if c is not None:
        hits, misses, read = (
            c.stats.hits - before[0],
            c.stats.misses - before[1],
            c.stats.bytes_read - before[2],
        )
        out |= {"hit_rate": hits / max(1, hits + misses), "bytes_per_token": read / n_gen}
    return out


def llama_cpp_run(path: Path, n_gen: int) -> dict:
    import llama_cpp

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, type_k=0, type_v=0, verbose=False)
    load_s = time.perf_counter() - t0
    llm.eval(PROMPT)
    logits = np.asarray(llm.scores[: len(PROMPT)], np.float32)
    tokens = [int(logits[-1].argmax())]
    t0 = time.perf_counter()
    for _ in range(n_gen):
        llm.eval(tokens[-1:])
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
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
    ap.add_argument("--compare", action="store_true", help="file and out are two results")
    a = ap.parse_args()
    if a.compare:
        print(json.dumps(compare(np.load(a.file)["logits"], np.load(a.out)["logits"])))
        return
    r = llama_cpp_run(a.file, a.n) if a.llama_cpp else frink_run(a.file, a.budget, a.n)
    np.savez(a.out, **{k: np.asarray(v) for k, v in r.items()})
    print(json.dumps({k: v for k, v in r.items() if k != "logits"}))


if __name__ == "__main__":
    main()
