"""KV cache types (-ctk/--cache-type-k, -ctv/--cache-type-v): how an attention layer's K or V
rows are stored, with llama.cpp's names and llama.cpp's rounding.

A row is rounded once, when it is written, exactly as llama.cpp rounds it into its cache:
f16 IEEE round-to-nearest-even; bf16 ggml's round-to-nearest-even of the f32 bits (NaN kept
quiet); q8_0 and q4_0 ggml's reference quantizers (quantize_row_q8_0_ref / q4_0_ref, the
rounding gguf-py's `gguf.quants` reproduces). Stored rows are arrays [..., width]: f32 and
f16 as themselves, bf16 as its 16 bits (uint16), q8_0 / q4_0 as their blocks' bytes.

`Coded` is what a non-f32 slot hands its readers: the stored rows plus their type, sliced
like the rows and decoded to f32 (`f32()`) a block of keys at a time by attention; `Paged`
is what a paged slot hands them: its page buffer and the sequence's page table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import FrinkError

F32 = np.float32
BLOCK = 32  # q8_0 / q4_0: weights per block, one f16 scale each
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
DEFAULT_CACHE_TYPE = "f16"  # llama.cpp's
# The options' spellings, for messages, and the environment variables that stand in for them.
OPTION_K = "-ctk/--cache-type-k"
OPTION_V = "-ctv/--cache-type-v"
ENV_K = "FRINK_CACHE_TYPE_K"
ENV_V = "FRINK_CACHE_TYPE_V"


def check_cache_type(value: str, option: str = OPTION_K) -> str:
    """`value` if it names a cache type, else a FrinkError naming the option and the types."""
    if value not in CACHE_TYPES:
        raise FrinkError(
            f"{option}: unknown KV cache type {value!r} (expected one of {', '.join(CACHE_TYPES)})"
        )
    return value


@dataclass(frozen=True)
class CacheTypes:
    """The K and V cache types one model's caches are made with. given: per type, whether
    someone chose it (an option, an argument or its environment variable); a type left to
    the default is f16 (llama.cpp's default) where the backend carries it, else f32."""

    k: str = "f32"
    v: str = "f32"
    given: tuple[bool, bool] = field(default=(True, True), compare=False)

    def __post_init__(self) -> None:
        check_cache_type(self.k, OPTION_K)
        check_cache_type(self.v, OPTION_V)

    def refusal(self, carried: tuple[str, ...], who: str) -> str | None:
        """One line naming the option whose chosen type `who` cannot carry and what it
        can (a defaulted type falls back to f32 there: carried_by)."""
        for option, value, given in (
            (OPTION_K, self.k, self.given[0]),
            (OPTION_V, self.v, self.given[1]),
        ):
            if given and value not in carried:
                return (
                    f"{option} {value}: the {who} backend cannot carry it "
                    f"(it carries {', '.join(carried)}; the numpy backend all of "
                    f"{', '.join(CACHE_TYPES)})"
                )
        return None

    def carried_by(self, carried: tuple[str, ...]) -> CacheTypes:
        """These types on a backend that carries `carried`: a defaulted type it cannot carry
        becomes f32 (every backend carries f32); a chosen one stays (refusal() named it)."""
        k = self.k if self.given[0] or self.k in carried else "f32"
        v = self.v if self.given[1] or self.v in carried else "f32"
        return self if (k, v) == (self.k, self.v) else CacheTypes(k, v, self.given)


F32_CACHE = CacheTypes()  # K and V rows kept as f32 (what references are computed with)


def requested_cache_types(k: str | None = None, v: str | None = None) -> CacheTypes:
    """The cache types asked for: k / v where given, else $FRINK_CACHE_TYPE_K / _V where
    set (as llama-server reads LLAMA_ARG_CACHE_TYPE_K), else DEFAULT_CACHE_TYPE, marked
    as defaulted. A bad value is a FrinkError naming the option or the variable."""
    picked = []
    for value, option, env in ((k, OPTION_K, ENV_K), (v, OPTION_V, ENV_V)):
        if value is not None:
            picked.append((check_cache_type(value, option), True))
        elif os.environ.get(env):
            picked.append((check_cache_type(os.environ[env], f"${env}"), True))
        else:
            picked.append((DEFAULT_CACHE_TYPE, False))
    (k_type, k_given), (v_type, v_given) = picked
    return CacheTypes(k_type, v_type, (k_given, v_given))


def stored_width(name: str, width: int) -> int:
    """Elements (bytes for q8_0 / q4_0) one stored row of `width` values takes."""
    if name == "q8_0":
        return width // BLOCK * (2 + BLOCK)
    if name == "q4_0":
        return width // BLOCK * (2 + BLOCK // 2)
    return width


def stored_dtype(name: str) -> np.dtype:
    """The dtype type `name`'s stored rows are kept in."""
    return np.dtype({"f32": np.float32, "f16": np.float16, "bf16": np.uint16}.get(name, np.uint8))


def check_width(name: str, width: int, option: str) -> None:
    """q8_0 / q4_0 rows are whole blocks: a head width not a multiple of 32 is refused."""
    if name in ("q8_0", "q4_0") and width % BLOCK:
        raise FrinkError(
            f"{option} {name}: this model's head width {width} is not a multiple of {BLOCK} "
            f"(use f32, f16 or bf16)"
        )


def encode(name: str, x: np.ndarray) -> np.ndarray:
    """f32 rows x [..., width] rounded and stored as cache type `name`."""
    if name == "f32":
        return x.astype(F32, copy=False)
    if name == "f16":
        return x.astype(np.float16)
    if name == "bf16":
        return _bf16_bits(x)
    lead, width = x.shape[:-1], x.shape[-1]
    blocks = np.ascontiguousarray(x, F32).reshape(-1, BLOCK)
    packed = _q8_0(blocks) if name == "q8_0" else _q4_0(blocks)
    return packed.reshape(*lead, stored_width(name, width))


def decode(name: str, s: np.ndarray) -> np.ndarray:
    """Stored rows s [..., stored width] of type `name` as f32 [..., width]."""
    if name == "f32":
        return s
    if name == "f16":
        return s.astype(F32)
    if name == "bf16":
        return (s.astype(np.uint32) << 16).view(F32)
    size = 2 + (BLOCK if name == "q8_0" else BLOCK // 2)
    lead = s.shape[:-1]
    b = s.reshape(*lead, s.shape[-1] // size, size)
    d = np.ascontiguousarray(b[..., :2]).view(np.float16).astype(F32)  # [..., nb, 1]
    if name == "q8_0":
        q = b[..., 2:].view(np.int8).astype(F32)
    else:
        qs = b[..., 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - np.int8(8)
        q = q.astype(F32)
    return (q * d).reshape(*lead, -1)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16: round-to-nearest-even of the f32 bits; NaN stays a
    quiet NaN."""
    u = np.ascontiguousarray(x, F32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 64, rounded).astype(np.uint16)


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero (exact: no x + 0.5 that rounds up first)."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.sign(x) * (whole + np.floor(2 * (a - whole)))


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0_ref over blocks [n, 32]: [n, 34] bytes (f16 scale, 32 int8)."""
    d = np.abs(blocks).max(axis=1, keepdims=True) / F32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, F32(0), F32(1) / d).astype(F32)
    qs = _roundf(blocks * inv).astype(np.int8).view(np.uint8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), qs], axis=1)


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    """quantize_row_q4_0_ref over blocks [n, 32]: [n, 18] bytes (f16 scale, 16 bytes of two
    nibbles: element j low, element j + 16 high)."""
    at = np.abs(blocks).argmax(axis=1)[:, None]
    d = np.take_along_axis(blocks, at, axis=1) / F32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, F32(0), F32(1) / d).astype(F32)
    q = np.minimum(np.trunc(blocks * inv + F32(8.5)), F32(15)).astype(np.uint8)
    qs = q[:, : BLOCK // 2] | (q[:, BLOCK // 2 :] << np.uint8(4))
    return np.concatenate([d.astype(np.float16).view(np.uint8), qs], axis=1)


def round_queries_(k_type: str, q: np.ndarray) -> None:
    """Round queries q [..., head width] in place as llama.cpp rounds them for its dot
    products with K rows of type `k_type`: a q8_0 / q4_0 K's vec_dot type is q8_0, so q goes
    through q8_0 (before the score scale); f32, f16 and bf16 keys leave q as it is."""
    if k_type in ("q8_0", "q4_0"):
        q[...] = decode("q8_0", encode("q8_0", q))


class Coded:
    """Stored rows of a non-f32 cache type, [Hkv, S, stored width], with the logical shape
    [Hkv, S, width]: sliced over heads and rows like the rows, decoded by f32()."""

    __slots__ = ("data", "kind", "width")

    def __init__(self, data: np.ndarray, kind: str, width: int) -> None:
        self.data, self.kind, self.width = data, kind, width

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data.shape[0], self.data.shape[1], self.width)

    def __getitem__(self, index: tuple[slice, slice]) -> Coded:
        return Coded(self.data[index], self.kind, self.width)

    def f32(self) -> np.ndarray:
        return decode(self.kind, self.data)


