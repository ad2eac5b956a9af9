"""How `frink` ends: the one error line and its exit code, for every command.

A bad input (FrinkError, or a flag click rejects) ends with one line on stderr,
`frink: error: ...`, and a non-zero exit; -v (recorded in the CliState the app's context
carries) prints the traceback first. Ctrl-C ends with `frink: interrupted` and 130.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

import click
import typer
from rich.console import Console

from . import interrupt
from .cli_groups import flag_group
from .errors import FrinkError, printable

# soft_wrap: an error or stats line stays one line at any terminal width (rich would
# otherwise wrap at 80 columns when stderr is a pipe, splitting "frink: error: ...").
err = Console(stderr=True, highlight=False, soft_wrap=True)

# Typer >= 0.22 vendors click as typer._click, whose exceptions are not click's own; catch
# both so a bad flag is one line under either. The two copies' ClickExceptions are
# unrelated classes of one shape (show, exit_code, format_message): no common type but Any.
_USAGE_ERRORS: tuple[type[Any], ...] = (click.exceptions.ClickException,)
_ABORTS: tuple[type[BaseException], ...] = (click.exceptions.Abort, typer.Abort)
_HELP_ERRORS: tuple[type[Any], ...] = tuple(
    c for c in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if c is not None
)
try:
    from typer._click import exceptions as _typer_click

    _USAGE_ERRORS += (_typer_click.ClickException,)
    _HELP_ERRORS += (_typer_click.NoArgsIsHelpError,)
except (ImportError, AttributeError):
    pass


@dataclass
class CliState:
    """What a command's flags tell run_app once it returns or fails: with -v, an error line
    comes after its traceback. One per process (STATE): run_app resets it per run."""

    verbose: bool = False


STATE = CliState()


def fail(message: str, code: int = 1) -> None:
    """The one error line (file-supplied text escaped), then exit; never a second failure
    if stderr itself is gone."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        err.print(f"frink: {printable(message)}", markup=False)
    quiet_exit(code)


def quiet_exit(code: int) -> None:
    # The interpreter flushes stdout once more at exit; on a closed pipe or a full disk that
    # flush fails again and prints a second, traceback-like line. Point it at /dev/null.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    sys.exit(code)


def check_streams() -> None:
    """stdout closed (`>&-`) leaves sys.stdout None: say so instead of a traceback later."""
    if sys.stdout is None or sys.stderr is None:
        if sys.stderr is not None:
            sys.stderr.write("frink: error: stdout is closed\n")
        os._exit(1)


def run_app(app: Any) -> None:
    """Run the typer app as `frink`: a bad input (FrinkError, or a flag click rejects)
    ends with one line on stderr and a non-zero exit (-v adds the traceback first); Ctrl-C
    is `frink: interrupted` and 130; a closed stdout pipe ends quietly."""
    check_streams()
    state = STATE
    state.verbose = False
    if hasattr(signal, "SIGPIPE"):
        # `frink run ... | head`: end quietly when the reader goes away, as cat does.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # A corrupt model's overflow shows as NumPy RuntimeWarnings (with their source lines)
    # before the NaN guard's one line says what it means; that line is the report.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"frink_cli(\.|$)")
    # Ctrl-C is KeyboardInterrupt even where the parent started frink with SIGINT ignored
    # (a shell's background job), which would otherwise run on and exit 0.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            if interrupt.pending():
                raise KeyboardInterrupt
            # Typer turns Ctrl-C (and typer.Exit(n)) into a returned exit code when not
            # standalone: 130 is its KeyboardInterrupt, anything else non-zero an Exit.
            code = app(standalone_mode=False)
            if code == 130:
                raise KeyboardInterrupt
            if isinstance(code, int) and not isinstance(code, bool) and code:
                quiet_exit(code)
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # a full disk shows here, inside the handlers below
    except _ABORTS + (KeyboardInterrupt,):
        fail("interrupted", 130)
    except _HELP_ERRORS as e:  # bare `frink`: the help text, not an error line
        e.show()
        sys.exit(e.exit_code)
    except _USAGE_ERRORS as e:
        if state.verbose:
            traceback.print_exc()
        fail(f"error: {e.format_message()}", e.exit_code or 2)
    except FrinkError as e:
        if state.verbose:
            traceback.print_exc()
        fail(f"error: {e}")
    except BrokenPipeError:
        quiet_exit(0)
    except MemoryError:
        fail("error: out of memory")
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EIO, errno.EBADF, errno.EDQUOT, errno.EFBIG):
            # stdout on a full disk or a closed descriptor: the answer cannot be written.
            fail(f"error: cannot write output ({e.strerror})")
        raise


def record_verbose(
    verbosity: bool = typer.Option(False, "-v", "--verbose", help="tracebacks and details"),
) -> bool:
    """-v, recorded where run_app reads it."""
    STATE.verbose = verbosity
    return verbosity


# Every command's -v: a flag group (cli_groups) on the command's `verbose` parameter.
verbose_flag = flag_group("verbose", record_verbose)
