"""`frink bench` and `serve` under two ring ranks (as mlx.launch starts them), against
the same command in one process: rank 0 alone answers, the other follows and exits with
it; `-p -` is rank 0's stdin alone; a frozen rank ends a server within seconds."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import signal
import subprocess
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


@pytest.mark.real
def test_run_prompt_from_stdin_under_two_ranks(tmp_path: Path, smollm2_path: Path) -> None:
    """`frink run -p -` as mlx.launch runs it: every rank's stdin is a pipe the launcher
    never closes. Rank 0 reads the prompt (it ends once the pipe goes quiet); a follower
    does not read it at all. A draft model (-md) runs whole on rank 0. The text is one
    process's."""
    model = str(smollm2_path)
    args = ("run", model, "-p", "-", "-n", "8", "--temp", "0", "--backend", "numpy", "-md", model)
    alone = subprocess.run(
        frink(*args), input=PROMPT, capture_output=True, text=True, env=child_env(), timeout=120
    )
    assert alone.returncode == 0, alone.stderr[-2000:]
    ranks = launch(tmp_path, [frink(*args)] * 2, child_env(), stdin=subprocess.PIPE)
    try:
        assert ranks[0].stdin is not None
        ranks[0].stdin.write(PROMPT)
        ranks[0].stdin.flush()  # and left open, as mlx.launch leaves it
        ranks[0].wait(timeout=60)  # (finish's communicate would close the pipes)
    finally:
        (rc0, out0, err0), (rc1, out1, err1) = finish(ranks, timeout=30)
    assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
    assert out0 == alone.stdout and out1 == ""
    assert "speculation:" in err0 and "speculation:" in alone.stderr


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
    """Streamed and concurrent answers as one process gives them; then a frozen rank 1
    (SIGSTOP: alive, silent) ends rank 0 (exit 1, one error line) within seconds, by the
    watchdog (3 s here; a killed rank: test_pipeline.py). (A server stopped by a signal
    returns and stops the others as any command does at its end: the bench test.)"""
    args = ("serve", str(smollm2_path), "--backend", "numpy", "-np", "2")
    with contextlib.closing(Server(smollm2_path, *args[2:])) as alone:
        expected = _answers(alone.port)
    port = free_port()
    env = dict(child_env(), FRINK_PIPELINE_PATIENCE="3")
    ranks = launch(tmp_path, [frink(*args, "--port", str(port))] * 2, env)
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
            ranks[1].send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            ranks[0].wait(timeout=10)
            assert time.monotonic() - t0 < 10 and ranks[0].returncode == 1
            # The request in flight is answered as a stopping server answers: a 503.
            with pytest.raises(openai.APIStatusError) as lost:
                pending.result(timeout=10)
            assert lost.value.status_code == 503, lost.value
        err = ranks[0].stderr.read() if ranks[0].stderr else ""
        assert "error: pipeline: rank 1 froze" in err
    finally:
        ranks[1].kill()
        finish(ranks, timeout=5)
