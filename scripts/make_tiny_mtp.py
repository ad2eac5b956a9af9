"""A tiny model with multi-token-prediction (MTP / NextN) blocks, and llama.cpp's run of them.

`with_mtp` adds MTP weights to a tiny fixture's HF dir, as released Qwen3.5 checkpoints
carry them, and converts it with llama.cpp's converter, which appends them as NextN
blocks; `llama_cpp_mtp` runs llama.cpp's MTP head over it: the reference frink's
`--spec mtp` drafter (frink_cli/mtp.py) is checked against.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_cpp_converter  # noqa: E402
from make_tiny_models import N_CTX, _context_params, _llama_context, _llama_decode  # noqa: E402
from tiny_specs import NORM_STD, SPECS, WEIGHT_STD  # noqa: E402


def with_mtp(spec_name: str, hf_dir: Path, out_dir: Path, n_mtp: int = 1) -> Path:
    """A GGUF of the tiny model `spec_name` (its HF dir) with n_mtp multi-token-prediction
    blocks, as a released Qwen3.5 checkpoint carries them: a copy of the model sharded as
    released ones are (model.safetensors.index.json over the trunk's shard and the MTP
    shard; transformers leaves the mtp.* weights unread, llama.cpp's converter reads every
    model*.safetensors), out_dir/hf: mtp.fc over [embedding; hidden], its two pre-fc
    norms, full-attention decoder layers shaped as the trunk's attention layers and the
    head norm, drawn as _randomize draws the trunk's; config mtp_num_hidden_layers says how
    many. The converter appends them as NextN blocks (nextn_predict_layers)."""
    from safetensors.numpy import load_file, save_file

    spec = SPECS[spec_name]
    hf = out_dir / "hf"
    shutil.copytree(hf_dir, hf)
    trunk = load_file(str(hf / "model.safetensors"))
    hf_cfg = json.loads((hf / "config.json").read_text())
    n, d = int(hf_cfg["num_hidden_layers"]), int(hf_cfg["hidden_size"])
    attn = next(i for i in range(n) if f"model.layers.{i}.self_attn.q_proj.weight" in trunk)
    src = f"model.layers.{attn}."
    shapes = {
        "mtp.fc.weight": (d, 2 * d),
        "mtp.pre_fc_norm_embedding.weight": (d,),
        "mtp.pre_fc_norm_hidden.weight": (d,),
        "mtp.norm.weight": (d,),
    }
    for k in range(n_mtp):
        for name, t in trunk.items():
            if name.startswith(src):
                shapes[f"mtp.layers.{k}.{name[len(src) :]}"] = t.shape
    rng = np.random.default_rng(spec.seed + 1000)
    mtp = {
        name: (
            rng.standard_normal(shape) * WEIGHT_STD
            if len(shape) >= 2
            else spec.norm_center + rng.standard_normal(shape) * NORM_STD
        ).astype(np.float32)
        for name, shape in shapes.items()
    }
    shards = {"model-00001-of-00002.safetensors": trunk, "model-00002-of-00002.safetensors": mtp}
    (hf / "model.safetensors").rename(hf / "model-00001-of-00002.safetensors")
    save_file(mtp, str(hf / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {name: shard for shard, ts in shards.items() for name in ts}
    index = {"metadata": {}, "weight_map": weight_map}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    (hf / "config.json").write_text(json.dumps(dict(hf_cfg, mtp_num_hidden_layers=n_mtp)))
    args = tuple(a for a in spec.convert_args if a != "--no-mtp")
    gguf = out_dir / "model.gguf"
    llama_cpp_converter.convert(hf, gguf, outtype="f32", model_name=spec.name, extra_args=args)
    return gguf


def llama_cpp_mtp(gguf_path: Path, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's multi-token-prediction head on `tokens`: (the target's hidden states as
    it hands them to the head (its "nextn embeddings": after the final norm) [T, n_embd],
    the head's logits [T - 1, n_vocab] for tokens[1:] at positions 0..T-2, its own KV rows).

    This llama-cpp-python's llama_batch_ext_set_embd_state is a stub (it returns false and
    keeps nothing), so the head's row reads a zero state: the logits check the block with
    h = 0 (embedding, enorm, eh_proj, the decoder layer, head norm and head), and the
    hidden states are checked apart."""
    import llama_cpp.llama_cpp_ext as X

    toks = [int(t) for t in tokens]
    n_ctx = max(N_CTX, len(toks))
    with _llama_context(gguf_path, n_ctx, load_mtp=True) as (L, ctx, n_vocab):
        X.llama_set_embeddings_nextn(ctx, True, False)
        _llama_decode(L, ctx, n_vocab, toks, 0)
        n_embd = L.llama_model_n_embd(L.llama_get_model(ctx))
        hidden = np.stack(
            [
                np.ctypeslib.as_array(X.llama_get_embeddings_nextn_ith(ctx, i), shape=(n_embd,))
                for i in range(len(toks))
            ]
        ).copy()
        cparams = _context_params(L, n_ctx, 2, None)
        cparams.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        cparams.ctx_other = ctx
        mtp = L.llama_init_from_model(L.llama_get_model(ctx), cparams)
        batch = L.llama_batch_ext_init(mtp)
        try:
            for k, tok in enumerate(toks[1:]):
                idx = L.llama_batch_ext_add_token(batch, 0, tok)
                pos = L.llama_pos(k)
                assert L.llama_batch_ext_set_pos(batch, idx, ctypes.byref(pos))
                L.llama_batch_ext_set_output_logits(batch, idx, True)
            if L.llama_process(mtp, L.LLAMA_PROCESS_TYPE_DECODE, batch) != 0:
                raise RuntimeError(f"llama.cpp's MTP head failed on {gguf_path}")
            logits = np.stack(
                [
                    np.ctypeslib.as_array(L.llama_get_logits_ith(mtp, i), shape=(n_vocab,))
                    for i in range(len(toks) - 1)
                ]
            ).copy()
        finally:
            L.llama_batch_ext_free(batch)
            L.llama_free(mtp)
        return hidden, logits
