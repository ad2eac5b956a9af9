"""Tracing a layer over a recording Ops: the calls a backend is asked about.

A backend says which layers it takes the way ggml's `supports_op` does: each layer's
composition (its architecture's `ArchConfig.layer`) runs ONCE over `TraceOps`, which
computes nothing and records every call as an `OpCall` (the op's name, its arrays' shapes
and the flag and scalar arguments a backend's predicate reads); the backend then answers
for each recorded call (backends/capability.py). Placeholders stand in for every array
(zero strides: no memory), for the layer's cache view and for its rope, so a trace costs
a few dozen tiny NumPy views per layer.

The weights a trace reads come from the loader itself (model/weights.py `load_layer`)
over a meta TensorReader: a checkpoint's declared shapes, or, with no file, the shapes
the config implies (required tensors present, optional ones absent); or they are the
weights given (a test's synthetic model). A model's traces are made once and kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..formats import Checkpoint
from ..model.config import ModelConfig
from ..model.reader import TensorReader, placeholder
from ..model.weights import ModelWeights, borrow_layer, load_layer
from .ops import AttentionCall

Shape = tuple[int, ...]


@dataclass(frozen=True)
class OpCall:
    """One recorded call: the op's name, the shapes of its array arguments in order (None
    for an array not given), and its other arguments by name (flags, scalars, and facts
    such as whether a bias or sinks were given)."""

    op: str
    shapes: tuple[Shape | None, ...] = ()
    params: dict[str, Any] = field(default_factory=dict, compare=False)

    def __getitem__(self, name: str) -> Any:
        return self.params.get(name)


@dataclass(frozen=True)
class TraceRope:
    """The rope a traced layer is given: what it rotates and how (the layer's rope dims
    and the model's layout)."""

    dims: int
    layout: str


class TraceSlot:
    """The cache view a traced layer is given: a recurrent layer's state is zeros of its
    shapes, and staging a new one keeps nothing; the layer's V head width is what a
    KV-sharing layer's attention (given no V) reports."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        self.shapes = cfg.recurrent_shapes(layer) if cfg.is_recurrent(layer) else ((0,), (0,))
        self.head_dim_v = cfg.layer_shape(layer).head_dim_v

    def recurrent_state(self) -> tuple[np.ndarray, np.ndarray]:
        return placeholder(self.shapes[0]), placeholder(self.shapes[1])

    def set_recurrent_state(self, tail: Any, state: Any) -> None:
        return None  # nothing is kept: a trace runs once


def _shape(a: Any) -> Shape | None:
    return None if a is None else tuple(np.shape(a))


class TraceOps:
    """Ops[np.ndarray] that records each call in `calls` and returns placeholders of the
    right shape, computing nothing."""

    def __init__(self) -> None:
        self.calls: list[OpCall] = []

    def _record(self, op: str, arrays: Sequence[Any], **params: Any) -> None:
        self.calls.append(OpCall(op, tuple(_shape(a) for a in arrays), params))

    def _same(self, op: str, x: Any, *others: Any, **params: Any) -> np.ndarray:
        self._record(op, (x, *others), **params)
        return placeholder(np.shape(x))

    def linear(self, x: Any, w: Any) -> np.ndarray:
        out = w.shape[0]
        self._record("linear", (x,), out=out, bias=getattr(w, "b", None) is not None)
        return placeholder((*np.shape(x)[:-1], out))

    def rms_norm(self, x: Any, w: Any, eps: float) -> np.ndarray:
        return self._same("rms_norm", x, w, weight=w is not None)

    def rms_norm_(self, x: Any, w: Any, eps: float) -> np.ndarray:
        return self._same("rms_norm_", x, w, weight=w is not None)

    def layer_norm(self, x: Any, w: Any, b: Any, eps: float) -> np.ndarray:
        return self._same("layer_norm", x, w, b, bias=b is not None)

    def clamp_(self, x: Any, c: float) -> np.ndarray:
        return self._same("clamp_", x, limit=c)

    def add_(self, x: Any, y: Any) -> np.ndarray:
        self._record("add_", (x, y))
        return placeholder(np.broadcast_shapes(np.shape(x), np.shape(y)))

    def concat(self, parts: list[Any], axis: int = -1) -> np.ndarray:
        self._record("concat", parts, axis=axis)
        return placeholder(np.shape(np.concatenate([np.empty(np.shape(p)) for p in parts], axis)))

    def scale_(self, x: Any, s: float) -> np.ndarray:
        return self._same("scale_", x, scale=s)

    def softcap_(self, x: Any, cap: float) -> np.ndarray:
        return self._same("softcap_", x, cap=cap)

    def glu(self, h: Any, act: str) -> np.ndarray:
        self._record("glu", (h,), act=act)
        return placeholder((*np.shape(h)[:-1], np.shape(h)[-1] // 2))

    def act(self, x: Any, act: str) -> np.ndarray:
        return self._same("act", x, act=act)

    def sigmoid(self, x: Any) -> np.ndarray:
        return self._same("sigmoid", x)

    def sigmoid_mul_(self, x: Any, gate: Any) -> np.ndarray:
        return self._same("sigmoid_mul_", x, gate)

    def index(self, values: tuple[int, ...]) -> np.ndarray:
        self._record("index", (), n=len(values))
        return np.asarray(values)

    def rope_(self, x: Any, pos: Any, rope: TraceRope) -> np.ndarray:
        return self._same("rope_", x, dims=rope.dims, layout=rope.layout)

    def attention(
        self, q: Any, k: Any, v: Any, kv: Any, pos: Any, call: AttentionCall[Any]
    ) -> np.ndarray:
        T, H, hk = np.shape(q)
        hv = np.shape(v)[-1] if v is not None else kv.head_dim_v
        self._record(
            "attention",
            (q, k, v),
            head_dim_k=hk,
            head_dim_v=hv,
            window=call.window,
            softcap=call.softcap,
            alibi=call.alibi is not None,
            sinks=call.sinks is not None,
            own_kv=k is not None and v is not None,
            causal=call.causal,
            chunk=call.chunk,
            temperature=call.temperature is not None,
            bias=call.bias is not None,
        )
        return placeholder((T, H * hv))

    def causal_conv(self, x: Any, tail: Any, taps: Any) -> tuple[np.ndarray, np.ndarray]:
        self._record("causal_conv", (x, tail, taps))
        return placeholder(np.shape(x)), placeholder(np.shape(tail))

    def l2_norm(self, x: Any, eps: float) -> np.ndarray:
        return self._same("l2_norm", x)

    def softplus(self, x: Any) -> np.ndarray:
        return self._same("softplus", x)

    def delta_rule(
        self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        self._record("delta_rule", (q, k, v, g, beta, state))
        return placeholder(np.shape(v)), placeholder(np.shape(state))

    def selective_scan(
        self, x: Any, dt: Any, a: Any, b: Any, c: Any, state: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        self._record("selective_scan", (x, dt, a, b, c, state))
        return placeholder(np.shape(x)), placeholder(np.shape(state))

    def lightning_attention(
        self, q: Any, k: Any, v: Any, slopes: tuple[float, ...], state: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        self._record("lightning_attention", (q, k, v, state))
        return placeholder(np.shape(v)), placeholder(np.shape(state))

    def route(
        self, logits: Any, k: int, renormalize: bool, gating: str = "softmax", bias: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        self._record("route", (logits,), k=k, gating=gating, bias=bias is not None)
        rows = (np.shape(logits)[0], k)
        return np.zeros(rows, np.int64), placeholder(rows)

    def route_grouped(
        self,
        logits: Any,
        k: int,
        renormalize: bool,
        gating: str,
        bias: Any,
        n_group: int,
        topk_group: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        self._record("route_grouped", (logits,), k=k, gating=gating, bias=bias is not None)
        rows = (np.shape(logits)[0], k)
        return np.zeros(rows, np.int64), placeholder(rows)

    def head_matmul(self, x: Any, w: Any) -> np.ndarray:
        self._record("head_matmul", (x, w))
        return placeholder((*np.shape(x)[:2], np.shape(w)[1]))

    def experts(self, x: Any, ids: Any, weights: Any, moe: Any, act: str) -> np.ndarray:
        biases = getattr(moe, "gate_up_exps_b", None) is not None
        return self._same("experts", x, ids, weights, act=act, biases=biases)

    def __getattr__(self, op: str) -> Any:
        """A primitive this recorder does not know yet (one an architecture adds): recorded
        by its name, with its array arguments' shapes; it returns rows shaped as its first
        argument. Every backend refuses it until it declares it."""
        if op.startswith("_"):
            raise AttributeError(op)

        def record(*args: Any, **kwargs: Any) -> np.ndarray:
            arrays = [a for a in args if isinstance(a, np.ndarray)]
            self._record(op, arrays)
            return placeholder(np.shape(arrays[0]) if arrays else ())

        return record


def trace_layer(cfg: ModelConfig, lw: Any, layer: int) -> list[OpCall]:
    """The calls layer `layer`'s composition makes over one row, with weights lw."""
    shape = cfg.layer_shape(layer)
    ops = TraceOps()
    x = placeholder((1, cfg.residual_width))
    rope = TraceRope(shape.rope_dim, cfg.rope_type)
    cfg.ext.layer(ops, cfg, shape, lw, x, None, TraceSlot(cfg, layer), rope)
    return ops.calls


# What a trace reads its weights from: a checkpoint (its declared shapes), a model's weights
# (or its layers), or None (the shapes the config implies).
Source = Checkpoint | ModelWeights | Sequence[Any] | None

# The traces made, per (config, source): kept with the source, so an entry is only ever
# found for the very object it was made from.
_TRACES: dict[tuple[ModelConfig, int], tuple[Any, list[list[OpCall]]]] = {}
_MAX_TRACES = 64


def _layer_weights(cfg: ModelConfig, source: Source, layer: int) -> Any:
    if source is None or isinstance(source, Checkpoint):
        return load_layer(TensorReader(source, meta=True), cfg, layer)
    layers = source.layers if isinstance(source, ModelWeights) else source
    return borrow_layer(layers, layer)


def model_traces(cfg: ModelConfig, source: Source = None) -> list[list[OpCall]]:
    """Per layer, its trace (trace_layer) over the weights `source` gives; made once."""
    key = (cfg, id(source))
    hit = _TRACES.get(key)
    if hit is not None and hit[0] is source:
        return hit[1]
    traces = [trace_layer(cfg, _layer_weights(cfg, source, i), i) for i in range(cfg.n_layer)]
    if len(_TRACES) >= _MAX_TRACES:
        _TRACES.clear()
    _TRACES[key] = (source, traces)
    return traces


__all__ = ["OpCall", "Source", "TraceOps", "model_traces", "trace_layer"]
