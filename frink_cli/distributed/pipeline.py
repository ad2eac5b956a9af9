"""A rank's part of a model, loaded: api.load with this rank's stage, then rank 0 leads
and every other rank follows (stage.py) until rank 0 stops them."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ..api import Model, load
from ..cache.kv_types import CacheTypes
from ..decoder import Decoder
from ..formats.checkpoint import TensorSource
from ..model.config import ModelConfig
from ..model.weights import ModelWeights
from .group import Group, PeerLost
from .plan import StagePlan, plan_stages
from .stage import Follower, LeadDecoder, ledger_summary


class PipelineStage:
    """api.Stage for this rank: plans the split once the config is known, and makes
    rank 0's LeadDecoder or a follower's plain Decoder over the stage's layers."""

    def __init__(self, group: Group, layer_split: str | None = None) -> None:
        self.group = group
        self.layer_split = layer_split
        self.plan_: StagePlan | None = None

    def plan(
        self, cfg: ModelConfig, path: Path, tensors: TensorSource, backend: str
    ) -> tuple[range, tuple[bool, bool]]:
        self.plan_ = plan_stages(self.group, cfg, path, tensors, backend, self.layer_split)
        return self.plan_.layers, self.plan_.ends

    def reads(self, tensor: str) -> bool:
        return self.plan_ is None or self.plan_.reads(tensor)

    def decoder(
        self, cfg: ModelConfig, weights: ModelWeights, backend, types: CacheTypes, layers: range
    ) -> Decoder:
        if self.group.rank == 0:
            return LeadDecoder(cfg, weights, backend, types, layers, group=self.group)
        return Decoder(cfg, weights, backend, types, layers)


def load_stage(
    path: str | Path, backend: str, layer_split: str | None = None, **opts: Any
) -> Model | None:
    """This rank's part of the model. Rank 0 gets the Model (its decoder leads the others;
    they are stopped when the process exits); every other rank follows rank 0's steps
    until it stops them, then gets None."""
    group = Group()
    model = load(path, backend=backend, stage=PipelineStage(group, layer_split), **opts)
    decoder = model.decoder
    if isinstance(decoder, LeadDecoder):
        atexit.register(_close_quietly, decoder)
        decoder.on_lost = _stop_serving
        return model
    Follower(decoder, group).run()
    return None


def _close_quietly(decoder: LeadDecoder) -> None:
    with contextlib.suppress(PeerLost):  # the others are gone already
        decoder.close()


def _stop_serving(e: PeerLost) -> None:
    """A lost rank ends rank 0 too. A command's step raises it (one error line, exit 1);
    a server, which handles SIGTERM, is asked to stop as a whole and then exits 1."""
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.SIG_IGN, None):
        return
    print(f"frink: error: {e}; stopping the server", file=sys.stderr, flush=True)
    atexit.register(os._exit, 1)  # run first (last in): the group failed, whatever follows
    os.kill(os.getpid(), signal.SIGTERM)


def ledgers(model: Model) -> list[dict]:
    """Every rank's submissions and refusals, in rank order (one entry for one process)."""
    decoder = model.decoder
    if isinstance(decoder, LeadDecoder):
        return [ledger_summary(decoder, 0), *decoder.ledgers()]
    return [ledger_summary(decoder, 0)]
