"""Granite 4.0-H (`granitehybrid`: GraniteMoeHybridForCausalLM) against transformers and
llama.cpp.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

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
    REFERENCES,
    _against_references,
    _max_diff,
    _path,
    _tokens,
    assert_split_states_equal_stepped,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.decoder import Decoder
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
    # The mamba2 layers are refused by the scan; the NoPE attention layer (no rope call in
    # its trace) is taken.
    assert [r is None or "selective_scan: not implemented" in r for r in refusals] == [True] * 4
    assert [r is None for r in refusals] == [False, True, False, False]


# --- the recurrent state in a mixed stack ---------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_prefill_is_exact_against_stepping(name: str, tiny_model: Callable) -> None:
    """A prefill split anywhere (its second part across the 64-token chunk boundary), then
    decode rows, gives the logits and the mamba states of the same tokens stepped."""
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    tokens = _tokens(tiny_model, name)
    assert_split_states_equal_stepped(m, tokens, _mamba_layers(name))


# --- every piece matters --------------------------------------------------------------------------


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
