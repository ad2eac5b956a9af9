"""`frink bench` and `serve` under two ring ranks (as mlx.launch starts them), against
the same command in one process: rank 0 alone answers, the other follows and exits with
it; a killed rank ends a server within seconds."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from frink_subprocess import child_env
from ring import finish, frink, launch
from serve_process import Server, free_port

PROMPT = "What is the capital of France?"
QUESTIONS = ("What is 2+2?", "Name a fruit.")


def test_bench_under_two_ranks_counts_each_rank(tmp_path: Path, tiny_model) -> None:
    model = str(tiny_model("llama").gguf)
    args = ("bench", model, "-p", "8", "-n", "4", "-r", "1", "--backend", "metal")
    (rc0, out0, err0), (rc1, out1, err1) = finish(
        launch(tmp_path, [frink(*args, "--submissions")] * 2, child_env())
    )
    assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
    assert out1 == ""  # a following rank prints nothing
    rows = [
        line for line in out0.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")
    ]
    assert len(rows) == 2 and all("dense-run" in r for r in rows), out0
    assert "lm-head" in rows[1] and "lm-head" not in rows[0]


def _answers(port: int) -> list[str]:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-")
    model = client.models.list().data[0].id

    def ask(q: str) -> str:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": q}], max_tokens=12, temperature=0
        )
        return r.choices[0].message.content or ""

    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    streamed = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    with cf.ThreadPoolExecutor(2) as pool:
        return [streamed, *pool.map(ask, QUESTIONS)]


def _wait_healthy(port: int, procs) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a rank exited before serving"
        url = f"http://127.0.0.1:{port}/health"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.3)
    raise AssertionError("the pipeline server did not come up")


@pytest.mark.real
def test_serve_under_two_ranks(tmp_path: Path, smollm2_path: Path) -> None:
    """Streamed and concurrent answers as one process gives them; then a killed rank 1
    ends rank 0 (exit 1, one error line) within seconds. (A server stopped by a signal
    returns and stops the others as any command does at its end: the bench test.)"""
    args = ("serve", str(smollm2_path), "--backend", "numpy", "-np", "2")
    with contextlib.closing(Server(smollm2_path, *args[2:])) as alone:
        expected = _answers(alone.port)
    port = free_port()
    ranks = launch(tmp_path, [frink(*args, "--port", str(port))] * 2, child_env())
    try:
        _wait_healthy(port, ranks)
        assert _answers(port) == expected
        url = f"http://127.0.0.1:{port}/v1"
        client = openai.OpenAI(base_url=url, api_key="-", max_retries=0)
        with cf.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(
                client.completions.create,
                model=client.models.list().data[0].id,
                prompt="Once upon a time",
                max_tokens=2000,
                temperature=0,
            )
            time.sleep(2)
            ranks[1].kill()
            t0 = time.monotonic()
            ranks[0].wait(timeout=10)
            assert time.monotonic() - t0 < 10 and ranks[0].returncode == 1
            # The request in flight is answered as a stopping server answers: a 503.
            with pytest.raises(openai.APIStatusError) as lost:
                pending.result(timeout=10)
            assert lost.value.status_code == 503, lost.value
        err = ranks[0].stderr.read() if ranks[0].stderr else ""
        assert "error: pipeline: rank 1 stopped" in err
    finally:
        finish(ranks, timeout=5)
