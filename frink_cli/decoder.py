"""The decoder loop: one forward step over a batch of new tokens, through runs of layers.

For each layer it asks the backend (if any) for a run; refused layers run on the host
body. The cache is checked for room before any layer writes, and committed only after
the last layer, so a step that fails leaves the cache as it was.
"""

from __future__ import annotations

import numpy as np

from .backends import Backend, LaunchFailed, Refusal
from .cache import KvCache
from .graph.body import HostBody
from .graph.linear import blas_threads
from .model.config import ModelConfig
from .model.weights import ModelWeights


class Decoder:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, backend: Backend | None = None) -> None:
        self.cfg = cfg
        self.host = HostBody(cfg, weights)
        self.backend = backend
        # BLAS threads for a one-row step (see graph/linear.py); None leaves BLAS alone.
        self.decode_blas_threads: int | None = 1
        if backend is not None:
            backend.bind(weights)

    def new_cache(self, n_ctx: int) -> KvCache:
        return KvCache(self.cfg, n_ctx)

    def hidden(self, ids: np.ndarray, cache: KvCache) -> np.ndarray:
        """Run new tokens `ids` at the cache's next positions; the last layer's output."""
        with blas_threads.limit(self._blas_limit(ids)):
            return self._forward(ids, cache, None)[0]

    def _blas_limit(self, ids) -> int | None:
        return self.decode_blas_threads if len(ids) == 1 else None

    def _forward(self, ids: np.ndarray, cache: KvCache, head: str | None) -> tuple[np.ndarray, bool]:
        """(output, is_logits). With head "last"/"all", a backend whose run reaches the last
        layer and that `runs_head` returns the logits from the same submission."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        if T == 0:
            return np.zeros((0, self.cfg.n_embd), np.float32), False
        cache.check_room(T)
        positions = np.arange(cache.n_past, cache.n_past + T)
        x = self.host.embed(ids)
        kind = "decode" if T == 1 else "prefill"
        layer = 0
        while layer < self.cfg.n_layer:
            plan = self.backend.plan(kind, layer, T, cache, positions=positions) if self.backend else None
            if plan is None or isinstance(plan, Refusal):
                if plan is not None:
                    self.backend.ledger.refuse(plan.reason)
                x = self.host.layer(layer, x, positions, cache)
                layer += 1
            else:
                try:
                    if head and plan.stop == self.cfg.n_layer and getattr(self.backend, "runs_head", False):
                        logits = self.backend.run_head(plan, x, positions, cache, head == "all")
                        cache.commit(T)
                        return logits, True
                    x = self.backend.run(plan, x, positions, cache)
                except LaunchFailed as e:
                    # The backend wrote no cache row before failing: the host body runs
                    # the same layers from the same x.
                    self.backend.ledger.fail(str(e))
                    for failed in range(plan.start, plan.stop):
                        x = self.host.layer(failed, x, positions, cache)
                layer = plan.stop
        cache.commit(T)
        return x, False

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        return self.host.logits(hidden)

    def step(self, ids: np.ndarray, cache: KvCache, all_logits: bool = False) -> np.ndarray:
        """Feed ids; logits for every row (all_logits) or for the last row only, [rows, V]."""
        with blas_threads.limit(self._blas_limit(ids)):
            x, is_logits = self._forward(ids, cache, "all" if all_logits else "last")
            if is_logits:
                return x
            return self.logits(x if all_logits else x[-1:])
