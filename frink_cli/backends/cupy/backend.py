"""CudaBackend: the decoder loop's view of the dense prefill stack.

plan() answers from eligibility.py alone, before any cache or device memory is touched:
the longest run of consecutive eligible layers from `layer`, or a named refusal. run()
takes the run in one stack call, then pushes each layer's K/V rows into the host cache
(the authoritative one) through its slots. Anything that goes wrong inside the stack is a
launch failure: it is raised as LaunchFailed before a single cache row is written, and the
decoder loop has the host body run the same layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...model.config import ModelConfig
from ...model.weights import ModelWeights
from .. import LaunchFailed, Refusal, Run
from ..ledger import Ledger
from . import eligibility
from .stack import DeviceLayer, dense_prefill_stack, upload_layer

F32 = np.float32


class CudaBackend:
    name = "cuda"

    def __init__(self, cfg: ModelConfig, ops: Any, weight_dtype: Any = F32, ledger: Ledger | None = None) -> None:
        self.cfg = cfg
        self.ops = ops
        self.weight_dtype = np.dtype(weight_dtype)
        self.ledger = ledger if ledger is not None else Ledger()
        self.layer_refusals = eligibility.layer_refusals(cfg)
        self.layers: dict[int, DeviceLayer] = {}
        self._inv_freq: dict[tuple[float, float], np.ndarray] = {}

    # -- load ----------------------------------------------------------------------------

    def bind(self, weights: ModelWeights) -> None:
        """Upload the weights of every layer the stack may take, once, at load. A failed
        upload (out of device memory, say) is reported and leaves those layers on the host."""
        self.layers.clear()
        try:
            for layer, refusal in enumerate(self.layer_refusals):
                if refusal is None:
                    self.layers[layer] = upload_layer(self.ops, weights.layers[layer], self.weight_dtype)
        except Exception as e:  # noqa: BLE001 - any device error means "not resident"
            self.layers.clear()
            self.ledger.fail(f"weight upload: {type(e).__name__}: {e}")
        self._rope_freqs = None if weights.rope_freqs is None else weights.rope_freqs.astype(np.float64)

    # -- the predicate's answer ------------------------------------------------------------

    def plan(self, kind: str, layer: int, n_rows: int, cache: Any, positions: np.ndarray | None = None) -> Run | Refusal:
        refusal = self.layer_refusals[layer]
        if refusal is None and layer not in self.layers:
            refusal = eligibility.NOT_RESIDENT
        if refusal is not None:
            return Refusal(refusal)
        stop = layer + 1
        while stop < self.cfg.n_layer and self.layer_refusals[stop] is None and stop in self.layers:
            stop += 1
        refusal = eligibility.step_refusal(self.cfg, kind, n_rows, cache, positions, range(layer, stop))
        return Refusal(refusal) if refusal is not None else Run(layer, stop)

    # -- the run -----------------------------------------------------------------------------

    def _rope_tables(self, layer: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin [T, rope_dim/2] at the batch's positions, computed as the host body's Rope
        computes its tables (float64 angles, rounded once), so both rotate identically."""
        shape = self.cfg.layer_shape(layer)
        key = (shape.rope_base, shape.rope_scale)
        if key not in self._inv_freq:
            dim = self.cfg.rope_dim
            inv = shape.rope_base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
            if self._rope_freqs is not None:
                inv = inv / self._rope_freqs
            self._inv_freq[key] = inv * shape.rope_scale
        ang = np.asarray(positions, dtype=np.float64)[:, None] * self._inv_freq[key][None, :]
        return np.cos(ang).astype(F32), np.sin(ang).astype(F32)

    def run(self, run: Run, x: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        layers = range(run.start, run.stop)
        n_past = cache.n_past
        tables: dict[tuple[float, float], tuple[np.ndarray, np.ndarray]] = {}
        for i in layers:
            shape = self.cfg.layer_shape(i)
            key = (shape.rope_base, shape.rope_scale)
            if key not in tables:
                tables[key] = self._rope_tables(i, positions)
        try:
            out = dense_prefill_stack(
                self.ops,
                self.cfg,
                [self.layers[i] for i in layers],
                [tables[(s.rope_base, s.rope_scale)] for s in map(self.cfg.layer_shape, layers)],
                x,
                [(cache.k[i][:, :n_past], cache.v[i][:, :n_past]) for i in layers],
            )
        except Exception as e:  # every device error falls back to the host
            raise LaunchFailed(f"dense prefill stack: {type(e).__name__}: {e}") from e
        self.ledger.submit("prefill-stack")
        # Only now, with every layer back, does the host cache change.
        for i, k, v in zip(layers, out.k_rows, out.v_rows):
            cache.slot(i).append(k, v)
        return out.hidden
