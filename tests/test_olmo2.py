"""OLMo 2 (`olmo2`) against transformers and llama.cpp, on every backend.

Why: OLMo 2 moves the llama layer's norms. It has no pre-norms (each branch reads the
residual stream itself), an RMSNorm on each branch's output before its residual add, and
Q/K norms over the whole projection width (one RMS over all query heads of a row, weight
[n_head*head_dim]; likewise the keys) -- two decorations of their own (`no_pre_norm`,
`qk_norm_full`) beside the post norms gemma3 already has. The fixture
(scripts/make_tiny_models.py, _OLMO2) draws every norm weight at random around 1, and the
decoration tests below prove that each one, switched off or replaced by its nearest
neighbour (a llama pre-norm, a per-head QK norm), moves the logits far past the 2e-3 bar.

What is checked: frink from the GGUF and from the HF dir, batched and one row at a time,
against transformers' and llama.cpp's logits, and the decode after a batched prefill
against llama.cpp's own decode steps; the HF reader gives exactly the converter's tensors
and metadata; `metal` (MLX's CPU device on Linux) with the device having run every layer;
`cuda` with NumPy standing in for CuPy and with the kernels on the CPU emulator, the whole
stack carried. The helpers are test_granite.py's (the same bar, written once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from model_checks import (
    FAR,
    REF_TOL,
    REFERENCES,
    SELF_TOL,
    SOURCES,
    _against_references,
    _assert_device_ran,
    _assert_greedy_matches_llamacpp,
    _assert_one_submission_per_token,
    _compare,
    _cuda_models,
    _decode_after_prefill,
    _max_diff,
    _path,
    _prefill_prefix_decode,
    _tokens,
    configured,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.decoder import Decoder
from frink_cli.model.weights import ModelWeights

NAME = "olmo2"
N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_EMBD = 3, 4, 2, 16, 64


# --- the fixture itself ---------------------------------------------------------------------------


def test_references_agree(tiny_model: Callable) -> None:
    """transformers and llama.cpp compute the same OLMo 2 (else neither can judge frink)."""
    ref = tiny_model(NAME).ref
    assert "logits_llamacpp" in ref, "llama.cpp's converter made no GGUF"
    _compare(ref["logits_llamacpp"], ref["logits_hf"], REF_TOL, "llama.cpp vs transformers")
    assert ref["greedy_logits_llamacpp"].shape[0] == ref["greedy_llamacpp"].shape[0] > 0


def test_the_converter_wrote_olmo2(tiny_model: Callable) -> None:
    """What llama.cpp's converter makes of Olmo2ForCausalLM: no attn_norm / ffn_norm, the
    two post norms, and Q/K norms as wide as the whole q and k projections."""
    ckpt = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    assert ckpt.metadata["general.architecture"] == NAME
    names = set(ckpt.tensors.names())
    for i in range(N_LAYER):
        have = {
            n.removeprefix(f"blk.{i}.").removesuffix(".weight")
            for n in names
            if n.startswith(f"blk.{i}.")
        }
        want = {"attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm"}
        want |= {"post_attention_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"}
        assert have == want, (i, sorted(have ^ want))
        assert ckpt.tensors.info(f"blk.{i}.attn_q_norm.weight").shape == (N_HEAD * HEAD_DIM,)
        assert ckpt.tensors.info(f"blk.{i}.attn_k_norm.weight").shape == (N_HEAD_KV * HEAD_DIM,)
    assert "output.weight" in names


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("source", SOURCES)
def test_numpy_matches_references(source: str, step: bool, tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, NAME, source))
    got = m.logits(_tokens(tiny_model, NAME), step=step)
    _against_references(
        got, tiny_model(NAME).ref, f"numpy({source}, {'step' if step else 'batch'})"
    )


@pytest.mark.parametrize("source", SOURCES)
def test_numpy_decode_after_prefill_matches_llamacpp(source: str, tiny_model: Callable) -> None:
    ref = tiny_model(NAME).ref
    m = frink_cli.load(_path(tiny_model, NAME, source))
    _assert_greedy_matches_llamacpp(m, ref, "decode")


def test_config_reads_the_decorations(tiny_model: Callable) -> None:
    """Both sources give the same ModelConfig: no pre-norm, full-width QK norm (not the
    per-head one), both post norms, NeoX rope, untied."""
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "hf")))
    assert hf == gg
    assert gg.ext.no_pre_norm and gg.ext.qk_norm_full and not gg.ext.qk_norm
    assert gg.ext.post_attn_norm and gg.ext.post_ffn_norm
    assert gg.rope_type == "neox" and not gg.tied_embeddings
    assert {"no_pre_norm", "qk_norm_full", "post_attn_norm", "post_ffn_norm"} <= gg.features()


def test_hf_dir_tensors_equal_the_converters(tiny_model: Callable) -> None:
    hf = open_checkpoint(_path(tiny_model, NAME, "hf"))
    gg = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    assert sorted(hf.tensors.names()) == sorted(gg.tensors.names())
    for n in gg.tensors.names():
        assert np.array_equal(hf.tensors.load(n), gg.tensors.load(n)), n


def test_hf_dir_metadata_matches_the_converters(tiny_model: Callable) -> None:
    hf = open_checkpoint(_path(tiny_model, NAME, "hf")).metadata
    gg = open_checkpoint(_path(tiny_model, NAME, "gguf")).metadata
    assert hf["general.architecture"] == NAME
    for key, value in gg.items():
        if key.startswith(f"{NAME}."):
            assert key in hf, f"{key} missing from the HF dir's metadata"
            if isinstance(value, float):
                assert hf[key] == pytest.approx(value), key
            else:
                assert list(np.atleast_1d(hf[key])) == list(np.atleast_1d(value)), key


# --- every decoration matters ---------------------------------------------------------------------


def _per_head(w: np.ndarray) -> np.ndarray:
    """A full-width QK norm weight [heads*hd] as per-head weights [heads, hd]: what a
    per-head QK norm (qwen3's) would apply with the same numbers."""
    return w.reshape(-1, HEAD_DIM)


# name -> (ModelConfig changes, per-layer weight changes (a function of the layer)).
_ONES = np.ones(N_EMBD, np.float32)
VARIANTS: dict[str, tuple[dict[str, Any], Callable[[Any], dict[str, Any]]]] = {
    # llama's pre-norms (weightless) where olmo2 has none.
    "pre norms": ({"no_pre_norm": False}, lambda lw: {"attn_norm": _ONES, "ffn_norm": _ONES}),
    # The QK norms dropped.
    "no qk norm": ({"qk_norm_full": False}, lambda lw: {"q_norm": None, "k_norm": None}),
    # The same QK norm weights applied per head (one RMS per head, not per row).
    "per-head qk norm": (
        {"qk_norm_full": False, "qk_norm": True},
        lambda lw: {"q_norm": _per_head(lw.q_norm), "k_norm": _per_head(lw.k_norm)},
    ),
    "no post-attention norm": ({"post_attn_norm": False}, lambda lw: {"post_attn_norm": None}),
    "no post-FFN norm": ({"post_ffn_norm": False}, lambda lw: {"post_ffn_norm": None}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_decoration_moves_the_graph(variant: str, tiny_model: Callable) -> None:
    """The graph honours each decoration: switched off (or replaced by its neighbour), the
    logits land far from both references, so parity cannot pass without it."""
    changes, weight_changes = VARIANTS[variant]
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    w = m.decoder.host.w
    layers = [dataclasses.replace(lw, **weight_changes(lw)) for lw in w.layers]
    off = Decoder(
        configured(m.config, **changes),
        ModelWeights(w.token_embd, w.output_norm, w.output, w.rope_freqs, layers),
    )
    tokens = np.asarray(_tokens(tiny_model, NAME))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    for key in REFERENCES:
        assert _max_diff(got, tiny_model(NAME).ref[key]) > FAR, f"{variant} still matches {key}"


# --- metal (MLX; its CPU device on Linux) ---------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("source", SOURCES)
def test_metal_matches_references(source: str, step: bool, tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    m = frink_cli.load(_path(tiny_model, NAME, source), backend="metal")
    assert m.backend_name == "metal"
    got = m.logits(_tokens(tiny_model, NAME), step=step)
    _against_references(
        got, tiny_model(NAME).ref, f"metal({source}, {'step' if step else 'batch'})"
    )
    _assert_device_ran(m, "olmo2 metal")


def test_metal_decode_after_prefill_matches_llamacpp(tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    ref = tiny_model(NAME).ref
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"), backend="metal")
    _compare(_decode_after_prefill(m, ref), ref["greedy_logits_llamacpp"], REF_TOL, "metal decode")
    _assert_device_ran(m, "olmo2 metal")


def test_metal_one_submission_per_token(tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"), backend="metal")
    _assert_one_submission_per_token(m)


# --- cuda: NumPy standing in for CuPy, and the kernels on the CPU emulator -----------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
def test_cuda_standing_in_matches_references(
    step: bool, tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load(path, backend="cuda")` with NumPy for CuPy: every layer on the stack, no
    refusals, both references."""
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"), backend="cuda")
    assert m.backend_name == "cuda"
    got = m.logits(_tokens(tiny_model, NAME), step=step)
    _against_references(got, tiny_model(NAME).ref, f"cuda-numpy({'step' if step else 'batch'})")
    ledger = m.decoder.backend.ledger
    assert ledger.total() > 0 and not ledger.refusals and not ledger.failures, (
        dict(ledger.submissions),
        dict(ledger.refusals),
        dict(ledger.failures),
    )


def test_cuda_numpy_stack_equals_host_body(tiny_model: Callable) -> None:
    host, dev = _cuda_models(_path(tiny_model, NAME, "gguf"))
    tokens = _tokens(tiny_model, NAME)
    want = _prefill_prefix_decode(host, tokens, split=17)
    got = _prefill_prefix_decode(dev, tokens, split=17)
    assert _max_diff(got, want) <= SELF_TOL
    ledger = dev.decoder.backend.ledger
    assert ledger.submissions == {"prefill-stack+lm-head": 2, "decode-stack+lm-head": 4}
    assert not ledger.refusals and not ledger.failures


def test_cuda_emulated_kernel_stack_equals_host_body(
    tiny_model: Callable,
    emulated_launcher: Any,  # noqa: F811 - the fixture imported above
) -> None:
    """olmo2 with kernels/*.cu on the CPU emulator (the full-width QK norm is the rms_norm
    kernel over whole q / k rows): the host body's logits, and both references'."""
    from frink_cli.backends.cupy.ops import KernelOps

    host, dev = _cuda_models(
        _path(tiny_model, NAME, "gguf"), lambda: KernelOps(np, emulated_launcher)
    )
    tokens = _tokens(tiny_model, NAME)[:24]
    want = _prefill_prefix_decode(host, tokens, split=9)
    got = _prefill_prefix_decode(dev, tokens, split=9)
    assert _max_diff(got, want) <= SELF_TOL
    _against_references(
        got, {k: tiny_model(NAME).ref[k][:24] for k in REFERENCES}, "olmo2 emulated"
    )
    ledger = dev.decoder.backend.ledger
    assert ledger.submissions == {"prefill-stack+lm-head": 2, "decode-stack+lm-head": 4}
    assert not ledger.refusals and not ledger.failures
