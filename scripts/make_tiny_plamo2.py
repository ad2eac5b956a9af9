"""A tiny random PLaMo-2 GGUF in llama.cpp's layout, and llama.cpp's logits for it.

Why: transformers has no PLaMo-2 (it is remote code), so the converter cannot be fed a
tiny HF model: the file is written directly with gguf-py, named and shaped as llama.cpp's
conversion/plamo.py (Plamo2Model) writes it and src/models/plamo2.cpp reads it, and
llama.cpp itself computes the reference logits (make_tiny_models' f32-KV-cache batch and
greedy decode).

What the converter writes, and so this file: per-layer head counts with 0 on the Mamba
layers; ssm.time_step_rank = the Mamba
head count, ssm.inner_size = heads * hidden_size_per_head, ssm.group_count 0; A stored as
-exp(A_log) [n_heads]; the conv kernel squeezed to [d_inner, d_conv]; the norms it
renames without a ".weight" suffix (post_attention_norm, post_ffw_norm, ssm_dt_norm,
ssm_b_norm, ssm_c_norm, ssm_a, ssm_d); per-head Q/K norm weights [heads, head_dim]; the
fused QKV; ffn_up holding the SwiGLU gate rows, then the up rows. Tensor shapes below are
numpy's (ggml's ne reversed).

The layers are attention, Mamba, attention, Mamba. The converter's own pattern (mamba_step
2) puts Mamba first, and llama.cpp 0.3.36 cannot run that: it sizes the rotation from
layer 0's head count (n_head(0) = 0 on a Mamba layer leaves n_rot = 0) and its CPU rope
never returns for 0 rotated dims. With an attention layer first it rotates whole heads, as
PLaMo-2 does, and the file is otherwise the converter's.

Every decoration is drawn away from its neutral value (the norms around 1, the post-norms
around the converter's 1/5 and 1/5**1.5 offsets, D, the dt bias), so a dropped one moves
the logits far. The reference sequence (80 tokens) and the greedy prompt (72) cross the
64-row recurrent prefill chunk.

Usage: python scripts/make_tiny_plamo2.py OUT_DIR    (writes model.gguf and ref.npz)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_models as tiny  # noqa: E402
from dequantize_gguf import finish  # noqa: E402

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_VOCAB = 4, 64, 4, 2, 16, 128, 512
MAMBA_HEADS, D_STATE, D_CONV = 4, 16, 4
D_INNER = MAMBA_HEADS * HEAD_DIM
DT_DIM = max(64, N_EMBD // 16)  # llama.cpp's dt width (not in the file)
N_CTX_TRAIN = 2048
EPS = 1e-6
ROPE_BASE = 10000.0
SEED = 34  # of seeds 31-40, the widest top-2 gaps (0.021; greedy 0.053)
SEQ_LEN, GREEDY_PROMPT, GREEDY = 80, 72, 24
MAMBA_LAYERS = tuple(i % 2 == 1 for i in range(N_LAYER))


def tensors(seed: int = SEED) -> dict[str, np.ndarray]:
    """The model's tensors by GGUF name, numpy order."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float = 0.15) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def around(center: float, spread: float, *shape: int) -> np.ndarray:
        return (center + rng.uniform(-spread, spread, shape)).astype(np.float32)

    d = N_EMBD
    t = {
        "token_embd.weight": w(N_VOCAB, d, std=0.5),
        "output_norm.weight": around(1.0, 0.5, d),
        "output.weight": w(N_VOCAB, d, std=0.3),
    }
    for i, is_mamba in enumerate(MAMBA_LAYERS):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = around(1.0, 0.5, d)
        if is_mamba:
            t[p + "ssm_in.weight"] = w(2 * D_INNER, d)
            t[p + "ssm_conv1d.weight"] = w(D_INNER, D_CONV, std=0.4)
            t[p + "ssm_x.weight"] = w(DT_DIM + 2 * D_STATE, D_INNER)
            t[p + "ssm_dt.weight"] = w(MAMBA_HEADS, DT_DIM, std=0.2)
            t[p + "ssm_dt.bias"] = around(-1.0, 0.8, MAMBA_HEADS)
            t[p + "ssm_a"] = -np.exp(around(-1.0, 0.8, MAMBA_HEADS))
            t[p + "ssm_d"] = around(1.0, 0.6, MAMBA_HEADS)
            t[p + "ssm_out.weight"] = w(d, D_INNER)
            t[p + "ssm_dt_norm"] = around(1.0, 0.5, DT_DIM)
            t[p + "ssm_b_norm"] = around(1.0, 0.5, D_STATE)
            t[p + "ssm_c_norm"] = around(1.0, 0.5, D_STATE)
        else:
            t[p + "attn_qkv.weight"] = w((N_HEAD + 2 * N_HEAD_KV) * HEAD_DIM, d)
            t[p + "attn_q_norm.weight"] = around(1.0, 0.6, N_HEAD, HEAD_DIM)
            t[p + "attn_k_norm.weight"] = around(1.0, 0.6, N_HEAD_KV, HEAD_DIM)
            t[p + "attn_output.weight"] = w(d, N_HEAD * HEAD_DIM)
        t[p + "post_attention_norm"] = around(0.2, 0.15, d)
        t[p + "ffn_norm.weight"] = around(1.0, 0.5, d)
        t[p + "ffn_up.weight"] = w(2 * N_FF, d)
        t[p + "ffn_down.weight"] = w(d, N_FF)
        t[p + "post_ffw_norm"] = around(5**-1.5, 0.06, d)
    return t


