"""YaRN (llama, qwen3) and LongRoPE (phi3), and the phi3 architecture, against transformers
and llama.cpp on every backend.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: most long-context checkpoints scale their rope, and a scaling that is read but not
applied only shows past the original context. The fixtures (scripts/make_tiny_models.py)
set original_max_position_embeddings = 32 and run 72 tokens: YaRN x8 (llama) and x4
(qwen3) with their cos/sin multiplier 1 + 0.1 ln(factor); phi3_longrope with long factors
(chosen because the context exceeds 32, in llama.cpp and transformers alike), its attention
factor, and half of each head rotating; phi3 plain (fused qkv and gate_up). The tests below
also prove each piece matters: without the YaRN blend, the cos/sin multiplier or the long
factors, the logits land far from both references.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from model_checks import (
    FAR,
    REFERENCES,
    _max_diff,
    _path,
    _tokens,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.decoder import Decoder
from frink_cli.graph.rope import rope_frequencies
from frink_cli.model.config import RopeScaling

NAMES = ("llama_yarn", "qwen3_yarn", "phi3", "phi3_longrope")
SCALED = ("llama_yarn", "qwen3_yarn", "phi3_longrope")


@pytest.mark.parametrize("name", NAMES)
def test_references_agree_past_the_original_context(name: str, tiny_model: Callable) -> None:
    ref = tiny_model(name).ref
    assert "logits_llamacpp" in ref, f"{name}: llama.cpp's converter made no GGUF"
    assert _max_diff(ref["logits_llamacpp"], ref["logits_hf"]) <= 2e-3
    if name in SCALED:
        assert len(ref["tokens"]) > 2 * 32


@pytest.mark.parametrize("name", NAMES)
def test_both_sources_read_the_same_scaling(name: str, tiny_model: Callable) -> None:
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "hf")))
    assert hf == gg
    sc = gg.rope_scaling
    if name == "phi3":
        assert sc is None and gg.rope_type == "neox" and gg.sliding_window is None
    elif name == "phi3_longrope":
        assert sc is not None and (sc.kind, sc.orig_ctx) == ("longrope", 32)
        assert sc.attn_factor == pytest.approx(np.sqrt(1 + np.log(256 / 32) / np.log(32)))
        assert gg.rope_dim == 8 and gg.head_dim_k == 16
    else:
        factor = 8.0 if name == "llama_yarn" else 4.0
        assert sc is not None and (sc.kind, sc.factor, sc.orig_ctx) == ("yarn", factor, 32)
        assert gg.rope_scale == pytest.approx(1 / factor)
    assert "rope_scaling" in gg.features() or sc is None


def test_hf_dir_matches_the_converter(tiny_model: Callable) -> None:
    """phi3's HF map gives the converter's tensors (fused qkv and gate_up as they are, the
    generated LongRoPE factors) and its metadata."""
    for name in ("phi3", "phi3_longrope"):
        hf = open_checkpoint(_path(tiny_model, name, "hf"))
        gg = open_checkpoint(_path(tiny_model, name, "gguf"))
        assert sorted(hf.tensors.names()) == sorted(gg.tensors.names())
        for n in gg.tensors.names():
            assert np.array_equal(hf.tensors.load(n), gg.tensors.load(n)), n
        for key, value in gg.metadata.items():
            if key.startswith("phi3."):
                have = hf.metadata.get(key)
                assert have is not None, key
                assert np.allclose(np.atleast_1d(have), np.atleast_1d(value)), key


def _off(tiny_model: Callable, name: str, **changes: object) -> np.ndarray:
    """The host body's logits with the model's RopeScaling fields changed."""
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    sc = m.config.rope_scaling
    assert sc is not None
    cfg = dataclasses.replace(m.config, rope_scaling=dataclasses.replace(sc, **changes))
    off = Decoder(cfg, m.decoder.host.w)
    tokens = np.asarray(_tokens(tiny_model, name))
    return off.step(tokens, off.new_cache(len(tokens)), all_logits=True)


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("llama_yarn", {"ext_factor": 0.0}),  # plain linear interpolation, no multiplier
        # The blend without its cos/sin multiplier (attn_factor cancels 1 + 0.1 ln 8).
        ("llama_yarn", {"attn_factor": 1 / (1 + 0.1 * np.log(8.0))}),
        ("qwen3_yarn", {"ext_factor": 0.0}),
        ("phi3_longrope", {"attn_factor": 1.0}),
        ("phi3_longrope", {"orig_ctx": 4096}),  # the short factors
    ],
)
def test_each_piece_of_the_scaling_matters(
    name: str, changes: dict[str, object], tiny_model: Callable
) -> None:
    got = _off(tiny_model, name, **changes)
    for key in REFERENCES:
        assert _max_diff(got, tiny_model(name).ref[key]) > FAR, (changes, key)


def test_yarn_frequencies_follow_ggml() -> None:
    """rope_frequencies against ggml's rope_yarn written out for one pair per regime:
    extrapolated (fast pairs), interpolated (slow pairs), and the multiplier."""
    sc = RopeScaling(kind="yarn", factor=8.0, orig_ctx=32, ext_factor=1.0)
    inv, mscale = rope_frequencies(64, 10000.0, 1 / 8, None, sc)
    plain = 10000.0 ** (-np.arange(0, 64, 2) / 64)
    assert inv[0] == pytest.approx(plain[0])  # beta_fast: pair 0 rotates as trained
    assert inv[-1] == pytest.approx(plain[-1] / 8)  # beta_slow: the last pair interpolated
    assert mscale == pytest.approx(1 + 0.1 * np.log(8))
