"""OLMo 2 (`olmo2`) against transformers and llama.cpp, on every backend.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: OLMo 2 moves the llama layer's norms. It has no pre-norms (each branch reads the
residual stream itself), an RMSNorm on each branch's output before its residual add, and
Q/K norms over the whole projection width (one RMS over all query heads of a row, weight
[n_head*head_dim]; likewise the keys) -- two decorations of their own (`no_pre_norm`,
`qk_norm_full`) beside the post norms gemma3 already has. The fixture
(scripts/tiny_specs.py, _OLMO2) draws every norm weight at random around 1, and its
conformance-table entry lists each one: switched off or replaced by its nearest neighbour
(a llama pre-norm, a per-head QK norm), it moves the logits far past the 2e-3 bar.

What is checked: frink from the GGUF and from the HF dir, batched and one row at a time,
against transformers' and llama.cpp's logits, and the decode after a batched prefill
against llama.cpp's own decode steps; the HF reader gives exactly the converter's tensors
and metadata; `metal` (MLX's CPU device on Linux) with the device having run every layer;
`cuda` with NumPy standing in for CuPy and with the kernels on the CPU emulator, the whole
stack carried. The helpers are test_granite.py's (the same bar, written once).
"""

from __future__ import annotations

from collections.abc import Callable

from model_checks import (
    _path,
)

from frink_cli.archs import config_from_checkpoint, open_checkpoint

NAME = "olmo2"
N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_EMBD = 3, 4, 2, 16, 64


# --- the fixture itself ---------------------------------------------------------------------------


def test_the_converter_wrote_olmo2(tiny_model: Callable) -> None:
    """What llama.cpp's converter makes of Olmo2ForCausalLM: no attn_norm / ffn_norm, the
    two post norms, and Q/K norms as wide as the whole q and k projections."""
    ckpt = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    assert ckpt.metadata["general.architecture"] == NAME
    names = set(ckpt.tensors.names())
    for i in range(N_LAYER):
        have = {
            n.removeprefix(f"blk.{i}.").removesuffix(".weight")
            for n in names
            if n.startswith(f"blk.{i}.")
        }
        want = {"attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm"}
        want |= {"post_attention_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"}
        assert have == want, (i, sorted(have ^ want))
        assert ckpt.tensors.info(f"blk.{i}.attn_q_norm.weight").shape == (N_HEAD * HEAD_DIM,)
        assert ckpt.tensors.info(f"blk.{i}.attn_k_norm.weight").shape == (N_HEAD_KV * HEAD_DIM,)
    assert "output.weight" in names


# --- the host body (numpy) ------------------------------------------------------------------------


def test_config_reads_the_decorations(tiny_model: Callable) -> None:
    """Both sources give the same ModelConfig: no pre-norm, full-width QK norm (not the
    per-head one), both post norms, NeoX rope, untied."""
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "hf")))
    assert hf == gg
    assert gg.ext.no_pre_norm and gg.ext.qk_norm_full and not gg.ext.qk_norm
    assert gg.ext.post_attn_norm and gg.ext.post_ffn_norm
    assert gg.rope_type == "neox" and not gg.tied_embeddings
    assert {"no_pre_norm", "qk_norm_full", "post_attn_norm", "post_ffn_norm"} <= gg.features()
