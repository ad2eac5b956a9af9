"""DeepSeek V2 / V3 (`deepseek2`): what is its own beyond its tests/conformance_table.py
entry (parity with transformers and llama.cpp, batched and stepped, GGUF and HF dir,
greedy, the converter's metadata and tensors, cuda's refusal, each decoration).

Why: multi-head latent attention caches a compressed latent and one rotated key part per
token instead of per-head K and V; that is its point, so the cache's size is asserted
here. `frink info` names the latent cache and the expert groups. A cache type other
than f32 is refused by name (the latent rows are both the keys and the values).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from model_checks import _path, assert_refused_by_name
from script_loader import load_script

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.cache import KvCache
from frink_cli.cache.kv_types import CacheTypes
from frink_cli.cache.latent import LatentKv
from frink_cli.errors import FrinkError
from frink_cli.report import describe

# The V3-style fixture's sizes (scripts/tiny_specs.py, _DEEPSEEK_MLA / _DEEPSEEK_V3).
KV_LORA, ROPE, NOPE, V, N_HEAD = 32, 8, 16, 20, 4


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2_lite"])
def test_the_cache_holds_the_latent_and_the_rope_key_per_token(
    name: str, tiny_model: Callable
) -> None:
    """Per token per layer, kv_lora_rank + rope dim f32 values (40 here); full K/V would
    take n_head * (nope + rope + v) = 176, 4.4x as much."""
    path = _path(tiny_model, name, "gguf")
    m = frink_cli.load(path)
    tokens = [int(t) for t in tiny_model(name).ref["tokens"]]
    n_ctx = 64
    cache = KvCache(m.config, n_ctx)
    cache.reserve(n_ctx)
    assert all(isinstance(s, LatentKv) for s in cache.slots)
    per_token_layer = cache.kv_bytes / (4 * n_ctx * m.config.n_layer)
    assert per_token_layer == KV_LORA + ROPE
    full = N_HEAD * (NOPE + ROPE + V)
    assert full == 176 and full / per_token_layer == pytest.approx(4.4)
    # A run writes [latent | k_pe] rows there, read back as the keys and the values.
    run = m.decoder.new_cache(n_ctx)
    m.decoder.step(tokens[:12], run)
    for slot in run.slots:
        k, v = slot.by_position()
        assert k.shape[0::2] == (1, KV_LORA + ROPE) and v is k
        assert np.all(np.any(k[0, :12] != 0, axis=-1))


def test_info_names_the_latent_cache_and_the_groups(tiny_model: Callable) -> None:
    d = describe(_path(tiny_model, "deepseek_v3", "gguf"))
    assert d["mla"]["cache"] == "latent"
    assert d["mla"]["cache_floats_per_token"] == KV_LORA + ROPE
    assert d["mla"]["q_lora_rank"] == 48
    assert d["moe"]["groups"] == 4 and d["moe"]["groups_used"] == 2
    assert d["moe"]["gating"] == "sigmoid" and d["moe"]["expert_bias"]
    assert {"mla", "moe", "rope_scaling", "yarn_mscale"} <= set(d["decorations"])
    cfg = config_from_checkpoint(open_checkpoint(_path(tiny_model, "deepseek_v2_lite", "gguf")))
    assert cfg.ext.mla.q_lora_rank == 0
    assert cfg.ext.moe.gating == "softmax" and not cfg.ext.moe.norm_topk


def test_a_quantized_latent_cache_is_refused_by_name(tiny_model: Callable) -> None:
    """The latent rows are keys and values at once: kept as -ctk says (f32, f16, bf16; f16
    by default, checked against llama.cpp in test_conformance.py); a quantized latent, or a
    chosen V type other than K's, is refused naming the option."""
    gguf = _path(tiny_model, "deepseek_v3", "gguf")
    with pytest.raises(FrinkError, match="-ctk/--cache-type-k q8_0: the latent"):
        frink_cli.load(gguf, cache_type_k="q8_0", cache_type_v="q8_0")
    with pytest.raises(FrinkError, match="-ctv/--cache-type-v f32: the latent"):
        frink_cli.load(gguf, cache_type_k="f16", cache_type_v="f32")
    m = frink_cli.load(gguf, cache_type_k="bf16", cache_type_v="bf16")
    assert m.decoder.cache_types == CacheTypes("bf16", "bf16")


def test_hostile_metadata_is_refused_by_name(tmp_path) -> None:
    """Each MLA or routing field made hostile (a zero or huge rank, groups that do not
    divide the experts, more groups used than there are) is one FrinkError naming it,
    before anything large is allocated; the valid file they start from runs."""
    F = load_script("fuzz_inputs")
    assert_refused_by_name(tmp_path, F.deepseek2_base().encode(), F.deepseek2_hostile())
