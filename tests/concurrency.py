"""Running a test's requests at the same time: the one way the tests start them together."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def all_at_once(fn: Callable[[int], T], n: int, timeout: float = 300.0) -> list[T]:
    """fn(0) .. fn(n - 1), each on a thread of its own, all running together: their results
    in order. An exception in any is raised here (after all have ended or timed out), and
    one still running after `timeout` seconds raises TimeoutError."""
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(fn, i) for i in range(n)]
        return [f.result(timeout=timeout) for f in futures]
