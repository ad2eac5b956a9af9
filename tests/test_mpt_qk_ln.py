"""MPT with QK LayerNorm (`qk_ln`, as SEA-LION uses it) against llama.cpp, on numpy, metal
and cuda (NumPy standing in for CuPy, and the kernels on the CPU emulator).

Why: mpt's qk_ln norms the whole Q and K projection widths with LayerNorms that have
biases (llama.cpp's mpt.cpp: attn_q_norm / attn_k_norm, after the QKV clamp, before the
split into heads). frink composes it once as the full-width QK norm olmo2 uses
(`qk_norm_full`), a LayerNorm with its biases because the model's norms are LayerNorms.
transformers' MPT has no qk_ln, so llama.cpp is the reference alone: the fixture
(scripts/make_tiny_mpt_qk_ln.py) adds random q_ln / k_ln weights and biases to the tiny mpt
HF directory and converts it with llama.cpp's converter; llama.cpp runs it one token per
decode (its batched graph aborts on this model, see the script). Both the GGUF and the HF
directory are checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_checks import (
    FAR,
    REF_TOL,
    SELF_TOL,
    _assert_device_ran,
    _assert_greedy_matches_llamacpp,
    _assert_one_submission_per_token,
    _compare,
    _decode_after_prefill,
    _max_diff,
    configured,
    cuda_models,
    prefill_prefix_decode,
)
from script_loader import load_script

import frink_cli
from frink_cli.archs import open_checkpoint
from frink_cli.decoder import Decoder

load_script("make_tiny_models")  # make_tiny_mpt_qk_ln imports its siblings
load_script("llama_cpp_converter")
_qk_ln = load_script("make_tiny_mpt_qk_ln")
SOURCES = ("gguf", "hf")


@pytest.fixture(scope="module")
def fixture(
    tiny_model: Callable, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(the GGUF, the HF directory, llama.cpp's reference) -- a few seconds to make."""
    out = tmp_path_factory.mktemp("mpt_qk_ln")
    ref = _qk_ln.make(tiny_model("mpt").hf_dir, out)
    return out / "model.gguf", out / "hf", ref


def _path(fixture: Any, source: str) -> Path:
    return fixture[0] if source == "gguf" else fixture[1]


def _tokens(ref: dict[str, np.ndarray]) -> list[int]:
    return [int(t) for t in ref["tokens"]]


def _against_llamacpp(got: np.ndarray, ref: dict[str, np.ndarray], what: str) -> None:
    _compare(got, ref["logits_llamacpp"], REF_TOL, what)


def test_the_fixture_has_qk_layernorms(fixture: Any) -> None:
    ckpt = open_checkpoint(fixture[0])
    assert ckpt.metadata["general.architecture"] == "mpt"
    names = set(ckpt.tensors.names())
    for i in range(2):
        for t in ("attn_q_norm", "attn_k_norm"):
            assert {f"blk.{i}.{t}.weight", f"blk.{i}.{t}.bias"} <= names
    cfg = frink_cli.load(fixture[0]).config
    assert cfg.ext.qk_norm_full and cfg.ext.layer_norm and cfg.ext.clamp_kqv == 1.0
    assert {"qk_norm_full", "layer_norm", "alibi_bias", "clamp_kqv"} <= cfg.features()


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("source", SOURCES)
def test_numpy_matches_llamacpp(source: str, step: bool, fixture: Any) -> None:
    ref = fixture[2]
    got = frink_cli.load(_path(fixture, source)).logits(_tokens(ref), step=step)
    _against_llamacpp(got, ref, f"numpy({source}, step={step})")


def test_greedy_decode_matches_llamacpp(fixture: Any) -> None:
    ref = fixture[2]
    m = frink_cli.load(fixture[0])
    _assert_greedy_matches_llamacpp(m, ref, "decode", min_steps=24)


@pytest.mark.parametrize("variant", ["no QK norm", "QK norm without biases"])
def test_each_piece_moves_the_logits(variant: str, fixture: Any) -> None:
    """Dropping the QK LayerNorm, or only its biases, moves the logits far from llama.cpp's."""
    path, _, ref = fixture
    m = frink_cli.load(path)
    w = m.decoder.host.w
    cfg = m.config
    if variant == "no QK norm":
        cfg = configured(cfg, qk_norm_full=False)
        changes: dict[str, Any] = {"q_norm": None, "k_norm": None}
    else:
        changes = {"q_norm_b": None, "k_norm_b": None}
    layers = [dataclasses.replace(lw, **changes) for lw in w.layers]
    off = Decoder(cfg, dataclasses.replace(w, layers=layers))
    tokens = np.asarray(_tokens(ref))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    assert _max_diff(got, ref["logits_llamacpp"]) > FAR


# --- metal (MLX; its CPU device on Linux) ---------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("source", SOURCES)
def test_metal_matches_llamacpp(source: str, step: bool, fixture: Any) -> None:
    pytest.importorskip("mlx.core")
    ref = fixture[2]
    m = frink_cli.load(_path(fixture, source), backend="metal")
    got = m.logits(_tokens(ref), step=step)
    _against_llamacpp(got, ref, f"metal({source}, step={step})")
    _assert_device_ran(m, "metal")


def test_metal_one_submission_per_token(fixture: Any) -> None:
    pytest.importorskip("mlx.core")
    m = frink_cli.load(fixture[0], backend="metal")
    _assert_one_submission_per_token(m)
    _compare(
        _decode_after_prefill(m, fixture[2]),
        fixture[2]["greedy_logits_llamacpp"],
        REF_TOL,
        "metal decode",
    )


# --- cuda ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
def test_cuda_standing_in_matches_llamacpp(
    step: bool, fixture: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    ref = fixture[2]
    m = frink_cli.load(fixture[0], backend="cuda")
    assert m.backend_name == "cuda"
    _against_llamacpp(m.logits(_tokens(ref), step=step), ref, f"cuda-numpy(step={step})")
    _assert_device_ran(m, "cuda-numpy")


def test_cuda_emulated_kernels_match_llamacpp(fixture: Any, emulated_launcher: Any) -> None:
    """layer_norm_f32 runs the QK LayerNorms too: a prefill, a prefill over the cached
    prefix and decode steps give the host body's logits and llama.cpp's."""
    from frink_cli.backends.cupy.ops import KernelOps

    ref = fixture[2]
    host, dev = cuda_models(fixture[0], lambda: KernelOps(np, emulated_launcher))
    tokens = _tokens(ref)[:24]
    want = prefill_prefix_decode(host, tokens, split=9)
    got = prefill_prefix_decode(dev, tokens, split=9)
    assert _max_diff(got, want) <= SELF_TOL
    _against_llamacpp(got, {"logits_llamacpp": ref["logits_llamacpp"][:24]}, "cuda-emulated")
    _assert_device_ran(dev, "cuda-emulated")
    assert "layer_norm_f32" in set(emulated_launcher.launches)
