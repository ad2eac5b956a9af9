"""Tiny random OpenELM and DeciLM GGUFs in llama.cpp's layout, and llama.cpp's logits.

Why: transformers has neither (both are remote code), so the converter cannot be fed a
tiny HF model: each file is written directly with gguf-py, named and shaped as llama.cpp's
converters write them (conversion/openelm.py, conversion/deci.py: per-layer head counts,
KV head counts and FFN widths as array-valued keys) and as src/models/openelm.cpp and
deci.cpp read them, and llama.cpp itself computes the reference logits (make_tiny_models'
f32-KV-cache batch and greedy decode).

openelm: every layer its own query heads, KV heads (GQA ratios differ too) and FFN width;
fused QKV; per-head Q and K RMSNorms (weights drawn away from 1); NeoX rope; the output
head tied to the embeddings (llama.cpp always reads token_embd as the head).

deci: every kind of layer llama.cpp's deci.cpp has, once at least -- attention with
different KV head counts, a "linear attention" layer (0 KV heads: wo on the normed input),
an attention-free layer (0 heads) with an FFN, and a dummy layer (0 heads, FFN width 0:
the Nemotron-Ultra "no-op" block, which passes its input on). The last layer attends:
llama.cpp's deci graph skips the output-row selection on an FFN-free last layer.

Usage: python scripts/make_tiny_per_layer.py {openelm|deci} OUT_DIR   (model.gguf, ref.npz)
"""

from __future__ import annotations

import sys
from pathlib import Path

import make_tiny_models as tiny
import numpy as np
from gguf import GGUFWriter

N_EMBD, HEAD_DIM, N_VOCAB, N_CTX_TRAIN = 64, 16, 512, 256
EPS = 1e-6

# Per layer: (query heads, KV heads, FFN width).
OPENELM_LAYERS = ((4, 1, 96), (4, 2, 128), (6, 3, 160), (8, 2, 192))
DECI_LAYERS = (
    (4, 2, 128),  # attention
    (4, 0, 96),  # "linear attention": wo only
    (0, 0, 160),  # attention-free, FFN only
    (0, 0, 0),  # no-op (dummy) layer
    (4, 4, 64),  # attention, as many KV heads as query heads
    (4, 1, 128),  # attention, one KV head
)
LAYERS = {"openelm": OPENELM_LAYERS, "deci": DECI_LAYERS}
SEEDS = {"openelm": 21, "deci": 22}


Layers = tuple[tuple[int, int, int], ...]


def tensors(
    arch: str, seed: int | None = None, layers: Layers | None = None
) -> dict[str, np.ndarray]:
    """The model's tensors by GGUF name, numpy order (ggml's ne reversed). `layers`
    replaces the arch's per-layer (heads, KV heads, FFN width) (tests' malformed files)."""
    rng = np.random.default_rng(SEEDS[arch] if seed is None else seed)

    def w(*shape: int, std: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return rng.uniform(0.5, 1.6, n).astype(np.float32)

    d, hd = N_EMBD, HEAD_DIM
    t = {"token_embd.weight": w(N_VOCAB, d, std=0.5), "output_norm.weight": norm(d)}
    if arch == "deci":
        t["output.weight"] = w(N_VOCAB, d, std=0.4)
    for i, (h, kv, ff) in enumerate(LAYERS[arch] if layers is None else layers):
        p = f"blk.{i}."
        if h > 0:
            t[p + "attn_norm.weight"] = norm(d)
        if arch == "openelm" and h > 0:
            t[p + "attn_qkv.weight"] = w((h + 2 * kv) * hd, d)
            t[p + "attn_q_norm.weight"] = norm(hd)
            t[p + "attn_k_norm.weight"] = norm(hd)
            t[p + "attn_output.weight"] = w(d, h * hd)
        elif arch == "openelm":
            pass  # a malformed file's layer without heads (refused by frink)
        elif kv > 0:
            t[p + "attn_q.weight"] = w(h * hd, d)
            t[p + "attn_k.weight"] = w(kv * hd, d)
            t[p + "attn_v.weight"] = w(kv * hd, d)
            t[p + "attn_output.weight"] = w(d, h * hd)
        elif h > 0:
            t[p + "attn_output.weight"] = w(d, d)  # linear attention: [n_embd, n_embd]
        if ff > 0:
            t[p + "ffn_norm.weight"] = norm(d)
            t[p + "ffn_gate.weight"] = w(ff, d)
            t[p + "ffn_up.weight"] = w(ff, d)
            t[p + "ffn_down.weight"] = w(d, ff)
    return t


def write(
    arch: str,
    path: Path,
    seed: int | None = None,
    layers: Layers | None = None,
    extra: dict[str, np.ndarray] | None = None,
    head_count_kv: list[int] | None = None,
) -> Path:
    """The GGUF; `layers`, `extra` tensors and a `head_count_kv` array of its own make the
    malformed variants the tests refuse."""
    layers = LAYERS[arch] if layers is None else layers
    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_block_count(len(layers))
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    # Arrays, as both converters write them (llama.cpp's get_key_or_arr reads them).
    writer.add_feed_forward_length([ff for _, _, ff in layers])
    writer.add_head_count([h for h, _, _ in layers])
    writer.add_head_count_kv(head_count_kv or [kv for _, kv, _ in layers])
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_vocab_size(N_VOCAB)
    writer.add_tokenizer_model("none")
    for name, data in (tensors(arch, seed, layers) | (extra or {})).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make(arch: str, out_dir: Path, seed: int | None = None) -> dict[str, np.ndarray]:
    """model.gguf and ref.npz (llama.cpp's logits: a batch, and a greedy decode) in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = write(arch, out_dir / "model.gguf", seed)
    tokens = tiny.fixture_tokens(vocab=N_VOCAB)
    ref = {"tokens": tokens, "logits_llamacpp": tiny.llama_cpp_logits(gguf_path, tokens)}
    prompt = tokens[: tiny.GREEDY_PROMPT]
    chosen, step_logits = tiny.llama_cpp_greedy(gguf_path, prompt, 8)
    ref |= {"greedy_prompt": prompt, "greedy_llamacpp": chosen}
    ref["greedy_logits_llamacpp"] = step_logits
    np.savez(out_dir / "ref.npz", **ref)
    return ref


if __name__ == "__main__":
    made = make(sys.argv[1], Path(sys.argv[2]))
    lg = made["logits_llamacpp"]
    print(f"logits std {lg.std():.3f}, min top-2 gap {tiny.min_top2_gap(lg):.3g}")
