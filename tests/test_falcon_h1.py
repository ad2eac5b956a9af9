"""Falcon-H1 (`falcon-h1`: FalconH1ForCausalLM) against transformers and llama.cpp.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

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
from fixture_copies import copy_hf_dir
from frink_subprocess import frink
from model_checks import (
    FAR,
    REFERENCES,
    _max_diff,
    _path,
    _tokens,
    assert_split_states_equal_stepped,
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
    assert all("selective_scan: not implemented" in r for r in refusals), refusals


# --- the state: K/V rows and mamba state in one slot ----------------------------------------------


def test_prefill_is_exact_against_stepping(tiny_model: Callable) -> None:
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    tokens = _tokens(tiny_model, NAME)
    split, stepped = assert_split_states_equal_stepped(m, tokens, range(N_LAYER))
    for i in range(N_LAYER):
        n = len(tokens)  # the K/V rows beside the state
        np.testing.assert_allclose(split.k[i][:, :n], stepped.k[i][:, :n], rtol=0, atol=1e-5)
        assert np.abs(split.k[i][:, n - 1]).max() > 1e-2


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
    src = _path(tiny_model, "falcon_h1_norm", "hf")
    hf = copy_hf_dir(src, tmp_path / "hf", mamba_norm_before_gate=True)
    with pytest.raises(FrinkError, match="mamba_norm_before_gate"):
        frink_cli.load(hf)
