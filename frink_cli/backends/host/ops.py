"""The host body's ops: the Ops interface (graph/ops.py) in NumPy, the reference.

Each op keeps the in-place fast paths the host body was tuned with (a prefill's [T, 2*n_ff]
rows are megabytes; a decode row pays per NumPy call): `*_` ops overwrite their first
argument, which the composition never reads again.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from ...cache.kv_types import round_queries_
from ...graph.ops import AttentionCall
from ...model.expert_cache import fetch_experts
from ...model.weights import Linear, MoeWeights
from .attention import attend, attend_chunked, temperature_factors
from .ffn import ACTIVATIONS, glu, glu_
from .gdn import causal_conv, l2_normalize
from .gdn import delta_rule as _delta_rule
from .lightning import lightning_attention as _lightning_attention
from .linear import linear, product, row_sequences
from .moe import route as _route
from .moe import route_grouped as _route_grouped
from .norms import layer_norm, rms_norm
from .rope import Rope
from .ssm import selective_scan as _selective_scan

F32 = np.float32


class HostOps:
    """Ops over np.ndarray. `pos` is the step's positions array, `rope` a graph.rope.Rope,
    `kv` a layer's cache slot (the cache.KvSlot / cache.RecurrentSlot protocol)."""

    def linear(self, x: np.ndarray, w: Linear) -> np.ndarray:
        return linear(x, w)

    def rms_norm(self, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
        return rms_norm(x, w, eps)

    def rms_norm_(self, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
        return rms_norm(x, w, eps, out=x)

    def layer_norm(
        self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float
    ) -> np.ndarray:
        return layer_norm(x, w, b, eps)

    def clamp_(self, x: np.ndarray, c: float) -> np.ndarray:
        return np.clip(x, F32(-c), F32(c), out=x)

    def add_(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x += y
        return x

    def concat(self, parts: list[np.ndarray], axis: int = -1) -> np.ndarray:
        return np.concatenate(parts, axis=axis)

    def scale_(self, x: np.ndarray, s: float) -> np.ndarray:
        x *= F32(s)
        return x

    def softcap_(self, x: np.ndarray, cap: float) -> np.ndarray:
        c = F32(cap)
        x /= c
        np.tanh(x, out=x)
        x *= c
        return x

    def glu(self, h: np.ndarray, act: str) -> np.ndarray:
        return glu_(h, act)

    def act(self, x: np.ndarray, act: str) -> np.ndarray:
        return ACTIVATIONS[act](x)

    def sigmoid(self, x: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-x))

    def sigmoid_mul_(self, x: np.ndarray, gate: np.ndarray) -> np.ndarray:
        x *= 1.0 / (1.0 + np.exp(-gate))
        return x

    def index(self, values: tuple[int, ...]) -> np.ndarray:
        return _index(values)

    def rope_(self, x: np.ndarray, pos: np.ndarray, rope: Rope) -> np.ndarray:
        rope.rotate_(x, pos)
        return x

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray | None,
        v: np.ndarray | None,
        kv: Any,
        pos: np.ndarray,
        call: AttentionCall[np.ndarray],
    ) -> np.ndarray:
        # The rows this step's queries see: [Hkv, S, hk], [Hkv, S, hv], row j at first + j.
        first, K, V = kv.append(k, v)
        if call.temperature is not None:
            q *= temperature_factors(pos, *call.temperature)[:, None, None]
        round_queries_(kv.types.k, q)  # as llama.cpp rounds them against a quantized K
        q *= F32(call.scale)  # q is a view into this step's own QKV rows
        slopes = _slopes(call.alibi) if call.alibi is not None else None
        if call.chunk is not None:
            scores = (call.softcap, slopes, call.sinks)
            return attend_chunked(q, K, V, first, pos, call.chunk, scores)
        return attend(
            q,
            K,
            V,
            first,
            pos,
            call.window,
            call.softcap,
            slopes,
            call.sinks,
            call.causal,
            call.bias,
        )

    def head_matmul(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return np.matmul(x.transpose(1, 0, 2), w.transpose(0, 2, 1)).transpose(1, 0, 2)

    def causal_conv(
        self, x: np.ndarray, tail: np.ndarray, taps: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        return causal_conv(x, tail, taps)

    def l2_norm(self, x: np.ndarray, eps: float) -> np.ndarray:
        return l2_normalize(x, eps)

    def softplus(self, x: np.ndarray) -> np.ndarray:
        return np.logaddexp(F32(0.0), x)

    # The kernels whose arguments are the op's own, called as they are.
    delta_rule = staticmethod(_delta_rule)
    selective_scan = staticmethod(_selective_scan)
    lightning_attention = staticmethod(_lightning_attention)
    route = staticmethod(_route)
    route_grouped = staticmethod(_route_grouped)

    def experts(
        self, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, moe: MoeWeights, act: str
    ) -> np.ndarray:
        # Rows grouped by expert: a prefill batch makes one matmul per expert it uses rather
        # than one per (row, expert); a decode row simply visits its top-k experts.
        out = np.zeros_like(x)
        owner = _row_owner(x.shape[0])
        chosen = np.unique(ids)
        # Every stack through the one fetch: a stack left in the file (--mem-budget) reads
        # its missing experts of this step in one batch (model/expert_cache.py).
        gate_ups, downs = fetch_experts((moe.gate_up_exps, moe.down_exps), chosen.tolist())
        for e, gate_up_e, down_e in zip(chosen, gate_ups, downs):
            rows, slot = np.nonzero(ids == e)
            # Each sequence's rows of this expert as it would multiply them alone
            # (linear.product): rows are ascending, so a sequence's are consecutive.
            seq = None
            if owner is not None:
                seq = np.unique(owner[rows], return_counts=True)[1].tolist()
            gu = product(x[rows], gate_up_e, seq)
            if moe.gate_up_exps_b is not None:
                gu += moe.gate_up_exps_b[e]
            y = product(glu(gu, act), down_e, seq)
            if moe.down_exps_b is not None:
                y += moe.down_exps_b[e]
            # A row picks an expert at most once, so rows are distinct and += is safe.
            out[rows] += y * weights[rows, slot][:, None]
        return out


HOST_OPS = HostOps()


@lru_cache(maxsize=16)
def _slopes(values: tuple[float, ...]) -> np.ndarray:
    a = np.asarray(values, dtype=np.float32)
    a.flags.writeable = False
    return a


@lru_cache(maxsize=16)
def _index(values: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(values, dtype=np.intp)
    a.flags.writeable = False
    return a


def _row_owner(n_rows: int) -> np.ndarray | None:
    """Which sequence each of a batched step's rows belongs to (None: one sequence)."""
    rows = row_sequences()
    if rows is None or len(rows) == 1 or sum(rows) != n_rows:
        return None
    return np.repeat(np.arange(len(rows)), rows)
