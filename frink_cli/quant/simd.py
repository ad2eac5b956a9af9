"""Sixteen-lane vectors for the numba kernels: LLVM vector types and the few operations on
them that unpacking ggml blocks needs.

Why not let numba vectorize plain loops: it promotes small integers to int64 (so a nibble
becomes an i64 -> f32 conversion, half the lanes per instruction), and without fastmath
LLVM must keep a float sum in order, so a dot product stays scalar. Whether a loop came
out vectorized also changed with the spelling of an expression, and the kernels measured
2-4x slower than the same arithmetic written as vectors. Here each value is an explicit
`<16 x float>` or `<16 x i32>`, which LLVM lowers to whatever the host has (one AVX-512
register, two AVX2 ones, four NEON ones), so the speed does not depend on the optimizer's
mood and the sums are in a fixed order: 16 lanes, each summed along the row, then a fixed
pairwise tree (`hsum`).

Sixteen lanes because ggml's 4-bit blocks hold 16 bytes per nibble half (Q4_0, Q5_*,
IQ4_*) and the K-quants scale runs of 16 or 32: a vector never straddles two scales.
Three types: `U8` (16 bytes, as loaded: the bit fields are cut out here, where an
operation covers 16 lanes in one 128-bit register), `I32` (widened codes) and `F32`.
Integer ops take two vectors of one type or a vector and an integer (broadcast); `F32`
ops take two F32 vectors or one and a float. Byte arithmetic wraps, as C's uint8_t does.
Loads and stores take a C-contiguous array and an offset in its flat order (row r of a
2-D array starts at r * shape[1]), so a kernel walks one weight matrix without making a
view per row (each view counts a reference on the shared array: an atomic per row, which
two threads fight over); they do not check bounds (the callers index whole blocks inside
a row). Nothing here fuses a multiply and an add except `fmadd`, so code that must
reproduce gguf-py's dequantization bit for bit just avoids `fmadd`.
"""

from __future__ import annotations

import sys
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model

if sys.byteorder != "little":  # scalars are loaded from the file's bytes as they lie
    raise ImportError("frink's quantized kernels assume a little-endian host (as GGUF is)")

LANES = 16
_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_VF = ir.VectorType(_F32, LANES)
_VI = ir.VectorType(_I32, LANES)
_VB = ir.VectorType(ir.IntType(8), LANES)


class F32(types.Type):
    def __init__(self) -> None:
        super().__init__(name="f32x16")


class I32(types.Type):
    def __init__(self) -> None:
        super().__init__(name="i32x16")


class U8(types.Type):
    def __init__(self) -> None:
        super().__init__(name="u8x16")


f32x16 = F32()
i32x16 = I32()
u8x16 = U8()


@register_model(F32)
class _F32Model(models.PrimitiveModel):
    def __init__(self, dmm: Any, fe_type: Any) -> None:
        super().__init__(dmm, fe_type, _VF)


@register_model(I32)
class _I32Model(models.PrimitiveModel):
    def __init__(self, dmm: Any, fe_type: Any) -> None:
        super().__init__(dmm, fe_type, _VI)


@register_model(U8)
class _U8Model(models.PrimitiveModel):
    def __init__(self, dmm: Any, fe_type: Any) -> None:
        super().__init__(dmm, fe_type, _VB)


def _splat(builder: ir.IRBuilder, value: ir.Value, vty: ir.VectorType) -> ir.Value:
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(_I32, 0))
    mask = ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count)
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), mask)


def _pointer(context: Any, builder: ir.IRBuilder, aty: Any, arr: Any, ity: Any, idx: Any) -> Any:
    """The address of element idx of a C-contiguous array, counted in its flat order."""
    data = context.make_array(aty)(context, builder, arr).data
    return builder.gep(data, [context.cast(builder, idx, ity, types.intp)])


def _is_array(t: Any, dtype: Any) -> bool:
    return isinstance(t, types.Array) and t.layout == "C" and t.dtype == dtype


def _operand(context: Any, builder: ir.IRBuilder, t: Any, v: Any, vty: ir.VectorType) -> Any:
    """A vector operand as it is, a scalar one converted and broadcast."""
    if isinstance(t, (F32, I32, U8)):
        return v
    lane = types.float32 if vty == _VF else types.int32 if vty == _VI else types.uint8
    return _splat(builder, context.cast(builder, v, t, lane), vty)


