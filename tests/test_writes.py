"""frink writes nothing outside FRINK_HOME (its model store), whatever it is asked.

Why a test of its own: a cache, a log or a temp file left in the user's home, the current
directory, the temp dir or beside the model file would go unnoticed by every other test.
Each command runs in a child whose HOME, TMPDIR and working directory are empty folders of
the test's; afterwards only FRINK_HOME may have changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from frink_subprocess import TIMEOUT_S, child_env, frink_command


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root: relative path -> (size, mtime_ns)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def test_nothing_is_written_outside_frink_home(tiny_model: Callable, tmp_path: Path) -> None:
    watched = {name: tmp_path / name for name in ("home", "tmp", "cwd", "models")}
    for d in watched.values():
        d.mkdir()
    frink_home = tmp_path / "frink_home"
    model = watched["models"] / "tiny.gguf"
    shutil.copy(tiny_model("llama").gguf, model)
    bad = watched["models"] / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 20)
    env = child_env()
    env.update(HOME=str(watched["home"]), TMPDIR=str(watched["tmp"]), FRINK_HOME=str(frink_home))
    env.pop("XDG_CACHE_HOME", None)
    before = {name: _tree(d) for name, d in watched.items()}
    commands = [
        ["run", str(model), "-p", "Hello", "-n", "4", "--temp", "0", "--raw"],
        ["run", str(model), "-p", "Hello", "-n", "2", "--json", "--backend", "metal"],
        ["info", str(model), "--json"],
        ["run", str(bad), "-p", "x"],
        ["models"],
        ["pull", "no-such-model"],
        ["parity", str(model), "--backend", "metal"],
    ]
    for args in commands:
        proc = subprocess.run(
            [*frink_command(), *args],
            env=env,
            cwd=watched["cwd"],
            capture_output=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        assert b"Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
    after = {name: _tree(d) for name, d in watched.items()}
    for name in watched:
        assert after[name] == before[name], (
            f"frink wrote into {name}: {after[name]} vs {before[name]}"
        )
