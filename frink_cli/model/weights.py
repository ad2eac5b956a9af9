"""The weights of a model as the host holds them: loaded, checked and fused once at load.

Each tensor is read through a TensorReader (model/reader.py): checked against the shape
the config implies, kept in the file's own blocks where the host has kernels for its type
(else dequantized to f32), and released before the next, so load never holds two full
copies. The matrices one step reads together are fused: Q/K/V into one, gate/up into one.
Which of a layer's tensors exist is the architecture's to say (ArchConfig.layer_plan, in
block terms) and its own extra tensors its to read (ArchConfig.read_layer); the head's
likewise (head_plan, read_head). No per-token work may come back to this module.

The layers sit in a LayerStore, loaded from the checkpoint on first access. With an
accelerated backend the host need not hold a layer the device holds whole: the backend
borrows each layer it uploads (loaded, used, freed: one host layer at a time), the decoder
then releases what the backend reports resident and loads the rest at once, so every layer
the host body runs is still dequantized at load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np

from ..formats import Checkpoint
from ..quant.blocks import QuantRows
from .block_weights import (
    GdnWeights,
    Mamba2Weights,
    MambaWeights,
    MoeWeights,
    ShortConvWeights,
    read_gdn,
    read_mamba,
    read_mamba2,
    read_moe,
    read_shortconv,
)
from .config import LayerPlan, LayerShape, ModelConfig
from .expert_cache import ExpertCache
from .linear import Linear, dequantized, embedding_rows
from .lora import LoraAdapter, attach
from .reader import TensorReader

__all__ = [
    "GdnWeights",
    "LayerStore",
    "LayerWeights",
    "Linear",
    "Mamba2Weights",
    "MambaWeights",
    "ModelWeights",
    "MoeWeights",
    "ShortConvWeights",
    "TensorReader",
    "borrow_layer",
    "dequantized",
    "embedding_rows",
    "load_weights",
    "map_layer",
    "unread_tensors",
]


@dataclass
class LayerWeights:
    """One layer's weights, for the blocks its architecture composes. An architecture with
    tensors of its own subclasses this in its module (ArchConfig.read_layer)."""

    attn_norm: np.ndarray | None  # [n_embd]; None without pre-norms
    # [n_head*hd_k (x2 with an output gate) + n_head_kv*(hd_k + hd_v), n_embd]
    qkv: Linear | None
    # [hd_k]; [n_head*hd_k] over the full width; [n_head, hd_k] one per head (k_norm alike)
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None  # [hd_k]; [n_head_kv*hd_k] over the full width
    wo: Linear | None  # [n_embd, n_head*hd_v]
    post_attn_norm: np.ndarray | None  # [n_embd]
    ffn_norm: np.ndarray | None  # [n_embd]; None without pre-norms
    gate_up: Linear | None  # [2*n_ff, n_embd]: gate rows, then up rows
    down: Linear | None  # [n_embd, n_ff]
    post_ffn_norm: np.ndarray | None  # [n_embd]
    gdn: GdnWeights | None = None
    moe: MoeWeights | None = None
    mamba: MambaWeights | None = None
    shortconv: ShortConvWeights | None = None
    mamba2: Mamba2Weights | None = None
    # LayerNorm biases, where the file has them.
    attn_norm_b: np.ndarray | None = None  # [n_embd]
    ffn_norm_b: np.ndarray | None = None  # [n_embd]
    # The full-width QK LayerNorms' biases.
    q_norm_b: np.ndarray | None = None  # [n_head*hd_k]
    k_norm_b: np.ndarray | None = None  # [n_head_kv*hd_k]
    up: Linear | None = None  # [n_ff, n_embd]: the plain (non-gated) FFN's up projection
    attn_sub_norm: np.ndarray | None = None  # [n_head*hd_v] on the rows o_proj reads
    ffn_sub_norm: np.ndarray | None = None  # [n_ff] on the rows ffn_down reads
    q_gain: np.ndarray | None = None  # [n_head, 1] a per-head Q gain
    wo_scale: np.ndarray | None = None  # [1] attn_output.scale
    down_scale: np.ndarray | None = None  # [1] ffn_down.scale
    attn_sinks: np.ndarray | None = None  # [n_head] the sink logits


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
    # [n_embd] a norm on the looked-up embeddings (a LayerNorm's weight, or ones).
    token_embd_norm: np.ndarray | None = None
    token_embd_norm_b: np.ndarray | None = None  # [n_embd]
    # LongRoPE's per-pair divisors ("rope_factors_long/short.weight"), or None.
    rope_factors_long: np.ndarray | None = None
    rope_factors_short: np.ndarray | None = None
    # The architecture's own head tensors (ArchConfig.read_head), or None.
    arch: Any = None
    # Every tensor name the loader has read (checked and loaded) so far: unread_tensors().
    tensors_read: set[str] = field(default_factory=set)


def load_weights(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    progress: Callable[[int, int], None] | None = None,
    lazy: bool = False,
    lora: Sequence[LoraAdapter] = (),
    ends: tuple[bool, bool] = (True, True),
    expert_cache: ExpertCache | None = None,
    lora_merge: bool = False,
) -> ModelWeights:
    """Load and fuse the weights. lazy=False loads every layer now (progress: after the
    embeddings, each layer, and the end); lazy=True loads only the embeddings, head and
    norms, leaving each layer to its first access (progress is then reported per layer
    as they load, until the caller clears `layers.on_load`). `lora`: adapters whose pairs
    the matrices they target carry (model/lora.py), checked against the file already;
    lora_merge: added into those matrices instead, at their scales now (f32 rows).
    `ends`: whether the token embedding and the output matrix are read (a pipeline stage
    reads the first only where it embeds, the second only where it runs the head; an unread
    one is an empty array). `expert_cache`: expert stacks stay in the file, read through it
    (model/expert_cache.py)."""
    r = TensorReader(ckpt, expert_cache=expert_cache)
    total = cfg.n_layer + 2
    d = cfg.n_embd
    token_embd: np.ndarray | QuantRows
    embeds, heads = ends
    if not (embeds or heads) or (not cfg.tied_embeddings and not all(ends)):
        token_embd, output = _stage_ends(r, cfg, embeds, heads)
    elif cfg.tied_embeddings:
        # One matrix serves both: the lookup gathers its rows, the head multiplies them.
        output = r.linear([("token_embd", cfg.n_vocab)], d, bias=False)
        token_embd = output.w
    else:
        token_embd = r.table("token_embd", cfg.n_vocab, d)
        output = r.linear([("output", cfg.n_vocab)], d, bias=False)
    rope_freqs = r.optional("rope_freqs.weight", (cfg.rope_dim // 2,))
    longrope = cfg.rope_scaling is not None and cfg.rope_scaling.kind == "longrope"
    factors = [
        r.optional(f"rope_factors_{which}.weight", (cfg.rope_dim // 2,), required=longrope)
        for which in ("long", "short")
    ]
    if progress:
        progress(1, total)
    output = attach(output, lora, lora_merge)
    layers = LayerStore(cfg.n_layer, lambda i: attach(load_layer(r, cfg, i), lora, lora_merge))
    if progress:
        seen: set[int] = set()

        def report(i: int) -> None:
            seen.add(i)
            progress(len(seen) + 1, total)

        layers.on_load = report
    if not lazy:
        for i in range(cfg.n_layer):
            layers[i]
        layers.on_load = None
    head = _read_head(r, cfg)
    if progress and not lazy:
        progress(total, total)
    return ModelWeights(
        token_embd,
        head.pop("output_norm"),
        output,
        rope_freqs,
        layers,
        **head,
        rope_factors_long=factors[0],
        rope_factors_short=factors[1],
        arch=cfg.ext.read_head(r, cfg),
        tensors_read=r.read,
    )


def _stage_ends(
    r: TensorReader, cfg: ModelConfig, embeds: bool, heads: bool
) -> tuple[np.ndarray | QuantRows, Linear]:
    """A pipeline stage's token embedding and output matrix, each read where the stage uses
    it, else an empty [0, n_embd] array (only where the two are separate tensors or the
    stage uses neither)."""
    d, empty = cfg.n_embd, np.zeros((0, cfg.n_embd), np.float32)
    token_embd = r.table("token_embd", cfg.n_vocab, d) if embeds else empty
    output = r.linear([("output", cfg.n_vocab)], d, bias=False) if heads else Linear(empty, None)
    return token_embd, output


def _read_head(r: TensorReader, cfg: ModelConfig) -> dict[str, Any]:
    """The final norm (and its bias) and the embedding norm, as the head plan says."""
    plan, d = cfg.ext.head_plan(cfg), cfg.n_embd
    embd_norm = embd_norm_b = None
    if plan.embd_norm == "ones":
        embd_norm = np.ones(d, np.float32)
    elif plan.embd_norm:
        embd_norm = r.get("token_embd_norm.weight", (d,))
        embd_norm_b = r.optional("token_embd_norm.bias", (d,))
    return dict(
        output_norm=r.ones_or(f"{plan.output_norm}.weight", d, plan.weightless),
        output_norm_b=r.optional("output_norm.bias", (d,)) if plan.norm_biases else None,
        token_embd_norm=embd_norm,
        token_embd_norm_b=embd_norm_b,
    )


def load_layer(r: TensorReader, cfg: ModelConfig, i: int, like: int | None = None) -> Any:
    """Block i's weights: its blocks' tensors as its architecture's plan says, then the
    architecture's own (ArchConfig.read_layer). like: the trunk layer whose shape block i
    has, where i is not one of cfg's layers (a NextN block after the trunk)."""
    p, shape = f"blk.{i}.", cfg.layer_shape(i if like is None else like)
    plan = cfg.ext.layer_plan(cfg, shape)
    d = cfg.n_embd
    mixers = _read_mixer(r, cfg, shape, plan, p)
    ffn = _read_ffn(r, cfg, shape, plan, p)
    # Norms only where their branch is: a layer without a mixer has no attn_norm and one
    # without an FFN no ffn_norm.
    attn_norm = plan.pre_norms and shape.mixer != "none"
    ffn_norm = plan.pre_norms and shape.ffn != "none"
    ffn_norm_name = p + f"{plan.ffn_norm}.weight"
    if ffn_norm and not r.has(ffn_norm_name) and r.has(p + plan.ffn_norm):
        ffn_norm_name = p + plan.ffn_norm  # a converter that writes it without a suffix
    # Where the pre-FFN norm is stored as post_attention_norm, there is no post norm.
    post_attn = "post_attention_norm" if plan.ffn_norm != "post_attention_norm" else None
    base = LayerWeights(
        attn_norm=r.ones_or(p + "attn_norm.weight", d, plan.weightless) if attn_norm else None,
        post_attn_norm=r.optional(p + f"{post_attn}.weight", (d,), required=plan.post_attn_norm)
        if post_attn
        else None,
        ffn_norm=r.ones_or(ffn_norm_name, d, plan.weightless) if ffn_norm else None,
        post_ffn_norm=r.optional(p + "post_ffw_norm.weight", (d,), required=plan.post_ffn_norm),
        attn_norm_b=r.optional(p + "attn_norm.bias", (d,))
        if plan.norm_biases and attn_norm
        else None,
        ffn_norm_b=r.optional(p + f"{plan.ffn_norm}.bias", (d,))
        if plan.norm_biases and ffn_norm
        else None,
        **mixers,
        **ffn,
    )
    return cfg.ext.read_layer(r, cfg, i, base)


