"""The sparse mixture-of-experts FFN: a router, the top k experts' gated FFNs weighted by
their router weights, and an optional shared expert."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ops import A, Ops


@dataclass(frozen=True)
class MoeConfig:
    """A sparse mixture-of-experts FFN on the layers that have a router."""

    layers: tuple[bool, ...]  # per layer: the FFN is routed
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int = 0  # shared expert width (always on); 0 = none
    norm_topk: bool = True  # renormalize the top-k router probabilities to sum to 1
    # The shared expert's output is scaled by sigmoid(its gate row); False: added as it is.
    shared_gate: bool = True
    # The router's gating (llama.cpp's expert_gating_func): "softmax" over the experts, or
    # "sigmoid" per expert. The weights are the gated probabilities of the chosen.
    gating: str = "softmax"
    # An expert-selection bias (llama.cpp's exp_probs_b): the top k is taken over
    # probs + bias, the weights stay the unbiased probs.
    expert_bias: bool = False
    # The chosen weights' multiplier after any renormalization (expert_weights_scale);
    # 1 = none.
    weights_scale: float = 1.0
    # Biases on the router (ffn_gate_inp.bias) and on every expert's gate, up and down rows
    # (ffn_{gate,up,down}_exps.bias [n_expert, rows]).
    biases: bool = False
    # The layer's dense FFN runs beside the experts, each branch with its own norms (ffn
    # "dense+moe"; the architecture composes it).
    parallel_dense: bool = False
    # Each chosen expert's input is the row times its weight, the expert's output then
    # added unweighted (llama.cpp's weight_before_ffn, Llama 4).
    weights_before: bool = False
    # Grouped routing: the experts in n_group consecutive groups, the top k
    # taken over the topk_group best groups only (llama.cpp's n_expert_groups /
    # n_group_used); 1 / 1: no groups.
    n_group: int = 1
    topk_group: int = 1

    @property
    def grouped(self) -> bool:
        """Grouped routing changes the selection (some group is left out)."""
        return self.n_group > 1 and self.topk_group < self.n_group


def moe(ops: Ops[A], m: MoeConfig, act: str, w: Any, h: A) -> A:
    """Softmax (or sigmoid) router, top k (over probabilities plus the expert bias, when
    the model has one; within the best groups when grouped), the chosen weights
    renormalized when norm_topk and multiplied by weights_scale; each chosen expert's gated
    FFN weighted by its weight; plus the shared expert, scaled by sigmoid(its gate row)
    when shared_gate. With weights_before, each chosen expert reads the row times its
    weight instead. Same arithmetic as llama.cpp's build_moe_ffn with softmax or sigmoid
    gating, exp_probs_b and expert groups.

    w.inp fuses everything that reads h: the router rows, then (with a gated shared
    expert) its gate row, then the shared expert's gate/up rows."""
    E = m.n_expert
    r = ops.linear(h, w.inp)
    if m.grouped:
        ids, weights = ops.route_grouped(
            r[:, :E], m.n_expert_used, m.norm_topk, m.gating, w.probs_b, m.n_group, m.topk_group
        )
    else:
        ids, weights = ops.route(r[:, :E], m.n_expert_used, m.norm_topk, m.gating, w.probs_b)
    if m.weights_scale != 1.0:
        weights = ops.scale_(weights, m.weights_scale)
    if m.weights_before:
        out = _weighted_inputs(ops, m, act, w, h, ids, weights)
    else:
        out = ops.experts(h, ids, weights, w, act)
    if w.down_shexp is not None:
        first = E + 1 if m.shared_gate else E
        shared = ops.linear(ops.glu(r[:, first:], act), w.down_shexp)
        if m.shared_gate:
            shared = ops.sigmoid_mul_(shared, r[:, E : E + 1])
        out = ops.add_(out, shared)
    return out


def _weighted_inputs(ops: Ops[A], m: MoeConfig, act: str, w: Any, h: A, ids: A, weights: A) -> A:
    """sum_j FFN_{ids[:, j]}(h * weights[:, j]): each chosen expert on its weighted row,
    one experts call per choice j (an expert's output then weighted by 1)."""
    out = None
    for j in range(m.n_expert_used):
        wj = weights[:, j : j + 1]
        y = ops.experts(h * wj, ids[:, j : j + 1], wj * 0.0 + 1.0, w, act)
        out = y if out is None else ops.add_(out, y)
    assert out is not None  # n_expert_used > 0
    return out
