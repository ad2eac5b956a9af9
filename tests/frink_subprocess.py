"""Run the real `frink` command in a child process, and check its error contract.

Why a subprocess: the promise under test is about the process a user sees (exit status,
what lands on stdout vs stderr, no traceback), and only a real process shows it, including
what the console script's entry point and Typer do before frink's own code runs.

The child gets the environment pytest started with (FRINK_HOME pinned the way conftest
pins it, so the default model resolves to the session's store even if a test moved it),
without colour, so stderr is plain text. Its peak memory is read with wait4, which lets
the tests say "did not allocate" about a file that claims 2**60 tensors.

Linux keeps a process's peak RSS across fork and exec (ru_maxrss starts from the parent's
high-water mark), so a frink spawned straight from a pytest process that grew to 1.7 GB
would report 1.7 GB. frink is therefore started by a small launcher (_LAUNCHER): it forks
frink and reads frink's own peak with wait4, its high-water mark counting from the
launcher's few MiB; it exits as frink exited (the same code, or the same signal).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_FRINK_HOME_AT_START = os.environ.get("FRINK_HOME")
# argv: PEAK_FILE COMMAND...; writes frink's peak RSS (ru_maxrss) to PEAK_FILE.
_LAUNCHER = r"""
import os, signal, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
while True:
    try:
        _, status, usage = os.wait4(pid, 0)
        break
    except InterruptedError:
        continue
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
os._exit(os.waitstatus_to_exitcode(status))
"""
# Long enough for a cold start on a loaded 2-core CI machine; a hang ends as a failure.
TIMEOUT_S = 120


def frink_command() -> list[str]:
    """The installed console script next to this interpreter, else `python -m frink_cli.cli`."""
    script = Path(sys.executable).parent / "frink"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "frink_cli.cli"]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("FRINK_HOME", None)
    if _FRINK_HOME_AT_START is not None:
        env["FRINK_HOME"] = _FRINK_HOME_AT_START
    for key in ("FORCE_COLOR", "CLICOLOR_FORCE"):
        env.pop(key, None)
    env["NO_COLOR"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    return env


@dataclass
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    peak_rss_mib: float

    def lines(self) -> list[str]:
        """stderr's non-empty lines."""
        return [line for line in self.stderr.splitlines() if line.strip()]

    def describe(self) -> str:
        return (
            f"frink {' '.join(self.args)} -> exit {self.returncode}\n"
            f"--- stdout ---\n{self.stdout[-2000:]}\n--- stderr ---\n{self.stderr[-4000:]}"
        )


def frink(*args: str | Path, stdin: str | bytes = b"", cwd: Path | None = None) -> Result:
    """Run `frink ARGS...`; stdin is empty (not a terminal) unless given. A str argument
    with lone surrogates reaches the child as the raw bytes they escape (os.fsencode)."""
    argv = tuple(str(a) for a in args)
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryDirectory() as tmp,
    ):
        peak_file = Path(tmp) / "peak"
        command = frink_command()
        command[0] = shutil.which(command[0]) or command[0]  # execv takes no PATH search
        proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(peak_file), *command, *argv],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            env=child_env(),
            cwd=cwd,
            start_new_session=True,  # a timeout kills frink with its launcher
        )
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin.encode("utf-8") if isinstance(stdin, str) else stdin)
            proc.stdin.close()
        except BrokenPipeError:  # the child exited before reading: fine, it had its say
            pass
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(TIMEOUT_S, kill)
        timer.start()
        try:
            status = proc.wait()
        finally:
            timer.cancel()
        # frink's own peak, from the launcher (absent if the launcher itself was killed).
        peak_kib = int(peak_file.read_text() or 0) if peak_file.is_file() else 0
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", errors="replace")
        stderr = err.read().decode("utf-8", errors="replace")
    if timed_out.is_set():
        stderr += f"\n[test harness: killed after {TIMEOUT_S} s]"
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = peak_kib / (1024 * 1024 if sys.platform == "darwin" else 1024)
    return Result(argv, status, stdout, stderr, rss)


def assert_error(result: Result, *fragments: str) -> str:
    """The error contract: non-zero exit, nothing on stdout, no traceback, and exactly one
    stderr line, starting "frink: error:" and containing every fragment (case-insensitive).
    Returns that line."""
    info = result.describe()
    assert result.returncode > 0, info  # not 0, and not killed by a signal
    assert result.stdout == "", "stdout must stay empty on an error\n" + info
    assert "Traceback" not in result.stderr, info
    lines = result.lines()
    assert len(lines) == 1, "an error is one line on stderr\n" + info
    line = lines[-1]
    assert line.startswith("frink: error:"), info
    for fragment in fragments:
        assert fragment.lower() in line.lower(), f"{fragment!r} not named in the error\n" + info
    return line


def embed_json(model: str | Path, texts: list[str], *flags: str) -> np.ndarray:
    """`frink embed MODEL TEXTS... FLAGS... --json` -> its vectors [len(texts), dim] (f32);
    a failed run fails the test with its output."""
    result = frink("embed", model, *texts, *flags, "--json")
    assert result.returncode == 0, result
    data = json.loads(result.stdout)["data"]
    return np.array([d["embedding"] for d in data], np.float32)
