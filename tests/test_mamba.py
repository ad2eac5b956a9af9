"""Mamba-1 (`mamba`: MambaForCausalLM, and Falcon-Mamba) against transformers and llama.cpp.

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

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import fixture_cache_root
from frink_subprocess import frink
from llama_quantize import llama_quantize
from model_checks import (
    FAR,
    PREFILL_CHUNK,
    REF_TOL,
    REFERENCES,
    SOURCES,
    _against_references,
    _assert_device_ran,
    _assert_greedy_matches_llamacpp,
    _assert_one_submission_per_token,
    _compare,
    _max_diff,
    _path,
    _tokens,
)
from script_loader import load_script

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError
from frink_cli.model.weights import ModelWeights

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
def test_references_agree(name: str, tiny_model: Callable) -> None:
    """transformers and llama.cpp compute the same model (else neither can judge frink)."""
    ref = tiny_model(name).ref
    assert "logits_llamacpp" in ref, "llama.cpp's converter made no GGUF"
    _compare(ref["logits_llamacpp"], ref["logits_hf"], REF_TOL, "llama.cpp vs transformers")
    assert ref["greedy_llamacpp"].shape[0] >= 24


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


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", NAMES)
def test_numpy_matches_references(name: str, source: str, step: bool, tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, name, source))
    got = m.logits(_tokens(tiny_model, name), step=step)
    _against_references(
        got, tiny_model(name).ref, f"{name} numpy({source}, {'step' if step else 'batch'})"
    )


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", NAMES)
def test_numpy_greedy_matches_llamacpp(name: str, source: str, tiny_model: Callable) -> None:
    """The prompt as one batch, then 24 decode steps: llama.cpp's logits at every step and
    its greedy tokens."""
    ref = tiny_model(name).ref
    m = frink_cli.load(_path(tiny_model, name, source))
    _assert_greedy_matches_llamacpp(m, ref, "decode", min_steps=24, min_prompt=PREFILL_CHUNK + 1)


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


@pytest.mark.parametrize("name", NAMES)
def test_hf_dir_tensors_equal_the_converters(name: str, tiny_model: Callable) -> None:
    """The HF reader's map (A = -exp(A_log), the squeezed conv kernel, tied or not) gives
    the tensors llama.cpp's converter wrote: exactly, but for A, whose exp NumPy and torch
    round apart by an ulp."""
    hf = open_checkpoint(_path(tiny_model, name, "hf"))
    gg = open_checkpoint(_path(tiny_model, name, "gguf"))
    assert sorted(hf.tensors.names()) == sorted(gg.tensors.names())
    for n in gg.tensors.names():
        a, b = hf.tensors.load(n), gg.tensors.load(n)
        assert a.shape == b.shape, n
        if n.endswith(".ssm_a"):
            np.testing.assert_allclose(a, b, rtol=2.5e-7, atol=0, err_msg=n)
        else:
            assert np.array_equal(a, b), n


@pytest.mark.parametrize("name", NAMES)
def test_hf_dir_metadata_matches_the_converters(name: str, tiny_model: Callable) -> None:
    hf = open_checkpoint(_path(tiny_model, name, "hf")).metadata
    gg = open_checkpoint(_path(tiny_model, name, "gguf")).metadata
    assert hf["general.architecture"] == "mamba"
    for key, value in gg.items():
        if key.startswith("mamba."):
            assert key in hf, f"{key} missing from the HF dir's metadata"
            if isinstance(value, float):
                assert hf[key] == pytest.approx(value), key
            else:
                assert list(np.atleast_1d(hf[key])) == list(np.atleast_1d(value)), key


def test_info_shows_the_model(tiny_model: Callable) -> None:
    """`frink info`: the mixer's sizes and state instead of attention and rope lines, each
    layer a mamba mixer; metal takes every layer, cuda none (refused by the mixer's name)."""
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
    assert [e["refusal"] for e in data["layers"]] == ["mixer mamba, ffn none"] * 3
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
    cache = m.decoder.new_cache(32)
    if step:
        for tok in tokens:
            last = m.decoder.step(np.asarray([tok]), cache)[-1]
    else:
        last = m.decoder.step(np.asarray(tokens), cache)[-1]
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
    dec = m.decoder
    stepped = dec.new_cache(len(tokens))
    want = np.concatenate([dec.step(np.asarray([t]), stepped) for t in tokens])
    split = dec.new_cache(len(tokens))
    got = np.concatenate(
        [
            dec.step(np.asarray(tokens[:13]), split, all_logits=True),
            dec.step(np.asarray(tokens[13:30]), split, all_logits=True),
            *[dec.step(np.asarray([t]), split) for t in tokens[30:]],
        ]
    )
    assert _max_diff(got, want) <= 1e-5
    for a, b in zip(split.delta_state, stepped.delta_state):
        assert a is not None and b is not None
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_truncating_a_mamba_cache_is_refused(tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, "mamba", "gguf"))
    tokens = _tokens(tiny_model, "mamba")[:12]
    cache = m.decoder.new_cache(32)
    first = m.decoder.step(np.asarray(tokens), cache)
    assert cache.has_recurrent_state
    with pytest.raises(FrinkError, match="mamba selective scan"):
        cache.truncate(len(tokens) - 1)
    assert cache.n_past == len(tokens)  # refused before anything changed
    cache.truncate(len(tokens))  # to where it is: nothing to roll back
    cache.truncate(0)  # back to the start: the state is zero again
    assert all(not s.any() for s in cache.delta_state if s is not None)
    assert all(not s.any() for s in cache.conv_state if s is not None)
    np.testing.assert_array_equal(m.decoder.step(np.asarray(tokens), cache), first)


