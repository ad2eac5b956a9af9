"""GGUF blocks -> MLX's quantized layouts (affine, mxfp4), bit for bit, where they coincide.

MLX's affine format stores per group of `group_size` weights one scale and one bias,
w = scale * q + bias, with q packed little-endian into uint32 words (a continuous bit
stream: 5-bit values straddle word boundaries). These GGUF block types are exactly that
with group 32:
  Q4_0 (w = d * (q - 8)), Q4_1 (w = d * q + m), Q5_0 (w = d * (q - 16)),
  Q5_1 (w = d * q + m), Q8_0 (w = d * q, q signed; stored as q + 128 with bias -128 d),
  Q4_K / Q5_K (a super-block of 256 = 8 sub-blocks of 32, w = (d * sc_j) * q - dmin * m_j
  with 6-bit sc_j, m_j: scale d * sc_j, bias -(dmin * m_j)).
For these the device keeps the file's own integers, so a quantized matmul on the device
multiplies by exactly the values the host body dequantized. The scales and biases are the
f32 values gguf-py's dequantize forms (d * sc, dmin * m: f16 times a small integer, exact
in f32), and scale * q is exact too (at most 11 + 6 + 5 bits), so MLX's scale * q + bias
rounds once, at the same place gguf-py's d * q - dm does: dequantize is bit-exact.
Q6_K, Q3_K and Q2_K scale sub-blocks of 16, which no MLX group size (32/64/128) holds, so
they (and any other type) are uploaded dense.

MXFP4 is MLX's mode="mxfp4": per 32 weights one e8m0 exponent byte and 32 e2m1 codes
(sign bit 3, magnitude bits 0-2), the codes packed 4 bits each in the same little-endian
stream as affine 4-bit, the scale byte e meaning 2^(e - 127) (measured with mx.quantize and
mx.dequantize, not assumed). ggml's block is the byte e then 16 bytes of nibbles in the
order of every 32-weight GGUF block; its dequantization is ggml_e8m0_to_fp32_half(e) =
2^(e - 128) times a table of doubled e2m1 values, which is the same 2^(e - 127) * e2m1:
the byte carries over unchanged. Three places differ, and each is handled, never guessed:
  - code 8 is +0 in ggml's table and -0 in e2m1: it is written as code 0, so even the sign
    of a zero matches;
  - e = 255 is NaN to MLX and 2^127 to ggml: such a tensor is not kept quantized;
  - e = 0 or 1 with a non-zero code gives subnormal weights, which MLX's CPU device keeps
    but a GPU may flush to zero: such a tensor is not kept quantized either (ggml's rule
    writes e < 2 only for a block of zeros, exact everywhere, or of weights below 2^-123).

Expert stacks ([n_expert, out, in], ffn_*_exps) follow the same rule: a mappable type stays
in the file's blocks, repacked per row exactly as a 2-D tensor's, and the MoE graph
multiplies the chosen experts in place (gather_qmm / gather_mm) without copying them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QUANTIZED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "MXFP4")
GROUP = 32
QK_K = 256  # weights per K-quant super-block

_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q8_0": 8, "MXFP4": 4}
# Bytes per block; a K-quant block covers QK_K weights, the others GROUP.
_BLOCK_BYTES = {
    "Q4_0": 18,
    "Q4_1": 20,
    "Q5_0": 22,
    "Q5_1": 24,
    "Q8_0": 34,
    "Q4_K": 2 + 2 + 12 + QK_K // 2,
    "Q5_K": 2 + 2 + 12 + QK_K // 8 + QK_K // 2,
    "MXFP4": 1 + GROUP // 2,
}


def mode(dtype: str) -> str:
    """The MLX quantization mode a QUANTIZED_TYPES type is held in."""
    return "mxfp4" if dtype == "MXFP4" else "affine"


class NotExact(ValueError):
    """A tensor of a QUANTIZED_TYPES type whose blocks MLX's layout would not reproduce
    exactly; the device holds it dense instead (the message says why)."""


# Why each GGUF type outside QUANTIZED_TYPES is not kept in its blocks on the device (what
# `frink info --backend metal` says); the host dequantizes it with gguf-py, as every backend.
_IQ_GRID = "its weights index a codebook grid (or sign table), not an affine scale * q + bias"
_DEQUANTIZED_WHY = {
    **dict.fromkeys(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"), _IQ_GRID),
    **dict.fromkeys(
        ("IQ4_NL", "IQ4_XS"), "its 4-bit codes index a non-uniform table, not MLX's affine steps"
    ),
    **dict.fromkeys(
        ("TQ1_0", "TQ2_0"),
        "ternary, base-3 packed (TQ1_0) or with a 256-weight scale (TQ2_0): no MLX layout",
    ),
    "NVFP4": "e2m1 values with fp8 scales per 16; no MLX layout",
    # (2-bit affine codes {0, 1} with scale 2d and bias -d at group size 128 would hold it
    # exactly; the device linears are wired for group 32 only.)
    "Q1_0": "1-bit signs with one scale per 128 weights; not mapped to an MLX layout",
}


def device_format(dtype: str) -> str:
    """How the metal backend holds a tensor of GGUF/safetensors type `dtype` (expert stacks
    included: `frink info --backend metal` lists this per type)."""
    if dtype == "MXFP4":
        return (
            f"quantized mxfp4 4-bit, group {GROUP} (the file's own e2m1 codes and e8m0 scales;"
            " expert stacks too, multiplied in place by gather_qmm; a tensor with an e8m0"
            " scale of 255 or subnormal weights is dequantized)"
        )
    if dtype in QUANTIZED_TYPES:
        return (
            f"quantized {_BITS[dtype]}-bit, group {GROUP} (the file's own blocks;"
            " expert stacks too, multiplied in place by gather_qmm)"
        )
    if dtype in ("Q6_K", "Q3_K", "Q2_K"):
        return (
            "f32 (dequantized at load, expert stacks too: its 16-weight sub-block scales"
            " fit no MLX group size)"
        )
    if dtype in _DEQUANTIZED_WHY:
        return f"f32 (dequantized at load, expert stacks too: {_DEQUANTIZED_WHY[dtype]})"
    return {
        "F32": "f32",
        # gather_mm would promote a stack to the activations' f32 on every call (a copy of
        # every expert per token), so on the GPU expert rows are multiplied in the stack's
        # own type; MLX's CPU gather_mm is f32 only.
        "F16": "f16 (expert stacks: gather_mm on f16 activations; f32 on MLX's CPU device)",
        "BF16": "bf16 (expert stacks: gather_mm on bf16 activations; f32 on MLX's CPU device)",
    }.get(dtype, "f32 (dequantized at load, expert stacks too)")


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] little-endian bytes -> f32 [...]."""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32]: element j < 16 the low nibble of byte j, j >= 16 the
    high nibble of byte j - 16 (the layout of every 32-weight GGUF block)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _k_scales(d: np.ndarray, dmin: np.ndarray, s: np.ndarray):
    """6-bit packed scales/mins of Q4_K/Q5_K ([..., 12] bytes; ggml's get_scale_min_k4) ->
    (scale, bias) f32 [..., 8], formed as gguf-py forms them."""
    s = s.reshape(*s.shape[:-1], 3, 4)
    lo, hi, mix = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], axis=-1)
    return d[..., None] * sc.astype(np.float32), -(dmin[..., None] * mn.astype(np.float32))


