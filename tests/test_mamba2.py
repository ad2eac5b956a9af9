"""Mamba-2 (`mamba2`: Mamba2ForCausalLM) against transformers and llama.cpp.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: Mamba-2's SSD mixer differs from Mamba-1's in every part around the scan: one fused
in_proj (z, x, B, C, dt), a conv over x, B and C together, a per-head scalar decay and dt,
B and C shared by groups of heads, and a gated RMSNorm per group before out_proj. frink
runs it through Mamba-1's scan primitive (each head's dt and A repeated over its channels,
B/C per group), so these tests pin both the block and the generalized scan.

What is checked: frink from the GGUF (llama.cpp's own converter) and from the HF dir,
batched and one row at a time, against transformers' and llama.cpp's logits on an 80-token
prompt (past the host scan's 64-token chunk and the metal backend's 64-row prefill chunk);
the prompt + 24 greedy decode steps against llama.cpp's; the state after a prompt against
a float64 per-token loop written here from the SSD formulas (not frink's code); prefill
exact against stepping across a chunk boundary; the HF reader gives the converter's tensors
and metadata; truncation refused; each piece of the block matters; `metal` (MLX's CPU
device on Linux) with the device having run every layer, one submission per decode token;
`cuda` refuses the mixer by name (the host body runs it).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest
from frink_subprocess import frink
from model_checks import (
    FAR,
    REFERENCES,
    _last_logits,
    _max_diff,
    _path,
    _split_against_stepped,
    _tokens,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.backends.host.ops import HostOps

NAME = "mamba2"
N_LAYER, D_MODEL, D_INNER, D_STATE, D_CONV = 3, 64, 128, 16, 4
N_HEAD, HEAD_DIM, N_GROUP = 8, 16, 2
CONV_DIM = D_INNER + 2 * N_GROUP * D_STATE
MIXER_TENSORS = {
    "attn_norm.weight",
    "ssm_in.weight",
    "ssm_conv1d.weight",
    "ssm_conv1d.bias",
    "ssm_dt.bias",
    "ssm_a",
    "ssm_d",
    "ssm_norm.weight",
    "ssm_out.weight",
}


# --- the fixture itself ---------------------------------------------------------------------------


def test_the_converter_wrote_mamba2(tiny_model: Callable) -> None:
    ckpt = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    md = ckpt.metadata
    assert md["general.architecture"] == "mamba2"
    assert md["mamba2.ssm.group_count"] == N_GROUP
    assert md["mamba2.ssm.time_step_rank"] == N_HEAD  # the head count
    names = set(ckpt.tensors.names())
    for i in range(N_LAYER):
        have = {n.removeprefix(f"blk.{i}.") for n in names if n.startswith(f"blk.{i}.")}
        assert have == MIXER_TENSORS, (i, sorted(have ^ MIXER_TENSORS))
        assert ckpt.tensors.info(f"blk.{i}.ssm_a").shape == (N_HEAD, 1)
        assert ckpt.tensors.info(f"blk.{i}.ssm_norm.weight").shape == (N_GROUP, D_INNER // 2)
    assert "output.weight" in names  # untied


# --- the host body (numpy) ------------------------------------------------------------------------


def test_config_and_layer_shape(tiny_model: Callable) -> None:
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "hf")))
    assert hf == gg
    m = gg.ext.mamba
    assert m is not None and m.version2
    assert (m.d_inner, m.d_state, m.conv_kernel, m.dt_rank, m.n_group) == (
        D_INNER,
        D_STATE,
        D_CONV,
        N_HEAD,
        N_GROUP,
    )
    assert m.conv_dim == CONV_DIM
    for i in range(gg.n_layer):
        shape = gg.layer_shape(i)
        assert (shape.mixer, shape.ffn, shape.n_head_kv) == ("mamba2", "none", 0)
        assert gg.is_recurrent(i)
    assert gg.layer_pattern() == f"MAMBA2 x{N_LAYER}"
    per_layer = 4 * ((D_CONV - 1) * CONV_DIM + D_INNER * D_STATE)
    assert gg.recurrent_state_bytes() == N_LAYER * per_layer


def test_info_shows_the_model(tiny_model: Callable) -> None:
    result = frink("info", _path(tiny_model, NAME, "gguf"))
    assert result.returncode == 0, result.describe()
    out = result.stdout
    assert "layers:         3 (MAMBA2 x3)" in out
    assert "mamba2:         inner 128, state 16, 8 heads x 16, 2 B/C groups, conv 4" in out
    assert "blk.2   mamba2 (8 heads, 128 x 16) + no ffn" in out
    assert "attention:" not in out
    metal = frink("info", _path(tiny_model, NAME, "hf"), "--backend", "metal")
    assert "metal takes 3 of 3 layers" in metal.stdout, metal.describe()
    cuda = frink("info", _path(tiny_model, NAME, "gguf"), "--backend", "cuda", "--json")
    data = json.loads(cuda.stdout)
    refusals = [e["refusal"] for e in data["layers"]]
    assert len(refusals) == N_LAYER
    assert all("selective_scan: not implemented" in r for r in refusals), refusals
    assert data["mamba"]["n_group"] == N_GROUP


# --- the state: the SSD recurrence in float64 -----------------------------------------------------


def _ssd_loop(
    tiny_model: Callable, tokens: list[int]
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The whole model one token at a time in float64, from the GGUF's tensors and the
    Mamba-2 paper's SSD recurrence, per head h (group g = h // (n_head / G)):
    dt_h = softplus(dt_h + dt_bias_h), h_state = exp(dt_h A_h) h_state + dt_h x_h B_g^T,
    y_h = h_state C_g + D_h x_h; then y * silu(z), RMS-normed per group times the norm
    weight. Returns (last logits, per layer: the last K-1 conv inputs, the final state
    [n_head, head_dim, d_state])."""
    ckpt = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    eps = float(ckpt.metadata["mamba2.attention.layer_norm_rms_epsilon"])

    def t(n: str) -> np.ndarray:
        return ckpt.tensors.load(n).astype(np.float64)

    def rms(v: np.ndarray) -> np.ndarray:
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)

    def silu(v: np.ndarray) -> np.ndarray:
        return v / (1.0 + np.exp(-v))

    emb, out_w = t("token_embd.weight"), t("output.weight")
    L = [{k: t(f"blk.{i}.{k}") for k in MIXER_TENSORS} for i in range(N_LAYER)]
    history = [np.zeros((D_CONV - 1, CONV_DIM)) for _ in range(N_LAYER)]
    state = [np.zeros((N_HEAD, HEAD_DIM, D_STATE)) for _ in range(N_LAYER)]
    per_group = N_HEAD // N_GROUP
    logits = np.zeros(0)
    for tok in tokens:
        r = emb[tok].copy()
        for i, w in enumerate(L):
            u = rms(r) * w["attn_norm.weight"]
            proj = w["ssm_in.weight"] @ u
            z, xbc_in, dt = (
                proj[:D_INNER],
                proj[D_INNER : D_INNER + CONV_DIM],
                proj[D_INNER + CONV_DIM :],
            )
            window = np.vstack([history[i], xbc_in])  # [K, conv_dim], oldest first
            history[i] = window[1:]
            xbc = silu((window * w["ssm_conv1d.weight"].T).sum(0) + w["ssm_conv1d.bias"])
            x = xbc[:D_INNER].reshape(N_HEAD, HEAD_DIM)
            B = xbc[D_INNER : D_INNER + N_GROUP * D_STATE].reshape(N_GROUP, D_STATE)
            C = xbc[D_INNER + N_GROUP * D_STATE :].reshape(N_GROUP, D_STATE)
            dt = np.log1p(np.exp(dt + w["ssm_dt.bias"]))
            y = np.zeros((N_HEAD, HEAD_DIM))
            for h in range(N_HEAD):
                g = h // per_group
                decay = np.exp(dt[h] * w["ssm_a"][h, 0])
                state[i][h] = decay * state[i][h] + dt[h] * np.outer(x[h], B[g])
                y[h] = state[i][h] @ C[g] + w["ssm_d"][h, 0] * x[h]
            y = y.reshape(D_INNER) * silu(z)
            y = (rms(y.reshape(N_GROUP, -1)) * w["ssm_norm.weight"]).reshape(D_INNER)
            r = r + w["ssm_out.weight"] @ y
        logits = out_w @ (rms(r) * t("output_norm.weight"))
    return logits, history, state


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
def test_state_after_a_prompt_matches_the_ssd_loop(step: bool, tiny_model: Callable) -> None:
    tokens = _tokens(tiny_model, NAME)[:70]  # past one 64-token scan chunk
    want_logits, want_conv, want_h = _ssd_loop(tiny_model, tokens)
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    last, cache = _last_logits(m, tokens, 80, step)
    assert np.max(np.abs(last - want_logits)) <= 1e-4
    for i in range(N_LAYER):
        conv, state = cache.conv_state[i], cache.delta_state[i]
        assert conv is not None and state is not None
        assert conv.shape == (D_CONV - 1, CONV_DIM) and state.shape == (D_INNER, D_STATE)
        np.testing.assert_allclose(conv, want_conv[i], rtol=0, atol=1e-5)
        np.testing.assert_allclose(state, want_h[i].reshape(D_INNER, D_STATE), rtol=0, atol=1e-5)
        assert np.abs(state).max() > 1e-2  # a state that carries something


