"""Random models built in memory: a ModelConfig and ModelWeights, no file, no converter.

Why: the GPU checks run on a machine that can download nothing and has no llama.cpp, so
they cannot make the tiny fixtures; and the refusal tests need configs with one feature
switched on at a time. Shapes and decorations follow llama (adjacent-pair rope), qwen2
(QKV biases, neox rope) and qwen3 (QK norm, neox rope, head_dim != n_embd / n_head);
a config with layer_norm / plain_ffn gets the LayerNorm families' biases and up matrix.
Correctness against third parties is the tiny fixtures' job; these models are only ever
compared with the host body running the same weights.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from frink_cli.archs.decoder import DecoderConfig
from frink_cli.archs.registry import registered_archs
from frink_cli.model.config import ModelConfig
from frink_cli.model.weights import LayerWeights, Linear, ModelWeights, map_layer
from frink_cli.quant.blocks import QuantMatrix, QuantRows

KINDS = ("llama", "qwen2", "qwen3")

# Real shapes for the pp512 timing (weights random, shared between layers: speed only).
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "kind": "llama",
        "n_layer": 30,
        "n_embd": 576,
        "n_head": 9,
        "n_head_kv": 3,
        "head_dim": 64,
        "n_ff": 1536,
        "n_vocab": 49152,
        "rope_base": 100000.0,
    },
    "llama-3.2-1b": {
        "kind": "llama",
        "n_layer": 16,
        "n_embd": 2048,
        "n_head": 32,
        "n_head_kv": 8,
        "head_dim": 64,
        "n_ff": 8192,
        "n_vocab": 128256,
        "rope_base": 500000.0,
    },
    "llama-3.2-3b": {
        "kind": "llama",
        "n_layer": 28,
        "n_embd": 3072,
        "n_head": 24,
        "n_head_kv": 8,
        "head_dim": 128,
        "n_ff": 8192,
        "n_vocab": 128256,
        "rope_base": 500000.0,
    },
    "qwen3-0.6b": {
        "kind": "qwen3",
        "n_layer": 28,
        "n_embd": 1024,
        "n_head": 16,
        "n_head_kv": 8,
        "head_dim": 128,
        "n_ff": 3072,
        "n_vocab": 151936,
        "rope_base": 1000000.0,
    },
}


def synthetic_config(
    kind: str = "llama",
    n_layer: int = 3,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 16,
    n_ff: int = 96,
    n_vocab: int = 128,
    rope_base: float = 10000.0,
    **overrides: Any,
) -> ModelConfig:
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {KINDS}")
    fields: dict[str, Any] = dict(  # noqa: C408 - keyword form, as ModelConfig(...) reads
        arch=kind,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        n_ff=n_ff,
        n_vocab=n_vocab,
        n_ctx_train=4096,
        norm_eps=1e-6 if kind != "llama" else 1e-5,
        rope_type="norm" if kind == "llama" else "neox",
        rope_dim=head_dim,
        rope_base=rope_base,
        rope_scale=1.0,
        rope_base_swa=rope_base,
        attn_scale=1.0 / math.sqrt(head_dim),
        sliding_window=None,
        swa_layers=(False,) * n_layer,
        ffn_act="silu",
        tied_embeddings=False,
        has_rope_freqs=False,
    )
    core = {f.name for f in dataclasses.fields(ModelConfig)}
    fields.update({k: v for k, v in overrides.items() if k in core})
    ext = {"qk_norm": kind == "qwen3"}
    ext.update({k: v for k, v in overrides.items() if k not in core})
    return ModelConfig(**fields, ext=ext_config(**ext))


def ext_config(**values: Any) -> DecoderConfig:
    """The first architecture config class that has every field named (the decorations a
    synthetic model switches on), with those values."""
    for cls in EXT_CLASSES:
        names = {f.name for f in dataclasses.fields(cls)}
        if values.keys() <= names:
            return cls(**values)
    raise ValueError(f"no architecture config has all of {sorted(values)}")


def _fields(cls: type) -> int:
    return len(dataclasses.fields(cls))


# Where synthetic_config finds a decoration: the shared decoder's, then every registered
# architecture's config, the smallest first (so the most general class that has the fields
# wins). Derived from the registry: adding an architecture adds nothing here.
EXT_CLASSES: tuple[type[DecoderConfig], ...] = (DecoderConfig,) + tuple(
    sorted(
        {a.ext_class for a in registered_archs()} - {DecoderConfig},
        key=lambda c: (_fields(c), c.__name__),
    )
)


def synthetic_weights(
    cfg: ModelConfig, seed: int = 0, qkv_bias: bool | None = None, share_layers: bool = False
) -> ModelWeights:
    """Weights drawn like the tiny fixtures' (std 0.1 matrices, norms around 1) so every
    decoration moves the logits. share_layers: one layer's arrays for every layer (fast to
    make at real sizes; for timing)."""
    rng = np.random.default_rng(seed)
    if qkv_bias is None:
        qkv_bias = cfg.arch == "qwen2"
    d, hk, hv = cfg.n_embd, cfg.head_dim_k, cfg.head_dim_v
    n_qkv = cfg.n_head * hk + cfg.n_head_kv * (hk + hv)

    def mat(rows: int, cols: int) -> np.ndarray:
        # Scaled so activations stay O(1) at any width.
        return (
            rng.standard_normal((rows, cols), dtype=np.float32)
            * np.float32(0.1 * math.sqrt(64 / cols))
        ).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def bias(n: int) -> np.ndarray:
        return (0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    # The LayerNorm families' shape (starcoder2, bloom): LayerNorm biases, biases on every
    # linear, and a plain FFN (up, not gate_up) when the config says so. Drawn only for
    # such configs, so the other kinds' weights stay as they were for a seed.
    ext = cfg.ext
    assert isinstance(ext, DecoderConfig)
    ln = ext.layer_norm

    def layer() -> LayerWeights:
        return LayerWeights(
            attn_norm=norm(d),
            qkv=Linear(
                mat(n_qkv, d),
                (0.1 * rng.standard_normal(n_qkv, dtype=np.float32)) if qkv_bias else None,
            ),
            q_norm=norm(hk) if ext.qk_norm else None,
            k_norm=norm(hk) if ext.qk_norm else None,
            wo=Linear(mat(d, cfg.n_head * hv), bias(d) if ln else None),
            post_attn_norm=norm(d) if ext.post_attn_norm else None,
            ffn_norm=norm(d),
            gate_up=None if ext.plain_ffn else Linear(mat(2 * cfg.n_ff, d), None),
            down=Linear(mat(d, cfg.n_ff), bias(d) if ln else None),
            post_ffn_norm=norm(d) if ext.post_ffn_norm else None,
            attn_norm_b=bias(d) if ln else None,
            ffn_norm_b=bias(d) if ln else None,
            up=Linear(mat(cfg.n_ff, d), bias(cfg.n_ff) if ln else None) if ext.plain_ffn else None,
        )

    if share_layers:
        one = layer()
        layers = [one] * cfg.n_layer
    else:
        layers = [layer() for _ in range(cfg.n_layer)]
    token_embd = rng.standard_normal((cfg.n_vocab, d), dtype=np.float32)
    out = ModelWeights(token_embd, norm(d), Linear(mat(cfg.n_vocab, d), None), None, layers)
    if ln:
        out.output_norm_b = bias(d)
    return out


def quantized_weights(w: ModelWeights, qtype: str) -> ModelWeights:
    """The same model with every matrix (the layers' and the output head; the embedding
    stays f32) in blocks of `qtype`, as a GGUF file of that type loads: gguf-py's quantizer,
    so Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16 or BF16. Shared layers stay shared."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    t = GGMLQuantizationType[qtype]
    done: dict[int, Any] = {}

    def linear(lin: Linear) -> Linear:
        m = np.asarray(lin.w)
        rows, cols = m.shape
        blocks = quantize(m, t).view(np.uint8).reshape(rows, -1)
        return Linear(QuantRows((QuantMatrix(blocks, t, rows, cols),)), lin.b, lin.sources)

    def layer(lw: LayerWeights) -> LayerWeights:
        if id(lw) not in done:
            done[id(lw)] = map_layer(lw, lambda a: a, linear)
        return done[id(lw)]

    return dataclasses.replace(w, output=linear(w.output), layers=[layer(lw) for lw in w.layers])


def shape_config(name: str, **overrides: Any) -> ModelConfig:
    return synthetic_config(**{**SHAPES[name], **overrides})
