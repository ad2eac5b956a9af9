#!/usr/bin/env python3
"""Write a random-weight llama GGUF at a real model's shapes, quantized, for speed and
memory measurements (`frink bench --compare llama.cpp` on a model no package ships).

    python scripts/make_synthetic_gguf.py DST.gguf [--shape llama-3.2-1b] [--type Q4_0]
        [--tokenizer SRC.gguf]

The layer shapes come from scripts/synthetic_models.py's SHAPES; the tokenizer (and so the
vocabulary, the embedding's and output head's rows) from a real GGUF, the default model's
unless --tokenizer names another, since llama.cpp loads no model without a vocabulary:
Llama-3.2-1B's layers then carry SmolLM2's 49152-token head, not Llama 3's 128256, which
the note beside a measurement must say. Weights are N(0, 0.02) quantized by gguf-py (its
quantize supports Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0); norms are ones. Only gguf-py writes
the bytes; the values mean nothing, so the file is for timing and memory, never for text.
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

# gguf-py's general.file_type for each type (llama.cpp's LLAMA_FTYPE_MOSTLY_*).
_FTYPE = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9}


def _copy_tokenizer(reader: GGUFReader, writer: GGUFWriter) -> int:
    """The tokenizer.* fields of a real file; returns its vocabulary size."""
    copy_fields(reader, writer, lambda key: key.startswith("tokenizer."))
    return len(reader.fields["tokenizer.ggml.tokens"].contents())


def write(dst: Path, shape: str, qtype: str, tokenizer: Path) -> None:
    s = SHAPES[shape]
    if s["kind"] != "llama":
        raise SystemExit(f"{shape}: only llama-kind shapes are written")
    t = GGMLQuantizationType[qtype]
    d, ff, hd = s["n_embd"], s["n_ff"], s["head_dim"]
    nh, nkv = s["n_head"], s["n_head_kv"]
    rng = np.random.default_rng(0)
    tmp = dst.with_suffix(".tmp")
    writer = GGUFWriter(tmp, "llama")
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

    def matrix(name: str, rows: int, cols: int) -> None:
        w = (0.02 * rng.standard_normal((rows, cols), dtype=np.float32)).astype(np.float32)
        writer.add_tensor(name, quantize(w, t), raw_dtype=t)

    def ones(name: str, n: int) -> None:
        writer.add_tensor(name, np.ones(n, np.float32))

    matrix("token_embd.weight", n_vocab, d)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight", d)
        matrix(p + "attn_q.weight", nh * hd, d)
        matrix(p + "attn_k.weight", nkv * hd, d)
        matrix(p + "attn_v.weight", nkv * hd, d)
        matrix(p + "attn_output.weight", d, nh * hd)
        ones(p + "ffn_norm.weight", d)
        matrix(p + "ffn_gate.weight", ff, d)
        matrix(p + "ffn_up.weight", ff, d)
        matrix(p + "ffn_down.weight", d, ff)
    ones("output_norm.weight", d)
    matrix("output.weight", n_vocab, d)
    finish(writer, tmp, dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dst", type=Path)
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--type", default="Q4_0", choices=sorted(_FTYPE))
    ap.add_argument("--tokenizer", type=Path, default=None)
    a = ap.parse_args()
    tok = a.tokenizer
    if tok is None:
        from frink_cli.pull import ensure_model

        tok = ensure_model()
    write(a.dst, a.shape, a.type, tok)


if __name__ == "__main__":
    main()
