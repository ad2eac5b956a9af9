"""EmbeddingGemma (`gemma-embedding`): Gemma 3's text layers with bidirectional attention,
an encoder whose final normed rows are pooled into embeddings.

    every layer: Gemma 3's (sandwich norms, QK norm, GeGLU, sqrt(n_embd) embedding scale)
    attention:   no causal mask; a local layer sees the keys with |q - k| <= window // 2
                 (window: config.json's sliding_window), a global layer every key
    after:       the final RMSNorm, then the folder's modules (mean pooling, two Dense
                 layers, Normalize: embedding.py)

Follows transformers' Gemma3TextModel with `use_bidirectional_attention` (whose config
turns sliding_window W into W // 2 + 1 and masks |q - k| >= that) and llama.cpp's
LLM_ARCH_GEMMA_EMBEDDING (LLAMA_SWA_TYPE_SYMMETRIC: masked where |q - k| > n_swa / 2). Its
converter class (EmbeddingGemma, for architectures Gemma3TextModel) writes config.json's
own sliding_window; with --sentence-transformers-dense-modules it also writes the folder's
Dense weights as dense_2 / dense_3, which embedding.py applies to a GGUF's pooled rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.attention import AttentionSpec
from ..model.config import LayerShape, ModelConfig
from ..model.reader import TensorReader
from .base import get
from .decoder import DecoderConfig, with_ext
from .gemma3 import Gemma3
from .hf_plan import HfModelType


@dataclass(frozen=True)
class EmbeddingGemmaConfig(DecoderConfig):
    """Gemma 3's layer as an encoder; bidirectional: no causal mask, a local layer's window
    symmetric around its query (off: Gemma 3's causal attention)."""

    bidirectional: bool = False

    def embeds_only(self) -> bool:
        return True

    def read_head(self, r: TensorReader, cfg: ModelConfig) -> tuple[np.ndarray, ...]:
        """A GGUF's Dense matrices after pooling (llama.cpp's dense_2, then dense_3), each
        [out, in], where the converter wrote them (--sentence-transformers-dense-modules);
        an HF folder's Dense modules are its modules.json's (embedding.py)."""
        out: list[np.ndarray] = []
        width = cfg.n_embd
        for name in ("dense_2.weight", "dense_3.weight"):
            if not r.has(name):
                break
            rows = r.ckpt.tensors.info(name).shape[0]
            out.append(r.get(name, (rows, width)))
            width = rows
        return tuple(out)

    def pooled_dense(self, head: Any) -> list[Any]:
        return list(head or ())

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        spec = super().make_attention_spec(cfg, shape)
        if not self.bidirectional:
            return spec
        # The file's window W: keys with |q - k| <= W // 2, the attention's |q - k| < window.
        window = shape.window // 2 + 1 if shape.window is not None else None
        return dataclasses.replace(spec, causal=False, window=window)


def _bidirectional(config: dict[str, Any]) -> bool:
    return config.get("use_bidirectional_attention") is True


class GemmaEmbedding(Gemma3):
    name = "gemma-embedding"
    ext_class = EmbeddingGemmaConfig
    hf_model_types: ClassVar[dict[str, HfModelType]] = {
        "gemma3_text": Gemma3.hf_model_types["gemma3_text"]
    }

    # Gemma3TextModel's own names (no "model." prefix, no lm_head), and Gemma 3's.
    hf_tensors = tuple((hf.removeprefix("model."), gg) for hf, gg in Gemma3.hf_tensors) + (
        Gemma3.hf_tensors
    )

    @classmethod
    def hf_claims(cls, config: dict[str, Any]) -> bool:
        return _bidirectional(config)

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        window = get(ckpt.metadata, self.key("attention.sliding_window"))
        if window is not None and int(window) < 2:
            # 0 would read as "no window" and 1 as a row seeing only itself: refused by name
            # rather than guessed.
            raise FrinkError(f"{ckpt.path}: gemma-embedding sliding_window {window} (2 or more)")
        return with_ext(super().config(ckpt), bidirectional=True)
