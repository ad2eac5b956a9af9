"""OpenAI gpt-oss (`gpt-oss`; HF `gpt_oss`) against transformers and llama.cpp.

Why: gpt-oss brings decorations no other architecture has -- a learned sink logit per head
in every softmax, biases on the router and on every expert, SwiGLU-OAI experts (a clamp at
7, alpha 1.702, +1 on the up branch), sliding-window layers that keep the YaRN scaling --
besides Q/K/V/O biases and a softmax over the top-k router logits. The fixture
(scripts/make_tiny_models.py, "gpt_oss") draws each of them so it matters: sinks around 1,
expert gate/up rows wide enough for the clamp to bite, 40 tokens against a window of 6.

What is checked: the references agree; frink from the GGUF and from the HF dir, batched and
one row at a time, on numpy and metal (the device ran; one submission per decode token),
against both references (2e-3, identical argmax); llama.cpp's 24 greedy decode steps, token
for token; the HF reader gives exactly the converter's tensors and metadata; each
decoration switched off moves the logits far from both references; cuda refuses the layers
by the MoE name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from model_checks import (
    FAR,
    REF_TOL,
    REFERENCES,
    SOURCES,
    _against_references,
    _assert_device_ran,
    _assert_greedy_matches_llamacpp,
    _assert_one_submission_per_token,  # noqa: I001 - tests/ on the path, as conftest's
    _compare,
    _decode_after_prefill,
    _max_diff,
    _path,
    _tokens,
    configured,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.backends.host import ffn
from frink_cli.decoder import Decoder

NAME = "gpt_oss"


def test_references_agree(tiny_model: Callable) -> None:
    ref = tiny_model(NAME).ref
    assert "logits_llamacpp" in ref, "llama.cpp's converter made no GGUF"
    _compare(ref["logits_llamacpp"], ref["logits_hf"], REF_TOL, "llama.cpp vs transformers")
    assert ref["greedy_llamacpp"].shape[0] == 24


def test_the_converter_wrote_gpt_oss(tiny_model: Callable) -> None:
    ck = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    md, names = ck.metadata, set(ck.tensors.names())
    assert md["general.architecture"] == "gpt-oss"
    assert md["gpt-oss.attention.sliding_window"] == 6
    assert md["gpt-oss.expert_count"] == 8 and md["gpt-oss.expert_used_count"] == 4
    assert md["gpt-oss.expert_feed_forward_length"] == 32
    assert md["gpt-oss.rope.scaling.type"] == "yarn"
    for i in range(3):
        for t in (
            "attn_sinks.weight",
            "attn_q.bias",
            "attn_output.bias",
            "post_attention_norm.weight",
            "ffn_gate_inp.bias",
            "ffn_gate_exps.bias",
            "ffn_up_exps.bias",
            "ffn_down_exps.bias",
        ):
            assert f"blk.{i}.{t}" in names, (i, t)


def test_config_reads_the_decorations(tiny_model: Callable) -> None:
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "hf")))
    assert hf == gg
    assert gg.swa_layers == (True, False, True) and gg.sliding_window == 6
    assert gg.ext.attn_sinks and gg.ext.swa_rope_scaled and gg.ffn_act == "swiglu_oai"
    assert gg.rope_type == "neox" and gg.ext.ffn_norm_tensor == "post_attention_norm"
    assert gg.rope_scaling is not None and gg.rope_scaling.kind == "yarn"
    # Every layer, sliding or not, rotates with the YaRN scale (1 / factor 4).
    assert {gg.layer_shape(i).rope_scale for i in range(3)} == {0.25}
    assert gg.ext.moe is not None and all(gg.ext.moe.layers) and gg.ext.moe.biases
    assert (gg.ext.moe.n_expert, gg.ext.moe.n_expert_used, gg.ext.moe.n_ff_exp) == (8, 4, 32)
    assert gg.ext.moe.norm_topk and gg.ext.moe.gating == "softmax"


def test_hf_dir_tensors_equal_the_converters(tiny_model: Callable) -> None:
    """The experts transposed and de-interleaved (gate even rows, up odd), their biases
    likewise, sinks named attn_sinks.weight: what the converter wrote, value for value."""
    hf = open_checkpoint(_path(tiny_model, NAME, "hf"))
    gg = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    assert sorted(hf.tensors.names()) == sorted(gg.tensors.names())
    for n in gg.tensors.names():
        a, b = hf.tensors.load(n), gg.tensors.load(n)
        assert a.shape == b.shape, n
        assert np.array_equal(a, b), n


def test_hf_dir_metadata_matches_the_converters(tiny_model: Callable) -> None:
    hf = open_checkpoint(_path(tiny_model, NAME, "hf")).metadata
    gg = open_checkpoint(_path(tiny_model, NAME, "gguf")).metadata
    for key, value in gg.items():
        if not key.startswith("gpt-oss."):
            continue
        have = hf.get(key)
        assert have is not None, f"{key} missing from the HF dir's metadata"
        if isinstance(value, float):
            assert have == pytest.approx(value), key
        else:
            assert list(np.atleast_1d(have)) == list(np.atleast_1d(value)), key


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("source", SOURCES)
def test_numpy_matches_references(source: str, step: bool, tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, NAME, source))
    got = m.logits(_tokens(tiny_model, NAME), step=step)
    assert got.shape[0] > 6 * m.config.sliding_window  # well past the window
    _against_references(got, tiny_model(NAME).ref, f"numpy({source}, {step=})")


@pytest.mark.parametrize("source", SOURCES)
def test_numpy_greedy_matches_llamacpp(source: str, tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, NAME, source))
    _assert_greedy_matches_llamacpp(m, tiny_model(NAME).ref, f"{source} greedy", min_steps=24)


# --- every decoration matters ---------------------------------------------------------------------


def _strip(lw, **fields):
    """A layer's weights with some fields changed, nested MoE fields as moe__name."""
    moe = {k.removeprefix("moe__"): v for k, v in fields.items() if k.startswith("moe__")}
    top = {k: v for k, v in fields.items() if not k.startswith("moe__")}
    if moe:
        top["moe"] = dataclasses.replace(lw.moe, **moe)
    return dataclasses.replace(lw, **top)