def test_prefill_is_exact_against_stepping(tiny_model: Callable) -> None:
    """A prefill split anywhere (the second part across the 64-token chunk boundary), then
    decode rows, gives the logits and state of the same tokens stepped one at a time."""
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    tokens = _tokens(tiny_model, NAME)
    got, want, split, stepped = _split_against_stepped(m, tokens, (13, 75), 96)
    assert _max_diff(got, want) <= 1e-5
    for a, b in zip(split.delta_state, stepped.delta_state):
        assert a is not None and b is not None
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_a_grouped_scan_across_chunks_equals_token_steps() -> None:
    """The host scan with Mamba-2's shapes (a per-channel scalar decay [d_inner, 1], B/C in
    groups) over a prompt longer than several chunks gives what token steps give."""
    from frink_cli.backends.host.ssm import CHUNK, selective_scan

    rng = np.random.default_rng(0)
    T, di, G, ds = 2 * CHUNK + 22, 32, 4, 8
    x, dt = rng.standard_normal((T, di), np.float32), rng.random((T, di), np.float32)
    a = -rng.random((di, 1), np.float32)
    b = rng.standard_normal((T, G, ds), np.float32)
    c = rng.standard_normal((T, G, ds), np.float32)
    h0 = rng.standard_normal((di, ds), np.float32)
    y, h = selective_scan(x, dt, a, b, c, h0)
    s, ys = h0, []
    for t in range(T):
        yt, s = selective_scan(x[t : t + 1], dt[t : t + 1], a, b[t : t + 1], c[t : t + 1], s)
        ys.append(yt)
    np.testing.assert_allclose(y, np.concatenate(ys), rtol=0, atol=1e-6)
    np.testing.assert_allclose(h, s, rtol=0, atol=1e-6)
    # Channel 9 is in group 1 (8 channels a group): its output reads group 1's C only.
    hh = h0[9].astype(np.float64)
    for t in range(3):
        hh = np.exp(dt[t, 9] * a[9, 0]) * hh + dt[t, 9] * x[t, 9] * b[t, 1]
    np.testing.assert_allclose(y[2, 9], hh @ c[2, 1], rtol=1e-5)


# --- every piece of the block matters -------------------------------------------------------------


@pytest.mark.parametrize("norm", ["none", "whole width"])
def test_the_grouped_norm_matters(
    norm: str, tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gated norm dropped, or taken over all of d_inner instead of per group (the only
    weightless rms_norm the mamba2 block asks for), moves the logits past FAR."""
    real = HostOps.rms_norm_

    def patched(self: HostOps, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
        if w is not None:
            return real(self, x, w, eps)
        if norm == "none":
            return x
        T = x.shape[0]
        return real(self, x.reshape(T, -1), None, eps).reshape(x.shape)

    monkeypatch.setattr(HostOps, "rms_norm_", patched)
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    tokens = np.asarray(_tokens(tiny_model, NAME))
    got = m.decoder.step(tokens, m.decoder.new_cache(len(tokens)), all_logits=True)
    for key in REFERENCES:
        assert _max_diff(got, tiny_model(NAME).ref[key]) > FAR, f"norm {norm} matches {key}"
