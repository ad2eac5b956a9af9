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
    lane = {id(_VF): types.float32, id(_VI): types.int32, id(_VB): types.uint8}[id(vty)]
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


@intrinsic
def lut(typingctx: Any, table: Any, idx: Any) -> Any:
    """table[idx[lane]] per lane (a gather; IQ4's 16 non-uniform levels)."""
    if not (_is_array(table, types.float32) and idx == i32x16):
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        # llvmlite's gep takes no vector index: the 16 addresses are built as integers
        base = _splat(builder, builder.ptrtoint(data, _I64), ir.VectorType(_I64, LANES))
        offs = builder.mul(
            builder.sext(args[1], ir.VectorType(_I64, LANES)),
            _splat(builder, ir.Constant(_I64, 4), ir.VectorType(_I64, LANES)),
        )
        pty = ir.VectorType(_F32.as_pointer(), LANES)
        ptrs = builder.inttoptr(builder.add(base, offs), pty)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(_VF, [pty, _I32, ir.VectorType(ir.IntType(1), LANES), _VF]),
            f"llvm.masked.gather.v{LANES}f32.v{LANES}p0f32",
        )
        mask = ir.Constant(ir.VectorType(ir.IntType(1), LANES), [1] * LANES)
        return builder.call(fn, [ptrs, ir.Constant(_I32, 4), mask, ir.Constant(_VF, ir.Undefined)])

    return f32x16(table, idx), codegen


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
    """Byte lane j = bit (start + j) of word: Q5_0/Q5_1's fifth bits, a uint32 a block."""
    if not (isinstance(word, types.Integer) and isinstance(start, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        w = _splat(builder, context.cast(builder, args[0], sig.args[0], types.int32), _VI)
        s = _splat(builder, context.cast(builder, args[1], sig.args[1], types.int32), _VI)
        shift = builder.add(s, ir.Constant(_VI, list(range(LANES))))
        bits = builder.and_(builder.lshr(w, shift), _splat(builder, ir.Constant(_I32, 1), _VI))
        return builder.trunc(bits, _VB)

    return u8x16(word, start), codegen


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
