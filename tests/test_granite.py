"""IBM Granite 3.x (`granite`, `granitemoe`; GraniteMoeShared is GGUF `granitemoe` with a
shared expert) against transformers and llama.cpp, on every backend.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: Granite is the llama layer plus four multipliers and (granitemoe) a sparse MoE with an
optional ungated shared expert -- the proof that a new architecture is one module over the
one layer graph (issue 10). The fixtures (scripts/make_tiny_models.py) draw every multiplier
far from neutral (embedding x0.35, residual x0.22 on both branches, kq scale 0.7 instead of
1/sqrt(16) = 0.25, logits / 8), and the decoration tests below prove each one moves the
logits by far more than the 2e-3 parity bar, so no parity test here can pass with one
decoration dropped, on any path (GGUF metadata, HF config, the graph itself).

What is checked, per fixture:
  - frink from the GGUF and from the HF dir, batched and one row at a time, against
    transformers' and llama.cpp's logits (2e-3, identical argmax), and the decode after a
    batched prefill against llama.cpp's own decode steps (its greedy continuation);
  - the HF reader gives exactly the converter's tensors (the fused MoE input_linear split
    into gate and up stacks, Q/K rows permuted for llama's rope) and metadata;
  - the same on `metal` (MLX's CPU device on Linux), where the device must have run
    (submissions, no failures, no refusals);
  - on `cuda` with NumPy standing in for CuPy and with the kernels on the CPU emulator
    (tests/test_cuda_backend.py's two stand-ins): granite runs whole on the stack; the
    granitemoe layers are refused by the MoE name alone (the granite decorations of those
    layers are carried) and the answer still matches both references.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fixture_copies import copy_gguf, copy_hf_dir
from model_checks import (
    FAR,
    REFERENCES,
    _against_references,
    _max_diff,
    _path,
    _tokens,
    cuda_models,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint

GRANITE = ("granite", "granitemoe", "granitemoeshared")
MOE = ("granitemoe", "granitemoeshared")

# The fixture's multipliers (scripts/tiny_specs.py, _GRANITE), as each source spells
# them, with the value that switches each off. head_dim is 64 / 4 = 16.
HEAD_DIM = 16
DECORATIONS = {
    # name: (HF config key, neutral HF value, GGUF key suffix, neutral GGUF value (None:
    #        key absent, llama.cpp's default), ModelConfig field, neutral field value)
    "embedding": ("embedding_multiplier", 1.0, "embedding_scale", None, "embd_scale", None),
    "residual": ("residual_multiplier", 1.0, "residual_scale", None, "residual_scale", None),
    "attention": (
        "attention_multiplier",
        1 / math.sqrt(HEAD_DIM),
        "attention.scale",
        None,
        "attn_scale",
        1 / math.sqrt(HEAD_DIM),
    ),
    # llama.cpp requires logit_scale, so its neutral form is 1.0, not absence.
    "logits": ("logits_scaling", 1.0, "logit_scale", 1.0, "logit_scale", None),
}
# Per fixture: (embd_scale, residual_scale, attn_scale, logit_scale) as made.
FIXTURE_VALUES = {
    "granite": (0.35, 0.22, 0.7, 8.0),
    "granitemoe": (12.0, 0.22, 1.5, 8.0),
    "granitemoeshared": (0.35, 0.22, 0.7, 8.0),
}


# --- helpers ------------------------------------------------------------------------------------


# --- the fixtures themselves ----------------------------------------------------------------------


@pytest.mark.parametrize("name", GRANITE)
def test_the_converter_wrote_granite(name: str, tiny_model: Callable) -> None:
    """What llama.cpp's converter makes of each HF class: arch, multipliers, tensor names
    (the fused input_linear split into gate and up stacks; GraniteMoeShared is granitemoe
    with ffn_*_shexp tensors and a shared width, and no shared-expert gate)."""
    md = open_checkpoint(_path(tiny_model, name, "gguf")).metadata
    names = set(open_checkpoint(_path(tiny_model, name, "gguf")).tensors.names())
    arch = "granite" if name == "granite" else "granitemoe"
    assert md["general.architecture"] == arch
    embd, resid, kq, logit = FIXTURE_VALUES[name]
    assert md[f"{arch}.embedding_scale"] == pytest.approx(embd)
    assert md[f"{arch}.residual_scale"] == pytest.approx(resid)
    assert md[f"{arch}.attention.scale"] == pytest.approx(kq)
    assert md[f"{arch}.logit_scale"] == pytest.approx(logit)
    moe = {"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}
    shexp = {"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"}
    dense = {"ffn_gate", "ffn_up", "ffn_down"}
    for i in range(3):
        have = {
            n.removeprefix(f"blk.{i}.").removesuffix(".weight")
            for n in names
            if n.startswith(f"blk.{i}.")
        }
        want = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"}
        want |= (
            dense if name == "granite" else moe | (shexp if name == "granitemoeshared" else set())
        )
        assert have == want, (i, sorted(have ^ want))
    assert ("output.weight" in names) == (name == "granitemoe")  # granite, granitemoeshared: tied
    if name != "granite":
        assert md["granitemoe.expert_count"] == 8
        assert md["granitemoe.feed_forward_length"] == 32  # the expert width; no expert key
        assert "granitemoe.expert_feed_forward_length" not in md
        assert md["granitemoe.expert_used_count"] == (3 if name == "granitemoeshared" else 2)
    if name == "granitemoeshared":
        assert md["granitemoe.expert_shared_feed_forward_length"] == 48


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("name", GRANITE)
def test_config_reads_the_decorations(name: str, tiny_model: Callable) -> None:
    """Both sources give the same ModelConfig, with every multiplier and the MoE as
    llama.cpp reads them: expert width = feed_forward_length (granitemoe writes no expert
    width), top-k renormalized (softmax over the top-k logits), shared expert ungated."""
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "hf")))
    assert hf == gg
    for field, value in zip(
        ("embd_scale", "residual_scale", "attn_scale", "logit_scale"), FIXTURE_VALUES[name]
    ):
        where = gg if field == "attn_scale" else gg.ext
        assert getattr(where, field) == pytest.approx(value), field
    assert gg.rope_type == "norm"
    if name == "granite":
        assert gg.ext.moe is None
        return
    assert gg.ext.moe is not None and all(gg.ext.moe.layers)
    assert (gg.ext.moe.n_expert, gg.ext.moe.n_ff_exp) == (8, 32)
    assert gg.ext.moe.n_expert_used == (3 if name == "granitemoeshared" else 2)
    assert gg.ext.moe.norm_topk is True
    assert gg.ext.moe.n_ff_shexp == (48 if name == "granitemoeshared" else 0)
    if name == "granitemoeshared":
        assert gg.ext.moe.shared_gate is False


# --- every decoration matters ---------------------------------------------------------------------


@pytest.mark.parametrize("decoration", list(DECORATIONS))
@pytest.mark.parametrize("name", GRANITE)
def test_each_gguf_key_is_read(
    name: str, decoration: str, tiny_model: Callable, tmp_path: Path
) -> None:
    """The GGUF with one multiplier key switched off (as llama.cpp reads its absence) gives
    logits far from the references: the reader takes every key from the file."""
    _, _, suffix, neutral = DECORATIONS[decoration][:4]
    src = _path(tiny_model, name, "gguf")
    arch = open_checkpoint(src).metadata["general.architecture"]
    copy = copy_gguf(src, tmp_path / "off.gguf", {f"{arch}.{suffix}": neutral})
    got = frink_cli.load(copy).logits(_tokens(tiny_model, name))
    for key in REFERENCES:
        assert _max_diff(got, tiny_model(name).ref[key]) > FAR, f"{suffix} off still matches {key}"


@pytest.mark.parametrize("decoration", list(DECORATIONS))
@pytest.mark.parametrize("name", GRANITE)
def test_each_hf_config_key_is_read(
    name: str, decoration: str, tiny_model: Callable, tmp_path: Path
) -> None:
    """The HF dir with one multiplier set to its neutral value in config.json gives logits
    far from the references: the HF reader takes every multiplier from the config."""
    key, neutral = DECORATIONS[decoration][:2]
    copy = copy_hf_dir(_path(tiny_model, name, "hf"), tmp_path / name, **{key: neutral})
    got = frink_cli.load(copy).logits(_tokens(tiny_model, name))
    for ref_key in REFERENCES:
        assert _max_diff(got, tiny_model(name).ref[ref_key]) > FAR, (
            f"{key}={neutral} still matches {ref_key}"
        )


def test_shared_expert_matters(tiny_model: Callable, tmp_path: Path) -> None:
    """granitemoeshared's shared expert is on the path: the same file without it (what a
    reader that ignored ffn_*_shexp would run) gives logits far from the references."""
    src = _path(tiny_model, "granitemoeshared", "gguf")
    copy = copy_gguf(
        src,
        tmp_path / "no_shexp.gguf",
        {"granitemoe.expert_shared_feed_forward_length": None},
        drop=("_shexp",),
    )
    m = frink_cli.load(copy)
    assert m.config.ext.moe is not None and m.config.ext.moe.n_ff_shexp == 0
    got = m.logits(_tokens(tiny_model, "granitemoeshared"))
    for key in REFERENCES:
        assert _max_diff(got, tiny_model("granitemoeshared").ref[key]) > FAR, key


# --- cuda: NumPy standing in for CuPy, and the kernels on the CPU emulator -----------------------


@pytest.mark.parametrize("name", MOE)
def test_cuda_refuses_granitemoe_layers_by_the_moe_name_alone(
    name: str, tiny_model: Callable
) -> None:
    """Every granitemoe layer is refused for its routed FFN and for nothing else: the granite
    decorations of its attention and residuals are carried (as granite's own layers show)."""
    from frink_cli.backends.cupy import eligibility

    cfg = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "gguf")))
    assert eligibility.layer_refusals(cfg) == [eligibility.MOE] * cfg.n_layer
    for layer in range(cfg.n_layer):
        assert eligibility.layer_reasons(cfg, layer) == [
            eligibility.MOE,
            "experts: not implemented",
        ], layer
    # The same layers with a dense FFN (granite's) are taken whole.
    dense = config_from_checkpoint(open_checkpoint(_path(tiny_model, "granite", "gguf")))
    assert eligibility.layer_refusals(dense) == [None] * dense.n_layer


@pytest.mark.parametrize("name", MOE)
def test_cuda_emulated_granitemoe_falls_back_and_matches(
    name: str, tiny_model: Callable, emulated_launcher
) -> None:
    """granitemoe with the emulated kernels: every layer refused (MoE), the host body runs
    them, and prefill + decode still give both references' logits."""
    from frink_cli.backends.cupy import eligibility
    from frink_cli.backends.cupy.ops import KernelOps

    _, dev = cuda_models(_path(tiny_model, name, "gguf"), lambda: KernelOps(np, emulated_launcher))
    tokens = _tokens(tiny_model, name)
    got = dev.logits(tokens)
    _against_references(got, tiny_model(name).ref, f"{name} emulated")
    ledger = dev.decoder.backend.ledger
    assert set(ledger.refusals) == {eligibility.MOE} and not ledger.failures
