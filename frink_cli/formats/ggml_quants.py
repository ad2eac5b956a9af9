"""Dequantizers for the ggml types gguf-py knows by name but cannot dequantize.

Why: gguf-py (0.19) lists Q1_0 -- the 1-bit type of the Bonsai models -- in its type and
block-size tables but raises NotImplementedError in `dequantize`. Its meaning is ggml's
own (ggml-common.h `block_q1_0`, ggml-quants.c `dequantize_row_q1_0`), and
tests/test_q1_0.py checks this against llama.cpp's dequantization of files llama.cpp
itself quantized. Everything else still goes to gguf-py, so each type has one meaning.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType

# Q1_0: blocks of 128 weights, 18 bytes each: the scale d (f16), then 16 bytes of signs,
# weight j of the block in bit j % 8 of byte j // 8 (least significant first). A set bit
# is +d, a clear one -d (the quantizer stores d = mean |w| over the block).
QK1_0 = 128
_Q1_0_BYTES = 2 + QK1_0 // 8


def dequantize_q1_0(rows: np.ndarray) -> np.ndarray:
    """uint8 rows [..., n_blocks * 18] -> float32 [..., n_blocks * 128]."""
    lead = rows.shape[:-1]
    blocks = np.ascontiguousarray(rows).reshape(-1, _Q1_0_BYTES)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # [n, 1]
    signs = np.unpackbits(blocks[:, 2:], axis=-1, bitorder="little")  # [n, 128], bit j
    out = np.where(signs.astype(bool), d, -d)
    return out.reshape(*lead, -1)


def _type(name: str) -> GGMLQuantizationType | None:
    """The gguf-py enum member, if this gguf-py version names the type at all."""
    return getattr(GGMLQuantizationType, name, None)


# ggml type -> frink's dequantizer, for the types gguf-py lists but cannot dequantize.
DEQUANTIZERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    t: fn for t, fn in ((_type("Q1_0"), dequantize_q1_0),) if t is not None
}