def affine_from_blocks(raw: np.ndarray, dtype: str, rows: int, cols: int):
    """(q uint8 [rows, cols], scales f32 [rows, cols/32], biases f32, bits) of one tensor."""
    bits = _BITS[dtype]
    if dtype in ("Q4_K", "Q5_K"):
        nb = cols // QK_K
        blocks = raw.reshape(rows, nb, _BLOCK_BYTES[dtype])
        scale, bias = _k_scales(_f16(blocks[..., 0:2]), _f16(blocks[..., 2:4]), blocks[..., 4:16])
        qs = blocks[..., -QK_K // 2 :].reshape(rows, nb, 4, 1, 32)
        # Sub-block 2c: low nibbles of bytes [32c, 32c+32); sub-block 2c+1: their high nibbles.
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(rows, nb, 8, 32)
        if dtype == "Q5_K":
            qh = blocks[
                ..., 16 : 16 + QK_K // 8
            ]  # bit j of byte i: high bit of sub-block j, weight i
            hb = np.unpackbits(qh[..., None], axis=-1, bitorder="little")  # [rows, nb, 32, 8]
            q = q | (hb.swapaxes(-1, -2) << 4)
        return q.reshape(rows, cols), scale.reshape(rows, -1), bias.reshape(rows, -1), bits
    nb = cols // GROUP
    blocks = raw.reshape(rows, nb, _BLOCK_BYTES[dtype])
    d = _f16(blocks[..., 0:2])
    if dtype == "Q8_0":
        q = blocks[..., 2:34].view(np.int8).astype(np.int16) + 128
        return q.astype(np.uint8).reshape(rows, cols), d, -128.0 * d, 8
    if dtype == "Q4_0":
        return _nibbles(blocks[..., 2:18]).reshape(rows, cols), d, -8.0 * d, 4
    if dtype == "Q4_1":
        return _nibbles(blocks[..., 4:20]).reshape(rows, cols), d, _f16(blocks[..., 2:4]), 4
    # Q5_0 / Q5_1: the 32 high bits in a little-endian uint32 before the nibbles.
    off = 2 if dtype == "Q5_0" else 4
    hb = np.unpackbits(blocks[..., off : off + 4], axis=-1, bitorder="little")
    q = _nibbles(blocks[..., off + 4 : off + 20]) | (hb << 4)
    bias = -16.0 * d if dtype == "Q5_0" else _f16(blocks[..., 2:4])
    return q.reshape(rows, cols), d, bias, 5


def mxfp4_from_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 [rows, cols], e8m0 scales uint8 [rows, cols/32]) of one MXFP4 tensor in
    MLX's mxfp4 terms; NotExact where MLX would not read back ggml's values (module doc)."""
    blocks = raw.reshape(rows, cols // GROUP, _BLOCK_BYTES["MXFP4"])
    e = blocks[..., 0]
    q = _nibbles(blocks[..., 1:])
    if (e == 255).any():
        raise NotExact("an e8m0 scale byte of 255 (NaN to MLX's mxfp4, 2^127 to ggml)")
    if ((e < 2) & ((q & 0x7) != 0).any(axis=-1)).any():
        raise NotExact(
            "subnormal weights (e8m0 scale byte 0 or 1 with non-zero codes), which a GPU may"
            " flush to zero"
        )
    q = np.where(q == 8, np.uint8(0), q)  # ggml's +0; e2m1's code 8 is -0
    return q.reshape(rows, cols), np.ascontiguousarray(e)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values [rows, cols] -> uint32 words [rows, cols*bits/32]: MLX's layout, value i
    of a row at bits [i*bits, (i+1)*bits) of the row's little-endian bit stream."""
    if 32 % bits == 0:
        per = 32 // bits
        q = q.astype(np.uint32).reshape(q.shape[0], -1, per)
        shifts = (np.arange(per, dtype=np.uint32) * bits)[None, None, :]
        return np.bitwise_or.reduce(q << shifts, axis=-1)
    # 8 values fill `bits` whole bytes: build them in a uint64, keep its low bytes.
    rows = q.shape[0]
    q = q.astype(np.uint64).reshape(rows, -1, 8)
    word = np.bitwise_or.reduce(q << (np.arange(8, dtype=np.uint64) * bits), axis=-1)
    by = word.astype("<u8").view(np.uint8).reshape(rows, -1, 8)[..., :bits]
    return np.ascontiguousarray(by).reshape(rows, -1).view("<u4").astype(np.uint32)


