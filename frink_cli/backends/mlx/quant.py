"""GGUF blocks -> MLX affine quantization, bit for bit, where the formats coincide.

MLX's affine format stores per group of `group_size` weights one scale and one bias,
w = scale * q + bias, with q packed little-endian into uint32 words. Three GGUF block
types are exactly that with group 32: Q4_0 (w = d * (q - 8)), Q4_1 (w = d * q + m) and
Q8_0 (w = d * q, q signed; stored as q + 128 with bias -128 d). For these the device keeps
the file's own integers, so a quantized matmul on the device multiplies by exactly the
values the host body dequantized. Any other type is uploaded dense.
"""

from __future__ import annotations

import numpy as np

QUANTIZED_TYPES = ("Q4_0", "Q4_1", "Q8_0")
GROUP = 32

def device_format(dtype: str) -> str:
    """How the metal backend holds a tensor of GGUF/safetensors type `dtype`."""
    if dtype in QUANTIZED_TYPES:
        return f"quantized {8 if dtype == 'Q8_0' else 4}-bit, group {GROUP} (the file's own blocks)"
    return {"F32": "f32", "F16": "f16", "BF16": "bf16"}.get(dtype, "f32 (dequantized at load)")


_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def affine_from_blocks(raw: np.ndarray, dtype: str, rows: int, cols: int):
    """(q uint8 [rows, cols], scales f32 [rows, cols/32], biases f32, bits) of one tensor."""
    nb = cols // GROUP
    blocks = raw.reshape(rows, nb, _BLOCK_BYTES[dtype])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if dtype == "Q8_0":
        q = blocks[..., 2:34].view(np.int8).astype(np.int16) + 128
        return q.astype(np.uint8).reshape(rows, cols), d, -128.0 * d, 8
    if dtype == "Q4_0":
        qs = blocks[..., 2:18]
        bias = -8.0 * d
    else:  # Q4_1
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[..., 4:20]
        bias = m
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # element j<16: low nibble; j>=16: high
    return q.reshape(rows, cols), d, bias, 4


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values [rows, cols] -> uint32 words [rows, cols*bits/32], element i of a word
    at bits [i*bits, (i+1)*bits)."""
    per = 32 // bits
    q = q.astype(np.uint32).reshape(q.shape[0], -1, per)
    shifts = (np.arange(per, dtype=np.uint32) * bits)[None, None, :]
    return np.bitwise_or.reduce(q << shifts, axis=-1)
