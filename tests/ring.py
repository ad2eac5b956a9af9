"""Start N processes as `mlx.launch -n N --backend ring` starts them, on loopback.

mlx.launch gives each rank MLX_RANK and MLX_HOSTFILE (a JSON list, per rank, of the
"ip:port" its ring listens on). Doing the same here lets a test hold each rank's process:
read its output, kill one, time the others' exit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def hostfile(tmp: Path, n: int) -> Path:
    path = tmp / f"ring{n}.json"
    path.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(n)]))
    return path


def launch(
    tmp: Path,
    argvs: Sequence[Sequence[str]],
    env: dict[str, str] | None = None,
    stdin: int | None = None,
) -> list[subprocess.Popen]:
    """One process per argv (rank = index), stdout and stderr piped, text mode; `stdin`
    for each (subprocess.PIPE: a pipe the test writes to, or holds open)."""
    ring = hostfile(tmp, len(argvs))
    procs = []
    for rank, argv in enumerate(argvs):
        e = dict(env if env is not None else os.environ)
        e.update(MLX_RANK=str(rank), MLX_HOSTFILE=str(ring), PYTHONPATH=str(REPO))
        procs.append(
            subprocess.Popen(
                list(argv),
                env=e,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
        )
    return procs


def worker(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "tests" / "pipeline_worker.py"), *args]


def frink(*args: str) -> list[str]:
    return [sys.executable, "-c", "from frink_cli.cli import main; main()", *args]


def finish(procs: Sequence[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str, str]]:
    """Each rank's (exit code, stdout, stderr); every rank killed if one overruns."""
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out
