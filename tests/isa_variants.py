"""The compiled kernels' instruction-set variants, and which of them this CPU runs: the
tests that force each one (FRINK_NATIVE_ISA, as a user would, read at import: so in a
child process, `child_json`) skip the others by name."""

from __future__ import annotations

import json
import subprocess
import sys

from frink_cli.quant import kernels

# Every variant native.c carries, best first.
ISAS = ("avx512+amx", "avx512", "avxvnni", "avx2", "base")


def runnable_isas() -> list[str]:
    """The variants this CPU (and its OS, for AMX's tile state) runs."""
    native = kernels._NATIVE
    if native is None:
        return []
    runnable = []
    for name in ISAS:
        try:
            before = native.use_isa(name)
        except ValueError:
            continue
        native.use_isa(before)
        runnable.append(name)
    return runnable


def unrunnable_reason(name: str) -> str | None:
    """Why variant `name` cannot run here (None: it can)."""
    if name in runnable_isas():
        return None
    return f"FRINK_NATIVE_ISA={name}: this CPU does not run it ({kernels.kernel_path()})"


def child_json(code: str, args: list[str], env: dict[str, str], timeout: int) -> dict:
    """Python `code` run in a child process with `args` and `env`: the JSON object its last
    line of output prints (the test fails with its stderr if it exits non-zero)."""
    r = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))
