"""Mamba-1 (`mamba`: MambaForCausalLM, and Falcon-Mamba) against transformers and llama.cpp.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: Mamba is the first architecture with neither attention nor an FFN: every layer is a
selective state-space mixer (conv, x/dt projections, the selective scan, a SiLU gate) whose
recurrent state (conv tail + scan state [d_inner, d_state]) rides on the layer's cache
slot. Falcon-Mamba adds weightless RMSNorms on dt, B and C (`ssm.dt_b_c_rms`).

What is checked: frink from the GGUF (llama.cpp's own converter) and from the HF dir,
batched and one row at a time, against transformers' and llama.cpp's logits; the prompt +
24 greedy decode steps against llama.cpp's; the state after a prompt against a float64
per-token loop written here from the Mamba paper's formulas (not frink's code); prefill
exact against stepping; the HF reader gives exactly the converter's tensors and metadata;
a cache holding mamba state refuses truncation; each piece of the block matters; `metal`
(MLX's CPU device on Linux) with the device having run every layer, one submission per
decode token; `cuda` refuses the mixer by name (the host body runs it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fixture_copies import copy_hf_dir
from frink_subprocess import frink
from model_checks import (
    REF_TOL,
    _assert_device_ran,
    _compare,
    _last_logits,
    _max_diff,
    _path,
    _split_against_stepped,
    _tokens,
    q8_0_requant,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.errors import FrinkError

NAMES = ("mamba", "falcon_mamba")
N_LAYER = {"mamba": 3, "falcon_mamba": 2}
D_MODEL, D_INNER, D_STATE, D_CONV, DT_RANK = 64, 128, 16, 4, 8
MIXER_TENSORS = {
    "attn_norm.weight",
    "ssm_in.weight",
    "ssm_conv1d.weight",
    "ssm_conv1d.bias",
    "ssm_x.weight",
    "ssm_dt.weight",
    "ssm_dt.bias",
    "ssm_a",
    "ssm_d",
    "ssm_out.weight",
}


# --- the fixtures themselves ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_the_converter_wrote_mamba(name: str, tiny_model: Callable) -> None:
    """What llama.cpp's converter makes of MambaForCausalLM / FalconMambaForCausalLM: the
    `mamba` architecture, the ssm_* tensors per layer and nothing of attention or FFN."""
    ckpt = open_checkpoint(_path(tiny_model, name, "gguf"))
    md = ckpt.metadata
    assert md["general.architecture"] == "mamba"
    assert md["mamba.ssm.dt_b_c_rms"] == (name == "falcon_mamba")
    assert md["mamba.ssm.time_step_rank"] == DT_RANK
    names = set(ckpt.tensors.names())
    for i in range(N_LAYER[name]):
        have = {n.removeprefix(f"blk.{i}.") for n in names if n.startswith(f"blk.{i}.")}
        assert have == MIXER_TENSORS, (i, sorted(have ^ MIXER_TENSORS))
        assert ckpt.tensors.info(f"blk.{i}.ssm_a").shape == (D_INNER, D_STATE)
    assert ("output.weight" in names) == (name == "falcon_mamba")  # mamba's fixture is tied


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_config_and_layer_shape(name: str, tiny_model: Callable) -> None:
    """Both sources give the same ModelConfig: every layer a mamba mixer with no FFN, the
    sizes from the ssm.* keys, the dt/B/C norms for Falcon-Mamba only."""
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "hf")))
    assert hf == gg
    m = gg.ext.mamba
    assert m is not None
    assert (m.d_inner, m.d_state, m.conv_kernel, m.dt_rank) == (D_INNER, D_STATE, D_CONV, DT_RANK)
    assert m.dt_b_c_rms == (name == "falcon_mamba")
    assert "mamba" in gg.features()
    for i in range(gg.n_layer):
        shape = gg.layer_shape(i)
        assert (shape.mixer, shape.ffn, shape.n_head_kv) == ("mamba", "none", 0)
        assert gg.is_recurrent(i)
    assert gg.layer_pattern() == f"MAMBA x{N_LAYER[name]}"
    per_layer = 4 * ((D_CONV - 1) * D_INNER + D_INNER * D_STATE)
    assert gg.recurrent_state_bytes() == N_LAYER[name] * per_layer


def test_info_shows_the_model(tiny_model: Callable) -> None:
    """`frink info`: the mixer's sizes and state instead of attention and rope lines, each
    layer a mamba mixer; metal takes every layer, cuda none (refused by the scan op it lacks)."""
    result = frink("info", _path(tiny_model, "falcon_mamba", "gguf"))
    assert result.returncode == 0, result.describe()
    out = result.stdout
    assert "layers:         2 (MAMBA x2)" in out
    assert "mamba:          inner 128, state 16, dt rank 8, conv 4, RMSNorm on dt/B/C" in out
    assert "19.0 KiB state per sequence" in out  # 2 x 4 x (3 x 128 + 128 x 16)
    assert "blk.1   mamba (128 x 16) + no ffn" in out
    assert "attention:" not in out and "rope:" not in out
    metal = frink("info", _path(tiny_model, "mamba", "hf"), "--backend", "metal")
    assert "metal takes 3 of 3 layers" in metal.stdout, metal.describe()
    cuda = frink("info", _path(tiny_model, "mamba", "gguf"), "--backend", "cuda", "--json")
    data = json.loads(cuda.stdout)
    refusals = [e["refusal"] for e in data["layers"]]
    assert len(refusals) == 3 and all("selective_scan: not implemented" in r for r in refusals)
    assert data["mamba"] == {
        "d_inner": 128,
        "d_state": 16,
        "dt_rank": 8,
        "conv_kernel": 4,
        "dt_b_c_rms": False,
        "n_group": 0,
    }


# --- the state: the Mamba paper's recurrence in float64 -------------------------------------------


def _paper_loop(
    name: str, tiny_model: Callable, tokens: list[int]
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The whole model one token at a time in float64, from the GGUF's tensors and the
    Mamba paper's formulas (zero-order hold on A, Euler on B, as the reference code does):
    per layer, x_t = silu(sum_k w_k u_{t-K+1+k} + b), Abar = exp(Delta A), h_t = Abar h_{t-1}
    + Delta B_t x_t, y_t = C_t h_t + D x_t. Returns (last logits, per layer: the last K-1
    conv inputs, the final state h)."""
    ckpt = open_checkpoint(_path(tiny_model, name, "gguf"))
    md = ckpt.metadata
    eps = float(md["mamba.attention.layer_norm_rms_epsilon"])
    norms_dtbc = bool(md["mamba.ssm.dt_b_c_rms"])

    def t(n: str) -> np.ndarray:
        return ckpt.tensors.load(n).astype(np.float64)

    def rms(v: np.ndarray) -> np.ndarray:
        return v / np.sqrt(np.mean(v * v) + eps)

    def silu(v: np.ndarray) -> np.ndarray:
        return v / (1.0 + np.exp(-v))

    emb = t("token_embd.weight")
    names = set(ckpt.tensors.names())
    out_w = t("output.weight") if "output.weight" in names else emb
    n_layer = int(md["mamba.block_count"])
    L = [{k: t(f"blk.{i}.{k}") for k in MIXER_TENSORS} for i in range(n_layer)]
    history = [np.zeros((D_CONV - 1, D_INNER)) for _ in range(n_layer)]  # past conv inputs
    h = [np.zeros((D_INNER, D_STATE)) for _ in range(n_layer)]
    logits = np.zeros(0)
    for tok in tokens:
        r = emb[tok].copy()
        for i, w in enumerate(L):
            u = rms(r) * w["attn_norm.weight"]
            xz = w["ssm_in.weight"] @ u
            xin, z = xz[:D_INNER], xz[D_INNER:]
            window = np.vstack([history[i], xin])  # [K, d_inner], oldest first
            history[i] = window[1:]
            x = silu((window * w["ssm_conv1d.weight"].T).sum(0) + w["ssm_conv1d.bias"])
            dbc = w["ssm_x.weight"] @ x
            dt, B, C = dbc[:DT_RANK], dbc[DT_RANK : DT_RANK + D_STATE], dbc[DT_RANK + D_STATE :]
            if norms_dtbc:
                dt, B, C = rms(dt), rms(B), rms(C)
            delta = np.log1p(np.exp(w["ssm_dt.weight"] @ dt + w["ssm_dt.bias"]))
            a_bar = np.exp(delta[:, None] * w["ssm_a"])
            h[i] = a_bar * h[i] + (delta * x)[:, None] * B[None, :]
            y = h[i] @ C + w["ssm_d"] * x
            r = r + w["ssm_out.weight"] @ (y * silu(z))
        logits = out_w @ (rms(r) * t("output_norm.weight"))
    return logits, history, h


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("name", NAMES)
def test_state_after_a_prompt_matches_the_papers_loop(
    name: str, step: bool, tiny_model: Callable
) -> None:
    tokens = _tokens(tiny_model, name)[:20]
    want_logits, want_conv, want_h = _paper_loop(name, tiny_model, tokens)
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    last, cache = _last_logits(m, tokens, 32, step)
    assert np.max(np.abs(last - want_logits)) <= 1e-4
    for i in range(N_LAYER[name]):
        conv, state = cache.conv_state[i], cache.delta_state[i]
        assert conv is not None and state is not None
        assert conv.shape == (D_CONV - 1, D_INNER) and state.shape == (D_INNER, D_STATE)
        np.testing.assert_allclose(conv, want_conv[i], rtol=0, atol=1e-5)
        np.testing.assert_allclose(state, want_h[i], rtol=0, atol=1e-5)
        assert np.abs(state).max() > 1e-2  # a state that carries something


