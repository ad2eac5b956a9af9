"""Talkie (`talkie`) against llama.cpp, on numpy, metal and cuda.

Why: Talkie brings four pieces to the one layer graph: the skip stream (the RMS-normed
embedding, times a per-layer scalar, added into every layer's output: `embd_skip`; it
rides beside the residual stream between layers), weightless norms (`weightless_norms`),
a per-head Q gain after a weightless per-head Q norm (`attn_q_gain`) and the output
projections' per-tensor scales (`proj_scales`); its logits are multiplied by
talkie.logit_scale. transformers has no Talkie, so the reference is llama.cpp alone: the
fixture (scripts/make_tiny_talkie.py) is a tiny random GGUF written with gguf-py in
llama.cpp's layout, and llama.cpp's own logits for it (an f32 KV cache; a batch, and a
greedy decode one token at a time). Every decoration's scalars are drawn away from 1, and
the decoration tests prove each one moves the logits far past the 2e-3 bar.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixture_copies import copy_gguf
from model_checks import (
    FAR,
    REF_TOL,
    SELF_TOL,
    _assert_device_ran,
    _assert_greedy_matches_llamacpp,
    _compare,
    _decode_after_prefill,
    configured,
    cuda_models,
    prefill_prefix_decode,
)
from script_loader import load_script

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError

load_script("make_tiny_models")  # make_tiny_talkie imports it as a sibling
_talkie = load_script("make_tiny_talkie")
N_LAYER, N_HEAD, N_EMBD, HEAD_DIM = _talkie.N_LAYER, _talkie.N_HEAD, _talkie.N_EMBD, 16


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """(the GGUF, llama.cpp's reference) -- made in a couple of seconds."""
    out = tmp_path_factory.mktemp("talkie")
    return out / "model.gguf", _talkie.make(out)


def _tokens(ref: dict[str, np.ndarray]) -> list[int]:
    return [int(t) for t in ref["tokens"]]


def _against_llamacpp(got: np.ndarray, ref: dict[str, np.ndarray], what: str) -> None:
    _compare(got, ref["logits_llamacpp"], REF_TOL, what)
    assert np.array_equal(got.argmax(-1), ref["logits_llamacpp"].argmax(-1)), what


def test_the_fixture_is_llama_cpps_talkie(fixture: Any) -> None:
    """llama.cpp loaded the file as talkie and its logits separate their top two."""
    path, ref = fixture
    ckpt = open_checkpoint(path)
    assert ckpt.metadata["general.architecture"] == "talkie"
    assert ckpt.tensors.info("blk.0.attn_q_norm.weight").shape == (N_HEAD, 1)
    assert ckpt.tensors.info("blk.0.layer_output_scale.weight").shape == (1,)
    assert not any("norm" in n and "q_norm" not in n for n in ckpt.tensors.names())
    lg = ref["logits_llamacpp"]
    assert lg.shape == (len(ref["tokens"]), _talkie.N_VOCAB) and lg.std() > 0.5
    assert ref["greedy_logits_llamacpp"].shape[0] == ref["greedy_llamacpp"].shape[0] > 0


def test_config_reads_the_decorations(fixture: Any) -> None:
    cfg = config_from_checkpoint(open_checkpoint(fixture[0]))
    assert {"embd_skip", "weightless_norms", "attn_q_gain", "proj_scales"} <= cfg.features()
    assert cfg.ext.logit_scale == pytest.approx(1 / _talkie.LOGIT_SCALE)  # frink's divides
    assert cfg.rope_type == "neox" and not cfg.tied_embeddings and not cfg.ext.qk_norm
    assert cfg.residual_width == 2 * N_EMBD
    assert cfg.norm_eps == pytest.approx(float(np.finfo(np.float32).eps))


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
def test_numpy_matches_llamacpp(step: bool, fixture: Any) -> None:
    path, ref = fixture
    got = frink_cli.load(path).logits(_tokens(ref), step=step)
    _against_llamacpp(got, ref, f"numpy({'step' if step else 'batch'})")


def test_numpy_decode_after_prefill_matches_llamacpp(fixture: Any) -> None:
    path, ref = fixture
    m = frink_cli.load(path)
    _assert_greedy_matches_llamacpp(m, ref, "decode")


def test_hidden_is_the_residual_stream(fixture: Any) -> None:
    """The skip stream rides beside the residual stream between layers only: hidden rows
    are n_embd wide."""
    path, ref = fixture
    dec = frink_cli.load(path).decoder
    assert dec.hidden(np.asarray(_tokens(ref)[:5]), dec.new_cache(8)).shape == (5, N_EMBD)


# --- every decoration matters ---------------------------------------------------------------------

# name -> (ModelConfig changes, per-layer weight changes (a function of the layer)).
VARIANTS: dict[str, tuple[dict[str, Any], Callable[[Any], dict[str, Any]]]] = {
    "no skip stream": ({}, lambda lw: {"skip_scale": np.zeros(1, np.float32)}),
    "skip stream unscaled": ({}, lambda lw: {"skip_scale": np.ones(1, np.float32)}),
    "no per-head Q gain": ({"attn_q_gain": False}, lambda lw: {"q_gain": None}),
    "no QK norms": ({}, lambda lw: {"q_norm": None, "k_norm": None, "q_gain": None}),
    "no projection scales": (
        {"proj_scales": False},
        lambda lw: {"wo_scale": None, "down_scale": None},
    ),
    "logits not scaled": ({"logit_scale": None}, lambda lw: {}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_decoration_moves_the_graph(variant: str, fixture: Any) -> None:
    path, ref = fixture
    changes, weight_changes = VARIANTS[variant]
    m = frink_cli.load(path)
    w = m.decoder.host.w
    layers = [dataclasses.replace(lw, **weight_changes(lw)) for lw in w.layers]
    off = Decoder(
        configured(m.config, **changes),
        dataclasses.replace(w, layers=layers),
    )
    tokens = np.asarray(_tokens(ref))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    diff = float(np.max(np.abs(got - ref["logits_llamacpp"])))
    assert diff > FAR, f"{variant} still matches llama.cpp ({diff:.3g})"


def test_embedding_not_normed_moves_the_graph(fixture: Any) -> None:
    """Both streams start from the RMS-normed embedding: the raw rows (drawn with std 1,
    not unit RMS per row) side by side instead land far from llama.cpp."""
    path, ref = fixture
    dec = frink_cli.load(path).decoder
    table = dec.host.w.token_embd
    dec.host.embed = lambda ids, positions=None: np.concatenate([table[ids], table[ids]], axis=-1)  # type: ignore[method-assign]
    tokens = np.asarray(_tokens(ref))
    got = dec.step(tokens, dec.new_cache(len(tokens)), all_logits=True)
    assert float(np.max(np.abs(got - ref["logits_llamacpp"]))) > FAR


# --- bad files ------------------------------------------------------------------------------------


def test_logit_scale_is_required(fixture: Any, tmp_path: Path) -> None:
    bad = copy_gguf(fixture[0], tmp_path / "m.gguf", {"talkie.logit_scale": None})
    with pytest.raises(FrinkError, match="logit_scale"):
        frink_cli.load(bad)


def test_output_head_is_required(fixture: Any, tmp_path: Path) -> None:
    bad = copy_gguf(fixture[0], tmp_path / "m.gguf", drop=("output.weight",))
    with pytest.raises(FrinkError, match="output.weight"):
        frink_cli.load(bad)


def test_a_missing_skip_scale_is_named(fixture: Any, tmp_path: Path) -> None:
    bad = copy_gguf(fixture[0], tmp_path / "m.gguf", drop=("blk.1.layer_output_scale.weight",))
    with pytest.raises(FrinkError, match="blk.1.layer_output_scale.weight"):
        frink_cli.load(bad)


# --- metal (MLX; its CPU device on Linux) ---------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
def test_metal_matches_llamacpp(step: bool, fixture: Any) -> None:
    pytest.importorskip("mlx.core")
    path, ref = fixture
    m = frink_cli.load(path, backend="metal")
    assert m.backend_name == "metal"
    got = m.logits(_tokens(ref), step=step)
    _against_llamacpp(got, ref, f"metal({'step' if step else 'batch'})")
    _assert_device_ran(m, "talkie metal")


def test_metal_decode_after_prefill_matches_llamacpp(fixture: Any) -> None:
    pytest.importorskip("mlx.core")
    path, ref = fixture
    m = frink_cli.load(path, backend="metal")
    _compare(_decode_after_prefill(m, ref), ref["greedy_logits_llamacpp"], REF_TOL, "metal decode")
    _assert_device_ran(m, "talkie metal")


def test_metal_split_runs_carry_the_skip_stream(fixture: Any) -> None:
    """Layers split between the device and the host body hand the skip stream across."""
    pytest.importorskip("mlx.core")
    path, ref = fixture
    m = frink_cli.load(path, backend="metal")
    backend = m.decoder.backend
    plan = backend.plan
    # Layer 1 on the host, layers 0 and 2 on the device.
    backend.plan = lambda kind, layer, *a, **k: None if layer == 1 else plan(kind, layer, *a, **k)
    try:
        got = m.logits(_tokens(ref))
    finally:
        backend.plan = plan
    _against_llamacpp(got, ref, "metal split")
    assert backend.ledger.total() > 0


# --- cuda: NumPy standing in for CuPy, and the kernels on the CPU emulator -----------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
def test_cuda_standing_in_matches_llamacpp(
    step: bool, fixture: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load(path, backend="cuda")` with NumPy for CuPy: every layer on the stack (the skip
    stream beside the residual stream), no refusals, llama.cpp's logits."""
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    path, ref = fixture
    m = frink_cli.load(path, backend="cuda")
    assert m.backend_name == "cuda"
    got = m.logits(_tokens(ref), step=step)
    _against_llamacpp(got, ref, f"cuda-numpy({'step' if step else 'batch'})")
    ledger = m.decoder.backend.ledger
    assert ledger.total() > 0 and not ledger.refusals and not ledger.failures, (
        dict(ledger.submissions),
        dict(ledger.refusals),
        dict(ledger.failures),
    )


def test_cuda_emulated_kernel_stack_equals_host_body(
    fixture: Any,
    emulated_launcher: Any,  # noqa: F811 - the fixture imported above
) -> None:
    """talkie with kernels/*.cu on the CPU emulator: the host body's logits, and llama.cpp's."""
    from frink_cli.backends.cupy.ops import KernelOps

    path, ref = fixture
    host, dev = cuda_models(path, lambda: KernelOps(np, emulated_launcher))
    tokens = _tokens(ref)[:24]
    want = prefill_prefix_decode(host, tokens, split=9)
    got = prefill_prefix_decode(dev, tokens, split=9)
    assert float(np.max(np.abs(got - want))) <= SELF_TOL
    # Every row of both prefills, then the decodes: positions 0..23 in order.
    _compare(got, ref["logits_llamacpp"][:24], REF_TOL, "talkie emulated")
    ledger = dev.decoder.backend.ledger
    assert ledger.submissions == {"prefill-stack+lm-head": 2, "decode-stack+lm-head": 4}
    assert not ledger.refusals and not ledger.failures