def write(
    path: Path,
    seed: int = SEED,
    metadata: dict[str, int] | None = None,
    drop: tuple[str, ...] = (),
) -> Path:
    """The GGUF; `metadata` overrides the ssm.* sizes (a key -> value, "" key prefix the
    arch) and `drop` leaves tensors out, for the malformed files the tests refuse."""
    md: dict[str, int] = {
        "ssm.state_size": D_STATE,
        "ssm.conv_kernel": D_CONV,
        "ssm.time_step_rank": MAMBA_HEADS,
        "ssm.inner_size": D_INNER,
        "ssm.group_count": 0,
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
    } | (metadata or {})
    tmp = path.with_suffix(".tmp")
    writer = GGUFWriter(str(tmp), "plamo2")
    writer.add_name("tiny plamo2")
    writer.add_vocab_size(N_VOCAB)
    writer.add_head_count_kv([0 if m else N_HEAD_KV for m in MAMBA_LAYERS])
    writer.add_head_count([0 if m else N_HEAD for m in MAMBA_LAYERS])
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    for key, value in md.items():
        writer.add_uint32(f"plamo2.{key}", value)
    writer.add_feed_forward_length(N_FF)
    writer.add_tokenizer_model("none")
    for name, data in tensors(seed).items():
        if name not in drop:
            writer.add_tensor(name, data)
    finish(writer, tmp, path)
    return path


def make(out_dir: Path, seed: int = SEED) -> dict[str, np.ndarray]:
    """model.gguf and ref.npz (llama.cpp's logits: a batch, and a greedy decode) in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = write(out_dir / "model.gguf", seed)
    tokens = tiny.fixture_tokens(length=SEQ_LEN, vocab=N_VOCAB)
    ref = tiny.llama_cpp_reference(gguf_path, tokens, tokens[:GREEDY_PROMPT], GREEDY)
    np.savez(out_dir / "ref.npz", **ref)
    return ref


if __name__ == "__main__":
    made = make(Path(sys.argv[1]))
    for what in ("logits_llamacpp", "greedy_logits_llamacpp"):
        print(f"{what}: min top-2 gap {tiny.min_top2_gap(made[what]):.3g}")
