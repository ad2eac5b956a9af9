"""A tiny random MPT with QK LayerNorm (MPT's `qk_ln`, as SEA-LION uses it), converted by
llama.cpp's own converter, and llama.cpp's logits for it.

Why: transformers' MptForCausalLM has no qk_ln (it neither builds nor loads the q_ln /
k_ln weights), so the tiny `mpt` fixture of make_tiny_models cannot carry it through
transformers. This script takes that fixture's HF directory, adds per layer the two
LayerNorms MPT's qk_ln defines (attn.q_ln, attn.k_ln over the whole d_model width, weight
and bias, drawn at random away from the identity), sets attn_config.qk_ln, and converts the
directory with llama.cpp's converter (which maps them to attn_q_norm / attn_k_norm). The
reference is llama.cpp alone, fed one token per decode: its batched path cannot run this
graph (mpt.cpp reshapes Q and K, strided views of the fused QKV rows, and ggml_reshape_2d
asserts a contiguous tensor: GGML_ASSERT(ggml_is_contiguous(a)) with more than one token),
while a single row is contiguous. The logits over the tokens and a greedy decode, f32 KV.

Usage: python scripts/make_tiny_mpt_qk_ln.py MPT_HF_DIR OUT_DIR   (writes hf/, model.gguf, ref.npz)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import llama_cpp_converter
import make_tiny_models as tiny
import numpy as np

SEED = 53
GREEDY_STEPS = 24


def add_qk_ln(hf_dir: Path, seed: int = SEED) -> None:
    """q_ln / k_ln LayerNorms (weight ~ 1 +- 0.4, bias ~ +-0.3) on every layer of the HF
    directory's model.safetensors, and attn_config.qk_ln = true in its config.json."""
    from safetensors.numpy import load_file, save_file

    cfg_path = hf_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["attn_config"]["qk_ln"] = True
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    weights_path = hf_dir / "model.safetensors"
    tensors = load_file(weights_path)
    rng = np.random.default_rng(seed)
    d = int(cfg["d_model"])
    for i in range(int(cfg["n_layers"])):
        for which in ("q_ln", "k_ln"):
            p = f"transformer.blocks.{i}.attn.{which}."
            tensors[p + "weight"] = (1.0 + 0.4 * rng.standard_normal(d)).astype(np.float32)
            tensors[p + "bias"] = (0.3 * rng.standard_normal(d)).astype(np.float32)
    save_file(tensors, weights_path, metadata={"format": "pt"})


def make(mpt_hf_dir: Path, out_dir: Path, seed: int = SEED) -> dict[str, np.ndarray]:
    """out_dir/hf (the HF directory with qk_ln), out_dir/model.gguf (llama.cpp's conversion)
    and out_dir/ref.npz (llama.cpp's logits: a batch, and a greedy decode)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = out_dir / "hf"
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    shutil.copytree(mpt_hf_dir, hf_dir)
    add_qk_ln(hf_dir, seed)
    gguf_path = llama_cpp_converter.convert(hf_dir, out_dir / "model.gguf", model_name="mpt-qk-ln")
    tokens = tiny.fixture_tokens(seed=seed, vocab=512)
    ref = {"tokens": tokens, "logits_llamacpp": tiny.llama_cpp_step_logits(gguf_path, tokens)}
    prompt = tokens[: tiny.GREEDY_PROMPT]
    chosen, step_logits = tiny.llama_cpp_greedy(gguf_path, prompt, GREEDY_STEPS, batch_prompt=False)
    ref |= {"greedy_prompt": prompt, "greedy_llamacpp": chosen}
    ref["greedy_logits_llamacpp"] = step_logits
    np.savez(out_dir / "ref.npz", **ref)
    return ref


if __name__ == "__main__":
    made = make(Path(sys.argv[1]), Path(sys.argv[2]))
    lg = made["logits_llamacpp"]
    print(f"logits std {lg.std():.3f}, min top-2 gap {tiny.min_top2_gap(lg):.3g}")
