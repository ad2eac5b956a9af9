"""Tiny random embedding models as sentence-transformers folders, written by
sentence-transformers itself: an MPNet (mean pooling + Normalize, all-mpnet-base-v2's
shape) and an EmbeddingGemma (Gemma 3 text with bidirectional attention; mean pooling, two
Dense layers without bias and Normalize, embeddinggemma-300m's shape).

Both borrow a BERT WordPiece tokenizer (all-MiniLM-L6-v2's files, passed as vocab_dir): the
fixtures check the encoder and the modules, and the tokenizer is the one both sides read.
Their norms, biases and relative-bias table are drawn away from their defaults so that a
dropped decoration moves the embeddings. tests/test_embed_families.py makes them on first
use; by hand:

    python scripts/make_tiny_encoders.py VOCAB_DIR OUT_DIR
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)
# What both models share: the borrowed BERT vocabulary (its [CLS], [SEP] and [PAD] as the
# bos / eos / pad ids), 64-wide rows in 4 heads, and weights drawn 10x transformers'
# default (0.02 leaves attention near uniform, so a dropped mask or bias would hardly show).
SHARED = {
    "vocab_size": 30522,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "initializer_range": 0.2,
    "bos_token_id": 101,
    "eos_token_id": 102,
    "pad_token_id": 0,
}
# Past MPNet's exact buckets (< 8) and its max_distance (128); past the Gemma window.
MAX_SEQ = 400
GEMMA_WINDOW = 8  # config.json's sliding_window: keys with |q - k| <= 4 on the local layers


def _draw(model: object, scale: float = 0.2) -> None:
    """Norm weights and biases drawn away from their defaults (1 and 0)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():  # type: ignore[attr-defined]
            if "LayerNorm.weight" in name:  # MPNet's LayerNorms scale by w
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
            elif "norm.weight" in name:  # Gemma's RMSNorms scale by 1 + w
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(scale * torch.randn_like(p))
            elif "relative_attention_bias" in name:
                p.copy_(2.0 * torch.randn_like(p))


def _save(model: object, base: Path, vocab_dir: Path, out: Path, extra: list[object]) -> Path:
    """model saved with the borrowed tokenizer, then wrapped by sentence-transformers into
    out with mean pooling, the extra modules and Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    model.save_pretrained(base, safe_serialization=True)  # type: ignore[attr-defined]
    for f in TOKENIZER_FILES:
        shutil.copy(vocab_dir / f, base / f)
    word = models.Transformer(str(base), max_seq_length=MAX_SEQ)
    dim = word.get_embedding_dimension()
    modules = [word, models.Pooling(dim, pooling_mode="mean"), *extra, models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


def make_mpnet(vocab_dir: Path, out: Path) -> Path:
    """A 2-layer MPNetModel (64 wide, 4 heads) as out/, a sentence-transformers folder."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.MPNetConfig(
        num_hidden_layers=2, max_position_embeddings=514, layer_norm_eps=1e-5, **SHARED
    )
    model = transformers.MPNetModel(cfg).eval()
    _draw(model)
    return _save(model, out.parent / (out.name + "-hf"), vocab_dir, out, [])


def make_embedding_gemma(vocab_dir: Path, out: Path) -> Path:
    """A 6-layer Gemma3TextModel with bidirectional attention (five local layers of window
    GEMMA_WINDOW, then a global one: the pattern llama.cpp hard-codes), mean pooling,
    Dense 64 -> 128 -> 64 (no bias, identity) and Normalize, as out/."""
    import torch
    import transformers
    from sentence_transformers.sentence_transformer import modules as models

    torch.manual_seed(1)
    cfg = transformers.Gemma3TextConfig(
        num_hidden_layers=6,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=GEMMA_WINDOW,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh",
        use_bidirectional_attention=True,
        **SHARED,
    )
    model = transformers.Gemma3TextModel(cfg).eval()
    _draw(model)
    identity = torch.nn.Identity()
    dense = [
        models.Dense(64, 128, bias=False, activation_function=identity),
        models.Dense(128, 64, bias=False, activation_function=identity),
    ]
    return _save(model, out.parent / (out.name + "-hf"), vocab_dir, out, dense)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vocab_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    a = ap.parse_args()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    print(make_mpnet(a.vocab_dir, a.out_dir / "mpnet"))
    print(make_embedding_gemma(a.vocab_dir, a.out_dir / "embeddinggemma"))


if __name__ == "__main__":
    main()
