"""MiMo-V2-Flash (`mimo2`): what is its own beyond its tests/conformance_table.py entry
(parity with transformers and llama.cpp, batched and stepped, GGUF and HF dir, greedy,
metal, the converter's metadata and tensors, cuda's refusal, each decoration).

Why: `frink info` must name what sets mimo2 apart (sinks on some layers, the value scale,
per-layer KV heads, the sliding pattern); hostile per-layer metadata must be refused by
name before anything is sized from it; an HF config that transformers and llama.cpp would
run apart (expert groups, a routed scaling factor, layer patterns that disagree) is
refused rather than run as one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixture_copies import copy_hf_dir
from model_checks import _path, assert_refused_by_name
from safetensors.numpy import save_file
from script_loader import load_script

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.errors import FrinkError
from frink_cli.report import describe


def test_info_names_the_decorations(tiny_model: Callable) -> None:
    d = describe(_path(tiny_model, "mimo2", "gguf"))
    assert {"attn_sinks", "value_scale", "moe", "layer_sizes", "sliding_window"} <= set(
        d["decorations"]
    )
    assert d["decoration_values"]["value_scale"] == pytest.approx(0.6)
    assert d["layer_pattern"] and d["per_layer_sizes"]
    assert d["moe"]["gating"] == "sigmoid" and d["moe"]["expert_bias"] and d["moe"]["norm_topk"]
    # The trunk only: the converter's three NextN blocks are not layers here.
    assert d["n_layer"] == 4
    cfg = config_from_checkpoint(open_checkpoint(_path(tiny_model, "mimo2", "gguf")))
    assert cfg.ext.attn_sinks == (False, True, True, False)
    assert cfg.swa_layers == (False, True, True, False)
    assert [cfg.layer_shape(i).n_head_kv for i in range(4)] == [1, 2, 2, 1]
    assert [cfg.layer_shape(i).rope_base for i in range(4)] == [50000.0, 3000.0, 3000.0, 50000.0]
    assert (cfg.head_dim_k, cfg.head_dim_v, cfg.rope_dim) == (24, 16, 8)


def test_hostile_metadata_is_refused_by_name(tmp_path: Path) -> None:
    """Each per-layer or mimo2 field made hostile (zero or huge head counts, arrays and
    patterns of the wrong length, a zero window, a bad value scale, expert groups) is one
    FrinkError naming it, before anything large is allocated; the valid file they start
    from runs."""
    F = load_script("fuzz_inputs")
    assert_refused_by_name(tmp_path, F.mimo2_base().encode(), F.mimo2_hostile())


def _hf_copy(tiny_model: Callable, tmp_path: Path, **changes: Any) -> Path:
    return copy_hf_dir(_path(tiny_model, "mimo2", "hf"), tmp_path / "hf", **changes)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"n_group": 2, "topk_group": 1}, "expert groups"),
        ({"routed_scaling_factor": 2.5}, "routed_scaling_factor"),
        ({"hybrid_layer_pattern": [0, 1, 0, 0]}, "disagree"),
        ({"hybrid_layer_pattern": [0, 1, 1]}, "hybrid_layer_pattern has 3 entries"),
        ({"swa_num_key_value_heads": "2"}, "swa_num_key_value_heads"),
        ({"swa_head_dim": 32}, "swa_head_dim"),
        ({"swa_num_attention_heads": 8}, "swa_num_attention_heads"),
        ({"layer_types": "sliding_attention"}, "layer_types"),
        ({"partial_rotary_factor": float("nan"), "rope_parameters": None}, "partial_rotary"),
        ({"sliding_window": None}, "sliding_window"),
        ({"sliding_window_size": 0, "sliding_window": None}, None),
    ],
)
def test_hf_configs_the_references_read_apart_are_refused(
    tiny_model: Callable, tmp_path: Path, changes: dict[str, Any], why: str | None
) -> None:
    path = _hf_copy(tiny_model, tmp_path, **changes)
    if why is None:
        # The released config's sliding_window_size: transformers' window is one more.
        cfg = config_from_checkpoint(open_checkpoint(path))
        assert cfg.sliding_window == 1
        return
    with pytest.raises(FrinkError, match=why):
        frink_cli.load(path)


def test_the_released_config_spelling_reads_the_same(tiny_model: Callable, tmp_path: Path) -> None:
    """A config.json as released (no rope_parameters / layer_types: rope_theta,
    swa_rope_theta, partial_rotary_factor, hybrid_layer_pattern, sliding_window_size)
    gives transformers' logits, as the fixture's own spelling does."""
    path = _hf_copy(
        tiny_model,
        tmp_path,
        rope_parameters=None,
        layer_types=None,
        sliding_window=None,
        rope_theta=50000.0,
        swa_rope_theta=3000.0,
        partial_rotary_factor=0.334,
        sliding_window_size=5,
    )
    ref = tiny_model("mimo2").ref
    m = frink_cli.load(path)
    assert (m.config.sliding_window, m.config.rope_base_swa, m.config.rope_dim) == (6, 3000.0, 8)
    got = m.logits([int(t) for t in ref["tokens"]])
    assert np.abs(got - ref["logits_hf"]).max() <= 2e-3
    assert np.array_equal(got.argmax(-1), ref["logits_hf"].argmax(-1))


def test_the_mtp_layers_of_an_hf_dir_are_ignored(tiny_model: Callable, tmp_path: Path) -> None:
    """Released checkpoints carry multi-token-prediction layers (model.mtp.*): frink runs
    the trunk, as llama.cpp's main pass does, and reads none of them."""
    path = _hf_copy(tiny_model, tmp_path)
    mtp = {"model.mtp.layers.0.input_layernorm.weight": np.ones(64, np.float32)}
    save_file(mtp, str(path / "mtp.safetensors"))
    ref = tiny_model("mimo2").ref
    got = frink_cli.load(path).logits([int(t) for t in ref["tokens"]])
    assert np.abs(got - ref["logits_hf"]).max() <= 2e-3