def _read_mixer(
    r: TensorReader, cfg: ModelConfig, shape: LayerShape, plan: LayerPlan, p: str
) -> dict[str, Any]:
    """The mixer block's weights, by the layer's mixer."""
    d, ext = cfg.n_embd, cfg.ext
    out: dict[str, Any] = dict(qkv=None, wo=None, q_norm=None, k_norm=None)
    if shape.mixer == "shortconv":
        out["shortconv"] = read_shortconv(r, p, d, ext.block("shortconv"))
    elif shape.mixer == "gdn":
        out["gdn"] = read_gdn(r, p, d, ext.block("gdn"))
    elif shape.mixer == "mamba":
        own = ext.read_mixer(r, cfg, shape, p)
        out["mamba"] = own if own is not None else read_mamba(r, p, d, ext.block("mamba"))
    elif shape.mixer in ("mamba2", "attention+mamba2"):
        out["mamba2"] = read_mamba2(r, p, d, ext.block("mamba"))
    elif shape.mixer == "linear":
        # wo alone, [n_embd, n_embd], on the normed input.
        out["wo"] = r.linear([(p + "attn_output", d)], d, bias=False)
    if shape.mixer in ("attention", "attention+mamba2"):
        out.update(_read_attention(r, cfg, shape, plan, p))
    return out


