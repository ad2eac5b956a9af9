"""Pipeline parallelism over MLX's distributed group: a model too big for one machine.

Under `mlx.launch` (ring backend) every rank runs the same command. Each loads only its
contiguous run of layers (plan.py: by --layer-split or memory; the first rank the token
embedding, the last the head), checks that every rank agrees, and then rank 0 runs the
program while the others follow its steps (stage.py, pipeline.py). Nothing but
`mx.distributed` messages passes between ranks (group.py).

This module itself imports nothing heavy: `launched()` is asked by every CLI command.
"""

from __future__ import annotations

import json
import os

ENV_RANK = "MLX_RANK"
ENV_HOSTFILE = "MLX_HOSTFILE"


def launched() -> bool:
    """Whether this process is one rank of several started by `mlx.launch` (ring backend):
    it sets MLX_RANK and writes the ring's hostfile to MLX_HOSTFILE, a JSON list of each
    rank's addresses (empty for one rank)."""
    path = os.environ.get(ENV_HOSTFILE)
    if ENV_RANK not in os.environ or not path:
        return False
    try:
        with open(path, encoding="utf-8") as f:
            ranks = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(ranks, list) and len(ranks) > 1


def following() -> bool:
    """Whether this process is a rank after the first: it follows rank 0's steps and never
    reads a prompt (rank 0 reads it, from stdin too, and sends only its rows on)."""
    return launched() and os.environ.get(ENV_RANK) != "0"