@pytest.mark.parametrize("name", NAMES)
def test_prefill_is_exact_against_stepping(name: str, tiny_model: Callable) -> None:
    """A prefill split anywhere (and then decode rows) gives the logits and state of the
    same tokens stepped one at a time."""
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    tokens = _tokens(tiny_model, name)
    got, want, split, stepped = _split_against_stepped(m, tokens, (13, 30))
    assert _max_diff(got, want) <= 1e-5
    for a, b in zip(split.delta_state, stepped.delta_state):
        assert a is not None and b is not None
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_hf_use_bias_is_refused_by_name(tiny_model: Callable, tmp_path: Path) -> None:
    """in_proj/out_proj biases (HF use_bias) are in no llama.cpp mamba graph: refused."""
    hf = copy_hf_dir(_path(tiny_model, "mamba", "hf"), tmp_path / "hf", use_bias=True)
    with pytest.raises(FrinkError, match="use_bias"):
        frink_cli.load(hf)


# --- cuda: the mixer refused by name --------------------------------------------------------------


def test_a_long_prefill_scan_equals_token_steps() -> None:
    """The host scan forms decays a chunk (backends.host.ssm.CHUNK tokens) at a time: a prompt
    longer than several chunks gives what token-by-token steps give."""
    from frink_cli.backends.host.ssm import CHUNK, selective_scan

    rng = np.random.default_rng(0)
    T = 2 * CHUNK + 22
    x, dt = rng.standard_normal((T, 32), np.float32), rng.random((T, 32), np.float32)
    a = -rng.random((32, 8), np.float32)
    # One B/C group (Mamba-1's): the scan's b, c are [T, groups, d_state].
    b, c = rng.standard_normal((T, 1, 8), np.float32), rng.standard_normal((T, 1, 8), np.float32)
    h0 = rng.standard_normal((32, 8), np.float32)
    y, h = selective_scan(x, dt, a, b, c, h0)
    s, ys = h0, []
    for t in range(T):
        yt, s = selective_scan(x[t : t + 1], dt[t : t + 1], a, b[t : t + 1], c[t : t + 1], s)
        ys.append(yt)
    np.testing.assert_allclose(y, np.concatenate(ys), rtol=0, atol=1e-6)
    np.testing.assert_allclose(h, s, rtol=0, atol=1e-6)
    assert not np.shares_memory(h, h0)


