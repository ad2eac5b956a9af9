"""The fuzzing suite: every hostile input ends in a clean refusal or a correct run.

Why: frink's promise for bad input (one line, non-zero exit, no traceback, no hang,
bounded memory) broke in ways only many inputs find. The cases come from
scripts/fuzz_inputs.py, seeded: truncations at every structural boundary of a tiny GGUF,
byte flips over its header, metadata and tensor-info regions, crafted GGUF headers for
each check, crafted safetensors directories and configs, hostile chat templates. Most run
in-process; a few go through the real CLI for what only a process shows: closed and full
streams, Ctrl-C at random moments, memory on refused inputs; and hostile HTTP clients
against a real `frink serve` (scripts/fuzz_http.py). `make fuzz` runs the same generators
for 20,000+ in-process cases and 2,000 HTTP ones.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest
from frink_subprocess import child_env, frink_command

_GEN = Path(__file__).resolve().parent.parent / "scripts" / "fuzz_inputs.py"
SEED = 11
N_RANDOM = 1500  # plus ~900 fixed cases: about two minutes on 2 cores


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_inputs", _GEN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_inputs", module)
    spec.loader.exec_module(module)
    return module


F = _gen()


def test_in_process_cases() -> None:
    counts, bad = F.run_cases(N_RANDOM, SEED)
    summary = ", ".join(f"{k} {counts.get(k, 0)}" for k in ("clean refusal", "correct run", *F.BAD))
    print(f"\nfuzz (seed {SEED}): {sum(counts.values())} cases: {summary}")
    assert not bad, "\n".join(f"{o}: {n}\n{d}" for n, o, d in bad[:10])
    assert counts["clean refusal"] and counts["correct run"]


# --- hostile HTTP clients -----------------------------------------------------------------

N_HTTP = 300  # of `make fuzz`'s 2,000: about 20 s on 2 cores


def test_http_clients(tmp_path: Path) -> None:
    """A seeded share of scripts/fuzz_http.py's cases against a real `frink serve`:
    malformed framing, drops at every stage, floods, surrogates, huge fields. No death,
    no 500, /health within a second after every case, no traceback in the log."""
    from script_loader import load_script

    H = load_script("fuzz_http")
    model = tmp_path / "tiny.gguf"
    model.write_bytes(F.base().encode())
    counts, bad = H.run_http_cases(model, N_HTTP, SEED)
    print(f"\nhttp fuzz (seed {SEED}): {dict(counts)}")
    assert not bad, "\n".join(f"{o}: {n}\n{d}" for n, o, d in bad[:10])
    assert counts["ok"] == N_HTTP


# --- through the CLI ----------------------------------------------------------------------

# Runs frink in a fresh interpreter and writes its own peak RSS (VmHWM) at exit: wait4's
# ru_maxrss would carry the pytest parent's memory across fork and exec.
_LAUNCHER = (
    "import atexit, os, sys\n"
    "def hwm():\n"
    "    with open('/proc/self/status') as f, open(os.environ['FUZZ_HWM'], 'w') as out:\n"
    "        out.write(next(l.split()[1] for l in f if l.startswith('VmHWM')))\n"
    "atexit.register(hwm)\n"
    "sys.argv[0] = 'frink'\n"
    "from frink_cli.cli import main\n"
    "main()\n"
)


def _run(
    args: list[str],
    *,
    stdin: object = subprocess.DEVNULL,
    stdout: object = None,
    close_fds: tuple[int, ...] = (),
    sigint_after: float | None = None,
    env: dict | None = None,
    measure: bool = False,
    timeout: float = 120,
) -> dict:
    fd, hwm_path = tempfile.mkstemp()
    os.close(fd)
    e = {**child_env(), **(env or {}), "FUZZ_HWM": hwm_path}
    cmd = [sys.executable, "-c", _LAUNCHER, *args] if measure else [*frink_command(), *args]
    if close_fds:  # the shell closes them, then execs frink
        closing = " ".join(f"{n}>&-" if n else "<&-" for n in close_fds)
        cmd = ["sh", "-c", f'exec "$@" {closing}', "sh", *cmd]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd, stdin=stdin, stdout=out if stdout is None else stdout, stderr=err, env=e
        )
        if sigint_after is not None:
            threading.Timer(
                sigint_after, lambda: proc.poll() is None and proc.send_signal(signal.SIGINT)
            ).start()
        t0 = time.perf_counter()
        try:
            proc.wait(timeout)
            hung = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            hung = True
        out.seek(0)
        err.seek(0)
        res = {
            "rc": proc.returncode,
            "stdout": out.read().decode("utf-8", "replace"),
            "stderr": err.read().decode("utf-8", "replace"),
            "hung": hung,
            "seconds": time.perf_counter() - t0,
        }
    raw = Path(hwm_path).read_text().strip()
    os.unlink(hwm_path)
    res["peak_mib"] = int(raw) / 1024 if raw else None
    return res


def _outcome(r: dict, size: int = 0) -> str:
    lines = [x for x in r["stderr"].splitlines() if x.strip()]
    if r["hung"]:
        return "hang"
    if r["rc"] < 0:
        return "crash"
    if "Traceback" in r["stderr"]:
        return "traceback"
    if r["rc"] == 0:
        return "correct run"
    if len(lines) != 1 or not lines[0].startswith("frink: "):
        return "traceback"  # not one clean line: as bad as a traceback for the user
    if r["peak_mib"] is not None and r["peak_mib"] * 2**20 > F.mem_limit(size):
        return "excessive memory"
    return "clean refusal"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fuzz_cli")
    out = {"valid": d / "valid.gguf"}
    out["valid"].write_bytes(F.base().encode())
    crafted = F.crafted_ggufs()
    for name in (
        "dup_key",
        "nested_500",
        "escape_tensor_name",
        "nan_weight",
        "huge_layers",
        "hostile_template",
        "template_bomb",
        "bad_utf8_token",
    ):
        out[name] = d / f"{name}.gguf"
        out[name].write_bytes(crafted[name])
    out["empty_tokens"] = d / "empty_tokens.gguf"
    out["empty_tokens"].write_bytes(F.empty_tokens_gguf())
    out["fifo"] = d / "fifo.gguf"
    os.mkfifo(out["fifo"])
    out["d"] = d
    return out


def test_cli_refusals_and_memory(files: dict[str, Path]) -> None:
    """Refused files through the real CLI: one line, and peak memory within
    256 MiB + 2x the file's size (scripts/fuzz_inputs.py: mem_limit)."""
    run = ["run", "-p", "hello", "-n", "2", "--temp", "0", "-c", "64"]
    jobs = {
        name: ([run[0], str(files[name]), *run[1:]], files[name].stat().st_size)
        for name in (
            "dup_key",
            "nested_500",
            "escape_tensor_name",
            "huge_layers",
            "hostile_template",
            "template_bomb",
            "bad_utf8_token",
            "empty_tokens",
        )
    }
    jobs["nan_check_tensors"] = (
        ["run", str(files["nan_weight"]), "-p", "hi", "--check-tensors"],
        files["nan_weight"].stat().st_size,
    )
    jobs["nan_guard"] = (
        ["run", str(files["nan_weight"]), "-p", "hi", "--temp", "0"],
        files["nan_weight"].stat().st_size,
    )
    jobs["fifo"] = (["run", str(files["fifo"]), "-p", "hi"], 0)
    jobs["dev_zero_prompt"] = (
        ["run", str(files["valid"]), "-f", "/dev/zero", "-c", "64"],
        64 * 1024,
    )
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(jobs, pool.map(lambda j: _run(j[0], measure=True), jobs.values())))
    report = []
    for name, r in results.items():
        o = _outcome(r, jobs[name][1])
        report.append(f"{name}: {o}, peak {r['peak_mib']} MiB, {r['seconds']:.1f} s")
        assert o == "clean refusal", f"{name}: {o}\n{r}"
    assert "\x1b" not in results["escape_tensor_name"]["stderr"]
    assert "non-finite" in results["nan_check_tensors"]["stderr"]
    assert "non-finite" in results["nan_guard"]["stderr"]
    print("\n" + "\n".join(report))


