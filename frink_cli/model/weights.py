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
class LayerWeights:
    attn_norm: np.ndarray  # [n_embd]
    wqkv: np.ndarray  # [n_head*hd_k + 2*n_head_kv*hd_k(v), n_embd]
    bqkv: np.ndarray | None  # [same rows] or None
    q_norm: np.ndarray | None  # [hd_k]
    k_norm: np.ndarray | None  # [hd_k]
    wo: np.ndarray  # [n_embd, n_head*hd_v]
    bo: np.ndarray | None
    post_attn_norm: np.ndarray | None  # [n_embd]
    ffn_norm: np.ndarray  # [n_embd]
    w_gate_up: np.ndarray  # [2*n_ff, n_embd]: gate rows, then up rows
    w_down: np.ndarray  # [n_embd, n_ff]
    post_ffn_norm: np.ndarray | None  # [n_embd]


@dataclass
class ModelWeights:
    token_embd: np.ndarray  # [n_vocab, n_embd]
    output_norm: np.ndarray  # [n_embd]
    output: np.ndarray  # [n_vocab, n_embd]; the same array as token_embd when tied
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

    d, hk, hv = cfg.n_embd, cfg.head_dim_k, cfg.head_dim_v
    nq, nk, nv = cfg.n_head * hk, cfg.n_head_kv * hk, cfg.n_head_kv * hv
    total = cfg.n_layer + 2

    token_embd = get("token_embd.weight", (cfg.n_vocab, d))
    output = token_embd if cfg.tied_embeddings else get("output.weight", (cfg.n_vocab, d))
    rope_freqs = get("rope_freqs.weight", (cfg.rope_dim // 2,), required=False)
    if progress:
        progress(1, total)

    layers = []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in names:
            wqkv = get(p + "attn_qkv.weight", (nq + nk + nv, d))
            bqkv = get(p + "attn_qkv.bias", (nq + nk + nv,), required=False)
        else:
            wqkv = np.concatenate(
                [get(p + "attn_q.weight", (nq, d)), get(p + "attn_k.weight", (nk, d)), get(p + "attn_v.weight", (nv, d))]
            )
            biases = [get(p + f"attn_{x}.bias", (n,), required=False) for x, n in (("q", nq), ("k", nk), ("v", nv))]
            if all(b is None for b in biases):
                bqkv = None
            else:
                bqkv = np.concatenate(
                    [b if b is not None else np.zeros(n, np.float32) for b, n in zip(biases, (nq, nk, nv))]
                )
        layers.append(
            LayerWeights(
                attn_norm=get(p + "attn_norm.weight", (d,)),
                wqkv=wqkv,
                bqkv=bqkv,
                q_norm=get(p + "attn_q_norm.weight", (hk,), required=cfg.qk_norm),
                k_norm=get(p + "attn_k_norm.weight", (hk,), required=cfg.qk_norm),
                wo=get(p + "attn_output.weight", (d, cfg.n_head * hv)),
                bo=get(p + "attn_output.bias", (d,), required=False),
                post_attn_norm=get(p + "post_attention_norm.weight", (d,), required=cfg.post_attn_norm),
                ffn_norm=get(p + "ffn_norm.weight", (d,)),
                w_gate_up=np.concatenate(
                    [get(p + "ffn_gate.weight", (cfg.n_ff, d)), get(p + "ffn_up.weight", (cfg.n_ff, d))]
                ),
                w_down=get(p + "ffn_down.weight", (d, cfg.n_ff)),
                post_ffn_norm=get(p + "post_ffw_norm.weight", (d,), required=cfg.post_ffn_norm),
            )
        )
        if progress:
            progress(i + 2, total)
    output_norm = get("output_norm.weight", (d,))
    if progress:
        progress(total, total)
    return ModelWeights(token_embd, output_norm, output, rope_freqs, layers)
