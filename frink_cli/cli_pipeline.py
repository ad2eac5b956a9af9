"""The CLI under `mlx.launch`: every rank runs the same command; rank 0 answers.

`load_or_follow` is what `_load` calls when the process is one rank of a ring
(distributed.launched()): rank 0 gets its stage of the model and goes on as the command
always does (printing, benchmarking, serving); every other rank follows rank 0's steps
and, once rank 0 stops it, ends the command with exit 0 and nothing on stdout.
"""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path
from typing import Any

import typer

from .distributed import following, launched

# The pipeline (mlx, the api) is imported only under mlx.launch: `frink --help` stays quick.

__all__ = [
    "LAYER_SPLIT",
    "following",
    "launched",
    "load_or_follow",
    "rank_submissions",
    "read_relayed_stdin",
]

# mlx.launch relays its stdin to the ranks in pieces, up to a second apart.
STDIN_QUIET_S = 2.0

LAYER_SPLIT = typer.Option(
    None,
    "--layer-split",
    help="under mlx.launch: the share of layers per rank, e.g. 3,1 (default: by memory)",
)


def load_or_follow(path: str | Path, backend: str, layer_split: str | None, **opts: Any) -> Any:
    """Rank 0's model; a following rank never returns (typer.Exit(0) once rank 0 stops)."""
    from .distributed.pipeline import load_stage

    model = load_stage(path, backend, layer_split, **opts)
    if model is None:
        raise typer.Exit(0)
    return model


def rank_submissions(model: Any) -> str:
    """Each rank's device submissions over the whole command, as markdown rows."""
    from .distributed.pipeline import ledgers

    lines = ["", "| rank | layers | submissions | refusals |", "| ---: | --- | --- | --- |"]
    for r in ledgers(model):
        subs = ", ".join(f"{k} {v}" for k, v in sorted(r["submissions"].items())) or "-"
        refs = ", ".join(f"{k} {v}" for k, v in sorted(r["refusals"].items())) or "-"
        a, b = r["layers"]
        lines.append(f"| {r['rank']} | {a}-{b - 1} | {subs} | {refs} |")
    return "\n".join(lines) + "\n"


def read_relayed_stdin(limit: int) -> bytes:
    """Rank 0's stdin (`-p -`) as mlx.launch relays it: the launcher never closes the
    ranks' stdin, so the prompt ends at EOF, or once nothing more came for STDIN_QUIET_S
    seconds after its first bytes (at most `limit` bytes)."""
    fd = sys.stdin.fileno()
    data = b""
    while len(data) < limit:
        ready, _, _ = select.select([fd], [], [], STDIN_QUIET_S if data else None)
        chunk = os.read(fd, min(1 << 16, limit - len(data))) if ready else b""
        if not chunk:
            break
        data += chunk
    return data
