"""The decoder loop: one forward step over a batch of new tokens, through runs of layers.

For each layer it asks the backend (if any) for a run; refused layers run on the host
body. The cache is checked for room before any layer writes, and committed only after
the last layer, so a step that fails leaves the cache as it was.
"""

from __future__ import annotations

import numpy as np

from .backends import Backend, Refusal
from .cache import KvCache
from .graph.body import HostBody
from .model.config import ModelConfig
from .model.weights import ModelWeights


class Decoder:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, backend: Backend | None = None) -> None:
        self.cfg = cfg
        self.host = HostBody(cfg, weights)
        self.backend = backend

    def new_cache(self, n_ctx: int) -> KvCache:
        return KvCache(self.cfg, n_ctx)

    def hidden(self, ids: np.ndarray, cache: KvCache) -> np.ndarray:
        """Run new tokens `ids` at the cache's next positions; the last layer's output."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        if T == 0:
            return np.zeros((0, self.cfg.n_embd), np.float32)
        cache.check_room(T)
        positions = np.arange(cache.n_past, cache.n_past + T)
        x = self.host.embed(ids)
        kind = "decode" if T == 1 else "prefill"
        layer = 0
        while layer < self.cfg.n_layer:
            plan = self.backend.plan(kind, layer, T, cache) if self.backend else None
            if plan is None or isinstance(plan, Refusal):
                if plan is not None:
                    self.backend.ledger.refuse(plan.reason)
                x = self.host.layer(layer, x, positions, cache)
                layer += 1
            else:
                x = self.backend.run(plan, x, positions, cache)
                layer = plan.stop
        cache.commit(T)
        return x

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        return self.host.logits(hidden)

    def step(self, ids: np.ndarray, cache: KvCache, all_logits: bool = False) -> np.ndarray:
        """Feed ids; logits for every row (all_logits) or for the last row only, [rows, V]."""
        x = self.hidden(ids, cache)
        return self.logits(x if all_logits else x[-1:])
