"""The Ops interface: the primitives a layer is composed of, implemented once per backend.

Why: a layer (its architecture's, composed from graph/blocks) is written ONCE over these
ops; the NumPy host body (backends/host/ops.py), MLX (backends/mlx/graph.py, traced by
mx.compile so a run of layers is still one submission) and CuPy (backends/cupy/cuda_ops.py:
kernels/*.cu and cuBLAS) each implement them, and graph/trace.py records them. A
decoration (a post-norm, a multiplier, a softcap, a gate) lives in the composition, never
in a backend; a backend implements primitives, and only brings a new one when an
architecture needs a new primitive.

Conventions every implementation keeps:
- Arrays are the backend's own (np.ndarray, mx.array, cupy.ndarray). Plain slicing,
  reshape, indexing with an index array, `*` and `+` between arrays are used by the
  composition directly: the three array types agree on them.
- A method whose name ends in `_` may overwrite its first argument and return it (NumPy's
  in-place fast paths), or return a new array (MLX). Callers always use the returned value
  and never read the argument again, so both are correct.
- `linear` takes a weight as the backend holds it (host f32 `Linear`, MLX quantized
  `DeviceLinear`, CuPy device matrix): residency is the backend's business.
- `pos` is the backend's opaque step context (the host: the positions array; MLX: traced
  positions and start); `rope` is the backend's per-layer rope object; `kv` is the layer's
  cache view (attention: where K/V rows go and are read; GDN and mamba:
  `recurrent_state()` and `set_recurrent_state(tail, state)`, staged until the step
  commits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

# An array where the block's backend is not named (the architectures' hooks take Ops[Any]).
Array = Any


class ArrayLike(Protocol):
    """What the composition does to a backend's arrays directly (np.ndarray, mx.array and
    cupy.ndarray all have it): read the shape, reshape, slice or index, `*` and `+`. The
    results are Any: the three libraries type them differently (MLX and CuPy not at all),
    so what a block checks is its calls into Ops, whose arrays are all A."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def reshape(self) -> Callable[..., Any]: ...

    def __getitem__(self, key: Any) -> Any: ...

    def __mul__(self, other: Any) -> Any: ...

    def __add__(self, other: Any) -> Any: ...


# The backend's array type: every block is generic over it, `ops: Ops[A]`.
A = TypeVar("A", bound=ArrayLike)

# The "swiglu_oai" activation's constants, shared by every backend's implementation and
# by the architecture that checks them: llama.cpp's ggml_swiglu_oai as its build_moe_ffn
# hard-codes it.
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


@dataclass(frozen=True, eq=False)
class AttentionCall(Generic[A]):
    """How one attention call scores and masks its keys (built once per layer by the
    attention block; every backend's `Ops.attention` reads it).

    scale: multiplies q before q.k.
    window: keys with q - k position < window are visible (None: all of the past).
    softcap: cap * tanh(scores / cap) before the softmax.
    alibi: per query head, its slope: -slope_h * (q pos - k pos) joins the scores.
    sinks [H]: per query head, one more logit in its softmax, with no value.
    causal False: bidirectional, every row the cache holds is visible to every query (an
    encoder's mask), or with a window those with |query - key position| < window.
    chunk: the query at p sees only keys at [p // chunk * chunk, p] (no window with it).
    temperature (floor_scale, s): the query at p is first multiplied by
    log(floor((p + 1) / floor_scale) + 1) * s + 1.
    bias [H, 2c + 1] (odd width): a relative-position score bias, head h's score for a key
    at d = key - query position gets bias[h, clip(d + c, 0, 2c)]."""

    scale: float
    window: int | None = None
    softcap: float | None = None
    alibi: tuple[float, ...] | None = None
    sinks: A | None = None
    causal: bool = True
    chunk: int | None = None
    temperature: tuple[float, float] | None = None
    bias: A | None = None


