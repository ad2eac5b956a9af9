"""A tiny random Talkie GGUF in llama.cpp's layout, and llama.cpp's logits for it.

Why: transformers has no Talkie (it is remote code), so the converter cannot be fed a
tiny HF model: the file is written directly with gguf-py, named and shaped as llama.cpp's
conversion/talkie.py writes it and src/models/talkie.cpp reads it (tensor shapes in ggml
order: attn_q_norm {1, n_head}, the scales {1}), and llama.cpp itself computes the
reference logits (make_tiny_models' f32-KV-cache batch and greedy decode).

Every scalar that is a decoration is drawn away from 1 (per-layer skip scales, per-head Q
gains, the projection scales, the logit scale), so a dropped one moves the logits far.

Usage: python scripts/make_tiny_talkie.py OUT_DIR    (writes model.gguf and ref.npz)
"""

from __future__ import annotations

import sys
from pathlib import Path

import make_tiny_models as tiny
import numpy as np
from gguf import GGUFWriter

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_VOCAB = 3, 64, 4, 2, 16, 128, 512
N_CTX_TRAIN = 256
EPS = float(np.finfo(np.float32).eps)  # what the converter writes (F.rms_norm's default)
LOGIT_SCALE = 2.5
SEED = 12


def tensors(seed: int = SEED) -> dict[str, np.ndarray]:
    """The model's tensors by GGUF name, numpy order (ggml's ne reversed)."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def scalar(lo: float, hi: float, *shape: int) -> np.ndarray:
        return rng.uniform(lo, hi, shape or (1,)).astype(np.float32)

    t = {"token_embd.weight": w(N_VOCAB, N_EMBD, std=1.0), "output.weight": w(N_VOCAB, N_EMBD)}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        t[p + "attn_q.weight"] = w(N_HEAD * HEAD_DIM, N_EMBD, std=0.2)
        t[p + "attn_k.weight"] = w(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.2)
        t[p + "attn_v.weight"] = w(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.2)
        t[p + "attn_output.weight"] = w(N_EMBD, N_HEAD * HEAD_DIM, std=0.2)
        t[p + "attn_output.scale"] = scalar(0.4, 1.6)
        t[p + "attn_q_norm.weight"] = scalar(0.5, 3.0, N_HEAD, 1)  # ggml {1, n_head}
        t[p + "ffn_gate.weight"] = w(N_FF, N_EMBD, std=0.2)
        t[p + "ffn_up.weight"] = w(N_FF, N_EMBD, std=0.2)
        t[p + "ffn_down.weight"] = w(N_EMBD, N_FF, std=0.2)
        t[p + "ffn_down.scale"] = scalar(0.4, 1.6)
        t[p + "layer_output_scale.weight"] = scalar(0.3, 2.0)
    return t


def write(path: Path, seed: int = SEED) -> Path:
    writer = GGUFWriter(str(path), "talkie")
    writer.add_name("tiny talkie")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_float32("talkie.logit_scale", LOGIT_SCALE)
    writer.add_vocab_size(N_VOCAB)
    writer.add_tokenizer_model("none")
    for name, data in tensors(seed).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make(out_dir: Path, seed: int = SEED) -> dict[str, np.ndarray]:
    """model.gguf and ref.npz (llama.cpp's logits: a batch, and a greedy decode) in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = write(out_dir / "model.gguf", seed)
    tokens = tiny.fixture_tokens(vocab=N_VOCAB)
    ref = {"tokens": tokens, "logits_llamacpp": tiny.llama_cpp_logits(gguf_path, tokens)}
    prompt = tokens[: tiny.GREEDY_PROMPT]
    chosen, step_logits = tiny.llama_cpp_greedy(gguf_path, prompt, 8)
    ref |= {"greedy_prompt": prompt, "greedy_llamacpp": chosen}
    ref["greedy_logits_llamacpp"] = step_logits
    np.savez(out_dir / "ref.npz", **ref)
    return ref


if __name__ == "__main__":
    made = make(Path(sys.argv[1]))
    lg = made["logits_llamacpp"]
    print(f"logits std {lg.std():.3f}, min top-2 gap {tiny.min_top2_gap(lg):.3g}")
