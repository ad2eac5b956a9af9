"""PLaMo-2 (`plamo2`) against llama.cpp, on numpy, metal and cuda.

Why: transformers has no PLaMo-2 (remote code), so the reference is llama.cpp alone: the
fixture (scripts/make_tiny_plamo2.py) is a tiny random GGUF written with gguf-py in the
layout llama.cpp's converter writes (per-layer head counts with 0 on the Mamba layers,
per-head Q/K norm weights, the norms it stores without a .weight suffix, the per-head
[z, x] rows of ssm_in), and llama.cpp's own logits for it: an 80-token batch and a greedy
run of 24 tokens after a 72-token prompt, both across the 64-row recurrent prefill chunk.
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
    _assert_device_ran,
    _assert_greedy_matches_llamacpp,
    _assert_one_submission_per_token,
    _compare,
    _decode_after_prefill,
    assert_refused_by_name,
)
from script_loader import load_script

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError

load_script("make_tiny_models")  # make_tiny_plamo2 imports it as a sibling
_plamo2 = load_script("make_tiny_plamo2")
HD, HEADS = _plamo2.HEAD_DIM, _plamo2.MAMBA_HEADS


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """(the GGUF, llama.cpp's reference) -- made in a few seconds."""
    out = tmp_path_factory.mktemp("plamo2")
    return out / "model.gguf", _plamo2.make(out)


@pytest.fixture(scope="module")
def model(fixture: Any) -> frink_cli.Model:
    return frink_cli.load(fixture[0])


def _tokens(ref: dict[str, np.ndarray]) -> list[int]:
    return [int(t) for t in ref["tokens"]]


def test_the_fixture_is_llama_cpps_plamo2(fixture: Any) -> None:
    """llama.cpp ran the file as plamo2: Mamba layers where head_count_kv is 0; its logits
    separate their top two and its greedy run is long enough to check."""
    path, ref = fixture
    ckpt = open_checkpoint(path)
    assert ckpt.metadata["general.architecture"] == "plamo2"
    assert list(ckpt.metadata["plamo2.attention.head_count_kv"]) == [2, 0, 2, 0]
    assert ckpt.tensors.info("blk.0.attn_q_norm.weight").shape == (4, HD)
    assert ckpt.tensors.info("blk.1.ssm_a").shape == (HEADS,)
    lg = ref["logits_llamacpp"]
    assert lg.shape == (_plamo2.SEQ_LEN, _plamo2.N_VOCAB) and lg.std() > 1.0
    assert len(ref["greedy_llamacpp"]) == 24 and len(ref["greedy_prompt"]) > 64


def test_config_and_info_name_the_decorations(fixture: Any) -> None:
    from frink_cli.report import describe

    cfg = config_from_checkpoint(open_checkpoint(fixture[0]))
    assert {"post_attn_norm", "post_ffn_norm", "qk_norm_heads", "mamba"} <= cfg.features()
    assert cfg.layer_pattern() == "ATTN x1 MAMBA x1 (x2)"
    m = cfg.ext.mamba
    assert (m.heads, m.dt_rank, m.d_inner, m.layers) == (HEADS, 64, HEADS * HD, (0, 1, 0, 1))
    assert cfg.rope_type == "neox" and cfg.attn_scale == pytest.approx(HD**-0.5)
    d = describe(fixture[0])
    assert {"post_attn_norm", "qk_norm_heads", "mamba"} <= set(d["decorations"])
    assert d["mamba"]["heads"] == HEADS and d["mamba"]["dt_b_c_rms"]


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
def test_numpy_matches_llamacpp(step: bool, fixture: Any, model: frink_cli.Model) -> None:
    got = model.logits(_tokens(fixture[1]), step=step)
    _compare(got, fixture[1]["logits_llamacpp"], REF_TOL, f"numpy({'step' if step else 'batch'})")


def test_numpy_greedy_is_llama_cpps(fixture: Any, model: frink_cli.Model) -> None:
    """llama.cpp's 24 greedy tokens after a prompt past the prefill chunk, and the logits
    each was chosen from."""
    _assert_greedy_matches_llamacpp(model, fixture[1], "greedy", min_steps=24, min_prompt=65)


# --- every decoration matters ---------------------------------------------------------------------


def _in_mamba(**change: Callable[[Any], Any]) -> Callable[[Any], dict[str, Any]]:
    """A change of the Mamba layers' mixer weights (field -> function of the old value)."""

    def layer(lw: Any) -> dict[str, Any]:
        mw = lw.mamba
        if mw is None:
            return {}
        new = {k: f(getattr(mw, k)) for k, f in change.items()}
        return {"mamba": dataclasses.replace(mw, **new)}

    return layer


def _attn(**change: Callable[[Any], Any]) -> Callable[[Any], dict[str, Any]]:
    """A change of the attention layers' weights."""
    return lambda lw: {} if lw.qkv is None else {k: f(getattr(lw, k)) for k, f in change.items()}


def _halves_not_per_head(w: Any) -> Any:
    """ssm_in read as [x rows; z rows] straight from the file (Mamba-1's layout), not per
    head [z_h, x_h]: the regrouping undone."""
    di = HEADS * HD
    per_head = np.arange(2 * di).reshape(HEADS, 2, HD)
    order = np.concatenate([per_head[:, 1].ravel(), per_head[:, 0].ravel()])
    file_rows = np.empty_like(w.w)
    file_rows[order] = w.w
    return dataclasses.replace(w, w=np.ascontiguousarray(file_rows))


def _swap_halves(lin: Any) -> Any:
    n = lin.w.shape[0] // 2
    return dataclasses.replace(lin, w=np.concatenate([lin.w[n:], lin.w[:n]]))


def _none(_: Any) -> None:
    return None


def _head0(w: np.ndarray) -> np.ndarray:
    return np.broadcast_to(w[0], w.shape)


# name -> per-layer weight changes (a function of the layer).
VARIANTS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "no post-mixer norm": lambda lw: {"post_attn_norm": None},
    "no post-FFN norm": lambda lw: {"post_ffn_norm": None},
    "weightless pre-norms": lambda lw: {
        "attn_norm": np.ones_like(lw.attn_norm),
        "ffn_norm": np.ones_like(lw.ffn_norm),
    },
    "SwiGLU halves swapped (up gated)": lambda lw: {"gate_up": _swap_halves(lw.gate_up)},
    "no QK norms": _attn(q_norm=_none, k_norm=_none),
    "head 0's QK norm weights for every head": _attn(q_norm=_head0, k_norm=_head0),
    "no dt/B/C norms": _in_mamba(dt_norm=_none, b_norm=_none, c_norm=_none),
    "no D skip": _in_mamba(d=np.zeros_like),
    "no dt bias": _in_mamba(dt_proj=lambda lin: dataclasses.replace(lin, b=np.zeros_like(lin.b))),
    "ssm_in as two halves": _in_mamba(in_proj=_halves_not_per_head),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_decoration_moves_the_graph(
    variant: str, fixture: Any, model: frink_cli.Model
) -> None:
    ref = fixture[1]
    w = model.decoder.host.w
    change = VARIANTS[variant]
    layers = [dataclasses.replace(lw, **change(lw)) for lw in w.layers]
    off = Decoder(model.config, dataclasses.replace(w, layers=layers))
    tokens = np.asarray(_tokens(ref))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    diff = float(np.max(np.abs(got - ref["logits_llamacpp"])))
    assert diff > FAR, f"{variant} still matches llama.cpp ({diff:.3g})"


# --- bad files ------------------------------------------------------------------------------------


def test_hostile_metadata_is_refused_by_name(tmp_path: Path) -> None:
    """Each ssm field made hostile (zero, huge, heads not dividing the inner size, B/C
    groups) is one FrinkError naming it, before anything large is allocated; the valid
    file they start from runs."""
    F = load_script("fuzz_inputs")
    assert_refused_by_name(tmp_path, F.plamo2_base().encode(), F.plamo2_hostile())


def test_a_missing_mamba_norm_is_named(tmp_path: Path) -> None:
    bad = _plamo2.write(tmp_path / "m.gguf", drop=("blk.1.ssm_b_norm",))
    with pytest.raises(FrinkError, match="blk.1.ssm_b_norm"):
        frink_cli.load(bad).logits([1, 2])


# --- metal (MLX; its CPU device on Linux) ---------------------------------------------------------


@pytest.fixture(scope="module")
def metal(fixture: Any) -> frink_cli.Model:
    pytest.importorskip("mlx.core")
    m = frink_cli.load(fixture[0], backend="metal")
    assert m.backend_name == "metal"
    return m


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
def test_metal_matches_llamacpp(step: bool, fixture: Any, metal: frink_cli.Model) -> None:
    got = metal.logits(_tokens(fixture[1]), step=step)
    _compare(got, fixture[1]["logits_llamacpp"], REF_TOL, f"metal({'step' if step else 'batch'})")
    _assert_device_ran(metal, "plamo2 metal")


def test_metal_decode_after_prefill_matches_llamacpp(fixture: Any, metal: frink_cli.Model) -> None:
    ref = fixture[1]
    _compare(_decode_after_prefill(metal, ref), ref["greedy_logits_llamacpp"], REF_TOL, "decode")
    _assert_device_ran(metal, "plamo2 metal")


def test_metal_one_submission_per_decode_token(fixture: Any) -> None:
    pytest.importorskip("mlx.core")
    _assert_one_submission_per_token(frink_cli.load(fixture[0], backend="metal"))


# --- cuda: NumPy standing in for CuPy -------------------------------------------------------------


def test_cuda_refuses_every_layer_by_name(fixture: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cuda stack has no causal conv (the Mamba layers) and no weightless RMSNorm (the
    per-head QK norm weights are applied after one): it refuses each layer by that name,
    the host body runs them, and the logits are llama.cpp's."""
    from frink_cli.backends.cupy import eligibility

    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    path, ref = fixture
    m = frink_cli.load(path, backend="cuda")
    assert m.backend_name == "cuda"
    _compare(m.logits(_tokens(ref)), ref["logits_llamacpp"], REF_TOL, "cuda-numpy")
    ledger = m.decoder.backend.ledger
    assert not ledger.failures, dict(ledger.failures)
    refused = [eligibility.layer_refusal(m.config, i) for i in range(4)]
    assert refused == ["rms_norm_: no weight", "causal_conv: not implemented"] * 2
    assert set(ledger.refusals) == set(refused)
