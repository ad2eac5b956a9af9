"""A real `frink serve` in a child process on a free localhost port, for the server tests
and scripts/bench_serve.py's way of driving one (scripts never import tests/, so that
script has its own few lines for the same job)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from frink_subprocess import child_env, frink_command
from script_loader import load_script

START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _limit_fds(n: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


class Server:
    def __init__(self, model: Path, *args: str, fd_limit: int | None = None) -> None:
        """`frink serve MODEL ARGS...`; fd_limit: the child's RLIMIT_NOFILE (soft and
        hard)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Closed (and removed) in stop(): it outlives this constructor by design.
        self._log = tempfile.NamedTemporaryFile(prefix="frink-serve-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*frink_command(), "serve", str(model), "--port", str(self.port), *args],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env=child_env(),
            start_new_session=True,
            preexec_fn=None if fd_limit is None else lambda: _limit_fds(fd_limit),
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"frink serve exited {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError):
                if self.get("/health")[0] == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"frink serve did not start:\n{self.log()}")
            time.sleep(0.2)

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict]:
        return self.request("GET", path, None, headers)

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict | None = None
    ) -> tuple[int, dict]:
        req = urllib.request.Request(
            self.url + path, data=body, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, {
                **json.loads(e.read() or b"{}"),
                "_headers": {k.lower(): v for k, v in e.headers.items()},
            }

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        self.stop()
        self._log.close()


@contextlib.contextmanager
def clean_stop(server: Server) -> Iterator[Server]:
    """`server` for a fixture to yield: when the fixture ends, it must stop with status 0
    and no traceback in its log; it is closed either way."""
    try:
        yield server
        code = server.stop()
        log = server.log()
        assert code == 0, log
        assert "Traceback" not in log, log
    finally:
        server.close()


def fuzz_base_model(directory: Path) -> Path:
    """scripts/fuzz_inputs.py's base model (a one-layer llama with a tokenizer and a chat
    template, context 64), written as directory/tiny.gguf."""
    path = directory / "tiny.gguf"
    path.write_bytes(load_script("fuzz_inputs").base().encode())
    return path
