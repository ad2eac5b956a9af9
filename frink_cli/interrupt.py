"""Ctrl-C before the CLI's error handling is in place.

`frink` spends its first few hundred milliseconds importing numpy, typer and rich, outside
any handler of frink's: a Ctrl-C there would end in a KeyboardInterrupt traceback. When
this process is the `frink` command, SIGINT is therefore only recorded until cli.main()
takes over, which then reports it like any other interrupt ("frink: interrupted", 130).
Imported by a library user or a test runner, nothing changes.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

_pending = False


def _record(signum: int, frame: object) -> None:
    global _pending
    _pending = True


def _is_the_command() -> bool:
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    name = Path(main_file or "").name
    return name == "frink" or (name == "cli.py" and "frink_cli" in str(main_file))


if _is_the_command():
    signal.signal(signal.SIGINT, _record)


def pending() -> bool:
    """Whether a Ctrl-C arrived while the command was starting up."""
    return _pending
