"""The ops the MLX graphs implement (backends/mlx/graph.py's MlxOps), with the arguments
they carry: what `layer_refusals` asks of each layer's trace. Importing it never imports
MLX, so `frink info --backend metal` answers anywhere.

Every primitive of the block library is traced into the compiled graph; attention is
SDPA over the device mirror (windows, ALiBi, sinks, KV sharing, bidirectional with a
symmetric window, V heads narrower or wider than K's) without a logit softcap or a
relative score bias; the activations are SiLU and GELU-tanh, gated or not,
and SwiGLU-OAI gated.
"""

from __future__ import annotations

from ...graph.trace import OpCall
from ..capability import Capabilities, supported

# The KV cache types (-ctk/-ctv) its mirrors hold; q8_0 / q4_0 rows it cannot read.
KV_CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16")
CARRIED_ACTIVATIONS = ("silu", "gelu_tanh", "swiglu_oai")
PLAIN_ACTIVATIONS = ("silu", "gelu_tanh")


def _gated(call: OpCall) -> str | None:
    return None if call["act"] in CARRIED_ACTIVATIONS else "act"


def _plain(call: OpCall) -> str | None:
    return None if call["act"] in PLAIN_ACTIVATIONS else "act"


def _attention(call: OpCall) -> str | None:
    if call["bias"]:
        return "relative bias"
    if call["softcap"]:
        return "softcap"
    return None


MLX_OPS: Capabilities = {
    **dict.fromkeys(
        (
            "linear",
            "rms_norm",
            "rms_norm_",
            "layer_norm",
            "clamp_",
            "add_",
            "concat",
            "scale_",
            "softcap_",
            "sigmoid",
            "sigmoid_mul_",
            "index",
            "rope_",
            "causal_conv",
            "l2_norm",
            "softplus",
            "delta_rule",
            "selective_scan",
            "lightning_attention",
            "route",
            "route_grouped",
            "head_matmul",
        ),
        supported,
    ),
    "glu": _gated,
    "act": _plain,
    "experts": _gated,
    "attention": _attention,
}
