"""Gemma 4 (`gemma4`; HF `gemma4_text`) against transformers and llama.cpp.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: Gemma 4's layers go further from llama's than any other family here -- sliding and full
layers with their own head widths and KV head counts, a weightless V norm and V = K where a
full layer has no v_proj, proportional rope (a quarter of the full layers' head rotates,
carried by llama.cpp as rope_freqs factors of 1e30), the last layers attending over earlier
layers' K/V (KV sharing), per-layer embeddings riding beside the residual stream, a
per-layer output scale and the final softcap. The fixture (scripts/make_tiny_models.py,
"gemma4") draws each of them so it matters, over 40 tokens against a window of 6.

What is checked: the references agree; frink from the GGUF and from the HF dir, batched and
one row at a time, on numpy and metal (the device ran; one submission per decode token),
against both references (2e-3, identical argmax); llama.cpp's 24 greedy decode steps, token
for token; the HF reader gives exactly the converter's tensors and metadata; each
decoration switched off moves the logits far from both references; two sequences batched
together give what each gives alone; cuda refuses the layers by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from model_checks import (
    _against_references,
    _max_diff,
    _path,
    _tokens,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint

NAME = "gemma4"
MOE = "gemma4_moe"  # the 26B-A4B shape: a dense FFN beside the experts in every layer
MM = "gemma4_mm"  # Gemma4ForConditionalGeneration (as released): towers ignored
MODELS = (NAME, MOE, MM)
N_LAYER = 7
SWA = (True, False, True, True, False, True, False)


def test_the_converter_wrote_gemma4(tiny_model: Callable) -> None:
    ck = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    md, names = ck.metadata, set(ck.tensors.names())
    assert md["general.architecture"] == "gemma4"
    assert md["gemma4.attention.shared_kv_layers"] == 2
    assert md["gemma4.embedding_length_per_layer_input"] == 8
    assert (md["gemma4.attention.key_length"], md["gemma4.attention.key_length_swa"]) == (32, 16)
    assert list(md["gemma4.attention.head_count_kv"]) == [2, 1, 2, 2, 1, 2, 1]
    assert list(md["gemma4.feed_forward_length"]) == [128] * 5 + [256] * 2
    assert "rope_freqs.weight" in names and "per_layer_token_embd.weight" in names
    for i in range(N_LAYER):
        assert f"blk.{i}.layer_output_scale.weight" in names
        # V = K on the full layers; no K/V at all on the two sharing layers.
        assert (f"blk.{i}.attn_v.weight" in names) == (SWA[i] and i < 5), i
        assert (f"blk.{i}.attn_k.weight" in names) == (i < 5), i


def test_config_reads_the_decorations(tiny_model: Callable) -> None:
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "hf")))
    assert hf == gg
    assert gg.swa_layers == SWA and gg.sliding_window == 6
    assert gg.attn_scale == 1.0 and gg.ext.v_norm and gg.ext.layer_out_scale
    assert gg.ext.kv_shared_from == 5 and gg.ext.per_layer_embd == 8
    assert gg.ext.final_logit_softcap == 3.0
    shapes = [gg.layer_shape(i) for i in range(N_LAYER)]
    assert [s.head_dim_k for s in shapes] == [16 if swa else 32 for swa in SWA]
    assert [s.rope_dim for s in shapes] == [16 if swa else 32 for swa in SWA]
    assert [s.no_rope_freqs for s in shapes] == list(SWA)  # proportional rope: full only
    assert list(gg.ext.v_from_k) == [False, True, False, False, True, False, False]
    # llama.cpp's rule: sliding layers reuse n_kv - 2, full ones n_kv - 1 (n_kv = 5).
    assert [s.kv_source for s in shapes] == [None] * 5 + [3, 4]
    assert gg.residual_width == 64 + N_LAYER * 8


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", "metal"])
@pytest.mark.parametrize("model", MODELS)
def test_two_sequences_batched_equal_each_alone(
    model: str, backend: str, tiny_model: Callable
) -> None:
    """A multi-sequence step: each sequence's sharing layers read that sequence's rows."""
    if backend == "metal":
        pytest.importorskip("mlx.core")
    m = frink_cli.load(_path(tiny_model, model, "gguf"), backend=backend)
    dec = m.decoder
    tokens = np.asarray(_tokens(tiny_model, model))
    a, b = tokens[:20], tokens[20:33]
    alone = []
    for seq in (a, b):
        cache = dec.new_cache(32)
        dec.step(seq[:-1], cache)
        alone.append(dec.step(seq[-1:], cache)[-1])
    caches = [dec.new_cache(32), dec.new_cache(32)]
    for c, seq in zip(caches, (a, b)):
        dec.step(seq[:-1], c)
    both = dec.step_batch([(a[-1:], caches[0]), (b[-1:], caches[1])])
    for got, want in zip(both, alone):
        assert _max_diff(got, want) < 1e-4


# --- every decoration matters ---------------------------------------------------------------------


def test_the_multimodal_dir_is_its_text_model(tiny_model: Callable) -> None:
    """model_type gemma4: the text model's config under text_config, its weights under
    language_model.; the towers are reported as ignored, and the model is the dense one."""
    hf = open_checkpoint(_path(tiny_model, MM, "hf"))
    assert any("ignored" in n for n in hf.notes), hf.notes
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, MM, "gguf")))
    assert config_from_checkpoint(hf) == gg
    assert gg.ext.per_layer_embd == 8 and gg.ext.kv_shared_from == 5 and gg.swa_layers == SWA


def test_the_moe_variant_is_read_as_llama_cpp_reads_it(tiny_model: Callable) -> None:
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, MOE, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, MOE, "hf")))
    assert hf == gg and gg.ext.moe is not None
    assert gg.ext.moe.parallel_dense and gg.ext.moe.norm_topk and gg.ext.moe.gating == "softmax"
    assert (gg.ext.moe.n_expert, gg.ext.moe.n_expert_used, gg.ext.moe.n_ff_exp) == (8, 2, 32)
    assert [gg.layer_shape(i).ffn for i in range(4)] == ["dense+moe"] * 4
    assert gg.ext.per_layer_embd == 0 and gg.ext.kv_shared_from is None
    names = set(open_checkpoint(_path(tiny_model, MOE, "gguf")).tensors.names())
    for t in (
        "ffn_gate_inp.scale",
        "ffn_down_exps.scale",
        "ffn_gate_up_exps.weight",
        "pre_ffw_norm_2.weight",
        "post_ffw_norm_1.weight",
        "post_ffw_norm_2.weight",
    ):
        assert f"blk.0.{t}" in names, t


def test_kv_sharing_reads_the_source_layers_rows(tiny_model: Callable) -> None:
    """The sharing layers' slots are their sources' (one set of rows, no copy): a cache
    holds K/V for the five computing layers only."""
    m = frink_cli.load(_path(tiny_model, NAME, "gguf"))
    cache = m.decoder.new_cache(16)
    m.decoder.step(np.asarray(_tokens(tiny_model, NAME)[:10]), cache)
    assert cache.slot(5).source is cache.slot(3) and cache.slot(6).source is cache.slot(4)
    assert cache.k[5] is cache.k[3] or np.array_equal(cache.k[5], cache.k[3])
    assert cache.k[1].shape == (1, cache.k[1].shape[1], 32)  # a full layer: 1 KV head of 32
    assert cache.k[0].shape[0] == 2 and cache.k[0].shape[2] == 16  # sliding: 2 heads of 16


# --- cuda: the layers are refused by name, the host body answers ----------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_cuda_refuses_by_name_and_matches(
    model: str, tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    from frink_cli.backends.cupy import eligibility

    cfg = config_from_checkpoint(open_checkpoint(_path(tiny_model, model, "gguf")))
    for layer in range(cfg.n_layer):
        reasons = eligibility.layer_reasons(cfg, layer)
        # The weightless V norm, or (a layer reading another's K/V) no K/V of its own.
        weightless = any(r.startswith("rms_norm") and r.endswith(": no weight") for r in reasons)
        assert weightless != (eligibility.SHARED_KV in reasons), reasons
        assert (eligibility.PER_LAYER_HEADS in reasons) == cfg.swa_layers[layer], reasons
        assert (eligibility.MOE in reasons) == (model == MOE), reasons
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    m = frink_cli.load(_path(tiny_model, model, "gguf"), backend="cuda")
    _against_references(m.logits(_tokens(tiny_model, model)), tiny_model(model).ref, "cuda-numpy")
    assert not m.decoder.backend.ledger.failures


# --- hostile metadata: every new size is a clean refusal, before any large allocation ------------

K = "gemma4."
HOSTILE: dict[str, tuple[dict, str]] = {
    "all_layers_share": ({K + "attention.shared_kv_layers": 7}, "leave no layers"),
    "negative_sharing": ({K + "attention.shared_kv_layers": -3}, "leave no layers"),
    "source_of_other_kind": ({K + "attention.shared_kv_layers": 1}, "other kind"),
    "per_layer_width_2^40": ({K + "embedding_length_per_layer_input": 1 << 40}, "inp_gate"),
    "negative_per_layer_width": ({K + "embedding_length_per_layer_input": -1}, "per_layer_input"),
    "sliding_head_width_2^40": (
        {K + "attention.key_length_swa": 1 << 40, K + "attention.value_length_swa": 1 << 40},
        "attn_q",
    ),
    "sliding_head_width_0": (
        {K + "attention.key_length_swa": 0, K + "attention.value_length_swa": 0},
        "dimension_count_swa",
    ),
    "odd_sliding_rope": ({K + "rope.dimension_count_swa": 7}, "dimension_count_swa"),
    "k_v_widths_differ": ({K + "attention.value_length_swa": 8}, "value_length_swa"),
    "kv_heads_array_short": ({K + "attention.head_count_kv": [2, 1]}, "head_count_kv"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_metadata_is_refused_by_name(case: str, tiny_model: Callable) -> None:
    from frink_cli.errors import FrinkError
    from frink_cli.model.weights import load_weights

    changes, fragment = HOSTILE[case]
    ck = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    ck = dataclasses.replace(ck, metadata={**ck.metadata, **changes})
    with pytest.raises(FrinkError, match=fragment):
        load_weights(ck, config_from_checkpoint(ck))