def _read_attention(
    r: TensorReader, cfg: ModelConfig, shape: LayerShape, plan: LayerPlan, p: str
) -> dict[str, Any]:
    """QKV (fused or separate; queries only for a KV-sharing layer; no V where V = K), the
    QK norms (per head, over the full width with their biases, or weightless), o_proj,
    and the attention block's optional tensors the plan names."""
    d, n_head, hk, hv = cfg.n_embd, shape.n_head, shape.head_dim_k, shape.head_dim_v
    nq = n_head * hk * (2 if plan.q_gate else 1)  # with a gate: its rows too
    nk, nv = shape.n_head_kv * hk, shape.n_head_kv * hv
    shares_kv = shape.kv_source is not None
    if r.has(p + "attn_qkv.weight"):
        qkv = r.linear([(p + "attn_qkv", nq + nk + nv)], d)
    elif shares_kv:
        qkv = r.linear([(p + "attn_q", nq)], d)
    elif plan.v_from_k:
        qkv = r.linear([(p + "attn_q", nq), (p + "attn_k", nk)], d)
    else:
        qkv = r.linear([(p + "attn_q", nq), (p + "attn_k", nk), (p + "attn_v", nv)], d)
    out: dict[str, Any] = dict(qkv=qkv, wo=r.linear([(p + "attn_output", d)], n_head * hv))
    full = plan.qk_norm == "full"
    if plan.qk_norm == "weightless":
        out["q_norm"] = out["k_norm"] = np.ones(hk, np.float32)
    elif plan.qk_norm == "heads":
        out["q_norm"] = r.get(p + "attn_q_norm.weight", (n_head, hk))
        out["k_norm"] = r.get(p + "attn_k_norm.weight", (shape.n_head_kv, hk))
    else:
        required = plan.qk_norm in ("head", "full")
        out["q_norm"] = r.optional(
            p + "attn_q_norm.weight", (n_head * hk if full else hk,), required=required
        )
        out["k_norm"] = r.optional(
            p + "attn_k_norm.weight", (nk if full else hk,), required=required and not shares_kv
        )
        if full and plan.norm_biases:
            out["q_norm_b"] = r.optional(p + "attn_q_norm.bias", (n_head * hk,))
            out["k_norm_b"] = r.optional(p + "attn_k_norm.bias", (nk,))
    if plan.sub_norms:
        out["attn_sub_norm"] = r.get(p + "attn_sub_norm.weight", (n_head * hv,))
    if plan.sinks:
        out["attn_sinks"] = r.get(p + "attn_sinks.weight", (n_head,))
    if plan.q_gain:
        out["q_gain"] = r.get(p + "attn_q_norm.weight", (n_head, 1))
    if plan.proj_scales:
        out["wo_scale"] = r.get(p + "attn_output.scale", (1,))
    return out