def test_cli_streams(files: dict[str, Path]) -> None:
    valid = str(files["valid"])
    cases = {
        "stdout_closed": _run(["info", valid], close_fds=(1,)),
        "stdin_closed": _run(["run", valid, "-p", "-"], stdin=None, close_fds=(0,)),
    }
    with open("/dev/full", "wb") as full:
        cases["stdout_full"] = _run(
            ["run", valid, "-p", "hello", "-n", "4", "--temp", "0"], stdout=full
        )
    for name, r in cases.items():
        assert _outcome(r) == "clean refusal", f"{name}\n{r}"
    assert _outcome(_run(["run", valid, "-p", "hello", "-n", "3", "--temp", "0"])) == "correct run"


def test_ctrl_c_at_any_point(files: dict[str, Path]) -> None:
    """SIGINT at seeded random moments (start-up, load, reading stdin): always
    `frink: interrupted` and exit 130; `pull` too."""
    rng = random.Random(SEED)
    valid = str(files["valid"])
    jobs = []
    for i in range(6):
        args = ["run", valid, "-p", "-"] + (["--json"] if i % 2 else [])
        jobs.append((args, rng.uniform(0.02, 2.0), {}))
    jobs.append((["pull"], 1.0, {"FRINK_HOME": str(files["d"] / "home")}))

    def one(job: tuple) -> dict:
        args, after, env = job
        # stdin a pipe that stays open: `-p -` waits on it until the signal comes.
        r, w = os.pipe()
        try:
            return _run(args, stdin=r, sigint_after=after, env=env)
        finally:
            os.close(r)
            os.close(w)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, jobs))
    for (args, after, _), res in zip(jobs, results):
        info = f"{args} SIGINT after {after:.2f} s\n{res}"
        assert res["rc"] == 130 and not res["hung"], info
        lines = [x for x in res["stderr"].splitlines() if x.strip()]
        # Progress a command printed before the signal (pull's "fetching ...") may precede
        # it; the interruption itself is one line, the last, and nothing else is said.
        assert lines and lines[-1] == "frink: interrupted", info
        assert "Traceback" not in res["stderr"] and "interrupted" not in "".join(lines[:-1]), info
