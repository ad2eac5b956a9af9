#!/usr/bin/env python3
"""Write a random-weight llama GGUF at a real model's shapes, quantized, for speed and
memory measurements (`frink bench --compare llama.cpp` on a model no package ships).

    python scripts/make_synthetic_gguf.py DST.gguf [--shape llama-3.2-1b] [--type Q4_0]
        [--tokenizer SRC.gguf | --vocab N]

A MoE shape (MOE_SHAPES: moe-6g, moe-tiny) routes every FFN through stacked experts, as
llama.cpp's llama architecture reads Mixtral (ffn_gate_inp, ffn_{gate,up,down}_exps): the
file for `--mem-budget` (experts left in the file). Its layers share one set of random
expert stacks (written once per layer, so the file is as big as the shape says, and
making it needs one layer's memory). --vocab N writes no tokenizer (model "none") and an N-row
embedding: a file run from token ids (the Python API, bench), made without a real model.

The layer shapes come from scripts/synthetic_models.py's SHAPES; the tokenizer (and so the
vocabulary, the embedding's and output head's rows) from a real GGUF, the default model's
unless --tokenizer names another, since llama.cpp loads no model without a vocabulary:
Llama-3.2-1B's layers then carry SmolLM2's 49152-token head, not Llama 3's 128256, which
the note beside a measurement must say. Weights are N(0, 0.02) quantized by gguf-py (its
quantize supports Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0); norms are ones. Only gguf-py writes
the bytes; the values mean nothing, so the file is for timing and memory, never for text.
The router (ffn_gate_inp, f32) is N(0, 1/n_embd): router logits of unit scale, as trained
routers give. At N(0, 1) the logits of a 2048-wide model spread ~45, the softmax turns every
rounding of the activations into a different mix of experts, and llama.cpp's 8-bit
activations alone moved its Q4_0 logits 9.6% (2 layers) to 27% (16 layers) of their scale
from its own f32 evaluation of the same weights (docs/performance.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dequantize_gguf import copy_fields, finish  # noqa: E402
from synthetic_models import SHAPES  # noqa: E402

# MoE shapes: (a SHAPES entry, what differs from it, n_expert, n_expert_used, expert width).
MOE_SHAPES: dict[str, tuple[str, dict[str, int], int, int, int]] = {
    # Llama-3.2-1B's attention, 64 experts of 1664, top 4: ~6.1 GB in Q4_0.
    "moe-6g": ("llama-3.2-1b", {}, 64, 4, 1664),
    # 12 layers of 64 experts of 512 at width 256, top 2: ~320 MB in Q8_0 (the test's).
    "moe-tiny": (
        "smollm2-135m",
        {"n_layer": 12, "n_embd": 256, "n_head": 4, "n_head_kv": 2},
        64,
        2,
        512,
    ),
}

# gguf-py's general.file_type for each type (llama.cpp's LLAMA_FTYPE_MOSTLY_*).
_FTYPE = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9}


def _copy_tokenizer(reader: GGUFReader, writer: GGUFWriter) -> int:
    """The tokenizer.* fields of a real file; returns its vocabulary size."""
    copy_fields(reader, writer, lambda key: key.startswith("tokenizer."))
    return len(reader.fields["tokenizer.ggml.tokens"].contents())


def write(dst: Path, shape: str, qtype: str, tokenizer: Path | None, vocab: int = 0) -> None:
    """The file; tokenizer None: no tokenizer, a `vocab`-row embedding and head."""
    experts = None
    if shape in MOE_SHAPES:
        base, changes, *experts = MOE_SHAPES[shape]
        s = {**SHAPES[base], **changes}
    else:
        s = SHAPES[shape]
    if s["kind"] != "llama":
        raise SystemExit(f"{shape}: only llama-kind shapes are written")
    t = GGMLQuantizationType[qtype]
    d, hd = s["n_embd"], s["head_dim"]
    ff = s["n_ff"] if experts is None else experts[2]
    nh, nkv = s["n_head"], s["n_head_kv"]
    rng = np.random.default_rng(0)
    tmp = dst.with_suffix(".tmp")
    writer = GGUFWriter(tmp, "llama")
    if tokenizer is None:
        writer.add_tokenizer_model("none")  # llama.cpp's vocabulary-less model
        writer.add_vocab_size(vocab)  # (which then takes its size from here)
        n_vocab = vocab
    else:
        n_vocab = _copy_tokenizer(GGUFReader(tokenizer), writer)
    writer.add_name(f"synthetic {shape} {qtype}")
    writer.add_file_type(_FTYPE[qtype])
    writer.add_context_length(8192)
    writer.add_embedding_length(d)
    writer.add_block_count(s["n_layer"])
    writer.add_feed_forward_length(ff)
    writer.add_head_count(nh)
    writer.add_head_count_kv(nkv)
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_rope_dimension_count(hd)
    writer.add_rope_freq_base(s["rope_base"])
    writer.add_layer_norm_rms_eps(1e-5)
    if experts is not None:
        writer.add_expert_count(experts[0])
        writer.add_expert_used_count(experts[1])
        writer.add_expert_feed_forward_length(ff)

    def quantized(*shape: int) -> np.ndarray:
        """N(0, 0.02) weights of `shape`, quantized a few thousand rows at a time."""
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        out = [
            quantize(0.02 * rng.standard_normal((min(4096, rows - r), cols), np.float32), t)
            for r in range(0, rows, 4096)
        ]
        return np.concatenate(out).reshape(*shape[:-1], -1)

    def matrix(name: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, quantized(rows, cols), raw_dtype=t)

    def ones(name: str, n: int) -> None:
        writer.add_tensor(name, np.ones(n, np.float32))

    if experts is not None:
        n_e = experts[0]
        stacks = {"gate": quantized(n_e, ff, d), "up": quantized(n_e, ff, d)}
        stacks["down"] = quantized(n_e, d, ff)
    matrix("token_embd.weight", n_vocab, d)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight", d)
        matrix(p + "attn_q.weight", nh * hd, d)
        matrix(p + "attn_k.weight", nkv * hd, d)
        matrix(p + "attn_v.weight", nkv * hd, d)
        matrix(p + "attn_output.weight", d, nh * hd)
        ones(p + "ffn_norm.weight", d)
        if experts is None:
            matrix(p + "ffn_gate.weight", ff, d)
            matrix(p + "ffn_up.weight", ff, d)
            matrix(p + "ffn_down.weight", d, ff)
            continue
        router = rng.standard_normal((n_e, d), np.float32) / d**0.5
        writer.add_tensor(p + "ffn_gate_inp.weight", router)
        for kind, stack in stacks.items():
            writer.add_tensor(f"{p}ffn_{kind}_exps.weight", stack, raw_dtype=t)
    ones("output_norm.weight", d)
    matrix("output.weight", n_vocab, d)
    finish(writer, tmp, dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dst", type=Path)
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted([*SHAPES, *MOE_SHAPES]))
    ap.add_argument("--type", default="Q4_0", choices=sorted(_FTYPE))
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--vocab", type=int, default=0, help="no tokenizer: N embedding rows")
    a = ap.parse_args()
    tok = a.tokenizer
    if a.vocab:
        write(a.dst, a.shape, a.type, None, a.vocab)
        return
    if tok is None:
        from frink_cli.pull import ensure_model

        tok = ensure_model()
    write(a.dst, a.shape, a.type, tok)


if __name__ == "__main__":
    main()
