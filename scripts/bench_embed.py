"""Embedding throughput: frink against llama-cpp-python's embedding mode on the same GGUF,
in one run, texts per second for one batch of texts of about the same length.

    python scripts/bench_embed.py [MODEL.gguf] [--batch 32] [--tokens 100] [--repeats 5]

MODEL defaults to nomic-embed-text-v1.5 F16 (scripts/fetch_nomic.py, into
$FRINK_TEST_CACHE/real or tests/.cache/real). Each side embeds the same batch once to warm
up, then both run in alternation `repeats` times (the same machine load for both); the
median times and the median of the per-round ratios are reported. llama.cpp runs the whole batch
in one decode (n_batch = n_ubatch holding every token, one sequence per text), on ggml's
plain CPU path (frink_cli.bench.PLAIN_CPU_ENV says why), with as many threads as CPUs.
Figures go to docs/performance.md with the machine named, never into tests.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from frink_cli import api
from frink_cli.bench import llama_cpp_plain_cpu_buffers

_REPO = Path(__file__).resolve().parent.parent
_TEXT = (
    "the model reads each sentence and maps its meaning to a vector so that similar texts "
    "land close together while unrelated ones drift apart in a space of many dimensions "
    "search engines rank documents by the cosine between a query and every passage they "
    "hold clustering groups reviews by topic and retrieval feeds a language model with "
    "facts it never saw during training numbers like 42 3.14 and 2024 appear too"
)
_WORDS = _TEXT.split()


def texts_of(model: api.Model, n: int, tokens: int) -> list[str]:
    """n different texts of `tokens` tokens each ([CLS] and [SEP] included) or just under."""
    out = []
    for i in range(n):
        words = [_WORDS[(i * 7 + k * 3) % len(_WORDS)] for k in range(tokens * 2)]
        while len(model.embed_tokens(" ".join(words))) > tokens:
            words.pop()
        out.append(" ".join(words))
    return out


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def interleaved(
    ours: Callable[[], object], ref: Callable[[], object], repeats: int
) -> tuple[float, float, float]:
    """(our median seconds, the reference's, the median of per-round ratios ref / ours):
    one warm-up each, then rounds of one run each, so both see the same machine load."""
    ours(), ref()
    pairs = []
    for i in range(repeats):
        pairs.append((timed(ours), timed(ref)))
        print(
            f"round {i + 1}: frink {pairs[-1][0]:.2f}s, llama.cpp {pairs[-1][1]:.2f}s", flush=True
        )
    ratio = statistics.median(r / o for o, r in pairs)
    return statistics.median(o for o, _ in pairs), statistics.median(r for _, r in pairs), ratio


def default_model() -> Path:
    sys.path.insert(0, str(_REPO / "scripts"))
    import fetch_nomic

    cache = Path(os.environ.get("FRINK_TEST_CACHE") or _REPO / "tests" / ".cache")
    return Path(fetch_nomic.fetch(cache / "real"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    path = args.model or default_model()
    os.environ["FRINK_LLAMA_CPP_NO_EXTRA_BUFTS"] = "1"
    llama_cpp_plain_cpu_buffers()
    import llama_cpp

    model = api.load(path)
    texts = texts_of(model, args.batch, args.tokens)
    n_tok = sum(len(model.embed_tokens(t)) for t in texts)
    room = -(-n_tok // 256) * 256  # llama.cpp pads its context to 256 cells
    llm = llama_cpp.Llama(
        model_path=str(path),
        embedding=True,
        n_ctx=room,
        n_batch=room,
        n_ubatch=room,
        n_threads=os.cpu_count() or 1,
        verbose=False,
    )
    last: dict[str, np.ndarray] = {}  # each side's latest embeddings, compared at the end

    def frink_side() -> None:
        last["frink"] = model.embed(texts).astype(np.float64)

    def llama_side() -> None:
        last["llama"] = np.array(llm.embed(texts, normalize=True), np.float64)

    ours, ref, ratio = interleaved(frink_side, llama_side, args.repeats)
    a, b = last["frink"], last["llama"]
    cos = ((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min()
    print(f"machine: {platform.machine()} {platform.processor() or '?'}, {os.cpu_count()} CPUs")
    print(f"model: {path.name}; {len(texts)} texts, {n_tok} tokens; min cosine {cos:.7f}")
    print(f"frink:     {len(texts) / ours:8.2f} texts/s ({ours * 1e3:.0f} ms per batch)")
    print(f"llama.cpp: {len(texts) / ref:8.2f} texts/s ({ref * 1e3:.0f} ms per batch)")
    print(f"ratio frink / llama.cpp (median of rounds): {ratio:.2f}x")


if __name__ == "__main__":
    main()
