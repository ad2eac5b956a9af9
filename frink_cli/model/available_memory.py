"""How much memory this process may still take: the tightest of its memory cgroups' limits
(v2 memory.max, v1 memory.limit_in_bytes, at its own cgroup and every ancestor) less what
each already holds, and the kernel's /proc/meminfo MemAvailable. --mem-budget auto
(model/mem_budget.py) sizes the weights from it.

"What a cgroup holds" is its working set, as the kernel's OOM decision sees it: usage
(v2 memory.current, v1 memory.usage_in_bytes) less the inactive page cache it would drop
first (memory.stat inactive_file, v1 total_inactive_file). Files are read under `root`
("/" on a machine; a fake tree in tests): root/proc/self/cgroup names the groups,
root/proc/self/mounts where each hierarchy is mounted. A cgroup path that is not under
its mount (a container that sees its own group as the mount's root) is read at the mount's
root. An unreadable file or an unlimited cgroup ("max", v1's page-rounded 2^63) sets no
bound; MemAvailable is always one (no /proc/meminfo: a FrinkError).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import FrinkError

# v1 writes "no limit" as 2^63 rounded down to a page; anything this big is unlimited.
_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Available:
    """Bytes this process may still take, and what bounds it (a file, for `frink info`)."""

    bytes: int
    source: str


def available_memory(root: Path = Path("/")) -> Available:
    """The tightest bound: MemAvailable, or a cgroup's limit less its working set."""
    best = _meminfo(root)
    for bound in _cgroup_bounds(root):
        if bound.bytes < best.bytes:
            best = bound
    return best


def _meminfo(root: Path) -> Available:
    path = root / "proc" / "meminfo"
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                return Available(int(value.split()[0]) * 1024, f"{path} MemAvailable")
    except (OSError, ValueError, IndexError):
        pass
    raise FrinkError(f"--mem-budget auto: cannot read MemAvailable from {path}")


def _cgroup_bounds(root: Path) -> list[Available]:
    """A bound for each limited memory cgroup this process is in (its own and ancestors)."""
    mounts = _mounts(root)
    out = []
    for version, group in _groups(root):
        mount = mounts.get(version)
        if mount is None:
            continue
        base = mount / group.lstrip("/")
        if not base.is_dir():
            base = mount
        for d in [base, *base.parents]:
            bound = _bound(d, version)
            if bound is not None:
                out.append(bound)
            if d == mount:
                break
    return out


def _mounts(root: Path) -> dict[int, Path]:
    """Where the v2 hierarchy and the v1 memory hierarchy are mounted (under root)."""
    found: dict[int, Path] = {}
    try:
        lines = (root / "proc" / "self" / "mounts").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        point = root / fields[1].lstrip("/")
        if fields[2] == "cgroup2":
            found.setdefault(2, point)
        elif fields[2] == "cgroup" and "memory" in fields[3].split(","):
            found.setdefault(1, point)
    return found


def _groups(root: Path) -> list[tuple[int, str]]:
    """(version, cgroup path) from /proc/self/cgroup: v2's "0::" line, v1's memory line."""
    try:
        lines = (root / "proc" / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, group = rest.partition(":")
        if hier == "0" and controllers == "":
            out.append((2, group))
        elif "memory" in controllers.split(","):
            out.append((1, group))
    return out


def _bound(d: Path, version: int) -> Available | None:
    """The group's limit less its working set, or None (no limit, or unreadable)."""
    names = ("memory.max", "memory.current", "inactive_file")
    if version == 1:
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    limit = _number(d / names[0])
    usage = _number(d / names[1])
    if limit is None or usage is None or limit >= _UNLIMITED:
        return None
    inactive = _stat(d / "memory.stat", names[2])
    return Available(max(0, limit - max(0, usage - inactive)), str(d / names[0]))


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return _UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
