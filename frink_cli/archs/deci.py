"""DeciLM / Nemotron-NAS (`deci`): per-layer sizes, and layers without attention or FFN.

Follows llama.cpp's src/models/deci.cpp (and conversion/deci.py, the converter of
DeciLMForCausalLM: Llama-3_1-Nemotron-51B and -Ultra-253B's block_configs, DeciLM-7B's
num_key_value_heads_per_layer; transformers has no DeciLM, so there is no HF-dir path).
A llama layer (norm rope, SwiGLU, rope_freqs, q.k scaled by attention.scale or
1/sqrt(head_dim)), except that each layer has its own sizes (ModelConfig.layer_sizes):

- n_head > 0, n_head_kv > 0: attention with the layer's own KV head count;
- n_head > 0, n_head_kv == 0: "linear attention" (mixer "linear"): x + wo(attn_norm(x)),
  wo [n_embd, n_embd], nothing attends and nothing is cached;
- n_head == 0: attention-free (mixer "none"): no attn_norm, the FFN reads x itself;
- n_ff == 0: FFN-free (ffn "none"). The converter writes it for the Nemotron-Ultra dummy
  block, which has no attention either: the layer passes its input on.

Refused by name, not guessed:
- an FFN-free layer WITH attention: llama.cpp's deci.cpp `continue`s past such a layer
  without taking its output (the attention branch is computed and discarded), while the
  original model adds it; no published model has one, and the two readings differ;
- bias tensors: llama.cpp adds optional FFN biases and ignores a linear layer's wo bias;
  no published deci file has them, and frink's dense FFN carries none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import LayerShape, ModelConfig
from .base import Arch
from .decoder import DecoderConfig
from .hf_plan import HfModelType


@dataclass(frozen=True)
class DeciConfig(DecoderConfig):
    """Per-layer sizes whose zeros shape the layer (llama.cpp's deci.cpp): no heads, no
    attention (mixer "none"); heads without KV heads, "linear attention": wo on the normed
    rows (mixer "linear"); no FFN width, no FFN."""

    def mixer(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, at: At
    ) -> Array:
        if shape.mixer == "linear":
            return ops.linear(h, w.wo)
        return super().mixer(ops, cfg, shape, w, h, at)


class Deci(Arch):
    name = "deci"
    ext_class = DeciConfig
    hf_model_types: ClassVar[dict[str, HfModelType]] = {}
    per_layer_sizes = True
    zero_head_layers = True
    zero_ffn_layers = True

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        where = ckpt.path
        biases = sorted(n for n in ckpt.tensors.names() if n.endswith(".bias"))
        if biases:
            raise FrinkError(f"{where}: deci bias tensors are not supported ({biases[0]})")
        if cfg.head_dim_k != cfg.head_dim_v or cfg.rope_dim != cfg.head_dim_k:
            raise FrinkError(
                f"{where}: deci needs key_length == value_length == rope dimensions "
                f"({cfg.head_dim_k}, {cfg.head_dim_v}, {cfg.rope_dim}), as llama.cpp asserts"
            )
        for layer in range(cfg.n_layer):
            shape = cfg.layer_shape(layer)
            if shape.ffn == "none" and shape.mixer != "none":
                raise FrinkError(
                    f"{where}: deci layer {layer} has attention but no FFN, which frink does "
                    "not support (llama.cpp discards such a layer's output; the original "
                    "model adds it)"
                )
        return cfg
