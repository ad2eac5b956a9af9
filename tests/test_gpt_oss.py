"""OpenAI gpt-oss (`gpt-oss`; HF `gpt_oss`) against transformers and llama.cpp.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: gpt-oss brings decorations no other architecture has -- a learned sink logit per head
in every softmax, biases on the router and on every expert, SwiGLU-OAI experts (a clamp at
7, alpha 1.702, +1 on the up branch), sliding-window layers that keep the YaRN scaling --
besides Q/K/V/O biases and a softmax over the top-k router logits. The fixture
(scripts/tiny_specs.py, "gpt_oss") draws each of them so it matters: sinks around 1,
expert gate/up rows wide enough for the clamp to bite, 40 tokens against a window of 6.

What is checked: the references agree; frink from the GGUF and from the HF dir, batched and
one row at a time, on numpy and metal (the device ran; one submission per decode token),
against both references (2e-3, identical argmax); llama.cpp's 24 greedy decode steps, token
for token; the HF reader gives exactly the converter's tensors and metadata; each
decoration switched off moves the logits far from both references; cuda refuses the layers
by the MoE name.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from model_checks import (
    FAR,
    REFERENCES,
    _against_references,
    _max_diff,
    _path,
    _tokens,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.backends.host import ffn

NAME = "gpt_oss"


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


# --- every decoration matters ---------------------------------------------------------------------


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
