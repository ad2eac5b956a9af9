"""Weights dequantized once at load into the layouts the host body multiplies with.

Every matrix is [out, in] as GGUF stores it, row-major: the host's decode kernel (graph/
linear.py) reads each output's row as one stream, and prefill GEMMs run alike on either
order. (Before that kernel, OpenBLAS's GEMV made column-major twice as fast for matrices
with at least as many outputs as inputs; the kernel beats both.) The matrices one step
reads together are fused at load: Q/K/V into one, gate/up into one, so a decode token
makes one product where it would make three. Each tensor is dequantized, checked against
the shape the config implies, and released before the next, so load never holds two full
copies. No per-token work may come back to this module.

The layers sit in a LayerStore, loaded from the checkpoint on first access. With an
accelerated backend the host need not hold a layer the device holds whole (a Mac's 8B Q4
model would otherwise need 32 GB of host f32 copies beside the device's own): the backend
borrows each layer it uploads (loaded, used, freed: one host layer at a time), the decoder
then releases what the backend reports resident and loads the rest at once, so every layer
the host body runs is still dequantized at load.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..quant import kernels
from ..quant.blocks import KERNEL_TYPES, QuantExperts, QuantMatrix, QuantRows
from .config import ModelConfig


@dataclass
class Linear:
    """A weight matrix [out, in] (the rows of several source tensors when fused) and its
    bias (zero-filled where only some of the fused tensors have one). The matrix is f32, or
    the file's own blocks (QuantRows) where the host has kernels for its types."""

    w: np.ndarray | QuantRows
    b: np.ndarray | None
    # The file's tensors whose rows these are, in order ("blk.0.attn_q.weight", ...): a
    # backend that keeps the file's own quantized blocks reads them from here. Empty when
    # the rows are rearranged from their sources (a GDN's unzipped beta/alpha).
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Row-major, which the decode kernel reads (see the module note); a no-op for
        # matrices built that way.
        if isinstance(self.w, np.ndarray) and self.w.ndim == 2 and not self.w.flags.c_contiguous:
            self.w = np.ascontiguousarray(self.w)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.w.shape)

    def dense(self) -> np.ndarray:
        """The matrix as f32 (a backend's upload; the host body multiplies w as it is)."""
        return dequantized(self.w)