def test_a_failed_step_leaves_the_mamba_state_untouched(
    tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new state is staged and committed only with the step: a step that dies in the
    last layer, after the others ran, leaves every layer's conv tail and scan state as it
    was, and the step then runs as if it had never been tried."""
    m = frink_cli.load(_path(tiny_model, "mamba", "gguf"))
    tokens = _tokens(tiny_model, "mamba")[:10]
    clean = m.decoder.new_cache(32)
    m.decoder.step(np.asarray(tokens[:8]), clean)
    want = m.decoder.step(np.asarray(tokens[8:]), clean)

    cache = m.decoder.new_cache(32)
    m.decoder.step(np.asarray(tokens[:8]), cache)
    before = [(c.copy(), s.copy()) for c, s in zip(cache.conv_state, cache.delta_state)]
    host = m.decoder.host
    real_layer = host.layer

    def failing(layer, *args, **kwargs):  # type: ignore[no-untyped-def]
        if layer == m.config.n_layer - 1:
            raise RuntimeError("simulated failure in the last layer")
        return real_layer(layer, *args, **kwargs)

    monkeypatch.setattr(host, "layer", failing)
    with pytest.raises(RuntimeError):
        m.decoder.step(np.asarray(tokens[8:]), cache)
    monkeypatch.setattr(host, "layer", real_layer)
    for (c0, s0), c1, s1 in zip(before, cache.conv_state, cache.delta_state):
        assert np.array_equal(c0, c1) and np.array_equal(s0, s1)
    assert cache.n_past == 8
    np.testing.assert_array_equal(m.decoder.step(np.asarray(tokens[8:]), cache), want)


def test_hf_use_bias_is_refused_by_name(tiny_model: Callable, tmp_path: Path) -> None:
    """in_proj/out_proj biases (HF use_bias) are in no llama.cpp mamba graph: refused."""
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(_path(tiny_model, "mamba", "hf"), hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(dict(cfg, use_bias=True)))
    with pytest.raises(FrinkError, match="use_bias"):
        frink_cli.load(hf)


# --- every piece of the block matters -------------------------------------------------------------


def _zeros_like(field: str) -> Callable[[object], dict]:
    return lambda mw: {field: np.zeros_like(getattr(mw, field))}


VARIANTS: dict[str, tuple[str, Callable[[object], dict]]] = {
    "no dt/B/C norms": ("falcon_mamba", lambda mw: dict(dt_norm=None, b_norm=None, c_norm=None)),
    "no D skip": ("mamba", _zeros_like("d")),
    "no conv bias": ("mamba", _zeros_like("conv_b")),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_piece_moves_the_graph(variant: str, tiny_model: Callable) -> None:
    name, change = VARIANTS[variant]
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    w = m.decoder.host.w
    layers = [
        dataclasses.replace(lw, mamba=dataclasses.replace(lw.mamba, **change(lw.mamba)))
        for lw in w.layers
    ]
    off = Decoder(m.config, ModelWeights(w.token_embd, w.output_norm, w.output, None, layers))
    tokens = np.asarray(_tokens(tiny_model, name))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    for key in REFERENCES:
        assert _max_diff(got, tiny_model(name).ref[key]) > FAR, f"{variant} still matches {key}"


# --- metal (MLX; its CPU device on Linux) ---------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", NAMES)
def test_metal_matches_references(name: str, source: str, step: bool, tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    m = frink_cli.load(_path(tiny_model, name, source), backend="metal")
    assert m.backend_name == "metal"
    got = m.logits(_tokens(tiny_model, name), step=step)
    _against_references(
        got, tiny_model(name).ref, f"{name} metal({source}, {'step' if step else 'batch'})"
    )
    _assert_device_ran(m, f"{name} metal")
    assert set(m.decoder.backend.ledger.submissions) == {"mamba-run+lm-head"}


@pytest.mark.parametrize("name", NAMES)
def test_metal_greedy_matches_llamacpp(name: str, tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    ref = tiny_model(name).ref
    m = frink_cli.load(_path(tiny_model, name, "gguf"), backend="metal")
    _assert_greedy_matches_llamacpp(m, ref, "metal decode", min_prompt=PREFILL_CHUNK + 1)
    _assert_device_ran(m, f"{name} metal")


@pytest.mark.parametrize("name", NAMES)
def test_metal_one_submission_per_token(name: str, tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    m = frink_cli.load(_path(tiny_model, name, "gguf"), backend="metal")
    _assert_one_submission_per_token(m)


def test_metal_state_equals_the_host_bodys(tiny_model: Callable) -> None:
    """The device's conv tail and scan state come back to the host cache at commit: after a
    prompt and decode steps they are the host body's."""
    pytest.importorskip("mlx.core")
    path = _path(tiny_model, "mamba", "gguf")
    host, dev = frink_cli.load(path), frink_cli.load(path, backend="metal")
    tokens = _tokens(tiny_model, "mamba")[:20]
    caches = []
    for m in (host, dev):
        cache = m.decoder.new_cache(32)
        m.decoder.step(np.asarray(tokens[:16]), cache)
        for t in tokens[16:]:
            m.decoder.step(np.asarray([t]), cache)
        caches.append(cache)
    for a, b in zip(caches[0].delta_state, caches[1].delta_state):
        assert a is not None and b is not None
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    for a, b in zip(caches[0].conv_state, caches[1].conv_state):
        assert a is not None and b is not None
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    _assert_device_ran(dev, "mamba metal")


# --- cuda: the mixer refused by name --------------------------------------------------------------


def test_cuda_refuses_the_mamba_mixer_by_name(
    tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cuda stack carries no mamba primitive: each layer is refused by the mixer's name
    and the host body runs it, still matching both references."""
    from frink_cli.backends.cupy.eligibility import layer_reasons

    path = _path(tiny_model, "mamba", "gguf")
    ckpt = open_checkpoint(path)
    cfg = config_from_checkpoint(ckpt)
    for i in range(cfg.n_layer):
        assert "selective_scan: not implemented" in layer_reasons(cfg, i, ckpt)
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    m = frink_cli.load(path, backend="cuda")
    got = m.logits(_tokens(tiny_model, "mamba"))
    _against_references(got, tiny_model("mamba").ref, "mamba cuda (host body)")
    assert m.decoder.backend.ledger.total() == 0


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

_make_tiny = load_script("make_tiny_models")
_Q8_0, _FTYPE_Q8_0, _FTYPE_F32 = 8, 7, 0  # ggml's Q8_0 type; llama.cpp's file types


@pytest.fixture(scope="module")
def q8(tiny_model: Callable) -> tuple[Path, dict[str, np.ndarray]]:
    """The mamba fixture quantized to Q8_0 by llama.cpp (ssm_in, ssm_x, ssm_out and the
    embedding; ssm_dt falls back to F16, the conv and vectors stay F32), and llama.cpp's
    logits on it and on its own F32 requant of it (cached beside the tiny models)."""
    src = _path(tiny_model, "mamba", "gguf")
    stamp = json.loads((src.parent / "stamp.json").read_text())
    root = fixture_cache_root() / "quant" / "mamba"
    root.mkdir(parents=True, exist_ok=True)
    key = json.dumps({"fixture": stamp["spec"], "v": 1})
    if (root / "key.json").is_file() and (root / "key.json").read_text() != key:
        for f in root.iterdir():
            f.unlink()
    (root / "key.json").write_text(key)
    path, f32, npz = (root / f"Q8_0{s}" for s in (".gguf", ".f32.gguf", ".npz"))
    if not path.is_file():
        llama_quantize(src, path, _Q8_0, False, _FTYPE_Q8_0)
    if not f32.is_file():
        llama_quantize(path, f32, -1, False, _FTYPE_F32)
    tokens = tiny_model("mamba").ref["tokens"]
    if not npz.is_file():
        np.savez(
            npz,
            quantized=_make_tiny.llama_cpp_logits(path, tokens),
            f32=_make_tiny.llama_cpp_logits(f32, tokens),
        )
    with np.load(npz) as z:
        return path, {k: z[k] for k in z.files}


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