# --- quantized: Q8_0 matrices (llama.cpp's quantizer) ---------------------------------------------


@pytest.fixture(scope="module")
def q8(tiny_model: Callable) -> tuple[Path, dict[str, np.ndarray]]:
    """The mamba fixture quantized to Q8_0 by llama.cpp (ssm_in, ssm_x, ssm_out and the
    embedding; ssm_dt falls back to F16, the conv and vectors stay F32), and llama.cpp's
    logits on it and on its own F32 requant of it (cached beside the tiny models)."""
    return q8_0_requant(tiny_model, "mamba")


@pytest.mark.parametrize("backend", ["numpy", "metal"])
@pytest.mark.usefixtures("exact_activations")  # against llama.cpp in f32 on the same weights
def test_q8_0_agrees_with_llama_cpp(
    backend: str, q8: tuple[Path, dict[str, np.ndarray]], tiny_model: Callable
) -> None:
    """On the Q8_0 file: llama.cpp's logits on the same weights in f32 at the parity bar,
    and its own quantized run's argmax (it rounds activations to 8 bits before each Q8_0
    matmul, which frink does not). metal multiplies the file's own Q8_0 blocks."""
    if backend == "metal":
        pytest.importorskip("mlx.core")
    path, ref = q8
    ckpt = open_checkpoint(path)
    assert ckpt.tensors.info("blk.0.ssm_in.weight").dtype == "Q8_0"
    m = frink_cli.load(path, backend=backend)
    got = m.logits(_tokens(tiny_model, "mamba"))
    _compare(got, ref["f32"], REF_TOL, f"Q8_0 {backend} vs llama.cpp (f32 requant)")
    assert np.array_equal(got.argmax(-1), ref["quantized"].argmax(-1))
    if backend == "metal":
        _assert_device_ran(m, "mamba Q8_0 metal")
