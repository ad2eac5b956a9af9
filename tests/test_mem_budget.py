"""--mem-budget: a MoE file bigger than its budget runs with its experts left in the file.

The proof runs frink in a memory cgroup whose limit is below the file's size: loading the
experts whole (what frink did before the budget) is killed there, so the test fails on the
old code; the logits must be the unbounded run's, bit for bit, and llama.cpp's mmap run of
the same file must agree with them. The file is scripts/make_synthetic_gguf.py's
moe-tiny (~320 MB of Q8_0 experts, no tokenizer), made once into the fixture cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import fixture_cache_root
from frink_subprocess import assert_error, child_env, frink

import frink_cli

_REPO = Path(__file__).resolve().parent.parent
_CGROUPS = Path("/sys/fs/cgroup/memory")
_IDS = [1, 17, 42, 99, 3, 250, 7, 128, 64, 200, 11, 5]
# A third of the ~320 MB file; the cgroup's limit sits between this (plus the interpreter
# and NumPy) and the file's size.
_BUDGET_GB = 0.1
_LIMIT_BYTES = 200 << 20

# The child: load under the budget ("auto", GiB, or "default": no budget given), write the
# prompt's logits, the cache's counts and where the budget came from.
_CHILD = r"""
import json, sys
import numpy as np
import frink_cli
from frink_cli.report import describe
path, arg, out = sys.argv[1], sys.argv[2], sys.argv[3]
budget = None if arg == "default" else arg if arg == "auto" else float(arg)
source = describe(path, "numpy", budget)["memory"]["budget_source"]
m = frink_cli.load(path, mem_budget=budget)
np.save(out, m.logits(json.loads(sys.argv[4])))
c = m.expert_cache
print(json.dumps({"resident": c.resident, "capacity": c.capacity, "source": source,
                  "read": c.stats.bytes_read, "misses": c.stats.misses}))
"""


@pytest.fixture(scope="module")
def moe_file() -> Path:
    path = fixture_cache_root() / "synthetic" / "moe-tiny-q8_0.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        script = _REPO / "scripts" / "make_synthetic_gguf.py"
        args = ["--shape", "moe-tiny", "--type", "Q8_0", "--vocab", "256"]
        subprocess.run([sys.executable, str(script), str(path), *args], check=True)
    return path


def _cgroup(name: str, limit: int) -> Path:
    """A v1 memory cgroup limited to `limit` bytes (skip where it cannot be made)."""
    group = _CGROUPS / name
    try:
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as e:
        pytest.skip(f"no memory cgroup (v1, as root) to run under: {e}")
    return group


@pytest.fixture(scope="module")
def unbounded_logits(moe_file: Path) -> np.ndarray:
    """Every expert resident: no budget given, and the file fits this machine's memory."""
    m = frink_cli.load(moe_file)
    assert m.expert_cache is None
    return m.logits(_IDS)


# GiB given; auto (the cgroup's headroom less the margin); no budget at all, where the
# default must choose auto because the model does not fit the cgroup.
@pytest.mark.parametrize("budget", [str(_BUDGET_GB), "auto", "default"])
def test_moe_bigger_than_the_cgroup_runs_with_the_unbounded_logits(
    moe_file: Path, unbounded_logits: np.ndarray, tmp_path: Path, budget: str
) -> None:
    assert moe_file.stat().st_size > _LIMIT_BYTES > _BUDGET_GB * 2**30
    group = _cgroup(f"frink-test-{os.getpid()}", _LIMIT_BYTES)
    out = tmp_path / "logits.npy"
    try:
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(moe_file), budget, str(out), json.dumps(_IDS)],
            env=child_env(),
            capture_output=True,
            text=True,
            # Joins the cgroup before it imports anything.
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
    finally:
        group.rmdir()
    assert child.returncode == 0, f"exit {child.returncode}\n{child.stderr[-3000:]}"
    counts = json.loads(child.stdout)
    assert counts["misses"] and counts["read"] > 0
    assert counts["resident"] <= counts["capacity"] < _LIMIT_BYTES
    if budget == str(_BUDGET_GB):
        assert counts["source"] == "--mem-budget"
    else:
        # The cgroup's limit bounds it, not the machine's MemAvailable.
        assert counts["source"].startswith("auto: ") and "memory.limit_in_bytes" in counts["source"]
    assert np.array_equal(np.load(out), unbounded_logits)


def test_unbounded_logits_match_llama_cpp(moe_file: Path, unbounded_logits: np.ndarray) -> None:
    _against_llama_cpp(moe_file, unbounded_logits)


def _against_llama_cpp(path: Path, logits: np.ndarray) -> None:
    """llama.cpp's mmap run of the file (8-bit activations there and here): each row's
    logits close, the top token the same."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=64,
        logits_all=True,
        use_mmap=True,
        type_k=0,
        type_v=0,
        verbose=False,
    )
    llm.eval(_IDS)
    ref = np.asarray(llm.scores[: len(_IDS)], np.float32)
    scale = np.abs(ref).max()
    assert np.abs(logits - ref).max() <= 2e-2 * scale
    assert (logits.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def test_info_says_what_stays_resident(moe_file: Path) -> None:
    r = frink("info", moe_file, "--mem-budget", str(_BUDGET_GB), "--json")
    assert r.returncode == 0, r.describe()
    mem = json.loads(r.stdout)["memory"]
    assert mem["streams_experts"] and mem["budget"] == _BUDGET_GB
    assert mem["dense"] < mem["expert_cache"] < mem["experts"]
    assert mem["budget_source"] == "--mem-budget"
    whole = json.loads(frink("info", moe_file, "--mem-budget", "1", "--json").stdout)["memory"]
    assert not whole["streams_experts"]
    # auto, outside a cgroup's limit: this machine's MemAvailable (the file fits it).
    auto = json.loads(frink("info", moe_file, "--mem-budget", "auto", "--json").stdout)["memory"]
    assert auto["budget_source"].startswith("auto: ") and not auto["streams_experts"]


def test_bench_reports_the_expert_cache(moe_file: Path) -> None:
    args = ("-p", "4", "-n", "2", "-r", "1", "--json", "--mem-budget", str(_BUDGET_GB))
    r = frink("bench", moe_file, *args)
    assert r.returncode == 0, r.describe()
    # (The warm-up reads what these small tests choose: hits, and nothing read, are fine.)
    for row in json.loads(r.stdout):
        assert 0 <= row["expert_hit_rate"] <= 1 and row["expert_bytes_per_token"] >= 0
    plain = json.loads(frink("bench", moe_file, *args[:-2]).stdout)
    assert all("expert_hit_rate" not in row for row in plain)


@pytest.mark.parametrize(
    "value, fragments",
    [
        ("0.001", ("--mem-budget", "dense weights")),
        ("0", ("--mem-budget", "positive")),
        ("-2", ("--mem-budget", "positive")),
        ("nan", ("--mem-budget", "positive")),
        ("lots", ("--mem-budget", "'lots'", "or auto")),
    ],
)
def test_a_bad_budget_is_one_line(moe_file: Path, value: str, fragments: tuple[str, ...]) -> None:
    assert_error(frink("info", moe_file, "--mem-budget", value), *fragments)


def test_a_device_backend_is_refused_by_name_under_a_small_budget(moe_file: Path) -> None:
    with pytest.raises(frink_cli.FrinkError, match="metal: --mem-budget"):
        frink_cli.load(moe_file, backend="metal", mem_budget=_BUDGET_GB)
