"""The weights of the blocks beyond attention and the dense FFN (the recurrent mixers and
the routed experts), and their readers: each reads one layer's tensors through a
TensorReader, given the block's own config."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import FrinkError
from ..graph.blocks.gdn import GdnConfig
from ..graph.blocks.mamba import MambaConfig
from ..graph.blocks.moe import MoeConfig
from ..graph.blocks.shortconv import ShortConvConfig
from ..quant.blocks import QuantExperts
from .expert_cache import StreamedExperts
from .linear import Linear
from .reader import TensorReader

# An expert stack as the host holds it: f32, the file's blocks, or left in the file.
ExpertStack = np.ndarray | QuantExperts | StreamedExperts


@dataclass
class GdnWeights:
    """A gated delta net layer (linear attention with a recurrent state)."""

    # [conv_dim + value_dim + 2*n_v, n_embd]: the conv input (q, k: n_k heads each, v: n_v
    # heads), then z (the output gate), then beta and alpha (one row per value head).
    in_proj: Linear
    conv: np.ndarray  # [conv_dim, kernel] depthwise causal conv taps, oldest first
    a: np.ndarray  # [n_v] -exp(A_log): the log-decay rate, as the converter stores it
    dt_bias: np.ndarray  # [n_v]
    norm: np.ndarray  # [hd_v] gated RMSNorm weight
    out: Linear  # [n_embd, value_dim]


@dataclass
class MambaWeights:
    """A Mamba-1 mixer (llama.cpp's ssm_* tensors, in GGUF's [out, in] layouts)."""

    in_proj: Linear  # [2*d_inner, n_embd]: x rows, then z (the output gate) rows
    conv: np.ndarray  # [d_inner, kernel] depthwise causal conv taps, oldest first
    conv_b: np.ndarray | None  # [d_inner] the conv's bias (None: the model has none)
    x_proj: Linear  # [dt_rank + 2*d_state, d_inner]: dt, B, C
    dt_proj: Linear  # [d_inner, dt_rank] with its bias [d_inner]
    # [d_inner, d_state] -exp(A_log), as the converter stores it; [d_inner, 1] where A is
    # one per head (MambaConfig.heads), repeated over the head's channels
    a: np.ndarray
    d: np.ndarray  # [d_inner] the skip (D) term
    out: Linear  # [n_embd, d_inner]
    # RMSNorm weights for dt [dt_rank], B and C [d_state] (weightless ones:
    # ones); None when the model norms none of them.
    dt_norm: np.ndarray | None = None
    b_norm: np.ndarray | None = None
    c_norm: np.ndarray | None = None


@dataclass
class ShortConvWeights:
    """A short-conv mixer (llama.cpp's shortconv.* tensors, [out, in] layouts)."""

    in_proj: Linear  # [3*n_embd, n_embd]: B rows, then C, then x
    conv: np.ndarray  # [n_embd, L_cache] depthwise causal conv taps, oldest first
    out: Linear  # [n_embd, n_embd]


@dataclass
class Mamba2Weights:
    """A Mamba-2 mixer (llama.cpp's ssm_* tensors for mamba2, in GGUF's [out, in] layouts)."""

    in_proj: Linear  # [2*d_inner + 2*G*d_state + n_head, n_embd]: z, x, B, C, dt rows
    conv: np.ndarray  # [d_inner + 2*G*d_state, kernel] depthwise causal conv taps, oldest first
    conv_b: np.ndarray  # [d_inner + 2*G*d_state] the conv's bias
    dt_bias: np.ndarray  # [n_head]
    a: np.ndarray  # [n_head] -exp(A_log), as the converter stores it (its [n_head, 1])
    d: np.ndarray  # [n_head] the skip (D) term
    # [G, d_inner / G] the gated grouped RMSNorm's weight; None: no norm (a model with
    # mamba_rms_norm false, where llama.cpp's graph skips it)
    norm: np.ndarray | None
    out: Linear  # [n_embd, d_inner]


@dataclass
class MoeWeights:
    """A sparse MoE FFN with an optional shared expert (sigmoid-gated or not)."""

    # [n_expert (+ 1 + 2*n_ff_shexp), n_embd]: router rows, then (with a shared expert) its
    # gate row (when gated) and its gate/up rows -- everything that reads the FFN input, in
    # one matmul.
    inp: Linear
    # Left in the file under a memory budget (StreamedExperts: read as chosen, through the
    # expert cache), else in the file's blocks where the host has kernels for their types
    # (QuantExperts: only the chosen experts' bytes are read), else f32; stack[e] is
    # expert e's matrix.
    gate_up_exps: ExpertStack  # [n_expert, 2*n_ff_exp, n_embd]: gate, then up
    down_exps: ExpertStack  # [n_expert, n_embd, n_ff_exp]
    down_shexp: Linear | None  # [n_embd, n_ff_shexp]
    # [n_expert] the expert-selection bias (exp_probs_b; MoeConfig.expert_bias), or None.
    probs_b: np.ndarray | None = None
    # The experts' biases (MoeConfig.biases), or None: [n_expert, 2*n_ff_exp]
    # (gate, then up) and [n_expert, n_embd].
    gate_up_exps_b: np.ndarray | None = None
    down_exps_b: np.ndarray | None = None
    # The MoE beside a dense FFN (MoeConfig.parallel_dense), or None: the router's
    # RMSNorm weight [n_embd] (ffn_gate_inp.scale / sqrt(n_embd)), the per-expert weight
    # scales [n_expert] (ffn_down_exps.scale), the experts' pre- and post-norms and the
    # dense branch's post-norm [n_embd].
    router_norm: np.ndarray | None = None
    expert_scale: np.ndarray | None = None
    pre_norm: np.ndarray | None = None
    post_norm: np.ndarray | None = None
    dense_post_norm: np.ndarray | None = None


def read_gdn(r: TensorReader, p: str, d: int, gdn: GdnConfig) -> GdnWeights:
    """Layer p's gated delta net (its ssm_* tensors; a fused ssm_ba unzipped)."""
    n_k, n_v = gdn.n_k_heads, gdn.n_v_heads
    conv_dim, value_dim = gdn.conv_dim, n_v * gdn.head_dim_v
    qkv_gate = [(p + "attn_qkv", conv_dim), (p + "attn_gate", value_dim)]
    if r.has(p + "ssm_ba.weight"):
        # A file may keep beta and alpha in one matrix, grouped by key head: for each of the
        # n_k groups, its n_v / n_k beta rows then as many alpha rows. Unzip into all betas
        # then all alphas, value head g*r + j (grouped order, as the rest of such a model).
        ba = r.get(p + "ssm_ba.weight", (2 * n_v, d)).reshape(n_k, 2, n_v // n_k, d)
        beta, alpha = ba[:, 0].reshape(n_v, d), ba[:, 1].reshape(n_v, d)
        in_proj = Linear(
            np.concatenate([r.linear(qkv_gate, d, bias=False).dense(), beta, alpha]), None
        )
    else:
        parts = qkv_gate + [(p + "ssm_beta", n_v), (p + "ssm_alpha", n_v)]
        # (No sources: a backend holds this fused matrix dense, as it always has.)
        in_proj = Linear(r.linear(parts, d, bias=False).w, None)
    return GdnWeights(
        in_proj=in_proj,
        conv=r.get(p + "ssm_conv1d.weight", (conv_dim, gdn.conv_kernel)),
        a=r.get(p + "ssm_a", (n_v,)),
        dt_bias=r.get(p + "ssm_dt.bias", (n_v,)),
        norm=r.get(p + "ssm_norm.weight", (gdn.head_dim_v,)),
        out=Linear(r.linear([(p + "ssm_out", d)], value_dim, bias=False).w, None),
    )


def read_mamba(r: TensorReader, p: str, d: int, m: MambaConfig) -> MambaWeights:
    """Layer p's Mamba-1 mixer."""
    di, ds, rank = m.d_inner, m.d_state, m.dt_rank
    for name in ("ssm_in.bias", "ssm_out.bias"):
        if r.has(p + name):
            # HF use_bias: llama.cpp's mamba graph has no such bias (it refuses the file).
            raise FrinkError(f"{p}{name}: mamba in/out projection biases are not supported")

    def linear(name: str, shape: tuple[int, int], bias: bool = False) -> Linear:
        b = r.get(p + name + ".bias", (shape[0],)) if bias else None  # (required: get)
        return Linear(
            r.linear([(p + name, shape[0])], shape[1], bias=False).w, b, (p + name + ".weight",)
        )

    def norm(name: str, n: int) -> np.ndarray | None:
        # llama.cpp norms dt, B and C when the file says so (ssm.dt_b_c_rms: weightless)
        # or holds weights for all three (its Jamba-style files).
        if all(f"{p}ssm_{x}_norm.weight" in r.names for x in ("dt", "b", "c")):
            return r.get(f"{p}ssm_{name}_norm.weight", (n,))
        return np.ones(n, np.float32) if m.dt_b_c_rms else None

    return MambaWeights(
        in_proj=linear("ssm_in", (2 * di, d)),
        conv=r.get(p + "ssm_conv1d.weight", (di, m.conv_kernel)),
        conv_b=r.get(p + "ssm_conv1d.bias", (di,)),
        x_proj=linear("ssm_x", (rank + 2 * ds, di)),
        dt_proj=linear("ssm_dt", (di, rank), bias=True),
        a=r.get(p + "ssm_a", (di, ds)),
        d=r.get(p + "ssm_d", (di,)),
        out=linear("ssm_out", (d, di)),
        dt_norm=norm("dt", rank),
        b_norm=norm("b", ds),
        c_norm=norm("c", ds),
    )


def read_shortconv(r: TensorReader, p: str, d: int, sc: ShortConvConfig) -> ShortConvWeights:
    """Layer p's short convolution."""

    def linear(name: str, rows: int) -> Linear:
        return r.linear([(p + name.removesuffix(".weight"), rows)], d, bias=False)

    return ShortConvWeights(
        in_proj=linear("shortconv.in_proj.weight", 3 * d),
        conv=r.get(p + "shortconv.conv.weight", (d, sc.conv_kernel)),
        out=linear("shortconv.out_proj.weight", d),
    )


def read_mamba2(r: TensorReader, p: str, d: int, m: MambaConfig) -> Mamba2Weights:
    """Layer p's Mamba-2 mixer."""
    di, H, G = m.d_inner, m.dt_rank, m.n_group
    for name in ("ssm_in.bias", "ssm_out.bias"):
        if r.has(p + name):
            # HF use_bias: llama.cpp's mamba2 graph has no such bias.
            raise FrinkError(f"{p}{name}: mamba2 in/out projection biases are not supported")
    conv_dim = m.conv_dim

    def linear(name: str, shape: tuple[int, int]) -> Linear:
        return r.linear([(p + name, shape[0])], shape[1], bias=False)

    return Mamba2Weights(
        in_proj=linear("ssm_in", (di + conv_dim + H, d)),
        conv=r.get(p + "ssm_conv1d.weight", (conv_dim, m.conv_kernel)),
        conv_b=r.get(p + "ssm_conv1d.bias", (conv_dim,)),
        dt_bias=r.get(p + "ssm_dt.bias", (H,)),
        a=r.get(p + "ssm_a", (H, 1)).reshape(H),
        d=r.get(p + "ssm_d", (H, 1)).reshape(H),
        # llama.cpp's graph skips the norm when absent, but its loader requires it (but
        # for a mixer beside attention).
        norm=r.optional(p + "ssm_norm.weight", (G, di // G), required=not m.parallel),
        out=linear("ssm_out", (d, di)),
    )


def read_moe(r: TensorReader, p: str, d: int, moe: MoeConfig) -> MoeWeights:
    """Layer p's routed experts, router and shared expert."""
    n_e, ff = moe.n_expert, moe.n_ff_exp
    # The gate and up stacks: one tensor, or two stacked along rows (each expert's gate
    # rows, then its up rows).
    fused_gate_up = r.has(p + "ffn_gate_up_exps.weight")
    if fused_gate_up:
        parts = [(p + "ffn_gate_up_exps", 2 * ff)]
    else:
        parts = [(p + "ffn_gate_exps", ff), (p + "ffn_up_exps", ff)]
    gate_up: ExpertStack | None = r.experts(parts, n_e, d)
    if gate_up is None:
        gate_up = np.concatenate(
            [r.get(name + ".weight", (n_e, n, d)) for name, n in parts], axis=1
        )
    down: ExpertStack | None = r.experts([(p + "ffn_down_exps", d)], n_e, ff)
    if down is None:
        down = r.get(p + "ffn_down_exps.weight", (n_e, d, ff))
    inp = [r.get(p + "ffn_gate_inp.weight", (n_e, d))]
    inp_sources = [p + "ffn_gate_inp.weight"]
    router_b = gate_up_b = down_b = None
    if moe.biases:  # the router's and every expert's
        router_b = r.get(p + "ffn_gate_inp.bias", (n_e,))
        gate_up_b = np.concatenate([r.get(name + ".bias", (n_e, n)) for name, n in parts], axis=1)
        down_b = r.get(p + "ffn_down_exps.bias", (n_e, d))
    down_shexp = None
    if moe.n_ff_shexp:
        sh = moe.n_ff_shexp
        if moe.shared_gate:
            # llama.cpp accepts the shared expert's gate as [n_embd] or [1, n_embd].
            gate_name = p + "ffn_gate_inp_shexp.weight"
            shape = (
                (d,)
                if r.has(gate_name) and len(r.ckpt.tensors.info(gate_name).shape) == 1
                else (1, d)
            )
            inp.append(r.get(gate_name, shape).reshape(1, d))
            inp_sources.append(gate_name)
        inp_sources += [p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"]
        inp += [
            r.get(p + "ffn_gate_shexp.weight", (sh, d)),
            r.get(p + "ffn_up_shexp.weight", (sh, d)),
        ]
        down_shexp = Linear(
            r.get(p + "ffn_down_shexp.weight", (d, sh)), None, (p + "ffn_down_shexp.weight",)
        )
    rows = sum(x.shape[0] for x in inp)
    inp_b = (
        None if router_b is None else np.concatenate([router_b, np.zeros(rows - n_e, np.float32)])
    )
    parallel: dict[str, np.ndarray] = {}
    if moe.parallel_dense:
        parallel = dict(
            router_norm=r.get(p + "ffn_gate_inp.scale", (d,)) * np.float32(d**-0.5),
            expert_scale=r.get(p + "ffn_down_exps.scale", (n_e,)),
            pre_norm=r.get(p + "pre_ffw_norm_2.weight", (d,)),
            post_norm=r.get(p + "post_ffw_norm_2.weight", (d,)),
            dense_post_norm=r.get(p + "post_ffw_norm_1.weight", (d,)),
        )
    return MoeWeights(
        inp=Linear(np.concatenate(inp), inp_b, tuple(inp_sources)),
        gate_up_exps=gate_up,
        down_exps=down,
        down_shexp=down_shexp,
        probs_b=r.get(p + "exp_probs_b.bias", (n_e,)) if moe.expert_bias else None,
        gate_up_exps_b=gate_up_b,
        down_exps_b=down_b,
        **parallel,
    )