def _read_ffn(
    r: TensorReader, cfg: ModelConfig, shape: LayerShape, plan: LayerPlan, p: str
) -> dict[str, Any]:
    """The FFN block's weights: routed experts, a plain or a gated dense FFN, or none."""
    d, n_ff = cfg.n_embd, shape.n_ff
    out: dict[str, Any] = dict(gate_up=None, down=None)
    if shape.ffn in ("moe", "dense+moe"):
        out["moe"] = read_moe(r, p, d, cfg.ext.block("moe"))
    if shape.ffn in ("moe", "none"):
        return out  # no dense FFN
    if plan.plain_ffn:
        out["up"] = r.linear([(p + "ffn_up", n_ff)], d)
        out["down"] = r.linear([(p + "ffn_down", d)], n_ff)
        return out
    if r.has(p + "ffn_gate.weight"):
        parts = [(p + "ffn_gate", n_ff), (p + "ffn_up", n_ff)]
    else:  # ffn_up holding the gate rows then the up rows
        parts = [(p + "ffn_up", 2 * n_ff)]
    out["gate_up"] = r.linear(parts, d, bias=False)
    out["down"] = r.linear([(p + "ffn_down", d)], n_ff, bias=False)
    if plan.sub_norms:
        out["ffn_sub_norm"] = r.get(p + "ffn_sub_norm.weight", (n_ff,))
    if plan.proj_scales:
        out["down_scale"] = r.get(p + "ffn_down.scale", (1,))
    return out


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