def _no_bias(lin):
    return dataclasses.replace(lin, b=None)


# name -> (config changes, per-layer weight changes)
OFF: dict[str, tuple[dict, Callable | None]] = {
    "sinks": ({"attn_sinks": False}, None),
    "swa_rope_scale": ({"swa_rope_scaled": False}, None),
    "sliding_window": ({"sliding_window": None, "swa_layers": (False,) * 3}, None),
    "qkv_bias": ({}, lambda lw: _strip(lw, qkv=_no_bias(lw.qkv))),
    "o_bias": ({}, lambda lw: _strip(lw, wo=_no_bias(lw.wo))),
    "router_bias": ({}, lambda lw: _strip(lw, moe__inp=_no_bias(lw.moe.inp))),
    "expert_gate_up_bias": ({}, lambda lw: _strip(lw, moe__gate_up_exps_b=None)),
    "expert_down_bias": ({}, lambda lw: _strip(lw, moe__down_exps_b=None)),
}


@pytest.mark.parametrize("decoration", list(OFF))
def test_each_decoration_moves_the_logits(decoration: str, tiny_model: Callable) -> None:
    changes, layer_change = OFF[decoration]
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    w = m.decoder.host.w
    if layer_change is not None:
        w = dataclasses.replace(w, layers=[layer_change(lw) for lw in w.layers])
    off = Decoder(configured(m.config, **changes), w)
    tokens = np.asarray(_tokens(tiny_model, NAME))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    for key in REFERENCES:
        assert _max_diff(got, tiny_model(NAME).ref[key]) > FAR, f"{decoration} off matches {key}"


@pytest.mark.parametrize("what", ["clamp", "alpha"])
def test_swiglu_oai_constants_matter(
    what: str, tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clamp at 7 bites on the fixture's experts, and alpha is not 1 (plain SwiGLU)."""
    if what == "clamp":
        monkeypatch.setattr(ffn, "SWIGLU_OAI_LIMIT", 1e30)
    else:
        monkeypatch.setattr(ffn, "SWIGLU_OAI_ALPHA", 1.0)
    got = frink_cli.load(_path(tiny_model, NAME, "gguf")).logits(_tokens(tiny_model, NAME))
    for key in REFERENCES:
        assert _max_diff(got, tiny_model(NAME).ref[key]) > FAR, f"{what} off matches {key}"


# --- metal (MLX; its CPU device on Linux) ---------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("source", SOURCES)
def test_metal_matches_references(source: str, step: bool, tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    m = frink_cli.load(_path(tiny_model, NAME, source), backend="metal")
    assert m.backend_name == "metal"
    got = m.logits(_tokens(tiny_model, NAME), step=step)
    _against_references(got, tiny_model(NAME).ref, f"metal({source}, {step=})")
    _assert_device_ran(m, "gpt_oss metal")


def test_metal_decode_after_prefill_matches_llamacpp(tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    ref = tiny_model(NAME).ref
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"), backend="metal")
    got = _decode_after_prefill(m, ref)
    _compare(got, ref["greedy_logits_llamacpp"], REF_TOL, "metal decode steps")
    _assert_device_ran(m, "gpt_oss metal")


def test_metal_one_submission_per_token(tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    _assert_one_submission_per_token(
        frink_cli.load(_path(tiny_model, NAME, "gguf"), backend="metal")
    )


# --- cuda: the layers are refused by name, the host body answers ----------------------------------


def test_cuda_refuses_by_name_and_matches(
    tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    from frink_cli.backends.cupy import eligibility

    cfg = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "gguf")))
    for layer in range(cfg.n_layer):
        reasons = eligibility.layer_reasons(cfg, layer)
        assert reasons[0] == eligibility.SINKS and eligibility.MOE in reasons, reasons
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"), backend="cuda")
    _against_references(m.logits(_tokens(tiny_model, NAME)), tiny_model(NAME).ref, "cuda-numpy")
    ledger = m.decoder.backend.ledger
    assert set(ledger.refusals) == {eligibility.SINKS} and not ledger.failures
