"""Falcon-H1 (`falcon-h1`: FalconH1ForCausalLM) against transformers and llama.cpp.

Why: the first layer with two mixers side by side: attention and a Mamba-2 mixer read the
same normed rows and their outputs are summed (mixer "attention+mamba2"), so one layer's
cache slot holds K/V rows and a recurrent state together, and the metal backend carries
both through one traced graph. Falcon-H1's nine multipliers are folded into the weights by
llama.cpp's converter; frink's HF reader folds them the same way, and each one matters.

The fixtures: `falcon_h1`, 3 layers, every multiplier away from 1, mamba_rms_norm off (as
released models); `falcon_h1_norm`, 2 layers with the gated grouped norm on; 80-token
prompts past the host scan's and metal's 64-token prefill chunks.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from frink_subprocess import frink
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

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError
from frink_cli.model.weights import ModelWeights

NAME = "falcon_h1"
NAMES = ("falcon_h1", "falcon_h1_norm")
N_LAYER = 3


# --- the fixture itself ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_references_agree(name: str, tiny_model: Callable) -> None:
    """transformers (its torch path: no mamba-ssm kernels here) and llama.cpp compute the
    same model (else neither can judge frink)."""
    ref = tiny_model(name).ref
    assert "logits_llamacpp" in ref, "llama.cpp's converter made no GGUF"
    _compare(ref["logits_llamacpp"], ref["logits_hf"], REF_TOL, "llama.cpp vs transformers")
    assert ref["greedy_llamacpp"].shape[0] >= 24
    assert len(ref["tokens"]) > 64


@pytest.mark.parametrize("name", NAMES)
def test_the_converter_wrote_falcon_h1(name: str, tiny_model: Callable) -> None:
    ckpt = open_checkpoint(_path(tiny_model, name, "gguf"))
    md = ckpt.metadata
    assert md["general.architecture"] == "falcon-h1"
    assert md["falcon-h1.ssm.group_count"] == 2 and md["falcon-h1.ssm.time_step_rank"] == 8
    names = set(ckpt.tensors.names())
    for i in range(int(md["falcon-h1.block_count"])):
        for t in ("attn_q.weight", "ssm_in.weight", "ffn_gate.weight", "ffn_norm"):
            assert f"blk.{i}.{t}" in names, t  # the FFN norm without a .weight suffix
        # mamba_rms_norm: the gated norm's weight, per group
        assert (f"blk.{i}.ssm_norm.weight" in names) == (name == "falcon_h1_norm")


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
    ref = tiny_model(name).ref
    m = frink_cli.load(_path(tiny_model, name, source))
    _assert_greedy_matches_llamacpp(m, ref, "decode", min_steps=24, min_prompt=PREFILL_CHUNK + 1)


def test_config_and_layer_shape(tiny_model: Callable) -> None:
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "hf")))
    assert hf == gg
    m = gg.ext.mamba
    assert m is not None and m.version2 and m.parallel
    assert (m.d_inner, m.d_state, m.dt_rank, m.n_group) == (128, 16, 8, 2)
    assert gg.rope_type == "neox" and gg.rope_base == 50000.0
    for i in range(N_LAYER):
        shape = gg.layer_shape(i)
        assert (shape.mixer, shape.ffn, shape.n_head, shape.n_head_kv, shape.n_ff) == (
            "attention+mamba2",
            "dense",
            4,
            2,
            96,
        )
        assert gg.is_recurrent(i)
    assert gg.layer_pattern() == "ATTN+MAMBA2 x3"


@pytest.mark.parametrize("name", NAMES)
def test_hf_dir_tensors_equal_the_converters(name: str, tiny_model: Callable) -> None:
    """The HF reader folds the multipliers into the weights as the converter does, in the
    same f32 order: the same tensors (A's exp aside, an ulp apart between NumPy and torch)."""
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


def test_hf_dir_metadata_matches_the_converters(tiny_model: Callable) -> None:
    hf = open_checkpoint(_path(tiny_model, NAME, "hf")).metadata
    gg = open_checkpoint(_path(tiny_model, NAME, "gguf")).metadata
    for key, value in gg.items():
        if key.startswith("falcon-h1."):
            assert key in hf, f"{key} missing from the HF dir's metadata"
            if isinstance(value, float):
                assert hf[key] == pytest.approx(value), key
            else:
                assert list(np.atleast_1d(hf[key])) == list(np.atleast_1d(value)), key


def test_info_shows_the_model(tiny_model: Callable) -> None:
    result = frink("info", _path(tiny_model, NAME, "gguf"))
    assert result.returncode == 0, result.describe()
    out = result.stdout
    assert "layers:         3 (ATTN+MAMBA2 x3)" in out
    assert "mamba2:         inner 128, state 16, 8 heads x 16, 2 B/C groups, conv 4" in out
    assert "attention:" in out
    metal = frink("info", _path(tiny_model, NAME, "hf"), "--backend", "metal")
    assert "metal takes 3 of 3 layers" in metal.stdout, metal.describe()
    cuda = frink("info", _path(tiny_model, NAME, "gguf"), "--backend", "cuda", "--json")
    refusals = [e["refusal"] for e in json.loads(cuda.stdout)["layers"]]
    assert all(r.startswith("mixer attention+mamba2") for r in refusals), refusals


# --- the state: K/V rows and mamba state in one slot ----------------------------------------------


def test_prefill_is_exact_against_stepping(tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    tokens = _tokens(tiny_model, NAME)
    dec = m.decoder
    stepped = dec.new_cache(96)
    want = np.concatenate([dec.step(np.asarray([t]), stepped) for t in tokens])
    split = dec.new_cache(96)
    got = np.concatenate(
        [
            dec.step(np.asarray(tokens[:13]), split, all_logits=True),
            dec.step(np.asarray(tokens[13:75]), split, all_logits=True),
            *[dec.step(np.asarray([t]), split) for t in tokens[75:]],
        ]
    )
    assert _max_diff(got, want) <= 1e-4
    for i in range(N_LAYER):
        a, b = split.delta_state[i], stepped.delta_state[i]
        assert a is not None and b is not None and np.abs(a).max() > 1e-2
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        n = len(tokens)  # the K/V rows beside the state
        np.testing.assert_allclose(split.k[i][:, :n], stepped.k[i][:, :n], rtol=0, atol=1e-5)
        assert np.abs(split.k[i][:, n - 1]).max() > 1e-2


def test_truncating_is_refused(tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    tokens = _tokens(tiny_model, NAME)[:12]
    cache = m.decoder.new_cache(32)
    first = m.decoder.step(np.asarray(tokens), cache)
    assert cache.has_recurrent_state
    with pytest.raises(FrinkError, match="mamba2 selective scan"):
        cache.truncate(len(tokens) - 1)
    assert cache.n_past == len(tokens)
    cache.truncate(0)
    assert all(not s.any() for s in cache.delta_state if s is not None)
    np.testing.assert_array_equal(m.decoder.step(np.asarray(tokens), cache), first)


def test_a_failed_step_leaves_the_slot_untouched(
    tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that dies in the last layer, after the others wrote their K/V rows and staged
    their mamba state, leaves every slot as it was; the step then runs as if never tried."""
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    tokens = _tokens(tiny_model, NAME)[:10]
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


# --- every piece matters --------------------------------------------------------------------------

MULTIPLIERS = (
    "embedding_multiplier",
    "lm_head_multiplier",
    "key_multiplier",
    "attention_in_multiplier",
    "attention_out_multiplier",
    "ssm_in_multiplier",
    "ssm_out_multiplier",
    "mlp_multipliers",
    "ssm_multipliers",
)


@pytest.mark.parametrize("key", MULTIPLIERS)
def test_each_multiplier_matters(key: str, tiny_model: Callable, tmp_path: Path) -> None:
    """The HF dir with one multiplier (or list of them) set to 1: frink's logits move past
    FAR from both references, so the reader folds each one in."""
    hf = tmp_path / "hf"
    shutil.copytree(_path(tiny_model, NAME, "hf"), hf)
    cfg = json.loads((hf / "config.json").read_text())
    cfg[key] = [1.0] * len(cfg[key]) if isinstance(cfg[key], list) else 1.0
    (hf / "config.json").write_text(json.dumps(cfg))
    got = frink_cli.load(hf).logits(_tokens(tiny_model, NAME))
    for ref in REFERENCES:
        assert _max_diff(got, tiny_model(NAME).ref[ref]) > FAR, f"{key} = 1 still matches {ref}"


@pytest.mark.parametrize("branch", ["attention", "mamba2"])
def test_each_branch_matters(branch: str, tiny_model: Callable) -> None:
    """Either mixer's output dropped from the sum moves the logits past FAR."""
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    w = m.decoder.host.w

    def zeroed(lin):  # type: ignore[no-untyped-def]
        return dataclasses.replace(lin, w=np.zeros_like(lin.w))

    if branch == "attention":
        layers = [dataclasses.replace(lw, wo=zeroed(lw.wo)) for lw in w.layers]
    else:
        layers = [
            dataclasses.replace(
                lw, mamba2=dataclasses.replace(lw.mamba2, out=zeroed(lw.mamba2.out))
            )
            for lw in w.layers
        ]
    off = Decoder(m.config, ModelWeights(w.token_embd, w.output_norm, w.output, None, layers))
    tokens = np.asarray(_tokens(tiny_model, NAME))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    for key in REFERENCES:
        assert _max_diff(got, tiny_model(NAME).ref[key]) > FAR, f"no {branch} matches {key}"


def test_the_gated_norm_matters(tiny_model: Callable) -> None:
    """falcon_h1_norm with its norm weights flattened to ones moves the logits past FAR."""
    m = frink_cli.load(_path(tiny_model, "falcon_h1_norm", "gguf"))
    w = m.decoder.host.w
    layers = [
        dataclasses.replace(
            lw, mamba2=dataclasses.replace(lw.mamba2, norm=np.ones_like(lw.mamba2.norm))
        )
        for lw in w.layers
    ]
    off = Decoder(m.config, ModelWeights(w.token_embd, w.output_norm, w.output, None, layers))
    tokens = np.asarray(_tokens(tiny_model, "falcon_h1_norm"))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    for key in REFERENCES:
        assert _max_diff(got, tiny_model("falcon_h1_norm").ref[key]) > FAR, key


def test_norm_before_gate_is_refused_by_name(tiny_model: Callable, tmp_path: Path) -> None:
    """transformers can norm y before gating it; llama.cpp's graph only gates first."""
    hf = tmp_path / "hf"
    shutil.copytree(_path(tiny_model, "falcon_h1_norm", "hf"), hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(dict(cfg, mamba_norm_before_gate=True)))
    with pytest.raises(FrinkError, match="mamba_norm_before_gate"):
        frink_cli.load(hf)


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


def test_metal_one_submission_per_token(tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"), backend="metal")
    _assert_one_submission_per_token(m)


def test_metal_state_equals_the_host_bodys(tiny_model: Callable) -> None:
    """After a prompt past metal's 64-row chunk and decode steps, the device's K/V rows and
    mamba states (back on the host cache at commit) are the host body's."""
    pytest.importorskip("mlx.core")
    path = _path(tiny_model, NAME, "gguf")
    host, dev = frink_cli.load(path), frink_cli.load(path, backend="metal")
    tokens = _tokens(tiny_model, NAME)
    caches = []
    for m in (host, dev):
        cache = m.decoder.new_cache(96)
        m.decoder.step(np.asarray(tokens[:72]), cache)
        for t in tokens[72:]:
            m.decoder.step(np.asarray([t]), cache)
        caches.append(cache)
    for i in range(N_LAYER):
        for a, b in (
            (caches[0].delta_state[i], caches[1].delta_state[i]),
            (caches[0].conv_state[i], caches[1].conv_state[i]),
            (caches[0].k[i], caches[1].k[i]),
            (caches[0].v[i], caches[1].v[i]),
        ):
            assert a is not None and b is not None and a.shape == b.shape
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    _assert_device_ran(dev, f"{NAME} metal")


# --- cuda: the mixer refused by name --------------------------------------------------------------


def test_cuda_refuses_the_parallel_mixer_by_name(
    tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    from frink_cli.backends.cupy.eligibility import layer_reasons

    path = _path(tiny_model, NAME, "gguf")
    ckpt = open_checkpoint(path)
    cfg = config_from_checkpoint(ckpt)
    for i in range(cfg.n_layer):
        assert "selective_scan: not implemented" in layer_reasons(cfg, i, ckpt)
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    m = frink_cli.load(path, backend="cuda")
    got = m.logits(_tokens(tiny_model, NAME))
    _against_references(got, tiny_model(NAME).ref, f"{NAME} cuda (host body)")
    assert m.decoder.backend.ledger.total() == 0
