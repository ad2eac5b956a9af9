"""The MLX side of the layer graph: resident weight types and the ops (MlxOps).

The layer is the architecture's composition (ModelConfig.ext.layer); MlxOps only builds lazy MLX
expressions for its primitives, and the backend traces a whole run of layers (and the lm
head) through the composition with mx.compile and evaluates it once. K/V live in
fixed-capacity mirrors, written with slice_update at a position held in an array, and the
attention mask is computed in the graph from the positions, so one traced graph serves
every decode step up to the mirror's capacity without retracing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from ...graph.blocks.moe import moe
from ...graph.ops import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, AttentionCall
from .lora import DeviceLora

LIGHTNING_BLOCK = 64  # prompt tokens per block of lightning attention's decayed scores


@dataclass
class DeviceLinear:
    """[out, in] weight: dense (w) or MLX-quantized (w packed, scales, and biases in `mode`
    "affine"; no biases in "mxfp4", whose scales are e8m0 bytes), or (parts) a fused linear
    whose source tensors differ in type: each part holds a run of source tensors of one type
    by that type's rule, and their outputs concatenate along the last axis in the host's
    fused row order, so a Q4_K q/k beside a Q6_K v keeps q/k quantized."""

    w: mx.array | None
    scales: mx.array | None = None
    biases: mx.array | None = None
    bits: int = 0
    bias: mx.array | None = None  # the layer's additive bias, not the quantization bias
    parts: tuple[DeviceLinear, ...] = ()
    sources: tuple[str, ...] = ()  # the file's tensors whose rows these are
    mode: str = "affine"  # MLX's quantization mode, when quantized
    lora: DeviceLora | None = None  # LoRA adapters on its rows (lora.py)

    def __call__(self, x: mx.array) -> mx.array:
        if self.parts:
            y = mx.concatenate([p(x) for p in self.parts], axis=-1)
        else:
            assert self.w is not None  # only a fused linear of parts has no w of its own
            if self.scales is not None:
                y = mx.quantized_matmul(
                    x,
                    self.w,
                    self.scales,
                    self.biases,
                    transpose=True,
                    group_size=32,
                    bits=self.bits,
                    mode=self.mode,
                )
            else:
                y = x @ self.w.T
        if self.bias is not None:
            y = y + self.bias
        return y + self.lora(x) if self.lora is not None else y


@dataclass
class DeviceGdn:
    in_proj: DeviceLinear  # [conv_dim + value_dim + 2 n_v, d]: conv input, z, beta, alpha
    conv: mx.array  # [conv_dim, kernel], oldest tap first
    a: mx.array  # [n_v] -exp(A_log)
    dt_bias: mx.array  # [n_v]
    norm: mx.array  # [hd_v]
    out: DeviceLinear


@dataclass
class DeviceExperts:
    """A resident stack of expert matrices [E, out, in]: dense (w), or MLX-quantized (w packed
    [E, out, in*bits/32], scales [E, out, in/32], and biases like them in `mode` "affine";
    none in "mxfp4").

    Called with rows x [..., 1, in] and the expert each row goes to, ids [...], it returns
    [..., 1, out] through gather_mm / gather_qmm, which read the chosen experts' weights
    where they lie: nothing of the stack is copied per token. A dense f16/bf16 stack takes
    its rows in its own type, since a mixed-type gather_mm would first promote the whole
    stack to f32 on every call."""

    w: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    bits: int = 0
    mode: str = "affine"

    def __call__(self, x: mx.array, ids: mx.array, sorted_ids: bool) -> mx.array:
        if self.scales is not None:
            return mx.gather_qmm(
                x,
                self.w,
                self.scales,
                self.biases,
                rhs_indices=ids,
                transpose=True,
                group_size=32,
                bits=self.bits,
                mode=self.mode,
                sorted_indices=sorted_ids,
            )
        wt = self.w.swapaxes(-1, -2)  # a transposed view, as matmul's w.T
        if self.w.dtype != mx.float32:
            y = mx.gather_mm(x.astype(self.w.dtype), wt, rhs_indices=ids, sorted_indices=sorted_ids)
            return y.astype(mx.float32)
        return mx.gather_mm(x, wt, rhs_indices=ids, sorted_indices=sorted_ids)


@dataclass
class DeviceMoe:
    """A resident MoE block: `inp` and `down_shexp` as the host's MoeWeights (read by the
    composition), the expert stacks in MLX's own gathered form (read by MlxOps.experts)."""

    # Router rows, then (when gated) the shared expert's gate row and its gate/up rows: the
    # host's fused order. Sources of different types are parts, so a quantized shared
    # expert stays quantized beside an f32 router (llama.cpp files keep routers in f32).
    inp: DeviceLinear
    gate_up_exps: list[DeviceExperts]  # [E, 2 ff, d] as one stack, or gate then up stacks
    down_exps: DeviceExperts  # [E, d, ff]
    down_shexp: DeviceLinear | None  # [d, ff_sh]
    probs_b: mx.array | None = None  # [E] the expert-selection bias, or None
    # The experts' biases: [E, 2 ff] (gate, then up) and [E, d], or None.
    gate_up_exps_b: mx.array | None = None
    down_exps_b: mx.array | None = None
    # The MoE beside a dense FFN: as the host's MoeWeights fields of these names.
    router_norm: mx.array | None = None
    expert_scale: mx.array | None = None
    pre_norm: mx.array | None = None
    post_norm: mx.array | None = None
    dense_post_norm: mx.array | None = None

    @property
    def gate_up_shexp(self) -> DeviceLinear | None:
        """The part of `inp` that holds the shared expert's gate/up rows (for inspection)."""
        for part in self.inp.parts or (self.inp,):
            if any(
                name.endswith(("ffn_gate_shexp.weight", "ffn_up_shexp.weight"))
                for name in part.sources
            ):
                return part
        return None


