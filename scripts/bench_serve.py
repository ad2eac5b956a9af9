"""Serving throughput and the prompt cache's time to first token, on localhost.

    python scripts/bench_serve.py MODEL.gguf [--llama-server PATH] [--tokens 64]

Starts `frink serve MODEL -np 8` on a free port (and, given --llama-server, llama.cpp's
own server on the same file, 8 slots, continuous batching, the same threads), then for
1, 4 and 8 concurrent clients sends one greedy /v1/completions request each (distinct
prompts, --tokens tokens, ignore_eos so every answer has the same length) and reports the
aggregate decode rate: all completion tokens over the round's wall time. Then a chat with
a ~400-token history: the first turn's time to first token (streamed) against the
second's, which re-sends that history and finds it in the prompt cache. Then a shared
system prompt (~1,500 tokens): one request's time to first token, then 7 concurrent
requests with the same system prompt and their own questions, each one's time to first
token (the paged cache finds the prompt's pages indexed), and the KV pages /metrics
reports in use.

    --ab: frink twice, its paged KV cache and `--kv-slots` (a whole-context cache per
    slot), alternated --rounds times in one run; each figure is the median of its rounds.

Bounded: a fixed number of requests, each with a timeout; localhost only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

PROMPTS = [
    "The history of the bicycle begins",
    "A recipe for bread:",
    "The planets of the solar system are",
    "Once upon a time, in a small village,",
    "The main causes of the French Revolution were",
    "How a steam engine works:",
    "My favourite animal is",
    "The rules of chess are simple:",
]
TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        return json.loads(r.read())


def first_token_seconds(url: str, body: dict) -> float:
    """Time from sending a streamed request to its first non-empty content chunk."""
    req = urllib.request.Request(
        url, json.dumps({**body, "stream": True}).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        first = None
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            delta = json.loads(line[6:])["choices"]
            if first is None and delta and delta[0].get("delta", {}).get("content"):
                first = time.perf_counter() - t0
        return first if first is not None else float("nan")


class Process:
    def __init__(self, argv: list[str], port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - read in stop()'s lifetime
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True
        )
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"{argv[0]} exited:\n{self.log.read().decode()[-3000:]}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.base + "/health", timeout=5) as r,
            ):
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                raise SystemExit(f"{argv[0]} did not start")
            time.sleep(0.3)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def round_rate(base: str, clients: int, n_tokens: int) -> float:
    """Aggregate completion tokens per second with `clients` concurrent requests."""
    counts: list[int] = []

    def one(i: int) -> None:
        r = post(
            base + "/v1/completions",
            {"prompt": PROMPTS[i], "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True},
        )
        counts.append(int(r["usage"]["completion_tokens"]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    return sum(counts) / (time.perf_counter() - t0)


def chat_cache(base: str) -> tuple[float, float, int]:
    """(first turn TTFT, second turn TTFT, the history's prompt tokens)."""
    notes = "Here are my notes. " + " ".join(
        f"Item {i}: the {w} is on the table." for i, w in enumerate(["cup", "book", "pen"] * 12)
    )
    history = [{"role": "user", "content": notes + " Summarise them."}]
    body = {"messages": history, "max_tokens": 16, "temperature": 0}
    first = first_token_seconds(base + "/v1/chat/completions", body)
    reply = post(base + "/v1/chat/completions", body)
    n_prompt = int(reply["usage"]["prompt_tokens"])
    history += [
        {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
        {"role": "user", "content": "Which item is a pen?"},
    ]
    second = first_token_seconds(base + "/v1/chat/completions", {**body, "messages": history})
    return first, second, n_prompt


SYSTEM = "You are a careful assistant. Follow these rules exactly. " + " ".join(
    f"Rule {i}: when asked about item {i}, answer with the number {i * 7} and nothing else."
    for i in range(72)
)


def shared_prompt(base: str) -> tuple[float, list[float], float]:
    """(first request's TTFT, the next 7 concurrent requests' TTFTs, KV pages in use after
    them: NaN without the paged cache's gauge)."""

    def body(i: int) -> dict:
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Item {i}?"}]
        return {"messages": msgs, "max_tokens": 8, "temperature": 0}

    url = base + "/v1/chat/completions"
    first = first_token_seconds(url, body(0))
    ttfts: dict[int, float] = {}

    def one(i: int) -> None:
        ttfts[i] = first_token_seconds(url, body(i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(1, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        lines = r.read().decode().splitlines()
    used = [float(x.split()[1]) for x in lines if x.startswith("frink_kv_pages_used ")]
    return first, [ttfts[i] for i in sorted(ttfts)], used[0] if used else float("nan")


def measure(base: str, n_tokens: int) -> dict:
    round_rate(base, 1, 8)  # warm up (first-use costs, thread choices)
    rates = {c: round_rate(base, c, n_tokens) for c in (1, 4, 8)}
    return {"rates": rates, "ttft": chat_cache(base), "shared": shared_prompt(base)}


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def report(results: dict[str, list[dict]]) -> None:
    print("| server | 1 client tok/s | 4 clients | 8 clients | 8/1 | TTFT turn 1 | turn 2 |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        rates = {c: median([r["rates"][c] for r in runs]) for c in (1, 4, 8)}
        t1 = median([r["ttft"][0] for r in runs])
        t2, n = median([r["ttft"][1] for r in runs]), runs[0]["ttft"][2]
        print(
            f"| {name} | {rates[1]:.1f} | {rates[4]:.1f} | {rates[8]:.1f} | "
            f"{rates[8] / rates[1]:.2f}x | {t1 * 1000:.0f} ms ({n} tokens) | {t2 * 1000:.0f} ms "
            f"({t2 / t1:.2f}x) |"
        )
    print("\n| server | shared prompt: TTFT 1st | 2nd..8th (median, max) | KV pages used |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        first = median([r["shared"][0] for r in runs])
        rest = median([median(r["shared"][1]) for r in runs])
        worst = median([max(r["shared"][1]) for r in runs])
        print(
            f"| {name} | {first * 1000:.0f} ms | {rest * 1000:.0f} ms ({rest / first:.2f}x), "
            f"{worst * 1000:.0f} ms ({worst / first:.2f}x) | {runs[-1]['shared'][2]:.0f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per request")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--ab", action="store_true", help="frink paged against frink --kv-slots")
    ap.add_argument("--rounds", type=int, default=1, help="alternated runs of each server")
    args = ap.parse_args()
    frink = [sys.executable, "-m", "frink_cli.cli"]
    servers = {
        "frink": lambda port: (
            frink
            + [
                "serve",
                str(args.model),
                "--port",
                str(port),
                "-np",
                "8",
                "-c",
                "2048",
                "--backend",
                args.backend,
            ]
        )
    }
    if args.ab:
        servers["frink --kv-slots"] = lambda port: [*servers["frink"](port), "--kv-slots"]
    if args.llama_server:
        servers["llama-server"] = lambda port: [
            str(args.llama_server),
            "-m",
            str(args.model),
            "--port",
            str(port),
            "-np",
            "8",
            "-c",
            str(8 * 2048),
            "-t",
            str(args.threads),
            "-tb",
            str(args.threads),
            "-cb",
        ]
    results: dict[str, list[dict]] = {name: [] for name in servers}
    for round_ in range(args.rounds):
        # Each round in the other order, so a load that rises or falls favours neither.
        order = list(servers.items()) if round_ % 2 == 0 else list(reversed(servers.items()))
        for name, argv in order:
            port = free_port()
            p = Process(argv(port), port)
            try:
                results[name].append(measure(p.base, args.tokens))
            finally:
                p.stop()
    report(results)


if __name__ == "__main__":
    main()