# Rows converted per step by quantized_stack: bounds the uint8/uint32 temporaries of a large
# expert stack (a 128-expert stack is hundreds of millions of weights) to a few tens of MB.
_CHUNK_WEIGHTS = 1 << 22


@dataclass(frozen=True)
class Quantized:
    """A tensor (or several stacked along their rows) in one of MLX's quantized layouts, as
    mx.quantized_matmul / mx.gather_qmm take it with group_size GROUP."""

    w: np.ndarray  # uint32 [..., cols*bits/32]
    scales: np.ndarray  # [..., cols/32]: f32 (affine), uint8 e8m0 exponents (mxfp4)
    biases: np.ndarray | None  # f32 like scales (affine); None (mxfp4)
    bits: int
    mode: str  # "affine" or "mxfp4"


def quantized_stack(raw: np.ndarray, dtype: str, shape: tuple[int, ...]) -> Quantized:
    """One tensor of a QUANTIZED_TYPES type, any rank (rows along the last axis, as GGUF
    stores them) -> its Quantized form, leading axes kept (a 1-D tensor is one row). Same
    integers as affine_from_blocks / mxfp4_from_blocks + pack of the 2-D view
    [prod(shape[:-1]), cols], converted a slab of rows at a time. NotExact when an MXFP4
    tensor holds blocks MLX cannot reproduce."""
    cols = shape[-1]
    lead = tuple(shape[:-1]) or (1,)
    rows = int(np.prod(lead))
    bits = _BITS[dtype]
    how = mode(dtype)
    per_block = QK_K if dtype.endswith("_K") else GROUP
    ng = cols // GROUP
    blocks = raw.reshape(rows, cols // per_block * _BLOCK_BYTES[dtype])
    packed = np.empty((rows, cols * bits // 32), np.uint32)
    scales = np.empty((rows, ng), np.uint8 if how == "mxfp4" else np.float32)
    biases = None if how == "mxfp4" else np.empty((rows, ng), np.float32)
    step = max(1, _CHUNK_WEIGHTS // cols)
    for r in range(0, rows, step):
        e = min(rows, r + step)
        if biases is None:
            q, scales[r:e] = mxfp4_from_blocks(blocks[r:e], e - r, cols)
        else:
            q, scales[r:e], biases[r:e], _ = affine_from_blocks(blocks[r:e], dtype, e - r, cols)
        packed[r:e] = pack(q, bits)
    return Quantized(
        packed.reshape(*lead, -1),
        scales.reshape(*lead, ng),
        None if biases is None else biases.reshape(*lead, ng),
        bits,
        how,
    )