# -- loads and stores -------------------------------------------------------------------


@intrinsic
def vload(typingctx: Any, a: Any, i: Any) -> Any:
    """a[i : i + 16] of a float32 array."""
    if not (_is_array(a, types.float32) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.load(builder.bitcast(p, _VF.as_pointer()), align=4)

    return f32x16(a, i), codegen


@intrinsic
def load_f32(typingctx: Any, a: Any, i: Any) -> Any:
    """a[i] (flat offset) of a float32 array: no negative-index wraparound, which numba's
    own indexing checks when it cannot prove an index non-negative."""
    if not (_is_array(a, types.float32) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1]))

    return types.float32(a, i), codegen


@intrinsic
def vstore(typingctx: Any, a: Any, i: Any, v: Any) -> Any:
    """a[i : i + 16] = v."""
    if not (_is_array(a, types.float32) and isinstance(i, types.Integer) and v == f32x16):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        builder.store(args[2], builder.bitcast(p, _VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(a, i, v), codegen


@intrinsic
def bload(typingctx: Any, a: Any, i: Any) -> Any:
    """The 16 bytes a[i : i + 16] of a uint8 array."""
    if not (_is_array(a, types.uint8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.load(builder.bitcast(p, _VB.as_pointer()), align=1)

    return u8x16(a, i), codegen


@intrinsic
def vload_f16(typingctx: Any, a: Any, i: Any) -> Any:
    """16 IEEE halves from the bytes a[i : i + 32], widened exactly."""
    if not (_is_array(a, types.uint8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        h = builder.load(
            builder.bitcast(p, ir.VectorType(ir.HalfType(), LANES).as_pointer()), align=1
        )
        return builder.fpext(h, _VF)

    return f32x16(a, i), codegen


@intrinsic
def vload_bf16(typingctx: Any, a: Any, i: Any) -> Any:
    """16 bfloat16 values from the bytes a[i : i + 32] (each is a float32's top half)."""
    if not (_is_array(a, types.uint8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        h = builder.load(
            builder.bitcast(p, ir.VectorType(ir.IntType(16), LANES).as_pointer()), align=1
        )
        bits = builder.shl(builder.zext(h, _VI), _splat(builder, ir.Constant(_I32, 16), _VI))
        return builder.bitcast(bits, _VF)

    return f32x16(a, i), codegen


@intrinsic
def load_f16(typingctx: Any, a: Any, i: Any) -> Any:
    """The IEEE half in bytes a[i], a[i + 1], as float32 (exact)."""
    if not (_is_array(a, types.uint8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        h = builder.load(builder.bitcast(p, ir.HalfType().as_pointer()), align=1)
        return builder.fpext(h, _F32)

    return types.float32(a, i), codegen


@intrinsic
def load_bf16(typingctx: Any, a: Any, i: Any) -> Any:
    """The bfloat16 in bytes a[i], a[i + 1], as float32 (exact)."""
    if not (_is_array(a, types.uint8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        h = builder.load(builder.bitcast(p, ir.IntType(16).as_pointer()), align=1)
        return builder.bitcast(builder.shl(builder.zext(h, _I32), ir.Constant(_I32, 16)), _F32)

    return types.float32(a, i), codegen


@intrinsic
def load_u8(typingctx: Any, a: Any, i: Any) -> Any:
    """The byte a[i] (flat offset), as int64."""
    if not (_is_array(a, types.uint8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.zext(builder.load(p), _I64)

    return types.int64(a, i), codegen


@intrinsic
def load_i8(typingctx: Any, a: Any, i: Any) -> Any:
    """The byte a[i] (flat offset) read as int8, as int64."""
    if not (_is_array(a, types.uint8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.sext(builder.load(p), _I64)

    return types.int64(a, i), codegen


def _word_load(bits: int) -> Any:
    def load(typingctx: Any, a: Any, i: Any) -> Any:
        if not (_is_array(a, types.uint8) and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            w = builder.load(builder.bitcast(p, ir.IntType(bits).as_pointer()), align=1)
            return builder.zext(w, _I64)

        return types.int64(a, i), codegen

    load.__name__ = load.__qualname__ = f"load_u{bits}"
    return load


load_u16 = intrinsic(_word_load(16))
load_u16.__doc__ = "The little-endian uint16 at bytes a[i : i + 2], as int64."
load_u32 = intrinsic(_word_load(32))
load_u32.__doc__ = "The little-endian uint32 at bytes a[i : i + 4], as int64."


def _host_has(feature: str) -> bool:
    import llvmlite.binding as llvm

    try:
        return bool(llvm.get_host_cpu_features().get(feature, False))
    except RuntimeError:  # features unknown on this host: take the generic path
        return False


def byte_lut(values: Any) -> Any:
    """An op mapping byte lanes 0..15 to values[lane] (16 int8 levels, as bytes): IQ4's
    non-uniform levels. One byte shuffle where the host has one (x86 pshufb, AArch64 tbl),
    so an IQ4 block costs what a Q4_0 block does; elsewhere lane by lane."""
    table = [int(v) & 0xFF for v in values]
    if len(table) != LANES:
        raise ValueError("byte_lut takes 16 values")
    import llvmlite.binding as llvm

    triple = llvm.get_process_triple()
    shuffle = None
    if triple.startswith(("x86_64", "i686")) and _host_has("ssse3"):
        shuffle = "llvm.x86.ssse3.pshuf.b.128"
    elif triple.startswith(("aarch64", "arm64")):
        shuffle = "llvm.aarch64.neon.tbl1.v16i8"

    def lookup(typingctx: Any, idx: Any) -> Any:
        if idx != u8x16:
            return None

        def codegen(context, builder, sig, args):
            tv = ir.Constant(_VB, table)
            if shuffle is not None:
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(_VB, [_VB, _VB]), shuffle
                )
                return builder.call(fn, [tv, args[0]])
            out = ir.Constant(_VB, ir.Undefined)
            for j in range(LANES):
                k = builder.extract_element(args[0], ir.Constant(_I32, j))
                out = builder.insert_element(
                    out, builder.extract_element(tv, k), ir.Constant(_I32, j)
                )
            return out

        return u8x16(idx), codegen

    lookup.__name__ = lookup.__qualname__ = "byte_lut"
    return intrinsic(lookup)


# -- integer lanes ----------------------------------------------------------------------


def _int_binop(op: str) -> Any:
    def binop(typingctx: Any, a: Any, b: Any) -> Any:
        if not (isinstance(a, (I32, U8)) and (b == a or isinstance(b, types.Integer))):
            return None

        def codegen(context, builder, sig, args):
            rhs = _operand(context, builder, sig.args[1], args[1], args[0].type)
            return getattr(builder, op)(args[0], rhs)

        return a(a, b), codegen

    binop.__name__ = binop.__qualname__ = op.rstrip("_")
    return binop


iand = intrinsic(_int_binop("and_"))
ior = intrinsic(_int_binop("or_"))
ishr = intrinsic(_int_binop("lshr"))
ishl = intrinsic(_int_binop("shl"))
iadd = intrinsic(_int_binop("add"))
isub = intrinsic(_int_binop("sub"))


@intrinsic
def lane_bits(typingctx: Any, word: Any, start: Any) -> Any:
    """Byte lane j = bit (start + j) of the 32-bit word (Q5_0/Q5_1's fifth bits; start 0
    or 16): the word's two bytes spread over the lanes and masked, all in byte lanes."""
    if not (isinstance(word, types.Integer) and isinstance(start, types.IntegerLiteral)):
        return None
    first = start.literal_value // 8
    if start.literal_value % 8 or not 0 <= first <= 2:
        return None

    def codegen(context, builder, sig, args):
        w32 = context.cast(builder, args[0], sig.args[0], types.uint32)
        quad = builder.bitcast(w32, ir.VectorType(ir.IntType(8), 4))
        pick = ir.Constant(ir.VectorType(_I32, LANES), [first] * 8 + [first + 1] * 8)
        spread = builder.shuffle_vector(quad, ir.Constant(quad.type, ir.Undefined), pick)
        bit = builder.and_(spread, ir.Constant(_VB, [1 << (j % 8) for j in range(LANES)]))
        return builder.zext(builder.icmp_unsigned("!=", bit, ir.Constant(_VB, [0] * LANES)), _VB)

    return u8x16(word, start), codegen


@intrinsic
def k_scales_mins(typingctx: Any, a: Any, p: Any) -> Any:
    """Q4_K/Q5_K's eight 6-bit mins and scales (gguf-py Q4_K.get_scale_min) as byte lanes
    [m0..m7, sc0..sc7], from the block at a[p] (d, dmin, then the 12 packed bytes S):
    run j < 4 has sc = S[j] & 63, m = S[j + 4] & 63; run j >= 4 has
    sc = (S[j + 4] & 15) | (S[j - 4] >> 6) << 4, m = (S[j + 4] >> 4) | (S[j] >> 6) << 4."""
    if not (_is_array(a, types.uint8) and isinstance(p, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        v = builder.load(builder.bitcast(ptr, _VB.as_pointer()), align=1)  # S[k] at 4 + k

        def pick(lanes: list[int]) -> Any:
            mask = ir.Constant(ir.VectorType(_I32, LANES), [4 + k for k in lanes])
            return builder.shuffle_vector(v, v, mask)

        def const(values: list[int]) -> Any:
            return ir.Constant(_VB, values)

        # low bits: m0..3 = S[4..7] & 63, m4..7 = S[8..11] >> 4, sc0..3 = S[0..3] & 63,
        # sc4..7 = S[8..11] & 15
        lo = pick([4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11])
        masked = builder.and_(lo, const([63] * 4 + [255] * 4 + [63] * 4 + [15] * 4))
        shifted = builder.lshr(lo, const([4] * LANES))
        sel = ir.Constant(ir.VectorType(_I32, LANES), [*range(4), *range(20, 24), *range(8, 16)])
        low = builder.shuffle_vector(masked, shifted, sel)
        # high bits of runs 4..7: m from S[j] = S[4..7], sc from S[j - 4] = S[0..3]
        hi = pick([0, 0, 0, 0, 4, 5, 6, 7, 0, 0, 0, 0, 0, 1, 2, 3])
        high = builder.and_(builder.lshr(hi, const([2] * LANES)), const(([0] * 4 + [48] * 4) * 2))
        return builder.or_(low, high)

    return u8x16(a, p), codegen


@intrinsic
def q3_scales(typingctx: Any, a: Any, p: Any) -> Any:
    """Q3_K's sixteen 6-bit scales (before the -32) as byte lanes, from the block at a[p]
    (the 12 packed bytes S sit at p + 96): run i has the low four bits of S[i % 8]'s nibble
    i // 8 and, above them, bits 2 (i // 4) .. 2 (i // 4) + 1 of S[8 + i % 4]."""
    if not (_is_array(a, types.uint8) and isinstance(p, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        base = builder.add(
            context.cast(builder, args[1], sig.args[1], types.intp), ir.Constant(_I64, 94)
        )
        ptr = _pointer(context, builder, sig.args[0], args[0], types.intp, base)
        v = builder.load(builder.bitcast(ptr, _VB.as_pointer()), align=1)  # S[k] at 2 + k

        def mask(lanes: list[int]) -> Any:
            return ir.Constant(ir.VectorType(_I32, LANES), lanes)

        def shr(u: Any, n: int) -> Any:
            return builder.lshr(u, ir.Constant(_VB, [n] * LANES))

        lo = builder.shuffle_vector(v, v, mask([2 + k % 8 for k in range(LANES)]))
        low = builder.shuffle_vector(
            builder.and_(lo, ir.Constant(_VB, [15] * LANES)),
            shr(lo, 4),
            mask([*range(8), *range(24, 32)]),
        )
        hp = builder.shuffle_vector(v, v, mask([10 + k % 4 for k in range(LANES)]))
        first = builder.shuffle_vector(hp, shr(hp, 2), mask([*range(4), *range(20, 24), *range(8)]))
        second = builder.shuffle_vector(
            shr(hp, 4), shr(hp, 6), mask([*range(4), *range(20, 24), *range(8)])
        )
        both = builder.shuffle_vector(first, second, mask([*range(8), *range(16, 24)]))
        high = builder.shl(
            builder.and_(both, ir.Constant(_VB, [3] * LANES)), ir.Constant(_VB, [4] * LANES)
        )
        return builder.or_(low, high)

    return u8x16(a, p), codegen


@intrinsic
def pairsum(typingctx: Any, a: Any) -> Any:
    """Lanes [a0 + a1, a2 + a3, ..., a14 + a15, 0 x 8]: 16-element sums into 32-element ones
    (the x sums that Q4_K/Q5_K's mins multiply, aligned with k_scales_mins' lanes)."""
    if a != f32x16:
        return None

    def codegen(context, builder, sig, args):
        zero = ir.Constant(_VF, [0.0] * LANES)
        even = ir.Constant(ir.VectorType(_I32, LANES), [*range(0, 16, 2), *range(16, 24)])
        odd = ir.Constant(ir.VectorType(_I32, LANES), [*range(1, 16, 2), *range(16, 24)])
        ev = builder.shuffle_vector(args[0], zero, even)
        od = builder.shuffle_vector(args[0], zero, odd)
        return builder.fadd(ev, od)

    return f32x16(a), codegen


@intrinsic
def zext(typingctx: Any, a: Any) -> Any:
    """Byte lanes read as unsigned, widened to int32 lanes."""
    if a != u8x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.zext(args[0], _VI)

    return i32x16(a), codegen


@intrinsic
def sext(typingctx: Any, a: Any) -> Any:
    """Byte lanes read as signed (int8), widened to int32 lanes."""
    if a != u8x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.sext(args[0], _VI)

    return i32x16(a), codegen


@intrinsic
def itof(typingctx: Any, a: Any) -> Any:
    """Signed lanes as float32 (exact below 2**24)."""
    if a != i32x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _VF)

    return f32x16(a), codegen


# -- float lanes ------------------------------------------------------------------------


@intrinsic
def vzero(typingctx: Any) -> Any:
    def codegen(context, builder, sig, args):
        return ir.Constant(_VF, [0.0] * LANES)

    return f32x16(), codegen


@intrinsic
def vsplat(typingctx: Any, x: Any) -> Any:
    if not isinstance(x, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return _operand(context, builder, sig.args[0], args[0], _VF)

    return f32x16(x), codegen


def _float_binop(op: str) -> Any:
    def binop(typingctx: Any, a: Any, b: Any) -> Any:
        if not (a == f32x16 and (b == f32x16 or isinstance(b, (types.Float, types.Integer)))):
            return None

        def codegen(context, builder, sig, args):
            rhs = _operand(context, builder, sig.args[1], args[1], _VF)
            return getattr(builder, op)(args[0], rhs)

        return f32x16(a, b), codegen

    binop.__name__ = binop.__qualname__ = op
    return binop


fadd = intrinsic(_float_binop("fadd"))
fsub = intrinsic(_float_binop("fsub"))
fmul = intrinsic(_float_binop("fmul"))


@intrinsic
def fmadd(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """a * b + c, fused where the host has FMA (llvm.fmuladd), so the rounding differs by
    host; only the dot products use it, never a dequantization."""
    if not (a == f32x16 and c == f32x16 and (b == f32x16 or isinstance(b, types.Float))):
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), f"llvm.fmuladd.v{LANES}f32"
        )
        b_ = _operand(context, builder, sig.args[1], args[1], _VF)
        return builder.call(fn, [args[0], b_, args[2]])

    return f32x16(a, b, c), codegen


@intrinsic
def vlane(typingctx: Any, a: Any, k: Any) -> Any:
    """Lane k of a broadcast to all lanes: one run's scale out of a vector of a block's 16
    (k is a constant once the run loop is unrolled, so this is one shuffle)."""
    if not (a == f32x16 and isinstance(k, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        idx = context.cast(builder, args[1], sig.args[1], types.int32)
        return _splat(builder, builder.extract_element(args[0], idx), _VF)

    return f32x16(a, k), codegen


@intrinsic
def hsum(typingctx: Any, a: Any) -> Any:
    """The lanes' sum, halves added pairwise (8+8, 4+4, 2+2, 1+1): a fixed order."""
    if a != f32x16:
        return None

    def codegen(context, builder, sig, args):
        v, n = args[0], LANES
        while n > 1:
            h = n // 2
            lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, h), list(range(h))))
            hi = builder.shuffle_vector(
                v, v, ir.Constant(ir.VectorType(_I32, h), list(range(h, n)))
            )
            v, n = builder.fadd(lo, hi), h
        return builder.extract_element(v, ir.Constant(_I32, 0))

    return types.float32(a), codegen