def dequantized(w: np.ndarray | QuantRows | QuantExperts) -> np.ndarray:
    """An f32 copy of a matrix (or an expert stack) held in blocks; an f32 array as it is."""
    if isinstance(w, np.ndarray):
        return w
    if isinstance(w, QuantExperts):
        n = w.n_expert
        parts = [kernels.dequantize_rows(p).reshape(n, p.rows // n, p.cols) for p in w.parts]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    return np.concatenate([kernels.dequantize_rows(p) for p in w.parts])


def embedding_rows(table: np.ndarray | QuantRows, ids: np.ndarray) -> np.ndarray:
    """table[ids] as a new f32 array: a table in blocks is dequantized on lookup, row by row
    (Gemma 3's 262k-row embedding stays ~170 MiB in Q4_K, where f32 is 670)."""
    if isinstance(table, np.ndarray):
        return table[ids]  # fancy indexing copies
    idx = np.asarray(ids, dtype=np.int64).reshape(-1)
    out = np.empty((idx.size, table.shape[1]), np.float32)
    for p, r0 in zip(table.parts, table.offsets()):
        mine = (idx >= r0) & (idx < r0 + p.rows)
        if mine.any():
            out[mine] = kernels.take_rows(p, idx[mine] - r0)
    return out


# The type names the host keeps in blocks; FRINK_F32_WEIGHTS=1 dequantizes every weight at
# load instead (the layout before the kernels, for comparisons).
_KERNEL_TYPE_NAMES = frozenset(t.name for t in KERNEL_TYPES)
_F32_WEIGHTS = bool(os.environ.get("FRINK_F32_WEIGHTS"))

# Rows dequantized per read when a matrix is filled a slice at a time (load_weights' fill):
# small beside any real matrix, large enough that the reads stay few.
_FILL_CHUNK_BYTES = 32 << 20


@dataclass
class GdnWeights:
    """A gated delta net layer (qwen35/qwen3next linear attention)."""

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
    conv_b: np.ndarray  # [d_inner] the conv's bias
    x_proj: Linear  # [dt_rank + 2*d_state, d_inner]: dt, B, C
    dt_proj: Linear  # [d_inner, dt_rank] with its bias [d_inner]
    a: np.ndarray  # [d_inner, d_state] -exp(A_log), as the converter stores it
    d: np.ndarray  # [d_inner] the skip (D) term
    out: Linear  # [n_embd, d_inner]
    # RMSNorm weights for dt [dt_rank], B and C [d_state] (Falcon-Mamba's are weightless:
    # ones); None when the model norms none of them.
    dt_norm: np.ndarray | None = None
    b_norm: np.ndarray | None = None
    c_norm: np.ndarray | None = None


@dataclass
class ShortConvWeights:
    """An LFM2 short-conv mixer (llama.cpp's shortconv.* tensors, [out, in] layouts)."""

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
    # [G, d_inner / G] the gated grouped RMSNorm's weight; None: no norm (falcon-h1 with
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
    # In the file's blocks where the host has kernels for their types (QuantExperts: only
    # the chosen experts' bytes are read), else f32; stack[e] is expert e's matrix.
    gate_up_exps: np.ndarray | QuantExperts  # [n_expert, 2*n_ff_exp, n_embd]: gate, then up
    down_exps: np.ndarray | QuantExperts  # [n_expert, n_embd, n_ff_exp]
    down_shexp: Linear | None  # [n_embd, n_ff_shexp]
    # [n_expert] the expert-selection bias (exp_probs_b; MoeConfig.expert_bias), or None.
    probs_b: np.ndarray | None = None
    # The experts' biases (MoeConfig.biases, gpt-oss), or None: [n_expert, 2*n_ff_exp]
    # (gate, then up) and [n_expert, n_embd].
    gate_up_exps_b: np.ndarray | None = None
    down_exps_b: np.ndarray | None = None
    # gemma4's MoE beside the dense FFN (MoeConfig.parallel_dense), or None: the router's
    # RMSNorm weight [n_embd] (ffn_gate_inp.scale / sqrt(n_embd)), the per-expert weight
    # scales [n_expert] (ffn_down_exps.scale), the experts' pre- and post-norms and the
    # dense branch's post-norm [n_embd].
    router_norm: np.ndarray | None = None
    expert_scale: np.ndarray | None = None
    pre_norm: np.ndarray | None = None
    post_norm: np.ndarray | None = None
    dense_post_norm: np.ndarray | None = None


@dataclass
class LayerWeights:
    attn_norm: np.ndarray | None  # [n_embd]; None with no_pre_norm
    # [n_head*hd_k (x2 with an output gate) + n_head_kv*(hd_k + hd_v), n_embd]; None for GDN
    qkv: Linear | None
    q_norm: np.ndarray | None  # [hd_k]; [n_head*hd_k] with qk_norm_full
    k_norm: np.ndarray | None  # [hd_k]; [n_head_kv*hd_k] with qk_norm_full
    wo: Linear | None  # [n_embd, n_head*hd_v]; None for GDN
    post_attn_norm: np.ndarray | None  # [n_embd]
    ffn_norm: np.ndarray | None  # [n_embd]; None with no_pre_norm
    gate_up: Linear | None  # [2*n_ff, n_embd]: gate rows, then up rows; None for MoE
    down: Linear | None  # [n_embd, n_ff]; None for MoE
    post_ffn_norm: np.ndarray | None  # [n_embd]
    gdn: GdnWeights | None = None
    moe: MoeWeights | None = None
    mamba: MambaWeights | None = None
    shortconv: ShortConvWeights | None = None
    mamba2: Mamba2Weights | None = None
    # LayerNorm biases (_ext(cfg).layer_norm), where the file has them.
    attn_norm_b: np.ndarray | None = None  # [n_embd]
    ffn_norm_b: np.ndarray | None = None  # [n_embd]
    # The full-width QK LayerNorms' biases (qk_norm_full with layer_norm: mpt's qk_ln).
    q_norm_b: np.ndarray | None = None  # [n_head*hd_k]
    k_norm_b: np.ndarray | None = None  # [n_head_kv*hd_k]
    up: Linear | None = None  # [n_ff, n_embd]: the plain (non-gated) FFN's up projection
    attn_sub_norm: np.ndarray | None = None  # [n_head*hd_v] (_ext(cfg).attn_sub_norm, bitnet)
    ffn_sub_norm: np.ndarray | None = None  # [n_ff] (_ext(cfg).ffn_sub_norm, bitnet)
    q_gain: np.ndarray | None = None  # [n_head, 1] talkie's per-head Q gain (attn_q_gain)
    wo_scale: np.ndarray | None = None  # [1] attn_output.scale (proj_scales)
    down_scale: np.ndarray | None = None  # [1] ffn_down.scale (proj_scales)
    skip_scale: np.ndarray | None = None  # [1] talkie's layer_output_scale (embd_skip)
    attn_sinks: np.ndarray | None = None  # [n_head] the sink logits (_ext(cfg).attn_sinks, gpt-oss)
    # gemma4's per-layer embedding ((_ext(cfg).per_layer_embd or 0) = n): its gate [n, n_embd],
    # projection [n_embd, n] and post-norm [n_embd].
    ple_gate: Linear | None = None
    ple_proj: Linear | None = None
    ple_post_norm: np.ndarray | None = None
    out_scale: np.ndarray | None = None  # [1] gemma4's layer_output_scale (layer_out_scale)


def map_layer(
    lw: LayerWeights,
    array: Callable[[np.ndarray], Any],
    linear: Callable[[Linear], Any],
    moe: Callable[[MoeWeights], Any] | None = None,
) -> LayerWeights:
    """The layer's weights with every array and Linear converted by a backend (its upload):
    the same dataclasses and fields, so the architecture's composition (ModelConfig.ext.layer)
    reads the device copy as it reads the host's, and no backend lists a layer's fields. `moe`
    converts a whole MoE block where a backend holds its experts in a form of its own."""

    def convert(v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, Linear):
            return linear(v)
        if isinstance(v, np.ndarray):
            return array(v)
        if isinstance(v, MoeWeights) and moe is not None:
            return moe(v)
        if is_dataclass(v) and not isinstance(v, type):
            return type(v)(**{f.name: convert(getattr(v, f.name)) for f in fields(v)})
        return v

    converted: LayerWeights = convert(lw)
    return converted


class LayerStore(Sequence[LayerWeights]):
    """The model's layers, each loaded from the checkpoint on first access and kept.

    `release(i)` drops layer i's host arrays; the next access loads them again (a
    one-time cost, paid only when the host body must run a layer a backend holds: a
    launch failing after admission). `borrow(i)` hands out a layer without keeping it.
    """

    def __init__(self, n_layer: int, load: Callable[[int], LayerWeights]) -> None:
        self._load = load
        self._layers: list[LayerWeights | None] = [None] * n_layer
        self.seen: set[int] = set()  # the layers loaded at least once (kept or borrowed)
        # Called with each layer index the first time it is loaded (load progress); None
        # once the model is loaded.
        self.on_load: Callable[[int], None] | None = None

    def __len__(self) -> int:
        return len(self._layers)

    def _index(self, i: int) -> int:
        n = len(self._layers)
        if not -n <= i < n:
            raise IndexError(f"layer {i} out of range [0, {n})")
        return i % n

    def _fresh(self, i: int) -> LayerWeights:
        lw = self._load(i)
        self.seen.add(i)
        if self.on_load is not None:
            self.on_load(i)
        return lw

    # Sequence's __getitem__ also takes a slice; a layer store is indexed by layer only.
    def __getitem__(self, i: int) -> LayerWeights:  # type: ignore[override]
        i = self._index(i)
        lw = self._layers[i]
        if lw is None:
            lw = self._layers[i] = self._fresh(i)
        return lw

    def __iter__(self) -> Iterator[LayerWeights]:
        return (self[i] for i in range(len(self._layers)))

    def borrow(self, i: int) -> LayerWeights:
        """Layer i, the kept copy if loaded, else a fresh load the store does not keep:
        freed when the caller drops it. A backend's bind() reads the layers it uploads
        this way, so load never holds more than one of them on the host at once."""
        i = self._index(i)
        lw = self._layers[i]
        return lw if lw is not None else self._fresh(i)

    def release(self, i: int) -> None:
        """Drop layer i's host arrays (freed unless someone else holds them)."""
        self._layers[self._index(i)] = None

    def loaded(self) -> set[int]:
        """Indices of the layers held on the host now."""
        return {i for i, lw in enumerate(self._layers) if lw is not None}


def borrow_layer(layers: Sequence[LayerWeights], i: int) -> LayerWeights:
    """Layer i for a one-off read (a backend's upload): borrowed from a LayerStore, so it
    is not kept on the host; plain lists (synthetic test weights) are indexed."""
    return layers.borrow(i) if isinstance(layers, LayerStore) else layers[i]


@dataclass
class ModelWeights:
    token_embd: np.ndarray | QuantRows  # [n_vocab, n_embd]: f32, or the file's blocks
    output_norm: np.ndarray  # [n_embd]
    output: Linear  # [n_vocab, n_embd]; shares token_embd's array when tied
    rope_freqs: np.ndarray | None  # [rope_dim / 2] frequency divisors, or None
    layers: Sequence[LayerWeights]  # a LayerStore from load_weights; a list also serves
    output_norm_b: np.ndarray | None = None  # [n_embd] the final LayerNorm's bias
    # [n_embd] bloom's LayerNorm on the embeddings; talkie's weightless RMSNorm (ones).
    token_embd_norm: np.ndarray | None = None
    token_embd_norm_b: np.ndarray | None = None  # [n_embd]
    # LongRoPE's per-pair divisors (phi3 "rope_factors_long/short.weight"), or None.
    rope_factors_long: np.ndarray | None = None
    rope_factors_short: np.ndarray | None = None
    # gemma4's per-layer embeddings ((_ext(cfg).per_layer_embd or 0)): the token table [n_vocab,
    # n_layer * n] (f32 or the file's blocks, rows dequantized on lookup), the projection of
    # the scaled embeddings [n_layer * n, n_embd] and its norm [n].
    per_layer_token_embd: np.ndarray | QuantRows | None = None
    per_layer_model_proj: Linear | None = None
    per_layer_proj_norm: np.ndarray | None = None
    # Every tensor name the loader has read (checked and loaded) so far: unread_tensors().
    tensors_read: set[str] = field(default_factory=set)


def load_weights(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    progress: Callable[[int, int], None] | None = None,
    lazy: bool = False,
) -> ModelWeights:
    """Load and fuse the weights. lazy=False loads every layer now (progress: after the
    embeddings, each layer, and the end); lazy=True loads only the embeddings, head and
    norms, leaving each layer to its first access (progress is then reported per layer
    as they load, until the caller clears `layers.on_load`)."""
    names = set(ckpt.tensors.names())
    read: set[str] = set()
    # Weights stay in the file's blocks where the host multiplies them as they are: a GGUF
    # file (its blocks readable) and the compiled kernels (without them, every step would
    # dequantize each matrix again; f32 at load is faster then).
    host_blocks = hasattr(ckpt.tensors, "blocks") and kernels.compiled() and not _F32_WEIGHTS

    def check(name: str, shape: tuple[int, ...]) -> None:
        read.add(name)
        if name not in names:
            raise FrinkError(f"{ckpt.path}: missing tensor {name}")
        info = ckpt.tensors.info(name)
        if tuple(info.shape) != shape:
            raise FrinkError(
                f"{ckpt.path}: tensor {name} has shape {list(info.shape)}, expected {list(shape)}"
            )

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        check(name, shape)
        return ckpt.tensors.load(name)

    def fill(dst: np.ndarray, name: str) -> None:
        """dst[...] = the tensor (checked against dst's shape), read a slice of rows at a
        time where the source can: a large matrix held in another memory order (a tied
        262k-row embedding, column-major) then never exists twice at full size."""
        check(name, dst.shape)
        load_rows = getattr(ckpt.tensors, "load_rows", None)
        step = max(1, _FILL_CHUNK_BYTES // (4 * dst.shape[-1]))
        if load_rows is None or dst.ndim != 2 or dst.shape[0] <= step:
            dst[...] = ckpt.tensors.load(name)
            return
        for r in range(0, dst.shape[0], step):
            dst[r : r + step] = load_rows(name, r, min(dst.shape[0], r + step))

    def optional(name: str, shape: tuple[int, ...], required: bool = False) -> np.ndarray | None:
        """get(), or None for a tensor the file lacks unless `required`."""
        if name not in names and not required:
            return None
        return get(name, shape)

    def in_blocks(parts: list[tuple[str, int]], in_dim: int) -> QuantRows | None:
        """The tensors' rows stacked as the file's own blocks, when the host has compiled
        kernels for every one's type (None: dequantize them to f32 at load)."""
        if not host_blocks:
            return None
        tensors = [name + ".weight" for name, _ in parts]
        if not all(t in names for t in tensors):
            return None  # fill() names the missing one
        if any(ckpt.tensors.info(t).dtype not in _KERNEL_TYPE_NAMES for t in tensors):
            return None
        runs = []
        for name, rows in parts:
            check(name + ".weight", (rows, in_dim))
            qtype, _, data = ckpt.tensors.blocks(name + ".weight")  # type: ignore[attr-defined]
            runs.append((qtype, rows, data))
        return QuantRows.joined(runs, in_dim)

    def experts(parts: list[tuple[str, int]], n_expert: int, in_dim: int) -> QuantExperts | None:
        """Expert stacks [n_expert, rows, in_dim] as the file's blocks, stacked along rows
        (None: f32 at load, as in_blocks)."""
        if not host_blocks:
            return None
        tensors = [name + ".weight" for name, _ in parts]
        if not all(t in names for t in tensors):
            return None
        if any(ckpt.tensors.info(t).dtype not in _KERNEL_TYPE_NAMES for t in tensors):
            return None
        stacks = []
        for name, rows in parts:
            check(name + ".weight", (n_expert, rows, in_dim))
            qtype, _, data = ckpt.tensors.blocks(name + ".weight")  # type: ignore[attr-defined]
            stacks.append(QuantMatrix.from_buffer(data, qtype, n_expert * rows, in_dim))
        return QuantExperts(tuple(stacks), n_expert)

    def fused(parts: list[tuple[str, int]], in_dim: int, bias: bool = True) -> Linear:
        """Rows of several tensors stacked into one matrix; biases zero-filled if partial."""
        w: np.ndarray | QuantRows | None = in_blocks(parts, in_dim)
        if w is None:
            # Every part's shape checked before the matrix is allocated: sizes come from the
            # metadata, which may be hostile (a head width of 2^40).
            for name, rows in parts:
                check(name + ".weight", (rows, in_dim))
            # Filled part by part: one copy of each part, no more.
            w = np.empty((sum(rows for _, rows in parts), in_dim), np.float32)
            r0 = 0
            for name, rows in parts:
                fill(w[r0 : r0 + rows], name + ".weight")
                r0 += rows
        bs = [optional(name + ".bias", (rows,)) if bias else None for name, rows in parts]
        b = None
        if any(x is not None for x in bs):
            b = np.concatenate(
                [x if x is not None else np.zeros(n, np.float32) for x, (_, n) in zip(bs, parts)]
            )
        return Linear(w, b, tuple(name + ".weight" for name, _ in parts))

    d = cfg.n_embd
    total = cfg.n_layer + 2

    token_embd: np.ndarray | QuantRows
    if cfg.tied_embeddings:
        # One matrix serves both: the lookup gathers its rows, the head multiplies them.
        output = fused([("token_embd", cfg.n_vocab)], d, bias=False)
        token_embd = output.w
    else:
        blocks = in_blocks([("token_embd", cfg.n_vocab)], d)
        token_embd = get("token_embd.weight", (cfg.n_vocab, d)) if blocks is None else blocks
        output = fused([("output", cfg.n_vocab)], d, bias=False)
    rope_freqs = optional("rope_freqs.weight", (cfg.rope_dim // 2,))
    longrope = cfg.rope_scaling is not None and cfg.rope_scaling.kind == "longrope"
    factors = [
        optional(f"rope_factors_{which}.weight", (cfg.rope_dim // 2,), required=longrope)
        for which in ("long", "short")
    ]
    if progress:
        progress(1, total)

    # Hybrids store the pre-FFN norm under post_attention_norm: it is not a post norm there.
    post_norm_name = (
        None if _ext(cfg).ffn_norm_tensor == "post_attention_norm" else "post_attention_norm"
    )

    def norm(name: str) -> np.ndarray:
        """A norm's weight [n_embd]: ones where the model's norms have none."""
        return np.ones(d, np.float32) if _ext(cfg).weightless_norms else get(name, (d,))

    def load_layer(i: int) -> LayerWeights:
        p = f"blk.{i}."
        shape = cfg.layer_shape(i)
        # This layer's widths (per-layer head counts and FFN widths: cfg.layer_sizes; head
        # widths per layer kind: gemma4).
        n_head, n_ff, hk, hv = shape.n_head, shape.n_ff, shape.head_dim_k, shape.head_dim_v
        nq = n_head * hk * (2 if _ext(cfg).attn_output_gate else 1)  # with a gate: its rows too
        nk, nv = shape.n_head_kv * hk, shape.n_head_kv * hv
        shares_kv = shape.kv_source is not None  # gemma4: no K/V of its own
        qkv = wo = q_norm = k_norm = q_norm_b = k_norm_b = gdn = mamba = mamba2 = shortconv = None
        if shape.mixer == "shortconv":
            shortconv = _load_shortconv(p, cfg, get, fused)
        elif shape.mixer == "gdn":
            gdn = _load_gdn(p, cfg, get, names, fused)
        elif shape.mixer == "mamba":
            mamba = _load_mamba(p, cfg, get, names, fused)
        elif shape.mixer in ("mamba2", "attention+mamba2"):
            # falcon-h1's "attention+mamba2": the attention tensors too, below.
            mamba2 = _load_mamba2(p, cfg, get, names, fused)
        elif shape.mixer == "linear":
            # deci's "linear attention": wo alone, [n_embd, n_embd], on the normed input.
            wo = fused([(p + "attn_output", d)], d, bias=False)
        if shape.mixer in ("attention", "attention+mamba2"):
            if p + "attn_qkv.weight" in names:
                qkv = fused([(p + "attn_qkv", nq + nk + nv)], d)
            elif shares_kv:
                qkv = fused([(p + "attn_q", nq)], d)
            elif _v_from_k(cfg, i):
                qkv = fused([(p + "attn_q", nq), (p + "attn_k", nk)], d)
            else:
                qkv = fused([(p + "attn_q", nq), (p + "attn_k", nk), (p + "attn_v", nv)], d)
            # Per head, or (qk_norm_full) over the whole q / k projection width.
            full = _ext(cfg).qk_norm_full
            if _ext(cfg).attn_q_gain:
                # talkie: weightless per-head Q and K norms; attn_q_norm is a gain per head.
                q_norm = k_norm = np.ones(hk, np.float32)
            else:
                q_norm = optional(
                    p + "attn_q_norm.weight",
                    (n_head * hk if full else hk,),
                    required=_ext(cfg).qk_norm or full,
                )
                k_norm = optional(
                    p + "attn_k_norm.weight",
                    (nk if full else hk,),
                    required=(_ext(cfg).qk_norm or full) and not shares_kv,
                )
                if full and _ext(cfg).layer_norm:
                    q_norm_b = optional(p + "attn_q_norm.bias", (n_head * hk,))
                    k_norm_b = optional(p + "attn_k_norm.bias", (nk,))
            wo = fused([(p + "attn_output", d)], n_head * hv)
        gate_up = down = moe = up = None
        if shape.ffn in ("moe", "dense+moe"):
            moe = _load_moe(p, cfg, get, ckpt, experts)
        if shape.ffn in ("moe", "none"):
            pass  # no dense FFN: a routed layer's experts (above), or deci's FFN-free layer
        elif _ext(cfg).plain_ffn:
            up = fused([(p + "ffn_up", n_ff)], d)
            down = fused([(p + "ffn_down", d)], n_ff)
        else:
            if p + "ffn_gate.weight" in names:
                parts = [(p + "ffn_gate", n_ff), (p + "ffn_up", n_ff)]
            else:  # phi3: ffn_up holds the gate rows then the up rows
                parts = [(p + "ffn_up", 2 * n_ff)]
            gate_up = fused(parts, d, bias=False)
            down = fused([(p + "ffn_down", d)], n_ff, bias=False)
        # Norms only where their branch is: an attention-free layer has no attn_norm and
        # an FFN-free one no ffn_norm (deci).
        attn_norm = not _ext(cfg).no_pre_norm and shape.mixer != "none"
        ffn_norm = not _ext(cfg).no_pre_norm and shape.ffn != "none"
        ffn_norm_name = p + f"{_ext(cfg).ffn_norm_tensor}.weight"
        if ffn_norm_name not in names and p + _ext(cfg).ffn_norm_tensor in names:
            # falcon-h1's converter writes it without a suffix (llama.cpp's loader asks so).
            ffn_norm_name = p + _ext(cfg).ffn_norm_tensor
        return LayerWeights(
            attn_norm=norm(p + "attn_norm.weight") if attn_norm else None,
            qkv=qkv,
            q_norm=q_norm,
            k_norm=k_norm,
            wo=wo,
            post_attn_norm=optional(
                p + f"{post_norm_name}.weight", (d,), required=_ext(cfg).post_attn_norm
            )
            if post_norm_name
            else None,
            ffn_norm=norm(ffn_norm_name) if ffn_norm else None,
            gate_up=gate_up,
            down=down,
            post_ffn_norm=optional(
                p + "post_ffw_norm.weight", (d,), required=_ext(cfg).post_ffn_norm
            ),
            gdn=gdn,
            moe=moe,
            mamba=mamba,
            shortconv=shortconv,
            mamba2=mamba2,
            attn_norm_b=optional(p + "attn_norm.bias", (d,))
            if _ext(cfg).layer_norm and attn_norm
            else None,
            ffn_norm_b=optional(p + f"{_ext(cfg).ffn_norm_tensor}.bias", (d,))
            if _ext(cfg).layer_norm and ffn_norm
            else None,
            q_norm_b=q_norm_b,
            k_norm_b=k_norm_b,
            up=up,
            attn_sub_norm=get(p + "attn_sub_norm.weight", (n_head * hv,))
            if _ext(cfg).attn_sub_norm and qkv is not None
            else None,
            ffn_sub_norm=get(p + "ffn_sub_norm.weight", (n_ff,))
            if _ext(cfg).ffn_sub_norm and gate_up is not None
            else None,
            attn_sinks=get(p + "attn_sinks.weight", (n_head,))
            if _ext(cfg).attn_sinks and qkv is not None
            else None,
            **_talkie_extras(p, cfg, get),
            **_gemma4_extras(p, cfg, get, fused),
        )

    def head_norms() -> dict[str, Any]:
        """The LayerNorm biases, bloom's embedding norm and gemma4's per-layer embedding
        tables (None where the model has none)."""
        return dict(
            **per_layer_tables(),
            output_norm_b=optional("output_norm.bias", (d,)) if _ext(cfg).layer_norm else None,
            token_embd_norm=optional("token_embd_norm.weight", (d,), required=_ext(cfg).embd_norm)
            if _ext(cfg).embd_norm
            else np.ones(d, np.float32)
            if _ext(cfg).embd_skip
            else None,
            token_embd_norm_b=optional("token_embd_norm.bias", (d,))
            if _ext(cfg).embd_norm
            else None,
        )

    def per_layer_tables() -> dict[str, Any]:
        n = cfg.n_layer * (_ext(cfg).per_layer_embd or 0)
        if not n:
            return {}
        blocks = in_blocks([("per_layer_token_embd", cfg.n_vocab)], n)
        return dict(
            per_layer_token_embd=get("per_layer_token_embd.weight", (cfg.n_vocab, n))
            if blocks is None
            else blocks,
            per_layer_model_proj=fused([("per_layer_model_proj", n)], d, bias=False),
            per_layer_proj_norm=get(
                "per_layer_proj_norm.weight", ((_ext(cfg).per_layer_embd or 0),)
            ),
        )

    layers = LayerStore(cfg.n_layer, load_layer)
    if progress:
        seen: set[int] = set()

        def report(i: int) -> None:
            seen.add(i)
            progress(len(seen) + 1, total)

        layers.on_load = report
    if lazy:
        output_norm = norm(f"{_ext(cfg).output_norm_tensor}.weight")
        return ModelWeights(
            token_embd,
            output_norm,
            output,
            rope_freqs,
            layers,
            **head_norms(),
            rope_factors_long=factors[0],
            rope_factors_short=factors[1],
            tensors_read=read,
        )
    for i in range(cfg.n_layer):
        layers[i]
    layers.on_load = None
    output_norm = norm(f"{_ext(cfg).output_norm_tensor}.weight")
    if progress:
        progress(total, total)
    return ModelWeights(
        token_embd,
        output_norm,
        output,
        rope_freqs,
        layers,
        **head_norms(),
        rope_factors_long=factors[0],
        rope_factors_short=factors[1],
        tensors_read=read,
    )


def unread_tensors(ckpt: Checkpoint, weights: ModelWeights) -> list[str]:
    """The file's tensors that no part of the model read: each one a feature frink would
    silently drop (a bias, a scale, a norm of a variant it does not know). Every layer is
    read once at load (a backend's bind borrows each layer it holds), so the loader's
    record covers the whole model; a layer not read yet is borrowed once to complete it."""
    layers = weights.layers
    if isinstance(layers, LayerStore):
        for i in range(len(layers)):
            if i not in layers.seen:
                layers.borrow(i)
    return sorted(set(ckpt.tensors.names()) - weights.tensors_read)


class _Decorations:
    """The architecture config's fields as the loader reads them, absent ones as None.
    Transitional: the loader moves into the architectures (their load_layer)."""

    def __init__(self, ext: Any) -> None:
        self._ext = ext

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ext, name, None)


def _ext(cfg: ModelConfig) -> Any:
    return _Decorations(cfg.ext)


def _v_from_k(cfg: ModelConfig, layer: int) -> bool:
    v_from_k = _ext(cfg).v_from_k
    return bool(v_from_k) and v_from_k[layer]


# load_weights' tensor reader: (name, expected shape) -> the array, or FrinkError.
_Get = Callable[[str, tuple[int, ...]], np.ndarray]
# load_weights' fused(parts, in_dim, bias): a Linear over tensors' rows, in the file's
# blocks where the host has kernels for them, else f32.
_Fused = Callable[..., Linear]


def _talkie_extras(p: str, cfg: ModelConfig, get: _Get) -> dict[str, Any]:
    """Layer p's per-head Q gain, projection scales and skip-stream scale, where the model
    has them (attn_q_gain, proj_scales, embd_skip)."""
    out: dict[str, Any] = {}
    if _ext(cfg).attn_q_gain:
        out["q_gain"] = get(p + "attn_q_norm.weight", (cfg.n_head, 1))
    if _ext(cfg).proj_scales:
        out["wo_scale"] = get(p + "attn_output.scale", (1,))
        out["down_scale"] = get(p + "ffn_down.scale", (1,))
    if _ext(cfg).embd_skip:
        out["skip_scale"] = get(p + "layer_output_scale.weight", (1,))
    return out


def _gemma4_extras(p: str, cfg: ModelConfig, get: _Get, fused: _Fused) -> dict[str, Any]:
    """Layer p's per-layer embedding weights and output scale, where the model has them
    (per_layer_embd, layer_out_scale)."""
    out: dict[str, Any] = {}
    d, n = cfg.n_embd, (_ext(cfg).per_layer_embd or 0)
    if n:
        out["ple_gate"] = fused([(p + "inp_gate", n)], d, bias=False)
        out["ple_proj"] = fused([(p + "proj", d)], n, bias=False)
        out["ple_post_norm"] = get(p + "post_norm.weight", (d,))
    if _ext(cfg).layer_out_scale:
        out["out_scale"] = get(p + "layer_output_scale.weight", (1,))
    return out


def _load_gdn(p: str, cfg: ModelConfig, get: _Get, names: set[str], fused: _Fused) -> GdnWeights:
    gdn = _ext(cfg).gdn
    assert gdn is not None  # only a layer_shape with mixer "gdn" comes here
    d, n_k, n_v = cfg.n_embd, gdn.n_k_heads, gdn.n_v_heads
    conv_dim, value_dim = gdn.conv_dim, n_v * gdn.head_dim_v
    qkv_gate = [(p + "attn_qkv", conv_dim), (p + "attn_gate", value_dim)]
    if p + "ssm_ba.weight" in names:
        # qwen3next keeps beta and alpha in one matrix, grouped by key head: for each of the
        # n_k groups, its r = n_v / n_k beta rows then its r alpha rows. Unzip into all betas
        # then all alphas, value head g*r + j (grouped order, as the rest of qwen3next).
        ba = get(p + "ssm_ba.weight", (2 * n_v, d)).reshape(n_k, 2, n_v // n_k, d)
        beta, alpha = ba[:, 0].reshape(n_v, d), ba[:, 1].reshape(n_v, d)
        in_proj = Linear(
            np.concatenate([fused(qkv_gate, d, bias=False).dense(), beta, alpha]), None
        )
    else:
        parts = qkv_gate + [(p + "ssm_beta", n_v), (p + "ssm_alpha", n_v)]
        # (No sources: a backend holds this fused matrix dense, as it always has.)
        in_proj = Linear(fused(parts, d, bias=False).w, None)
    return GdnWeights(
        in_proj=in_proj,
        conv=get(p + "ssm_conv1d.weight", (conv_dim, gdn.conv_kernel)),
        a=get(p + "ssm_a", (n_v,)),
        dt_bias=get(p + "ssm_dt.bias", (n_v,)),
        norm=get(p + "ssm_norm.weight", (gdn.head_dim_v,)),
        out=Linear(fused([(p + "ssm_out", d)], value_dim, bias=False).w, None),
    )


def _load_mamba(
    p: str, cfg: ModelConfig, get: _Get, names: set[str], fused: _Fused
) -> MambaWeights:
    m = _ext(cfg).mamba
    assert m is not None  # only a layer_shape with mixer "mamba" comes here
    d, di, ds, r = cfg.n_embd, m.d_inner, m.d_state, m.dt_rank
    for name in ("ssm_in.bias", "ssm_out.bias"):
        if p + name in names:
            # HF use_bias: llama.cpp's mamba graph has no such bias (it refuses the file).
            raise FrinkError(f"{p}{name}: mamba in/out projection biases are not supported")

    def linear(name: str, shape: tuple[int, int], bias: bool = False) -> Linear:
        b = get(p + name + ".bias", (shape[0],)) if bias else None  # (required: get)
        return Linear(
            fused([(p + name, shape[0])], shape[1], bias=False).w, b, (p + name + ".weight",)
        )

    def norm(name: str, n: int) -> np.ndarray | None:
        # llama.cpp norms dt, B and C when the file says so (ssm.dt_b_c_rms: weightless)
        # or holds weights for all three (its Jamba-style files).
        if all(f"{p}ssm_{x}_norm.weight" in names for x in ("dt", "b", "c")):
            return get(f"{p}ssm_{name}_norm.weight", (n,))
        return np.ones(n, np.float32) if m.dt_b_c_rms else None

    return MambaWeights(
        in_proj=linear("ssm_in", (2 * di, d)),
        conv=get(p + "ssm_conv1d.weight", (di, m.conv_kernel)),
        conv_b=get(p + "ssm_conv1d.bias", (di,)),
        x_proj=linear("ssm_x", (r + 2 * ds, di)),
        dt_proj=linear("ssm_dt", (di, r), bias=True),
        a=get(p + "ssm_a", (di, ds)),
        d=get(p + "ssm_d", (di,)),
        out=linear("ssm_out", (d, di)),
        dt_norm=norm("dt", r),
        b_norm=norm("b", ds),
        c_norm=norm("c", ds),
    )


def _load_shortconv(p: str, cfg: ModelConfig, get: _Get, fused: _Fused) -> ShortConvWeights:
    sc = _ext(cfg).shortconv
    assert sc is not None  # only a layer_shape with mixer "shortconv" comes here
    d = cfg.n_embd

    def linear(name: str, rows: int) -> Linear:
        return fused([(p + name.removesuffix(".weight"), rows)], d, bias=False)

    return ShortConvWeights(
        in_proj=linear("shortconv.in_proj.weight", 3 * d),
        conv=get(p + "shortconv.conv.weight", (d, sc.conv_kernel)),
        out=linear("shortconv.out_proj.weight", d),
    )


def _load_mamba2(
    p: str, cfg: ModelConfig, get: _Get, names: set[str], fused: _Fused
) -> Mamba2Weights:
    m = _ext(cfg).mamba
    assert m is not None and m.version2  # only a layer_shape with mixer "mamba2" comes here
    d, di, H, G = cfg.n_embd, m.d_inner, m.dt_rank, m.n_group
    for name in ("ssm_in.bias", "ssm_out.bias"):
        if p + name in names:
            # HF use_bias: llama.cpp's mamba2 graph has no such bias.
            raise FrinkError(f"{p}{name}: mamba2 in/out projection biases are not supported")
    has_norm = p + "ssm_norm.weight" in names
    if not has_norm and not m.parallel:
        # llama.cpp's graph skips the norm when absent, but its loader requires it (but for
        # falcon-h1's).
        raise FrinkError(f"{p}ssm_norm.weight: missing (mamba2's gated grouped norm)")
    conv_dim = m.conv_dim

    def linear(name: str, shape: tuple[int, int]) -> Linear:
        return fused([(p + name, shape[0])], shape[1], bias=False)

    return Mamba2Weights(
        in_proj=linear("ssm_in", (di + conv_dim + H, d)),
        conv=get(p + "ssm_conv1d.weight", (conv_dim, m.conv_kernel)),
        conv_b=get(p + "ssm_conv1d.bias", (conv_dim,)),
        dt_bias=get(p + "ssm_dt.bias", (H,)),
        a=get(p + "ssm_a", (H, 1)).reshape(H),
        d=get(p + "ssm_d", (H, 1)).reshape(H),
        norm=get(p + "ssm_norm.weight", (G, di // G)) if has_norm else None,
        out=linear("ssm_out", (d, di)),
    )


_Experts = Callable[[list[tuple[str, int]], int, int], QuantExperts | None]


def _load_moe(
    p: str, cfg: ModelConfig, get: _Get, ckpt: Checkpoint, experts: _Experts
) -> MoeWeights:
    moe = _ext(cfg).moe
    assert moe is not None  # only a layer_shape with ffn "moe" or "dense+moe" comes here
    d, n_e, ff = cfg.n_embd, moe.n_expert, moe.n_ff_exp
    names = set(ckpt.tensors.names())
    # The gate and up stacks: one tensor, or two stacked along rows (each expert's gate
    # rows, then its up rows).
    fused_gate_up = p + "ffn_gate_up_exps.weight" in names
    if fused_gate_up:
        parts = [(p + "ffn_gate_up_exps", 2 * ff)]
    else:
        parts = [(p + "ffn_gate_exps", ff), (p + "ffn_up_exps", ff)]
    gate_up: np.ndarray | QuantExperts | None = experts(parts, n_e, d)
    if gate_up is None:
        gate_up = np.concatenate([get(name + ".weight", (n_e, n, d)) for name, n in parts], axis=1)
    down: np.ndarray | QuantExperts | None = experts([(p + "ffn_down_exps", d)], n_e, ff)
    if down is None:
        down = get(p + "ffn_down_exps.weight", (n_e, d, ff))
    inp = [get(p + "ffn_gate_inp.weight", (n_e, d))]
    inp_sources = [p + "ffn_gate_inp.weight"]
    router_b = gate_up_b = down_b = None
    if moe.biases:  # gpt-oss: the router's and every expert's
        router_b = get(p + "ffn_gate_inp.bias", (n_e,))
        gate_up_b = np.concatenate([get(name + ".bias", (n_e, n)) for name, n in parts], axis=1)
        down_b = get(p + "ffn_down_exps.bias", (n_e, d))
    down_shexp = None
    if moe.n_ff_shexp:
        sh = moe.n_ff_shexp
        if moe.shared_gate:
            # llama.cpp accepts the shared expert's gate as [n_embd] or [1, n_embd].
            gate_name = p + "ffn_gate_inp_shexp.weight"
            shape = (
                (d,)
                if gate_name in names and len(ckpt.tensors.info(gate_name).shape) == 1
                else (1, d)
            )
            inp.append(get(gate_name, shape).reshape(1, d))
            inp_sources.append(gate_name)
        inp_sources += [p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"]
        inp += [
            get(p + "ffn_gate_shexp.weight", (sh, d)),
            get(p + "ffn_up_shexp.weight", (sh, d)),
        ]
        down_shexp = Linear(
            get(p + "ffn_down_shexp.weight", (d, sh)), None, (p + "ffn_down_shexp.weight",)
        )
    rows = sum(x.shape[0] for x in inp)
    inp_b = (
        None if router_b is None else np.concatenate([router_b, np.zeros(rows - n_e, np.float32)])
    )
    parallel: dict[str, np.ndarray] = {}
    if moe.parallel_dense:  # gemma4
        parallel = dict(
            router_norm=get(p + "ffn_gate_inp.scale", (d,)) * np.float32(d**-0.5),
            expert_scale=get(p + "ffn_down_exps.scale", (n_e,)),
            pre_norm=get(p + "pre_ffw_norm_2.weight", (d,)),
            post_norm=get(p + "post_ffw_norm_2.weight", (d,)),
            dense_post_norm=get(p + "post_ffw_norm_1.weight", (d,)),
        )
    return MoeWeights(
        inp=Linear(np.concatenate(inp), inp_b, tuple(inp_sources)),
        gate_up_exps=gate_up,
        down_exps=down,
        down_shexp=down_shexp,
        probs_b=get(p + "exp_probs_b.bias", (n_e,)) if moe.expert_bias else None,
        gate_up_exps_b=gate_up_b,
        down_exps_b=down_b,
        **parallel,
    )
