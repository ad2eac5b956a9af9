"""The LayerNorm dense families: StarCoder2 (`starcoder2`), BLOOM (`bloom`) and MPT (`mpt`)
against transformers and llama.cpp, on numpy, metal and cuda (NumPy standing in for CuPy,
and the kernels of kernels/*.cu on the CPU emulator).

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: they bring four new pieces to the one layer graph -- LayerNorm with bias
(ModelConfig.layer_norm), the plain GELU MLP (plain_ffn), ALiBi instead of rope
(alibi_bias; bloom also normalizes its embeddings, embd_norm) and mpt's clamp_kqv -- each
composed once (archs/decoder.py over graph/blocks) over HostOps, MlxOps and CudaOps. The fixtures
(scripts/make_tiny_models.py) draw every bias and norm weight at random, so a dropped bias
or a missing norm moves the logits far; the decoration tests below check that each new
field matters by far more than the parity bar.

Tolerance: 2e-3 against both references. llama.cpp's CPU GELU reads an f16 table (see
DESIGN.md), ~1e-3 off transformers on these models; mpt's transformers MLP uses the exact
erf GELU where llama.cpp (and frink, following it) use the tanh form: both within 2e-3.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from model_checks import configured

import frink_cli
from frink_cli.decoder import Decoder

FAMILIES = ("starcoder2", "bloom", "mpt")
REFERENCES = ("logits_hf", "logits_llamacpp")
REF_TOL = 2e-3
FAR = 0.1


def _path(tiny_model: Callable, name: str, source: str):
    tm = tiny_model(name)
    return tm.gguf if source == "gguf" else tm.hf_dir


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def _against_references(got: np.ndarray, ref: dict, what: str) -> None:
    for key in REFERENCES:
        diff = _max_diff(got, ref[key])
        assert diff <= REF_TOL, f"{what} vs {key}: max |diff| {diff:.3g}"
        assert np.array_equal(got.argmax(-1), ref[key].argmax(-1)), f"{what} vs {key}: argmax"


@pytest.mark.parametrize("name", FAMILIES)
def test_config_reads_the_family(name: str, tiny_model: Callable) -> None:
    cfg = frink_cli.load(_path(tiny_model, name, "gguf")).config
    ext = cfg.ext
    assert ext.layer_norm and ext.plain_ffn and cfg.ffn_act == "gelu_tanh"
    assert getattr(ext, "embd_norm", False) == (name == "bloom")
    assert getattr(ext, "alibi_bias", None) == (None if name == "starcoder2" else 8.0)
    assert getattr(ext, "clamp_kqv", None) == (1.0 if name == "mpt" else None)
    assert {"layer_norm", "plain_ffn"} <= cfg.features()


def test_alibi_slopes_are_ggmls() -> None:
    """ggml_soft_max_ext's slopes: m0^(h+1) for the first 2^floor(log2 H) heads, then odd
    powers of m1 (worked by hand for 8 heads and 6 heads at max bias 8)."""
    from frink_cli.archs.alibi import AlibiConfig

    ext = AlibiConfig(alibi_bias=8.0)
    assert np.allclose(ext.alibi_slopes(8), [2.0 ** -(h + 1) for h in range(8)])
    want = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    assert np.allclose(ext.alibi_slopes(6), want)


# --- numpy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "field", "off"),
    [
        ("starcoder2", "layer_norm", False),
        ("starcoder2", "plain_ffn", False),
        ("bloom", "alibi_bias", 0.0),
        ("bloom", "embd_norm", False),
        ("mpt", "clamp_kqv", None),
        ("mpt", "alibi_bias", 4.0),
    ],
)
def test_each_new_field_moves_the_logits(
    name: str, field: str, off: object, tiny_model: Callable
) -> None:
    """Switched off (or changed), each new field moves the logits far from the references:
    no parity test above can pass with it dropped."""
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    cfg = m.config
    if field == "plain_ffn":
        # A gated FFN would need gate rows the file lacks: run the plain FFN's up rows as
        # both halves instead (act(up) * up), which is what dropping the flag would mean.
        for lw in m.decoder.host.w.layers:
            lw.gate_up = dataclasses.replace(lw.up, w=np.concatenate([lw.up.w, lw.up.w]), b=None)
    new = configured(cfg, **{field: off})
    m.decoder = Decoder(new, m.decoder.host.w, None)
    got = m.logits(tiny_model(name).ref["tokens"])
    assert _max_diff(got, tiny_model(name).ref["logits_llamacpp"]) > FAR


# --- cuda: NumPy standing in for CuPy, and the kernels on the CPU emulator -----------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_cuda_carries_every_layer(name: str, tiny_model: Callable) -> None:
    """LayerNorm (with bias), the plain GELU FFN, ALiBi and the QKV clamp are the stack's
    kernels; bloom's embedding LayerNorm is the host's, with the lookup."""
    from frink_cli.backends.cupy import eligibility

    cfg = frink_cli.load(_path(tiny_model, name, "gguf")).config
    assert eligibility.layer_refusals(cfg) == [None] * cfg.n_layer


@pytest.mark.parametrize("name", FAMILIES)
def test_cuda_emulated_kernels_match_references(
    name: str, tiny_model: Callable, emulated_launcher: Any
) -> None:
    """kernels/*.cu on the CPU emulator (layer_norm_f32, act_f32, clamp_f32, the attention
    kernel's ALiBi): a prefill, a prefill over the cached prefix and decode steps give the
    host body's logits and both references'."""
    from model_checks import SELF_TOL, cuda_models, prefill_prefix_decode

    from frink_cli.backends.cupy.ops import KernelOps

    host, dev = cuda_models(
        _path(tiny_model, name, "gguf"), lambda: KernelOps(np, emulated_launcher)
    )
    first_launch = len(emulated_launcher.launches)
    ref = tiny_model(name).ref
    n = min(24, len(ref["tokens"]))
    tokens = [int(t) for t in ref["tokens"][:n]]
    want = prefill_prefix_decode(host, tokens, split=9)
    got = prefill_prefix_decode(dev, tokens, split=9)
    assert _max_diff(got, want) <= SELF_TOL, f"{name}: emulated kernels vs host body"
    _against_references(got, {k: ref[k][:n] for k in REFERENCES}, f"{name} cuda-emulated")
    ledger = dev.decoder.backend.ledger
    assert ledger.submissions == {"prefill-stack+lm-head": 2, "decode-stack+lm-head": 4}
    assert not ledger.refusals and not ledger.failures
    want_kernels = {"layer_norm_f32", "act_f32", "causal_gqa_attention_f32"}
    if name == "mpt":
        want_kernels.add("clamp_f32")
    assert want_kernels <= set(emulated_launcher.launches[first_launch:])