# Routed rows (tokens x top-k) from which a prefill sorts them by expert before the gathered
# matmuls, so each expert's weights are read once for all its rows (mlx-lm's threshold). A
# decode token's k rows go unsorted.
SORT_MIN_ROWS = 64


@dataclass(frozen=True)
class DeviceRope:
    """A layer's rope as mx.fast.rope takes it (freqs: per-pair periods, for llama 3.x's
    rope_freqs, YaRN or LongRoPE) and the factor YaRN / LongRoPE multiply cos and sin by,
    applied to the rotated output (the rotation is linear, so this is exact)."""

    dims: int
    traditional: bool
    base: float | None
    scale: float
    freqs: mx.array | None
    mscale: float = 1.0


class StepContext:
    """The traced step's positions [T] and first position (a 0-d array), so one traced
    graph serves every step of its shape."""

    def __init__(self, positions: mx.array, start: mx.array) -> None:
        self.positions, self.start = positions, start


class RowPositions:
    """A multi-sequence step's row-wise context: each row's position in its own sequence
    [T]. The rows of several sequences are not consecutive positions, so rope_ rotates each
    row at its own; the parts that touch a history get each sequence's StepContext."""

    def __init__(self, positions: mx.array) -> None:
        self.positions = positions


class LayerState:
    """One layer's device state inside a traced run: its K/V mirror [1, Hkv, capacity, hd]
    (a, b) for attention, or its conv tail and recurrent state (a, b) for a gated delta net
    or a mamba mixer;
    the ops replace them with the updated arrays and record the new K/V rows."""

    def __init__(
        self, a: mx.array, b: mx.array, c: mx.array | None = None, d: mx.array | None = None
    ) -> None:
        self.a, self.b = a, b
        # A layer with attention and a mamba mixer side by side: its K/V mirror
        # is (a, b) and its conv tail and scan state (c, d).
        self.c, self.d = c, d
        self.rows: tuple[mx.array, mx.array] | None = None

    def recurrent_state(self) -> tuple[mx.array, mx.array]:
        if self.c is not None:
            assert self.d is not None
            return self.c, self.d
        return self.a, self.b

    def set_recurrent_state(self, tail: mx.array, state: mx.array) -> None:
        if self.c is not None:
            self.c, self.d = tail, state
        else:
            self.a, self.b = tail, state

    def arrays(self) -> list[mx.array]:
        """The state arrays, in the order the traced run takes and returns them."""
        if self.c is None or self.d is None:
            return [self.a, self.b]
        return [self.a, self.b, self.c, self.d]


