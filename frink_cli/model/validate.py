"""Numbers a model file states, checked before anything is built from them.

The readers check that a file is well formed and that each value has its key's type; this
module checks that the values make a model. A zero head count divides by zero, an odd
rope dimension pairs a dimension with nothing, a NaN rope base or epsilon turns every
logit into NaN (a greedy run then prints nothing and exits 0), and a vocabulary longer
than the embedding indexes past it. Each is refused here, by name, with what was expected.
`check_tensors` is the optional full scan of the weights (llama.cpp's --check-tensors).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FrinkError

if TYPE_CHECKING:
    from ..formats import Checkpoint
    from .config import ModelConfig

# Positions beyond this are no context any machine holds (2**24 tokens of KV cache for
# one layer of a tiny model is already gigabytes); larger values are corrupt.
_MAX_CTX = 1 << 26


def validate_config(cfg: ModelConfig, where: str, ckpt: Checkpoint | None = None) -> None:
    """Refuse a config whose numbers cannot describe a working model (with the checkpoint:
    nor the file's own tensors and vocabulary)."""

    def bad(what: str, value: Any, expected: str) -> FrinkError:
        return FrinkError(f"{where}: bad model metadata ({what} = {value!r}; expected {expected})")

    # A model without attention anywhere has no heads to count (all zero).
    attends = cfg.ext.attends(cfg)
    heads = (
        (
            ("head count", cfg.n_head),
            ("KV head count", cfg.n_head_kv),
            ("key length", cfg.head_dim_k),
            ("value length", cfg.head_dim_v),
        )
        if attends
        else ()
    )
    for what, value in (
        *heads,
        ("embedding length", cfg.n_embd),
        ("vocabulary rows", cfg.n_vocab),
        ("layer count", cfg.n_layer),
    ):
        if value <= 0:
            raise bad(what, value, "> 0")
    # With per-layer sizes these are the largest of each, checked layer by layer instead.
    if attends and cfg.layer_sizes is None and cfg.n_head % cfg.n_head_kv:
        raise bad("head count", cfg.n_head, f"a multiple of the {cfg.n_head_kv} KV heads")
    if cfg.layer_sizes is not None:
        for layer in range(cfg.n_layer):
            s = cfg.layer_shape(layer)
            if s.n_head_kv and s.n_head % s.n_head_kv:
                raise bad(
                    f"layer {layer} head count",
                    s.n_head,
                    f"a multiple of its {s.n_head_kv} KV heads",
                )
    if not 0 < cfg.n_ctx_train <= _MAX_CTX:
        raise bad("context length", cfg.n_ctx_train, f"between 1 and {_MAX_CTX}")
    if cfg.rope_dim % 2 or not 0 <= cfg.rope_dim <= cfg.head_dim_k:
        raise bad(
            "rope dimension count",
            cfg.rope_dim,
            f"an even number no larger than the head dim {cfg.head_dim_k}",
        )
    for what, real in (
        ("rope base", cfg.rope_base),
        ("sliding-window rope base", cfg.rope_base_swa),
        ("norm epsilon", cfg.norm_eps),
        ("rope scale", cfg.rope_scale),
    ):
        if not (math.isfinite(real) and real > 0):
            raise bad(what, real, "a finite number > 0")
    for what, optional in (("attention scale", cfg.attn_scale), *cfg.ext.positive_values()):
        if optional is not None and not (math.isfinite(optional) and optional > 0):
            raise bad(what, optional, "a finite number > 0")
    if cfg.sliding_window is not None and not 0 < cfg.sliding_window <= _MAX_CTX:
        raise bad("sliding window", cfg.sliding_window, f"between 1 and {_MAX_CTX}")
    if ckpt is not None:
        _check_sizes(cfg, ckpt, where)
        _check_vocabulary(cfg, ckpt.metadata, where)


def _check_sizes(cfg: ModelConfig, ckpt: Checkpoint, where: str) -> None:
    """Every weight matrix the config implies is at least one tensor of the file, so none
    can hold more elements than the file's largest tensor. Checked before the weights are
    loaded, which allocate (fused) buffers from these sizes before they see a tensor."""
    names = ckpt.tensors.names()
    largest = max((math.prod(ckpt.tensors.info(n).shape) for n in names), default=0)
    for what, rows in cfg.ext.matrix_rows(cfg):
        if rows * cfg.n_embd > largest:
            raise FrinkError(
                f"{where}: bad model metadata ({what} {rows} x embedding {cfg.n_embd} is larger "
                f"than any tensor in the file)"
            )


def _check_vocabulary(cfg: ModelConfig, md: dict[str, Any], where: str) -> None:
    """A GGUF vocabulary has one entry per embedding row (llama.cpp sizes token_embd from
    it); its per-token arrays one entry per token."""
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None or md.get("tokenizer.ggml.model") in (None, "none", "no_vocab"):
        return
    n = len(tokens)
    if n != cfg.n_vocab:
        raise FrinkError(
            f"{where}: the tokenizer has {n} tokens but token_embd.weight has {cfg.n_vocab} rows"
        )
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in md and len(md[key]) != n:
            raise FrinkError(f"{where}: {key} has {len(md[key])} entries for {n} tokens")


def check_tensors(ckpt: Checkpoint, progress: Callable[[int, int], None] | None = None) -> None:
    """Every weight scanned for NaN and Inf, one tensor at a time (llama.cpp's
    --check-tensors): a file damaged in its data, not its header, is refused by name."""
    names = ckpt.tensors.names()
    for i, name in enumerate(names):
        w = ckpt.tensors.load(name)
        if not np.isfinite(w).all():
            bad = int(np.size(w) - np.count_nonzero(np.isfinite(w)))
            raise FrinkError(
                f"{ckpt.path}: tensor {name} holds {bad} non-finite values (NaN or Inf)"
            )
        if progress:
            progress(i + 1, len(names))
