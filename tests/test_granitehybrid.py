"""Granite 4.0-H (`granitehybrid`: GraniteMoeHybridForCausalLM) against transformers and
llama.cpp.

Why: the first stack mixing Mamba-2 layers with attention layers, every layer followed by
an FFN (GraniteMoE's experts + ungated shared expert, or shared_mlp alone as the dense
FFN), under Granite's multipliers and with NoPE attention. A layer's kind comes from the
GGUF's per-layer head_count_kv (0: Mamba-2), and the metal backend must run the mixed stack
as one traced graph, one submission per decode token.

Two fixtures: `granitehybrid` (MAMBA2 ATTN MAMBA2 MAMBA2 ATTN, MoE + shared expert, tied)
and `granitehybrid_dense` (MAMBA2 ATTN MAMBA2 MAMBA2, no experts, untied), 80-token
prompts past the host scan's and metal's 64-token prefill chunks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

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
    configured,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError
from frink_cli.model.weights import ModelWeights

NAMES = ("granitehybrid", "granitehybrid_dense")
KINDS = {
    "granitehybrid": ("mamba2", "attention", "mamba2", "mamba2", "attention"),
    "granitehybrid_dense": ("mamba2", "attention", "mamba2", "mamba2"),
}


def _mamba_layers(name: str) -> list[int]:
    return [i for i, k in enumerate(KINDS[name]) if k == "mamba2"]


# --- the fixtures themselves ----------------------------------------------------------------------


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
def test_the_converter_wrote_granitehybrid(name: str, tiny_model: Callable) -> None:
    ckpt = open_checkpoint(_path(tiny_model, name, "gguf"))
    md = ckpt.metadata
    assert md["general.architecture"] == "granitehybrid"
    kv = [int(v) for v in md["granitehybrid.attention.head_count_kv"]]
    assert kv == [0 if k == "mamba2" else 2 for k in KINDS[name]]
    assert md["granitehybrid.rope.scaling.finetuned"] is False  # NoPE
    names = set(ckpt.tensors.names())
    for i, kind in enumerate(KINDS[name]):
        assert (f"blk.{i}.ssm_in.weight" in names) == (kind == "mamba2")
        assert (f"blk.{i}.attn_q.weight" in names) == (kind == "attention")
        assert (f"blk.{i}.ffn_gate_inp.weight" in names) == (name == "granitehybrid")


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


@pytest.mark.parametrize("name", NAMES)
def test_config_and_layer_shapes(name: str, tiny_model: Callable) -> None:
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "hf")))
    assert hf == gg
    m = gg.ext.mamba
    assert m is not None and m.version2
    assert (m.d_inner, m.d_state, m.dt_rank, m.n_group) == (128, 16, 8, 2)
    assert gg.ext.no_rope
    assert (gg.ext.embd_scale, gg.ext.residual_scale, gg.ext.logit_scale) == pytest.approx(
        (12.0 if name == "granitehybrid_dense" else 0.35, 0.3, 8.0)
    )
    assert gg.attn_scale == pytest.approx(0.7)
    moe = name == "granitehybrid"
    for i, kind in enumerate(KINDS[name]):
        shape = gg.layer_shape(i)
        assert shape.mixer == kind
        assert shape.ffn == ("moe" if moe else "dense")
        assert shape.n_head_kv == (0 if kind == "mamba2" else 2)
        assert gg.is_recurrent(i) == (kind == "mamba2")
    if moe:
        assert gg.ext.moe is not None
        assert (gg.ext.moe.n_expert, gg.ext.moe.n_expert_used, gg.ext.moe.n_ff_exp) == (4, 2, 32)
        assert (gg.ext.moe.n_ff_shexp, gg.ext.moe.shared_gate) == (48, False)
    else:
        assert gg.ext.moe is None and gg.n_ff == 48
    per_layer = 4 * (3 * (128 + 2 * 2 * 16) + 128 * 16)
    assert gg.recurrent_state_bytes() == len(_mamba_layers(name)) * per_layer


@pytest.mark.parametrize("name", NAMES)
def test_hf_dir_tensors_equal_the_converters(name: str, tiny_model: Callable) -> None:
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
    for key in (
        "attention.head_count_kv",
        "rope.scaling.finetuned",
        "context_length",
        "ssm.conv_kernel",
        "ssm.inner_size",
        "ssm.state_size",
        "ssm.time_step_rank",
        "ssm.group_count",
        "embedding_scale",
        "residual_scale",
        "attention.scale",
        "logit_scale",
    ):
        k = f"granitehybrid.{key}"
        assert k in hf, f"{k} missing from the HF dir's metadata"
        want = gg[k]
        if isinstance(want, float):
            assert hf[k] == pytest.approx(want), k
        else:
            assert list(np.atleast_1d(hf[k])) == list(np.atleast_1d(want)), k


def test_info_shows_the_model(tiny_model: Callable) -> None:
    result = frink("info", _path(tiny_model, "granitehybrid", "gguf"))
    assert result.returncode == 0, result.describe()
    out = result.stdout
    assert "layers:         5 (MAMBA2 x1 ATTN x1 MAMBA2 x2 ATTN x1)" in out
    assert "positions:      none (NoPE" in out
    assert "mamba2:         inner 128, state 16, 8 heads x 16, 2 B/C groups, conv 4" in out
    assert "attention:" in out and "experts:" in out
    assert "blk.0   mamba2 (8 heads, 128 x 16) + moe ffn 4x32" in out
    metal = frink("info", _path(tiny_model, "granitehybrid", "hf"), "--backend", "metal")
    assert "metal takes 5 of 5 layers" in metal.stdout, metal.describe()
    cuda = frink(
        "info", _path(tiny_model, "granitehybrid_dense", "gguf"), "--backend", "cuda", "--json"
    )
    refusals = [e["refusal"] for e in json.loads(cuda.stdout)["layers"]]
    assert [r.split(", ")[0] for r in refusals] == [
        "mixer mamba2",
        "no_rope not carried",
        "mixer mamba2",
        "mixer mamba2",
    ]


# --- the recurrent state in a mixed stack ---------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_prefill_is_exact_against_stepping(name: str, tiny_model: Callable) -> None:
    """A prefill split anywhere (its second part across the 64-token chunk boundary), then
    decode rows, gives the logits and the mamba states of the same tokens stepped."""
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    tokens = _tokens(tiny_model, name)
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
    for i in _mamba_layers(name):
        a, b = split.delta_state[i], stepped.delta_state[i]
        assert a is not None and b is not None and np.abs(a).max() > 1e-2
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_truncating_a_hybrid_cache_is_refused(tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, "granitehybrid", "gguf"))
    tokens = _tokens(tiny_model, "granitehybrid")[:12]
    cache = m.decoder.new_cache(32)
    first = m.decoder.step(np.asarray(tokens), cache)
    with pytest.raises(FrinkError, match="mamba2 selective scan"):
        cache.truncate(len(tokens) - 1)
    assert cache.n_past == len(tokens)
    cache.truncate(0)
    np.testing.assert_array_equal(m.decoder.step(np.asarray(tokens), cache), first)


# --- every piece matters --------------------------------------------------------------------------

CONFIG_VARIANTS: dict[str, tuple[str, dict]] = {
    "no residual multiplier": ("granitehybrid", {"residual_scale": None}),
    "no embedding multiplier": ("granitehybrid_dense", {"embd_scale": None}),
    "no logit scale": ("granitehybrid", {"logit_scale": None}),
    "default attention scale": ("granitehybrid", {"attn_scale": 0.25}),
    "rope instead of NoPE": ("granitehybrid", {"no_rope": False}),
}


@pytest.mark.parametrize("variant", list(CONFIG_VARIANTS))
def test_each_decoration_moves_the_graph(variant: str, tiny_model: Callable) -> None:
    name, change = CONFIG_VARIANTS[variant]
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    off = Decoder(configured(m.config, **change), m.decoder.host.w)
    tokens = np.asarray(_tokens(tiny_model, name))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    for key in REFERENCES:
        assert _max_diff(got, tiny_model(name).ref[key]) > FAR, f"{variant} still matches {key}"


def test_the_shared_expert_and_the_gated_norm_matter(tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, "granitehybrid", "gguf"))
    w = m.decoder.host.w
    tokens = np.asarray(_tokens(tiny_model, "granitehybrid"))

    def run(layers: list) -> np.ndarray:
        off = Decoder(m.config, ModelWeights(w.token_embd, w.output_norm, w.output, None, layers))
        return off.step(tokens, off.new_cache(len(tokens)), all_logits=True)

    no_shared = [
        dataclasses.replace(
            lw, moe=dataclasses.replace(lw.moe, down_shexp=_zeroed(lw.moe.down_shexp))
        )
        for lw in w.layers
    ]
    flat_norm = [
        lw
        if lw.mamba2 is None
        else dataclasses.replace(
            lw, mamba2=dataclasses.replace(lw.mamba2, norm=np.ones_like(lw.mamba2.norm))
        )
        for lw in w.layers
    ]
    for what, layers in (("no shared expert", no_shared), ("no gated norm weight", flat_norm)):
        got = run(layers)
        for key in REFERENCES:
            assert _max_diff(got, tiny_model("granitehybrid").ref[key]) > FAR, (what, key)


def _zeroed(lin):  # type: ignore[no-untyped-def]
    return dataclasses.replace(lin, w=np.zeros_like(lin.w))


# --- metal (MLX; its CPU device on Linux) ---------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", NAMES)
def test_metal_matches_references(name: str, source: str, step: bool, tiny_model: Callable) -> None:
    """The mixed stack (mamba2 and attention layers, their FFNs, the head) as one traced
    graph per chunk."""
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
    """After a prompt past metal's 64-row chunk and decode steps, the device's mamba states
    and K/V rows, back on the host cache at commit, are the host body's."""
    pytest.importorskip("mlx.core")
    path = _path(tiny_model, "granitehybrid", "gguf")
    host, dev = frink_cli.load(path), frink_cli.load(path, backend="metal")
    tokens = _tokens(tiny_model, "granitehybrid")
    caches, last = [], []
    for m in (host, dev):
        cache = m.decoder.new_cache(96)
        m.decoder.step(np.asarray(tokens[:72]), cache)
        for t in tokens[72:]:
            out = m.decoder.step(np.asarray([t]), cache)
        caches.append(cache)
        last.append(out)
    for i in _mamba_layers("granitehybrid"):
        for a, b in (
            (caches[0].delta_state[i], caches[1].delta_state[i]),
            (caches[0].conv_state[i], caches[1].conv_state[i]),
        ):
            assert a is not None and b is not None
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    assert _max_diff(last[0], last[1]) <= 1e-4
    _assert_device_ran(dev, "granitehybrid metal")


# --- cuda: what it does not carry, refused by name ------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_cuda_refuses_by_name(
    name: str, tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mamba2 layers by their scan (an op the stack lacks), the attention layers by MoE's
    router; the dense model's NoPE attention layers are the stack's (no op of theirs is
    refused); the host body runs the rest, matching both references."""
    from frink_cli.backends.cupy.eligibility import MOE, layer_reasons

    path = _path(tiny_model, name, "gguf")
    ckpt = open_checkpoint(path)
    cfg = config_from_checkpoint(ckpt)
    for i, kind in enumerate(KINDS[name]):
        reasons = layer_reasons(cfg, i, ckpt)
        if kind == "mamba2":
            assert "selective_scan: not implemented" in reasons
        elif name == "granitehybrid":
            assert MOE in reasons
        else:
            assert reasons == []
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    m = frink_cli.load(path, backend="cuda")
    got = m.logits(_tokens(tiny_model, name))
    _against_references(got, tiny_model(name).ref, f"{name} cuda (host body)")
    ledger = m.decoder.backend.ledger
    assert (ledger.total() == 0) == (name == "granitehybrid") and not ledger.failures
