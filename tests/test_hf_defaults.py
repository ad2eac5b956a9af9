"""configs/hf_defaults.json against the installed transformers' config classes.

The table stands in for AutoConfig, which fills in a config.json's missing keys before
llama.cpp's converter reads it. Every value must equal the class default; a key the class
does not carry must be named below with the reason, so drift cannot hide.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from frink_cli.archs.registry import supported_model_types
from frink_cli.resources import config_file

transformers = pytest.importorskip("transformers")

TABLE: dict[str, dict[str, Any]] = json.loads(config_file("hf_defaults.json").read_text())[
    "model_types"
]

# Checkpoints whose config class is remote code (trust_remote_code), absent from transformers.
REMOTE_CODE = {"MiniMaxText01"}

# Keys the table carries that transformers 5's class keeps elsewhere or computes.
NOT_ON_THE_CLASS: dict[tuple[str, str], str] = {
    ("gemma3_text", "sliding_window_pattern"): "v5 spells it layer_types",
    ("qwen3_5_text", "full_attention_interval"): "v5 spells it layer_types",
    ("qwen3_5_moe_text", "full_attention_interval"): "v5 spells it layer_types",
    ("qwen3_next", "full_attention_interval"): "v5 spells it layer_types",
    ("starcoder2", "rms_norm_eps"): "starcoder2 reads norm_epsilon",
    ("lfm2", "rms_norm_eps"): "lfm2 reads norm_eps",
    ("lfm2_moe", "rms_norm_eps"): "lfm2 reads norm_eps",
    ("lfm2_moe", "block_multiple_of"): "dense LFM2's FFN sizing, unused by the MoE",
    ("lfm2_moe", "block_ffn_dim_multiplier"): "dense LFM2's FFN sizing, unused by the MoE",
    ("lfm2_moe", "block_auto_adjust_ff_dim"): "dense LFM2's FFN sizing, unused by the MoE",
    ("mamba", "num_attention_heads"): "no attention; the converter's head count is 0",
    ("falcon_mamba", "num_attention_heads"): "no attention; the converter's head count is 0",
    ("mamba2", "num_attention_heads"): "no attention; the converter's head count is 0",
    ("deepseek_v2", "rope_interleave"): "V3's key; V2 always interleaves",
    ("bert", "position_embedding_type"): "v5 dropped it (absolute only)",
    # "auto" in a config.json: the class computes the value from the hidden size.
    ("mamba", "time_step_rank"): "auto: derived",
    ("falcon_mamba", "time_step_rank"): "auto: derived",
    ("falcon_h1", "mamba_d_head"): "auto: derived",
}
# transformers 5 keeps rope settings per attention kind in rope_parameters.
ROPE_PARAMETERS = {
    "rope_theta": ("full_attention", "rope_theta"),
    "rope_local_base_freq": ("sliding_attention", "rope_theta"),
}


def _class_value(cfg: Any, key: str) -> tuple[bool, Any]:
    """(found, value) of `key` on a config instance, through rope_parameters as v5 keeps it."""
    try:
        return True, getattr(cfg, key)
    except Exception:  # noqa: BLE001 - absent, or refused as a per-layer attribute
        pass
    rope = getattr(cfg, "rope_parameters", None) or {}
    if key in rope:
        return True, rope[key]
    kind, name = ROPE_PARAMETERS.get(key, ("", ""))
    if isinstance(rope.get(kind), dict) and name in rope[kind]:
        return True, rope[kind][name]
    return False, None


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, float) and isinstance(theirs, int | float):
        return math.isclose(ours, theirs, rel_tol=1e-12)
    if isinstance(theirs, tuple):
        theirs = list(theirs)
    return bool(ours == theirs)


def test_every_registered_hf_model_type_reads_the_table() -> None:
    """Each architecture's hf_type entries come from the table, and nothing in it is stale."""
    registered = set(supported_model_types())
    multimodal = {mt for mt in registered if f"{mt}_text" in TABLE}
    assert set(TABLE) == registered - multimodal


@pytest.mark.parametrize("model_type", sorted(set(TABLE) - REMOTE_CODE))
def test_defaults_match_the_transformers_config_class(model_type: str) -> None:
    cls = transformers.CONFIG_MAPPING[model_type]
    cfg = cls()
    # gemma4 refuses global reads of per-layer attributes unless told.
    cfg.allow_global_per_layer_attribute_access = True
    checked, wrong, absent = 0, [], []
    for key, ours in TABLE[model_type].items():
        found, theirs = _class_value(cfg, key)
        if (model_type, key) in NOT_ON_THE_CLASS:
            assert not found or ours == "auto", f"{model_type}.{key} is on the class now"
            continue
        if not found:
            absent.append(key)
            continue
        checked += 1
        if not _same(ours, theirs):
            wrong.append(f"{key}: table {ours!r}, {cls.__name__} {theirs!r}")
    assert not wrong, f"{model_type}: " + "; ".join(wrong)
    assert not absent, f"{model_type}: not on {cls.__name__}: {absent} (name them above)"
    assert checked >= 3