class Ops(Protocol[A]):
    """The primitives over the backend's array type A (host: Ops[np.ndarray])."""

    # --- linear algebra and elementwise ----------------------------------------------------
    def linear(self, x: A, w: Any) -> A:
        """x [T, in] @ W.T (+ bias) -> [T, out], a new array."""
        ...

    def rms_norm(self, x: A, w: A | None, eps: float) -> A:
        """RMSNorm over the last axis into a new array (x is left as it was); w None:
        weightless (Mamba-2's grouped norm multiplies by its [G, width] weight after)."""
        ...

    def rms_norm_(self, x: A, w: A | None, eps: float) -> A:
        """RMSNorm over the last axis; may overwrite x (a [T, heads, hd] view works too)."""
        ...

    def layer_norm(self, x: A, w: A, b: A | None, eps: float) -> A:
        """LayerNorm over the last axis into a new array: (x - mean) / sqrt(var + eps) * w
        (+ b), as llama.cpp's ggml_norm then its weight and bias."""
        ...

    def clamp_(self, x: A, c: float) -> A:
        """x clipped to [-c, c]; may overwrite x."""
        ...

    def add_(self, x: A, y: A) -> A:
        """x + y; may overwrite x."""
        ...

    def concat(self, parts: list[A], axis: int = -1) -> A:
        """The arrays side by side along `axis` (the last: columns; 0: the rows of a
        multi-sequence step's sequences, one after another), a new array."""
        ...

    def scale_(self, x: A, s: float) -> A:
        """x * s; may overwrite x."""
        ...

    def softcap_(self, x: A, cap: float) -> A:
        """cap * tanh(x / cap); may overwrite x."""
        ...

    def glu(self, h: A, act: str) -> A:
        """act(gate) * up over rows [..., gate | up]; may overwrite h."""
        ...

    def act(self, x: A, act: str) -> A:
        """act(x) into a new array ("silu" | "gelu_tanh")."""
        ...

    def sigmoid(self, x: A) -> A: ...

    def sigmoid_mul_(self, x: A, gate: A) -> A:
        """x * sigmoid(gate); may overwrite x."""
        ...

    def index(self, values: tuple[int, ...]) -> A:
        """A constant index array (cached: asked once per layer per step)."""
        ...

    # --- attention -------------------------------------------------------------------------
    def rope_(self, x: A, pos: Any, rope: Any) -> A:
        """Rotate x [T, heads, head_dim] at the step's positions; may overwrite x."""
        ...

    def attention(
        self, q: A, k: A | None, v: A | None, kv: Any, pos: Any, call: AttentionCall[A]
    ) -> A:
        """Write the new rows k [T, Hkv, hk], v [T, Hkv, hv] to the cache view kv, then
        softmax(call.scale q K^T + the call's mask and biases) V over every row visible to
        q [T, H, hk] (GQA: query head h reads KV head h // (H / Hkv)) -> [T, H * hv].
        k and v None: a KV-sharing layer's queries, over the rows its source layer wrote
        (kv is that layer's slot, read-only). What is visible and how scores are shaped is
        the AttentionCall's."""
        ...

    def head_matmul(self, x: A, w: A) -> A:
        """Per head, a matrix times the head's rows: x [T, H, a], w [H, b, a] ->
        [T, H, b] (MLA's absorbed key and value projections)."""
        ...

    # --- gated delta net -------------------------------------------------------------------
    def causal_conv(self, x: A, tail: A, taps: A) -> tuple[A, A]:
        """Depthwise causal conv of x [T, C] after `tail` [K-1, C], taps [C, K] oldest first
        -> (out [T, C], the new tail: the last K-1 inputs)."""
        ...

    def l2_norm(self, x: A, eps: float) -> A:
        """x / sqrt(sum(x^2) + eps) over the last axis."""
        ...

    def softplus(self, x: A) -> A: ...

    def delta_rule(self, q: A, k: A, v: A, g: A, beta: A, state: A) -> tuple[A, A]:
        """The gated delta rule over T tokens: q, k [T, H, dk]; v [T, H, dv]; log decay g and
        beta [T, H]; state [H, dk, dv] (not modified) -> (o [T, H, dv], the new state)."""
        ...

    # --- lightning attention --------------------------------------------------------------------
    def lightning_attention(
        self, q: A, k: A, v: A, slopes: tuple[float, ...], state: A
    ) -> tuple[A, A]:
        """Linear attention with a per-head decay over T tokens: q, k, v [T, H, d]; slopes
        [H] (s_h > 0); state [H, d, d] (K^T V so far, not modified). Per token t and head h:
        S = exp(-s_h) S + k_t^T v_t;  o_t = q_t S  -> (o [T, H, d], the new state). A prompt
        may be taken in blocks (intra-block scores with the decay exp(-s (i - j)), the
        inter-block part through the state), which is the same sum."""
        ...

    # --- mamba (selective state space) ------------------------------------------------------
    def selective_scan(self, x: A, dt: A, a: A, b: A, c: A, state: A) -> tuple[A, A]:
        """Mamba's scan over T tokens, per channel i: h = exp(dt[i] A[i]) h + dt[i] x[i] B;
        y[i] = h[i] . C. x, dt (softplus-ed) [T, d_inner]; a [d_inner, d_state] (Mamba-1) or
        [d_inner, 1] (Mamba-2's per-head scalar, broadcast over the state); b, c
        [T, G, d_state]: channel i reads group i // (d_inner / G) (Mamba-1: G = 1); state
        [d_inner, d_state] (not modified) -> (y [T, d_inner], the new state)."""
        ...

    # --- mixture of experts ----------------------------------------------------------------
    def route(
        self,
        logits: A,
        k: int,
        renormalize: bool,
        gating: str = "softmax",
        bias: A | None = None,
    ) -> tuple[A, A]:
        """Router over [T, n_expert] logits -> (expert ids [T, k], weights [T, k]): the
        probabilities are softmax(logits) or (gating "sigmoid") sigmoid(logits); the top k
        is taken over probabilities + bias [n_expert] when given, highest first; the weights
        are the unbiased probabilities of the chosen, renormalized to sum to 1 when asked."""
        ...

    def route_grouped(
        self,
        logits: A,
        k: int,
        renormalize: bool,
        gating: str,
        bias: A | None,
        n_group: int,
        topk_group: int,
    ) -> tuple[A, A]:
        """route() with the experts in n_group consecutive groups: each group scored by
        the sum of its two best selection scores (probabilities + bias), the top
        topk_group groups kept and the top k taken over their experts only (grouped
        routing, llama.cpp's n_expert_groups / n_group_used)."""
        ...

    def experts(self, x: A, ids: A, weights: A, moe: Any, act: str) -> A:
        """sum_j weights[:, j] * down_e(act(gate_e(x)) * up_e(x)) for e = ids[:, j], over the
        backend's resident expert stacks in `moe` -> [T, n_embd]; with the experts' biases
        (moe.gate_up_exps_b, moe.down_exps_b) added to their gate/up and down rows."""
        ...
