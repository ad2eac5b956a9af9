"""--mem-budget auto's reading of the memory available (model/available_memory.py), over fake
/proc and /sys trees: cgroup v2 and v1 limits less their working sets, ancestors, a
container's own group at its mount's root, unlimited groups, and MemAvailable; and the
margin the budget leaves (model/mem_budget.auto_budget). The real thing runs under a cgroup
in tests/test_mem_budget.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from frink_cli.errors import FrinkError
from frink_cli.model.available_memory import available_memory
from frink_cli.model.mem_budget import AUTO_MARGIN, auto_budget, parse_budget

MIB = 1 << 20
GIB = 1 << 30
_V2_MOUNT = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
_V1_MOUNT = "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0\n"
_V1_UNLIMITED = 9223372036854771712


def _tree(
    root: Path, meminfo_kb: int, mounts: str = "", cgroup: str = "", groups: dict | None = None
) -> Path:
    """root/proc/{meminfo, self/mounts, self/cgroup}; groups: {dir under root: {file: text}}."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(
        f"MemTotal:       99999999 kB\nMemFree:  1 kB\nMemAvailable:   {meminfo_kb} kB\n"
    )
    (root / "proc" / "self" / "mounts").write_text("proc /proc proc rw 0 0\n" + mounts)
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    for d, files in (groups or {}).items():
        (root / d).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (root / d / name).write_text(text)
    return root


def test_without_cgroups_it_is_memavailable(tmp_path: Path) -> None:
    got = available_memory(_tree(tmp_path, 8 * MIB))
    assert got.bytes == 8 * GIB and got.source.endswith("meminfo MemAvailable")


def test_v2_limit_less_the_working_set(tmp_path: Path) -> None:
    app = "sys/fs/cgroup/user.slice/app"
    stat = "anon 1\ninactive_file 268435456\nactive_file 5\n"
    groups = {
        "sys/fs/cgroup/user.slice": {"memory.max": "max", "memory.current": str(5 * GIB)},
        app: {"memory.max": str(2 * GIB), "memory.current": str(GIB), "memory.stat": stat},
    }
    root = _tree(tmp_path, 16 * MIB, _V2_MOUNT, "0::/user.slice/app\n", groups)
    got = available_memory(root)
    # 2 GiB less (1 GiB used - 256 MiB of inactive page cache).
    assert got.bytes == 2 * GIB - (GIB - 256 * MIB)
    assert got.source == str(root / app / "memory.max")


def test_a_tighter_ancestor_bounds_it(tmp_path: Path) -> None:
    groups = {
        "sys/fs/cgroup/a": {"memory.max": str(3 * GIB), "memory.current": str(2900 * MIB)},
        "sys/fs/cgroup/a/b": {"memory.max": str(2 * GIB), "memory.current": str(GIB)},
    }
    got = available_memory(_tree(tmp_path, 16 * MIB, _V2_MOUNT, "0::/a/b\n", groups))
    assert got.bytes == 3 * GIB - 2900 * MIB and got.source.endswith("a/memory.max")


def test_v1_limit_less_the_working_set(tmp_path: Path) -> None:
    d = "sys/fs/cgroup/memory/docker/abc"
    groups = {
        "sys/fs/cgroup/memory": {
            "memory.limit_in_bytes": str(_V1_UNLIMITED),
            "memory.usage_in_bytes": str(9 * GIB),
        },
        d: {
            "memory.limit_in_bytes": str(GIB),
            "memory.usage_in_bytes": str(600 * MIB),
            "memory.stat": "cache 5\ninactive_file 7\ntotal_inactive_file 104857600\n",
        },
    }
    cgroup = "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n"
    got = available_memory(_tree(tmp_path, 16 * MIB, _V1_MOUNT, cgroup, groups))
    assert got.bytes == GIB - (600 - 100) * MIB
    assert got.source.endswith("docker/abc/memory.limit_in_bytes")


def test_a_containers_own_group_is_read_at_the_mount_root(tmp_path: Path) -> None:
    # The group's path names the host's hierarchy; the container sees its group as the root.
    groups = {"sys/fs/cgroup": {"memory.max": str(GIB), "memory.current": str(256 * MIB)}}
    root = _tree(tmp_path, 16 * MIB, _V2_MOUNT, "0::/kubepods/pod1/ctr\n", groups)
    assert available_memory(root).bytes == GIB - 256 * MIB


def test_unlimited_groups_and_a_tighter_memavailable(tmp_path: Path) -> None:
    groups = {
        "sys/fs/cgroup/a": {"memory.max": "max", "memory.current": str(GIB)},
        "sys/fs/cgroup/b": {"memory.max": str(4 * GIB), "memory.current": "0"},
    }
    # a sets no bound, and b's limit is not this process's.
    got = available_memory(_tree(tmp_path, 8 * MIB, _V2_MOUNT, "0::/a\n", groups))
    assert got.bytes == 8 * GIB and "MemAvailable" in got.source
    # Below b's headroom, MemAvailable is the bound.
    got = available_memory(_tree(tmp_path / "2", 2 * MIB, _V2_MOUNT, "0::/b\n", groups))
    assert got.bytes == 2 * GIB and "MemAvailable" in got.source


def test_no_meminfo_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    with pytest.raises(FrinkError, match="--mem-budget auto: cannot read MemAvailable"):
        available_memory(tmp_path)


@pytest.mark.parametrize(
    "avail, budget", [(8 * GIB, 6 * GIB), (128 * MIB, 128 * MIB - AUTO_MARGIN), (MIB, 0)]
)
def test_the_auto_budget_leaves_a_margin(tmp_path: Path, avail: int, budget: int) -> None:
    got, source = auto_budget(_tree(tmp_path, avail // 1024))
    assert got == budget and source.startswith("auto: ") and "MemAvailable" in source


@pytest.mark.parametrize("text", ["abc", "", "1e999", "-1", "0"])
def test_a_budget_that_is_neither_gb_nor_auto_is_refused(text: str) -> None:
    with pytest.raises(FrinkError, match="--mem-budget .*positive number of GB, or auto"):
        parse_budget(text)


def test_gb_text_and_auto_are_accepted() -> None:
    assert parse_budget("1.5") == 1.5 and parse_budget("auto") == "auto"
    assert parse_budget(None) is None
