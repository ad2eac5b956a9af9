"""Weights dequantized once at load into the layouts the host body multiplies with.

Every matrix stays [out, in] as GGUF stores it (x @ W.T is a plain BLAS call on it), and
the matrices one step reads together are fused at load: Q/K/V into one, gate/up into one,
so a decode token makes one GEMV where it would make three. Each tensor is dequantized,
checked against the shape the config implies, and released before the next, so load never
holds two full copies. No per-token work may come back to this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from .config import ModelConfig

@dataclass
class Linear:
    """A weight matrix [out, in] (the rows of several source tensors when fused) and its
    bias (zero-filled where only some of the fused tensors have one)."""

    w: np.ndarray
    b: np.ndarray | None


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [n_embd]
    qkv: Linear  # [n_head*hd_k + n_head_kv*(hd_k + hd_v), n_embd]
    q_norm: np.ndarray | None  # [hd_k]
    k_norm: np.ndarray | None  # [hd_k]
    wo: Linear  # [n_embd, n_head*hd_v]
    post_attn_norm: np.ndarray | None  # [n_embd]
    ffn_norm: np.ndarray  # [n_embd]
    gate_up: Linear  # [2*n_ff, n_embd]: gate rows, then up rows
    down: Linear  # [n_embd, n_ff]
    post_ffn_norm: np.ndarray | None  # [n_embd]


@dataclass
class ModelWeights:
    token_embd: np.ndarray  # [n_vocab, n_embd]
    output_norm: np.ndarray  # [n_embd]
    output: Linear  # [n_vocab, n_embd]; shares token_embd's array when tied
    rope_freqs: np.ndarray | None  # [rope_dim / 2] frequency divisors, or None
    layers: list[LayerWeights]


def load_weights(
    ckpt: Checkpoint, cfg: ModelConfig, progress: Callable[[int, int], None] | None = None
) -> ModelWeights:
    names = set(ckpt.tensors.names())

    def get(name: str, shape: tuple[int, ...], required: bool = True) -> np.ndarray | None:
        if name not in names:
            if required:
                raise FrinkError(f"{ckpt.path}: missing tensor {name}")
            return None
        info = ckpt.tensors.info(name)
        if tuple(info.shape) != shape:
            raise FrinkError(
                f"{ckpt.path}: tensor {name} has shape {list(info.shape)}, expected {list(shape)}"
            )
        return ckpt.tensors.load(name)

    def fused(parts: list[tuple[str, int]], in_dim: int, bias: bool = True) -> Linear:
        """Rows of several tensors stacked into one matrix; biases zero-filled if partial."""
        ws, bs = [], []
        for name, rows in parts:
            ws.append(get(name + ".weight", (rows, in_dim)))
            bs.append(get(name + ".bias", (rows,), required=False) if bias else None)
        w = ws[0] if len(ws) == 1 else np.concatenate(ws)
        b = None
        if any(x is not None for x in bs):
            b = np.concatenate([x if x is not None else np.zeros(n, np.float32) for x, (_, n) in zip(bs, parts)])
        return Linear(w, b)

    d, hk, hv = cfg.n_embd, cfg.head_dim_k, cfg.head_dim_v
    nq, nk, nv = cfg.n_head * hk, cfg.n_head_kv * hk, cfg.n_head_kv * hv
    total = cfg.n_layer + 2

    token_embd = get("token_embd.weight", (cfg.n_vocab, d))
    if cfg.tied_embeddings:
        output = Linear(token_embd, None)
    else:
        output = fused([("output", cfg.n_vocab)], d, bias=False)
    rope_freqs = get("rope_freqs.weight", (cfg.rope_dim // 2,), required=False)
    if progress:
        progress(1, total)

    layers = []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in names:
            qkv = fused([(p + "attn_qkv", nq + nk + nv)], d)
        else:
            qkv = fused([(p + "attn_q", nq), (p + "attn_k", nk), (p + "attn_v", nv)], d)
        layers.append(
            LayerWeights(
                attn_norm=get(p + "attn_norm.weight", (d,)),
                qkv=qkv,
                q_norm=get(p + "attn_q_norm.weight", (hk,), required=cfg.qk_norm),
                k_norm=get(p + "attn_k_norm.weight", (hk,), required=cfg.qk_norm),
                wo=fused([(p + "attn_output", d)], cfg.n_head * hv),
                post_attn_norm=get(p + "post_attention_norm.weight", (d,), required=cfg.post_attn_norm),
                ffn_norm=get(p + "ffn_norm.weight", (d,)),
                gate_up=fused([(p + "ffn_gate", cfg.n_ff), (p + "ffn_up", cfg.n_ff)], d, bias=False),
                down=fused([(p + "ffn_down", d)], cfg.n_ff, bias=False),
                post_ffn_norm=get(p + "post_ffw_norm.weight", (d,), required=cfg.post_ffn_norm),
            )
        )
        if progress:
            progress(i + 2, total)
    output_norm = get("output_norm.weight", (d,))
    if progress:
        progress(total, total)
    return ModelWeights(token_embd, output_norm, output, rope_freqs, layers)
