"""Where frink keeps its files: everything it writes lives under frink_home().

$FRINK_HOME, else ~/.cache/frink. The model store is its models/ folder (pull.py); caches
other libraries would otherwise put elsewhere go under its cache/ folder.
"""

from __future__ import annotations

import os
from pathlib import Path


def frink_home() -> Path:
    home = os.environ.get("FRINK_HOME")
    if home:
        return Path(home).expanduser()
    return Path.home() / ".cache" / "frink"


def cache_dir(name: str) -> Path:
    """frink_home()/cache/<name>, made on first use."""
    d = frink_home() / "cache" / name
    d.mkdir(parents=True, exist_ok=True)
    return d