class Paged:
    """K or V rows read through a page table (a paged cache's, cache/paged.py): a layer's
    page buffer `data` [Hkv, pages * page, stored width] of cache type `kind`, logical row j
    at buffer row table[j // page] * page + j % page, `n` rows. The C attention reads it
    as it lies; sliced over heads and rows (NumPy's paths) it gathers those rows."""

    __slots__ = ("data", "kind", "width", "table", "page", "n")

    def __init__(
        self, data: np.ndarray, kind: str, width: int, table: np.ndarray, page: int, n: int
    ) -> None:
        self.data, self.kind, self.width = data, kind, width
        self.table, self.page, self.n = table, page, n

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data.shape[0], self.n, self.width)

    def buffer_rows(self) -> np.ndarray:
        """The buffer row of each logical row, [n]."""
        j = np.arange(self.n)
        return self.table[j // self.page].astype(np.int64) * self.page + j % self.page

    def __getitem__(self, index: tuple[slice, slice]) -> np.ndarray | Coded:
        heads, rows = index
        data = self.data[heads][:, self.buffer_rows()[rows]]
        return data if self.kind == "f32" else Coded(data, self.kind, self.width)

    def f32(self) -> np.ndarray:
        return as_f32(self[:, :])


Rows = np.ndarray | Coded | Paged  # what a slot hands its readers: f32, stored, or paged rows


def as_f32(rows: Rows) -> np.ndarray:
    """Rows as f32: f32 rows as they are, coded or paged rows decoded."""
    return rows if isinstance(rows, np.ndarray) else rows.f32()
