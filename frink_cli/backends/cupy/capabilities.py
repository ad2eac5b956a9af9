"""The ops the cuda stack implements (backends/cupy/ops.py's CudaOps over the kernels), with
the arguments it carries: what `layer_reasons` asks of each layer's trace.

GEMMs (with or without bias), RMSNorm with a weight (rows, or heads where they lie in the
QKV rows), LayerNorm over rows, the two rope layouts over even dims within the head,
attention over the device KV cache (own K/V of one width up to the kernel's head-dim
bound, windows, ALiBi; no logit softcap, no sinks), SiLU / GELU-tanh activations, gated
or not, and the elementwise decorations. The gated delta net's, mamba's, the short conv's
and MoE's primitives and the sigmoid gate are not implemented.
"""

from __future__ import annotations

from ...graph.trace import OpCall
from ..capability import Capabilities, supported
from .kernel_ops import ACT_CODES

# Shared-memory bounds of kernels/attention.cu (FRINK_MAX_HEAD_DIM; 2 dims per thread of 128).
MAX_HEAD_DIM = 256
# The KV cache types (-ctk/-ctv) its device cache holds: f32 rows only.
KV_CACHE_TYPES: tuple[str, ...] = ("f32",)
ROPE_LAYOUTS = ("norm", "neox")


def _weighted(call: OpCall) -> str | None:
    return None if call["weight"] else "no weight"


def _rows(call: OpCall) -> str | None:
    shape = call.shapes[0]
    return None if shape is not None and len(shape) == 2 else "not over rows"


def _activation(call: OpCall) -> str | None:
    return None if call["act"] in ACT_CODES else "act"


def _rope(call: OpCall) -> str | None:
    if call["layout"] not in ROPE_LAYOUTS:
        return "layout"
    head_dim = call.shapes[0][-1] if call.shapes[0] else 0
    dims = call["dims"]
    return "dims (odd or > head dim)" if dims % 2 == 1 or dims > head_dim else None


# Llama 4's chunked local attention and its attention temperature (NoPE layers).
CHUNKED = "chunked attention / attention temperature"


def _attention(call: OpCall) -> str | None:
    if call["bias"]:
        return "relative bias"
    if call["causal"] is False:
        return "bidirectional"
    if call["softcap"]:
        return "softcap"
    if call["own_kv"] and call["head_dim_k"] != call["head_dim_v"]:
        # Before sinks: a model with both is refused on every layer by this name.
        return "K/V widths differ"
    if call["sinks"]:
        return "sinks"
    if call["chunk"] or call["temperature"]:
        return CHUNKED
    if not call["own_kv"]:
        return "no K/V of its own"
    if max(call["head_dim_k"], call["head_dim_v"]) > MAX_HEAD_DIM:
        return f"head dim > {MAX_HEAD_DIM}"
    return None


CUDA_OPS: Capabilities = {
    "linear": supported,
    "rms_norm": _weighted,
    "rms_norm_": _weighted,
    "layer_norm": _rows,
    "clamp_": supported,
    "add_": supported,
    "concat": supported,
    "scale_": supported,
    "softcap_": supported,
    "glu": _activation,
    "act": _activation,
    "sigmoid": supported,
    "index": supported,
    "rope_": _rope,
    "attention": _attention,
}
