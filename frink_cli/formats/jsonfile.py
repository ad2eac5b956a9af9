"""The one JSON reader for files that come with a model: bounded in size and depth.

config.json, the tokenizer files, the shard index and safetensors headers all come from
whoever published the model. Python's json module recurses once per nesting level (a
header of 100,000 `[` ends in RecursionError), keeps the last of two equal keys without
a word (so a header can say two things about one tensor), and reads whatever size it is
given. Here the nesting depth is measured before parsing, duplicate keys are refused,
and files are read only up to a cap, so every such input ends in a FrinkError that
names the file.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import FrinkError

# Real configs and tokenizer files nest fewer than 10 levels; 64 leaves room and is far
# below the interpreter's recursion limit.
MAX_DEPTH = 64
# tokenizer.json of a 262k vocabulary is ~33 MB; the cap is for files nothing real reaches.
MAX_FILE_BYTES = 512 * 1024 * 1024

# A JSON string literal: its brackets do not count towards the depth.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_CHUNK = 1 << 20


def _depth(raw: bytes) -> int:
    """The deepest nesting of [ and { in `raw` (strings skipped), without recursion."""
    skeleton = np.frombuffer(_STRING.sub(b"", raw), dtype=np.uint8)
    level, deepest = 0, 0
    # In chunks, so the running sum costs a few MB, not 4 bytes per byte of the file.
    for i in range(0, len(skeleton), _CHUNK):
        c = skeleton[i : i + _CHUNK]
        step = ((c == ord("[")) | (c == ord("{"))).astype(np.int32)
        step -= (c == ord("]")) | (c == ord("}"))
        run = np.cumsum(step, dtype=np.int64) + level
        deepest = max(deepest, int(run.max()))
        level = int(run[-1])
    return deepest


def _no_duplicates(where: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            for k, _ in pairs:
                if k in seen:
                    raise FrinkError(f"{where}: duplicate JSON key {k!r}")
                seen.add(k)
        return out

    return hook


def parse_json(raw: bytes, where: str) -> Any:
    """`raw` (UTF-8 JSON) parsed, refusing excessive nesting and duplicate keys."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FrinkError(f"{where}: not UTF-8 text (byte {e.start})") from None
    depth = _depth(raw)
    if depth > MAX_DEPTH:
        raise FrinkError(f"{where}: JSON nested {depth} levels deep (at most {MAX_DEPTH})")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(where))
    except json.JSONDecodeError as e:
        raise FrinkError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:  # unreachable after the depth check; kept as the last line
        raise FrinkError(f"{where}: JSON nested too deeply") from None


def read_json(path: Path, what: str = "JSON file") -> Any:
    """A JSON file from a model directory, parsed with parse_json's limits."""
    return parse_json(read_model_file(path, what), str(path))


def read_model_file(path: Path, what: str = "file") -> bytes:
    """The bytes of a small file that comes with a model (a regular file, at most
    MAX_FILE_BYTES), or a FrinkError that names it."""
    try:
        with open_regular(path) as f:
            # By the file's size: read(n) allocates n bytes up front, whatever the file holds.
            size = os.fstat(f.fileno()).st_size
            raw = f.read(min(size, MAX_FILE_BYTES) + 1)
    except OSError as e:
        raise FrinkError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise FrinkError(f"{path}: {what} is larger than {MAX_FILE_BYTES} bytes")
    return raw


def open_regular(path: Path) -> BinaryIO:
    """Open `path` for reading only if it is a regular file.

    A FIFO or device given as a model file would block on open or never end; O_NONBLOCK
    keeps the open itself from waiting for a writer, and the stat refuses the rest.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FrinkError(f"{path}: not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