def attention_mask(
    positions: mx.array,
    capacity: int,
    window: int | None,
    causal: bool = True,
    chunk: int | None = None,
) -> mx.array:
    """Additive mask [T, capacity]: causal, key k visible to the query at p if k <= p (and
    p - k < window, and k in p's chunk: k // chunk == p // chunk); bidirectional (an
    encoder's step holds its whole sequence), every key up to the step's last position (and
    |p - k| < window)."""
    kv = mx.arange(capacity)[None, :]
    p = positions[:, None]
    if causal:
        visible = kv <= p
        if window is not None:
            visible = visible & (p - kv < window)
    else:
        visible = kv <= mx.max(positions)
        if window is not None:
            visible = visible & (mx.abs(p - kv) < window)
    if chunk is not None:
        visible = visible & (kv // chunk == p // chunk)
    return mx.where(visible, mx.array(0.0, mx.float32), mx.array(-mx.inf, mx.float32))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _heads_first(x: mx.array) -> mx.array:
    """[T, H, d] -> [1, H, T, d], the layout of mx.fast.rope and SDPA."""
    return x.transpose(1, 0, 2)[None]


def _top_k(p: mx.array, select: mx.array, k: int, renormalize: bool) -> tuple[mx.array, mx.array]:
    """The k best selection scores' ids [T, k] and their probabilities (renormalized)."""
    ids = mx.argsort(-select, axis=-1)[:, :k]
    wts = mx.take_along_axis(p, ids, axis=-1)
    if renormalize:
        wts = wts / wts.sum(axis=-1, keepdims=True)
    return ids, wts


class MlxOps:
    """The Ops interface (graph/ops.py) as lazy MLX expressions, traced by mx.compile."""

    def linear(self, x: mx.array, w: DeviceLinear) -> mx.array:
        return w(x)

    def rms_norm(self, x: mx.array, w: mx.array | None, eps: float) -> mx.array:
        return mx.fast.rms_norm(x, w, eps)

    rms_norm_ = rms_norm

    def layer_norm(self, x: mx.array, w: mx.array, b: mx.array | None, eps: float) -> mx.array:
        return mx.fast.layer_norm(x, w, b, eps)

    def clamp_(self, x: mx.array, c: float) -> mx.array:
        return mx.clip(x, -c, c)

    def add_(self, x: mx.array, y: mx.array) -> mx.array:
        return x + y

    def concat(self, parts: list[mx.array], axis: int = -1) -> mx.array:
        return mx.concatenate(parts, axis=axis)

    def scale_(self, x: mx.array, s: float) -> mx.array:
        return x * s

    def softcap_(self, x: mx.array, cap: float) -> mx.array:
        return cap * mx.tanh(x / cap)

    def act(self, x: mx.array, act: str) -> mx.array:
        if act == "silu":
            return x * mx.sigmoid(x)
        if act == "gelu_tanh":
            return 0.5 * x * (1.0 + mx.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
        raise ValueError(f"activation {act} not carried")  # eligibility refuses it first

    def glu(self, h: mx.array, act: str) -> mx.array:
        n = h.shape[-1] // 2
        if act == "swiglu_oai":  # as backends/host/ffn.py's swiglu_oai
            g = mx.minimum(h[..., :n], SWIGLU_OAI_LIMIT)
            u = mx.clip(h[..., n:], -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
            return g * mx.sigmoid(SWIGLU_OAI_ALPHA * g) * (u + 1.0)
        return self.act(h[..., :n], act) * h[..., n:]

    def sigmoid(self, x: mx.array) -> mx.array:
        return mx.sigmoid(x)

    def sigmoid_mul_(self, x: mx.array, gate: mx.array) -> mx.array:
        return x * mx.sigmoid(gate)

    def index(self, values: tuple[int, ...]) -> mx.array:
        return mx.array(values)  # a constant of the traced graph

    def rope_(self, x: mx.array, pos: StepContext | RowPositions, rope: DeviceRope) -> mx.array:
        rows = isinstance(pos, RowPositions)
        # Rows at scattered positions: each row is a batch entry of mx.fast.rope, with its
        # own offset; consecutive positions: one sequence from its first.
        r = mx.fast.rope(
            x[:, :, None] if rows else _heads_first(x),
            rope.dims,
            traditional=rope.traditional,
            base=rope.base,
            scale=rope.scale,
            offset=pos.positions if isinstance(pos, RowPositions) else pos.start,
            freqs=rope.freqs,
        )
        if rope.mscale != 1.0:
            d = rope.dims
            if d == r.shape[-1]:
                r = r * rope.mscale
            else:  # the dims that do not rotate pass through unscaled, as on the host
                r = mx.concatenate([r[..., :d] * rope.mscale, r[..., d:]], axis=-1)
        return r[:, :, 0] if rows else r[0].transpose(1, 0, 2)

    def attention(
        self,
        q: mx.array,
        k: mx.array | None,
        v: mx.array | None,
        kv: LayerState,
        pos: StepContext,
        call: AttentionCall[mx.array],
    ) -> mx.array:
        if call.bias is not None:
            raise ValueError("a relative attention bias not carried")  # eligibility refuses it
        if call.softcap:
            raise ValueError("attention logit softcap not carried")  # eligibility refuses it first
        T, H, _ = q.shape
        if k is not None and v is not None:
            k4, v4 = _heads_first(k), _heads_first(v)
            at = pos.start.reshape(1)
            # Rounded to the mirror's cache type (f16 / bf16) as the host cache rounds them.
            kv.a = mx.slice_update(kv.a, k4.astype(kv.a.dtype), at, axes=(2,))
            kv.b = mx.slice_update(kv.b, v4.astype(kv.b.dtype), at, axes=(2,))
            kv.rows = (k4[0], v4[0])
        # (else a KV-sharing layer: kv is its source layer's state, this step's rows in it)
        keys, values = kv.a.astype(q.dtype), kv.b.astype(q.dtype)  # (no-ops for f32)
        mask = attention_mask(pos.positions, kv.a.shape[2], call.window, call.causal, call.chunk)
        if call.temperature is not None:
            floor_scale, t = call.temperature
            p = pos.positions.astype(mx.float32)
            q = q * (mx.log(mx.floor((p + 1.0) / floor_scale) + 1.0) * t + 1.0)[:, None, None]
        if call.alibi is not None:
            # ALiBi folded into the additive mask: [H, T, capacity], -slope_h * (p - j).
            dist = pos.positions[:, None] - mx.arange(kv.a.shape[2])[None, :]
            slopes = mx.array(call.alibi, dtype=mx.float32)[:, None, None]
            mask = mask[None] - slopes * dist.astype(mx.float32)[None]
        o = mx.fast.scaled_dot_product_attention(
            _heads_first(q), keys, values, scale=call.scale, mask=mask, sinks=call.sinks
        )
        return o[0].transpose(1, 0, 2).reshape(T, -1)

    def causal_conv(self, x: mx.array, tail: mx.array, taps: mx.array) -> tuple[mx.array, mx.array]:
        T, K = x.shape[0], taps.shape[1]
        xin = mx.concatenate([tail, x])
        c = xin[:T] * taps[:, 0]
        for j in range(1, K):
            c = c + xin[j : j + T] * taps[:, j]
        return c, xin[T:]

    def l2_norm(self, x: mx.array, eps: float) -> mx.array:
        return x * mx.rsqrt((x * x).sum(axis=-1, keepdims=True) + eps)

    def softplus(self, x: mx.array) -> mx.array:
        return mx.logaddexp(mx.zeros_like(x), x)

    def delta_rule(
        self,
        q: mx.array,
        k: mx.array,
        v: mx.array,
        g: mx.array,
        beta: mx.array,
        state: mx.array,
    ) -> tuple[mx.array, mx.array]:
        """The per-token recurrence for every row, unrolled in the traced graph."""
        decay = mx.exp(g)
        outs = []
        s = state
        for t in range(q.shape[0]):
            s = s * decay[t][:, None, None]
            kt = k[t][:, None, :]  # [H, 1, dk]
            delta = (v[t] - (kt @ s)[:, 0]) * beta[t][:, None]
            s = s + kt.transpose(0, 2, 1) * delta[:, None, :]
            outs.append((q[t][:, None, :] @ s)[:, 0])
        return mx.stack(outs), s

    def selective_scan(
        self,
        x: mx.array,
        dt: mx.array,
        a: mx.array,
        b: mx.array,
        c: mx.array,
        state: mx.array,
    ) -> tuple[mx.array, mx.array]:
        """Mamba's per-token scan for every row (Mamba-1: one B/C group; Mamba-2: G groups,
        a per-head decay), unrolled in the traced graph."""
        T, di = x.shape
        G, ds = b.shape[1], b.shape[2]
        decay = mx.exp(dt[:, :, None] * a)  # [T, d_inner, d_state] (Mamba-2: [T, d_inner, 1])
        inp = ((dt * x).reshape(T, G, di // G, 1) * b[:, :, None, :]).reshape(T, di, ds)
        outs = []
        h = state
        for t in range(T):
            h = decay[t] * h + inp[t]
            outs.append((h.reshape(G, di // G, ds) @ c[t][:, :, None]).reshape(di))
        return mx.stack(outs), h

    def lightning_attention(
        self,
        q: mx.array,
        k: mx.array,
        v: mx.array,
        slopes: tuple[float, ...],
        state: mx.array,
    ) -> tuple[mx.array, mx.array]:
        """Blocks of LIGHTNING_BLOCK tokens in the traced graph: each block's decayed
        scores within it, the state across blocks (the host kernel's sum, in MLX)."""
        s = mx.array(slopes, dtype=mx.float32)
        outs, S = [], state
        for b0 in range(0, q.shape[0], LIGHTNING_BLOCK):
            qb, kb, vb = (a[b0 : b0 + LIGHTNING_BLOCK].transpose(1, 0, 2) for a in (q, k, v))
            n = qb.shape[1]
            i = mx.arange(n, dtype=mx.float32)
            q_decay = mx.exp(-s[:, None] * (i[None, :] + 1))[:, :, None]  # [H, n, 1]
            k_decay = mx.exp(-s[:, None] * (n - 1 - i[None, :]))[:, :, None]
            gap = i[:, None] - i[None, :]
            diag = mx.where(gap >= 0, mx.exp(-s[:, None, None] * mx.maximum(gap, 0)), 0.0)
            out = ((qb @ kb.transpose(0, 2, 1)) * diag) @ vb + (qb * q_decay) @ S
            outs.append(out.transpose(1, 0, 2))
            S = S * mx.exp(-s * n)[:, None, None] + (kb * k_decay).transpose(0, 2, 1) @ vb
        return (outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)), S

    def route(
        self,
        logits: mx.array,
        k: int,
        renormalize: bool,
        gating: str = "softmax",
        bias: mx.array | None = None,
    ) -> tuple[mx.array, mx.array]:
        p = mx.sigmoid(logits) if gating == "sigmoid" else mx.softmax(logits, axis=-1)
        select = p if bias is None else p + bias  # the bias moves the selection only
        return _top_k(p, select, k, renormalize)

    def route_grouped(
        self,
        logits: mx.array,
        k: int,
        renormalize: bool,
        gating: str,
        bias: mx.array | None,
        n_group: int,
        topk_group: int,
    ) -> tuple[mx.array, mx.array]:
        p = mx.sigmoid(logits) if gating == "sigmoid" else mx.softmax(logits, axis=-1)
        select = p if bias is None else p + bias
        T, E = select.shape
        # Each group's score: the sum of its two best; the topk_group best groups kept.
        score = mx.sort(select.reshape(T, n_group, E // n_group), axis=-1)[..., -2:].sum(-1)
        floor = mx.sort(score, axis=-1)[:, n_group - topk_group][:, None]
        keep = mx.repeat(score >= floor, E // n_group, axis=-1)
        return _top_k(p, mx.where(keep, select, -mx.inf), k, renormalize)

    def head_matmul(self, x: mx.array, w: mx.array) -> mx.array:
        return mx.matmul(x.transpose(1, 0, 2), w.transpose(0, 2, 1)).transpose(1, 0, 2)

    def experts(
        self, x: mx.array, ids: mx.array, wts: mx.array, m: DeviceMoe, act: str
    ) -> mx.array:
        """Each (row, chosen expert) pair is one gathered matvec on the resident stacks; a
        prefill's pairs are sorted by expert first so each expert's weights are read once."""
        T, d = x.shape
        k = ids.shape[1]
        sort = T * k >= SORT_MIN_ROWS
        if sort:
            flat = ids.reshape(-1)
            order = mx.argsort(flat)
            rows, idx = x[order // k][:, None, :], flat[order]  # [T k, 1, d] grouped by expert
        else:
            rows, idx = x[:, None, None, :], ids  # [T, 1, 1, d] against [T, k]: broadcast over k
        parts = [g(rows, idx, sort) for g in m.gate_up_exps]
        gu = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)
        if m.gate_up_exps_b is not None:  # each pair's expert's bias row, shaped like gu
            gu = gu + m.gate_up_exps_b[idx][..., None, :]
        y = m.down_exps(self.glu(gu, act), idx, sort)
        if m.down_exps_b is not None:
            y = y + m.down_exps_b[idx][..., None, :]
        if sort:
            y = y[mx.argsort(order)]  # back to (row, rank) order
        return (y.reshape(T, k, d) * wts[..., None]).sum(axis=1)


MLX_OPS = MlxOps()


def _moe(cfg, m: DeviceMoe, h: mx.array) -> mx.array:
    """The MoE block (graph/blocks/moe.py) on MLX ops, for a look at its primitives."""
    return moe(MLX_OPS, cfg.ext.moe, cfg.ffn_act, m, h)
