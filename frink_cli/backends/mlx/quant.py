"""GGUF blocks -> MLX affine quantization, bit for bit, where the formats coincide.

MLX's affine format stores per group of `group_size` weights one scale and one bias,
w = scale * q + bias, with q packed little-endian into uint32 words. Three GGUF block
types are exactly that with group 32: Q4_0 (w = d * (q - 8)), Q4_1 (w = d * q + m) and
Q8_0 (w = d * q, q signed; stored as q + 128 with bias -128 d). For these the device keeps
the file's own integers, so a quantized matmul on the device multiplies by exactly the
values the host body dequantized. Any other type is uploaded dense.

Expert stacks ([n_expert, out, in], ffn_*_exps) follow the same rule: a mappable type stays
in the file's blocks, repacked per row exactly as a 2-D tensor's, and the MoE graph
multiplies the chosen experts in place (gather_qmm / gather_mm) without copying them.
"""

from __future__ import annotations

import numpy as np

QUANTIZED_TYPES = ("Q4_0", "Q4_1", "Q8_0")
GROUP = 32

def device_format(dtype: str) -> str:
    """How the metal backend holds a tensor of GGUF/safetensors type `dtype` (expert stacks
    included: `frink info --backend metal` lists this per type)."""
    if dtype in QUANTIZED_TYPES:
        return (f"quantized {8 if dtype == 'Q8_0' else 4}-bit, group {GROUP} (the file's own blocks;"
                " expert stacks too, multiplied in place by gather_qmm)")
    return {
        "F32": "f32",
        # gather_mm would promote a stack to the activations' f32 on every call (a copy of
        # every expert per token), so on the GPU expert rows are multiplied in the stack's
        # own type; MLX's CPU gather_mm is f32 only.
        "F16": "f16 (expert stacks: gather_mm on f16 activations; f32 on MLX's CPU device)",
        "BF16": "bf16 (expert stacks: gather_mm on bf16 activations; f32 on MLX's CPU device)",
    }.get(dtype, "f32 (dequantized at load, expert stacks too)")


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


# Rows converted per step by affine_stack: bounds the uint8/uint32 temporaries of a large
# expert stack (a 128-expert stack is hundreds of millions of weights) to a few tens of MB.
_CHUNK_WEIGHTS = 1 << 22


def affine_stack(raw: np.ndarray, dtype: str, shape: tuple[int, ...]):
    """One Q4_0/Q4_1/Q8_0 tensor of any rank (rows along the last axis, as GGUF stores
    them) -> (packed uint32 [*shape[:-1], cols*bits/32], scales f32 [*shape[:-1], cols/32],
    biases f32, bits). A 1-D tensor is one row. Same integers as affine_from_blocks + pack
    of the 2-D view [prod(shape[:-1]), cols], converted a slab of rows at a time."""
    cols = shape[-1]
    lead = tuple(shape[:-1]) or (1,)
    rows = int(np.prod(lead))
    bits = 8 if dtype == "Q8_0" else 4
    nb = cols // GROUP
    blocks = raw.reshape(rows, nb * _BLOCK_BYTES[dtype])
    packed = np.empty((rows, cols * bits // 32), np.uint32)
    scales = np.empty((rows, nb), np.float32)
    biases = np.empty((rows, nb), np.float32)
    step = max(1, _CHUNK_WEIGHTS // cols)
    for r in range(0, rows, step):
        e = min(rows, r + step)
        q, scales[r:e], biases[r:e], _ = affine_from_blocks(blocks[r:e], dtype, e - r, cols)
        packed[r:e] = pack(q, bits)
    return packed.reshape(*lead, -1), scales.reshape(*lead, nb), biases.reshape(*lead, nb), bits
