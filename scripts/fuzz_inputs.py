"""Hostile inputs for frink, seeded, and the classifier that says how each one ended.

Why this exists: frink promises that every bad input ends in one clear refusal (a
FrinkError in-process; one stderr line and a non-zero exit through the CLI) or a correct
run, never a traceback, hang, crash or runaway memory. This module makes the inputs that
test the promise: a tiny valid GGUF with a tokenizer and chat template, written by a
writer of its own so that every structural boundary is known and any field can be made
wrong (duplicate keys, overlapping tensors, nested arrays, bad UTF-8...); truncations at
every boundary; byte flips over the header, metadata and tensor-info regions; crafted
safetensors directories; hostile chat templates. `run_cases` runs them in-process and
counts outcomes; tests/test_fuzz.py runs a CI-sized share, `make fuzz` the soak:

    python scripts/fuzz_inputs.py [--cases N] [--http-cases N] [--seed S]

The HTTP family (scripts/fuzz_http.py) runs hostile clients against a real `frink serve`
on this module's tiny model: no death, no 500, no stall of /health past a second.

Needs numpy and frink only. Every case is reproducible from (seed, index).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import sys
import tempfile
import time
import traceback
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# GGUF value types (the spec's numbering).
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_PACK = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 16, 2, 1, 32, 64
HEAD_DIM = N_EMBD // N_HEAD
PIECES = ["\u2581", "\u2581h", "h", "e", "l", "o", "i", "\u2581hello", "\u2581hi"]
TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES
N_VOCAB = len(TOKENS)
TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
# Outcomes that break the promise.
BAD = ("traceback", "hang", "crash", "excessive memory")
HANG_S = 30.0


def mem_limit(file_bytes: int) -> int:
    """The bound on peak memory for a refused input: 256 MiB + 2x its size. The base is
    the interpreter and NumPy, with room to spare (a refused tiny model peaks well
    below it)."""
    return 256 * 2**20 + 2 * file_bytes


# ---------------------------------------------------------------------------------------
# a GGUF writer that can write anything


def s(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def val(vtype: int, v: object) -> bytes:
    if vtype == STR:
        return s(v)  # type: ignore[arg-type]
    if vtype == ARR:
        if isinstance(v, bytes):  # an array body written by hand (e.g. nested 500 deep)
            return v
        etype, items = v  # type: ignore[misc]
        return struct.pack("<IQ", etype, len(items)) + b"".join(val(etype, x) for x in items)
    return struct.pack(_PACK[vtype], v)


@dataclass
class Gguf:
    """A GGUF file as parts: each kv is (key, type, value); each tensor (name, numpy array,
    ggml type, offset or None for the next aligned slot)."""

    kvs: list[tuple[str | bytes, int, object]]
    tensors: list[tuple[str | bytes, np.ndarray, int, int | None]]
    alignment: int = 32
    version: int = 3
    boundaries: list[int] = field(default_factory=list)
    regions: dict[str, tuple[int, int]] = field(default_factory=dict)

    def encode(self) -> bytes:
        out = bytearray(b"GGUF")
        b = self.boundaries
        b.clear()
        out += struct.pack("<IQQ", self.version, len(self.tensors), len(self.kvs))
        b += [4, 8, 16, 24]
        for key, vtype, v in self.kvs:
            out += s(key)
            b.append(len(out))
            out += struct.pack("<I", vtype)
            b.append(len(out))
            out += val(vtype, v)
            b.append(len(out))
        kv_end = len(out)
        offset = 0
        blobs = []
        for name, arr, gtype, off in self.tensors:
            raw = arr.tobytes()
            if off is None:
                off = offset
            offset = max(offset, -(-(off + len(raw)) // self.alignment) * self.alignment)
            ne = list(reversed(arr.shape))
            out += s(name)
            b.append(len(out))
            out += struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
            b.append(len(out))
            out += struct.pack("<IQ", gtype, off)
            b.append(len(out))
            blobs.append((off, raw))
        ti_end = len(out)
        start = -(-len(out) // self.alignment) * self.alignment
        out += b"\0" * (start - len(out))
        data = bytearray(max((o + len(r) for o, r in blobs), default=0))
        for o, r in blobs:
            data[o : o + len(r)] = r
            b += [start + o, start + o + len(r)]
        out += data
        self.regions = {
            "header": (0, 24),
            "metadata": (24, kv_end),
            "tensor_info": (kv_end, ti_end),
            "data": (start, len(out)),
        }
        return bytes(out)


def base_kvs() -> list[tuple[str, int, object]]:
    types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(PIECES))]
    return [
        ("general.architecture", STR, "llama"),
        ("general.name", STR, "frink fuzz base"),
        ("llama.block_count", U32, 1),
        ("llama.context_length", U32, N_CTX),
        ("llama.embedding_length", U32, N_EMBD),
        ("llama.feed_forward_length", U32, N_FF),
        ("llama.attention.head_count", U32, N_HEAD),
        ("llama.attention.head_count_kv", U32, N_HEAD_KV),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.rope.dimension_count", U32, HEAD_DIM),
        ("llama.rope.freq_base", F32, 10000.0),
        ("tokenizer.ggml.model", STR, "llama"),
        ("tokenizer.ggml.tokens", ARR, (STR, TOKENS)),
        ("tokenizer.ggml.scores", ARR, (F32, scores)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.chat_template", STR, TEMPLATE),
    ]


def base_tensors(seed: int = 0) -> list[tuple[str, np.ndarray, int, None]]:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    t = {
        "token_embd.weight": w(N_VOCAB, N_EMBD),
        "output_norm.weight": np.ones(N_EMBD, np.float32),
        "blk.0.attn_norm.weight": np.ones(N_EMBD, np.float32),
        "blk.0.attn_q.weight": w(N_HEAD * HEAD_DIM, N_EMBD),
        "blk.0.attn_k.weight": w(N_HEAD_KV * HEAD_DIM, N_EMBD),
        "blk.0.attn_v.weight": w(N_HEAD_KV * HEAD_DIM, N_EMBD),
        "blk.0.attn_output.weight": w(N_EMBD, N_HEAD * HEAD_DIM),
        "blk.0.ffn_norm.weight": np.ones(N_EMBD, np.float32),
        "blk.0.ffn_gate.weight": w(N_FF, N_EMBD),
        "blk.0.ffn_up.weight": w(N_FF, N_EMBD),
        "blk.0.ffn_down.weight": w(N_EMBD, N_FF),
    }
    return [(k, v, 0, None) for k, v in t.items()]


def base() -> Gguf:
    return Gguf(base_kvs(), base_tensors())


def _with(
    g: Gguf, key: str, vtype: int | None = None, value: object = None, drop: bool = False
) -> Gguf:
    kvs = [kv for kv in g.kvs if kv[0] != key]
    if not drop:
        kvs.append((key, vtype, value))  # type: ignore[arg-type]
    return Gguf(kvs, g.tensors, g.alignment, g.version)


def _tensor(
    g: Gguf,
    name: str,
    arr: np.ndarray | None = None,
    rename: str | bytes | None = None,
    offset: int | None = None,
) -> Gguf:
    ts = []
    for n, a, t, o in g.tensors:
        if n == name:
            n, a, o = (
                (rename if rename is not None else n),
                (a if arr is None else arr),
                (offset if offset is not None else o),
            )
        ts.append((n, a, t, o))
    return Gguf(g.kvs, ts, g.alignment, g.version)


def crafted_ggufs() -> dict[str, bytes]:
    """One file per check the readers and validate_config make."""
    g = base()
    # 500 arrays, each holding the next, around one u32.
    nested = struct.pack("<IQ", ARR, 1) * 499 + struct.pack("<IQI", U32, 1, 1)
    nan_w = base_tensors()[3][1].copy()
    nan_w[0, 0] = np.nan
    cases: dict[str, Gguf] = {
        "dup_key": Gguf(g.kvs + [("llama.block_count", U32, 2)], g.tensors),
        "dup_tensor": Gguf(g.kvs, g.tensors + [g.tensors[-1]]),
        "bool_block_count": _with(g, "llama.block_count", BOOL, True),
        "u32_template": _with(g, "tokenizer.chat_template", U32, 5),
        "str_heads": _with(g, "llama.attention.head_count", STR, "2"),
        "nested_500": _with(g, "frink.nested", ARR, nested),
        "bad_utf8_token": _with(
            g, "tokenizer.ggml.tokens", ARR, (STR, TOKENS[:-1] + [b"\xff\xfe"])
        ),
        "bad_utf8_template": _with(g, "tokenizer.chat_template", STR, b"{{ '\xc3' }}"),
        "bad_utf8_key": Gguf(g.kvs + [(b"frink.\xff", U32, 1)], g.tensors),
        "align_array": _with(g, "general.alignment", ARR, (U32, [32])),
        "align_nan": _with(g, "general.alignment", F32, float("nan")),
        "align_zero": _with(g, "general.alignment", U32, 0),
        "align_three": _with(g, "general.alignment", U32, 3),
        "overlap": _tensor(g, "output_norm.weight", offset=0),
        "misaligned": _tensor(g, "blk.0.ffn_down.weight", offset=4 * N_VOCAB * N_EMBD + 4),
        "odd_rope_dim": _with(g, "llama.rope.dimension_count", U32, HEAD_DIM - 1),
        "big_rope_dim": _with(g, "llama.rope.dimension_count", U32, HEAD_DIM + 2),
        "zero_heads": _with(g, "llama.attention.head_count", U32, 0),
        "zero_kv_heads": _with(g, "llama.attention.head_count_kv", U32, 0),
        "nan_rope_base": _with(g, "llama.rope.freq_base", F32, float("nan")),
        "zero_rope_base": _with(g, "llama.rope.freq_base", F32, 0.0),
        "neg_rope_base": _with(g, "llama.rope.freq_base", F32, -1.0),
        "nan_eps": _with(g, "llama.attention.layer_norm_rms_epsilon", F32, float("nan")),
        "zero_eps": _with(g, "llama.attention.layer_norm_rms_epsilon", F32, 0.0),
        "inf_eps": _with(g, "llama.attention.layer_norm_rms_epsilon", F32, float("inf")),
        "huge_layers": _with(g, "llama.block_count", U32, 10**9),
        "huge_ctx": _with(g, "llama.context_length", U64, 2**62),
        "tokens_short": _with(g, "tokenizer.ggml.tokens", ARR, (STR, TOKENS[:-1])),
        "tokens_long": _with(g, "tokenizer.ggml.tokens", ARR, (STR, TOKENS + ["x"])),
        "scores_short": _with(g, "tokenizer.ggml.scores", ARR, (F32, [0.0] * 5)),
        "token_type_str": _with(g, "tokenizer.ggml.token_type", ARR, (STR, ["1"] * N_VOCAB)),
        "tokens_u32": _with(g, "tokenizer.ggml.tokens", ARR, (U32, list(range(N_VOCAB)))),
        "bos_out_of_range": _with(g, "tokenizer.ggml.bos_token_id", U32, 10**6),
        "nan_weight": _tensor(g, "blk.0.attn_q.weight", arr=nan_w),
        "escape_tensor_name": _tensor(
            g, "blk.0.ffn_up.weight", rename="blk.0.ffn_up.weight\x1b[2J\nall good"
        ),
        "unknown_tensor": _tensor(g, "blk.0.ffn_up.weight", rename="blk.0.ffn_zzz.weight"),
        "version_1": Gguf(g.kvs, g.tensors, version=1),
        "no_arch": _with(g, "general.architecture", drop=True),
        "arch_u32": _with(g, "general.architecture", U32, 7),
        "hostile_template": _with(
            g,
            "tokenizer.chat_template",
            STR,
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        ),
        "template_bomb": _with(
            g,
            "tokenizer.chat_template",
            STR,
            "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
        ),
    }
    return {k: v.encode() for k, v in {**cases, **llama4_ggufs()}.items()}


def llama4_base() -> Gguf:
    """The base model as a one-layer llama4 (its FFN dense: experts every 2nd layer)."""
    kvs = [(k.replace("llama.", "llama4.", 1), t, v) for k, t, v in base_kvs()]
    kvs[0] = ("general.architecture", STR, "llama4")
    kvs += [
        ("llama4.expert_count", U32, 4),
        ("llama4.expert_used_count", U32, 1),
        ("llama4.interleave_moe_layer_step", U32, 2),
    ]
    return Gguf(kvs, base_tensors())


def llama4_ggufs() -> dict[str, Gguf]:
    """llama4's own metadata, each field zero, huge or not a number (and the valid base)."""
    g = llama4_base()
    return {
        "llama4_valid": g,
        "llama4_chunk_zero": _with(g, "llama4.attention.chunk_size", U32, 0),
        "llama4_chunk_huge": _with(g, "llama4.attention.chunk_size", U32, 2**32 - 1),
        "llama4_no_chunks": _with(g, "llama4.attention.sliding_window", U32, 0),
        "llama4_moe_step_zero": _with(g, "llama4.interleave_moe_layer_step", U32, 0),
        "llama4_moe_step_huge": _with(g, "llama4.interleave_moe_layer_step", U32, 2**32 - 1),
        "llama4_nope_step_zero": _with(g, "llama4.no_rope_layer_step", U32, 0),
        "llama4_nope_step_huge": _with(g, "llama4.no_rope_layer_step", U32, 2**32 - 1),
        "llama4_floor_zero": _with(g, "llama4.attention.temperature_floor_scale", F32, 0.0),
        "llama4_temp_nan": _with(g, "llama4.attention.temperature_scale", F32, float("nan")),
    }


def _drawers(seed: int) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]:
    """(w(*shape): seeded weights of std 0.2, ones(*shape)), for an architecture's base
    file."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    return w, lambda *shape: np.ones(shape, np.float32)


def _arch_kvs(arch: str, drop: tuple[str, ...]) -> list[tuple[str, int, object]]:
    """The base's metadata as architecture `arch`'s, without the keys ending in `drop`."""
    kvs = [(k.replace("llama.", f"{arch}."), t, v) for k, t, v in base_kvs()]
    kvs = [kv for kv in kvs if not kv[0].endswith(drop)]
    kvs[0] = ("general.architecture", STR, arch)
    return kvs


# --- deepseek2 (issue 31): MLA and grouped-routing metadata --------------------------------
DS_KV_LORA, DS_Q_LORA, DS_ROPE, DS_NOPE, DS_V, DS_EXPERTS, DS_FF_EXP = 16, 16, 4, 4, 8, 4, 8


def deepseek2_base() -> Gguf:
    """A valid two-layer deepseek2 (a dense layer, then 4 experts in 2 groups with a
    shared expert and a selection bias; MLA with q_lora_rank) on the base's tokenizer."""
    w, ones = _drawers(1)
    arch = "deepseek2"
    kvs = _arch_kvs(arch, (".block_count", ".rope.dimension_count"))
    kvs += [
        (f"{arch}.block_count", U32, 2),
        (f"{arch}.rope.dimension_count", U32, DS_ROPE),
        (f"{arch}.attention.head_count_kv", U32, 1),
        (f"{arch}.attention.key_length", U32, DS_KV_LORA + DS_ROPE),
        (f"{arch}.attention.value_length", U32, DS_KV_LORA),
        (f"{arch}.attention.key_length_mla", U32, DS_NOPE + DS_ROPE),
        (f"{arch}.attention.value_length_mla", U32, DS_V),
        (f"{arch}.attention.kv_lora_rank", U32, DS_KV_LORA),
        (f"{arch}.attention.q_lora_rank", U32, DS_Q_LORA),
        (f"{arch}.leading_dense_block_count", U32, 1),
        (f"{arch}.expert_count", U32, DS_EXPERTS),
        (f"{arch}.expert_used_count", U32, 2),
        (f"{arch}.expert_group_count", U32, 2),
        (f"{arch}.expert_group_used_count", U32, 1),
        (f"{arch}.expert_gating_func", U32, 2),
        (f"{arch}.expert_feed_forward_length", U32, DS_FF_EXP),
        (f"{arch}.expert_shared_count", U32, 1),
        (f"{arch}.expert_weights_scale", F32, 2.5),
        (f"{arch}.expert_weights_norm", BOOL, True),
    ]
    kvs = [kv for kv in kvs if kv[0] != f"{arch}.attention.head_count_kv"] + [
        (f"{arch}.attention.head_count_kv", U32, 1)
    ]
    nq = N_HEAD * (DS_NOPE + DS_ROPE)
    t = {"token_embd.weight": w(N_VOCAB, N_EMBD), "output_norm.weight": ones(N_EMBD)}
    for i in range(2):
        p = f"blk.{i}."
        t |= {
            p + "attn_norm.weight": ones(N_EMBD),
            p + "attn_q_a.weight": w(DS_Q_LORA, N_EMBD),
            p + "attn_q_a_norm.weight": ones(DS_Q_LORA),
            p + "attn_q_b.weight": w(nq, DS_Q_LORA),
            p + "attn_kv_a_mqa.weight": w(DS_KV_LORA + DS_ROPE, N_EMBD),
            p + "attn_kv_a_norm.weight": ones(DS_KV_LORA),
            p + "attn_k_b.weight": w(N_HEAD, DS_KV_LORA, DS_NOPE),
            p + "attn_v_b.weight": w(N_HEAD, DS_V, DS_KV_LORA),
            p + "attn_output.weight": w(N_EMBD, N_HEAD * DS_V),
            p + "ffn_norm.weight": ones(N_EMBD),
        }
    t |= {
        "blk.0.ffn_gate.weight": w(N_FF, N_EMBD),
        "blk.0.ffn_up.weight": w(N_FF, N_EMBD),
        "blk.0.ffn_down.weight": w(N_EMBD, N_FF),
        "blk.1.ffn_gate_inp.weight": w(DS_EXPERTS, N_EMBD),
        "blk.1.exp_probs_b.bias": w(DS_EXPERTS),
        "blk.1.ffn_gate_exps.weight": w(DS_EXPERTS, DS_FF_EXP, N_EMBD),
        "blk.1.ffn_up_exps.weight": w(DS_EXPERTS, DS_FF_EXP, N_EMBD),
        "blk.1.ffn_down_exps.weight": w(DS_EXPERTS, N_EMBD, DS_FF_EXP),
        "blk.1.ffn_gate_shexp.weight": w(DS_FF_EXP, N_EMBD),
        "blk.1.ffn_up_shexp.weight": w(DS_FF_EXP, N_EMBD),
        "blk.1.ffn_down_shexp.weight": w(N_EMBD, DS_FF_EXP),
    }
    return Gguf(kvs, [(k, v, 0, None) for k, v in t.items()])


def deepseek2_hostile() -> dict[str, tuple[bytes, str]]:
    """deepseek2 files with one MLA or routing field made hostile -> (file, the name the
    refusal must carry)."""
    g = deepseek2_base()
    key = "deepseek2."
    cases: dict[str, tuple[Gguf, str]] = {
        "kv_lora_zero": (_with(g, key + "attention.kv_lora_rank", U32, 0), "kv_lora_rank"),
        "kv_lora_huge": (_with(g, key + "attention.kv_lora_rank", U32, 2**31), "kv_lora_rank"),
        "q_lora_huge": (_with(g, key + "attention.q_lora_rank", U32, 2**31), "q_lora_rank"),
        "key_mla_zero": (_with(g, key + "attention.key_length_mla", U32, 0), "key_length_mla"),
        "key_mla_huge": (
            _with(g, key + "attention.key_length_mla", U32, 2**31),
            "key_length_mla",
        ),
        "value_mla_huge": (
            _with(g, key + "attention.value_length_mla", U32, 2**31),
            "value",
        ),
        "groups_not_dividing": (_with(g, key + "expert_group_count", U32, 3), "expert_group_count"),
        "groups_zero_size": (_with(g, key + "expert_group_count", U32, 4), "expert_group_count"),
        "groups_used_over": (
            _with(g, key + "expert_group_used_count", U32, 3),
            "expert_group_used_count",
        ),
        "shared_count_huge": (
            _with(g, key + "expert_shared_count", U32, 2**31),
            "expert_shared_count",
        ),
        "gating_unknown": (_with(g, key + "expert_gating_func", U32, 7), "expert_gating_func"),
        "dense_lead_mismatch": (
            _with(g, key + "leading_dense_block_count", U32, 2),
            "leading_dense_block_count",
        ),
    }
    return {k: (v.encode(), why) for k, (v, why) in cases.items()}


# --- mimo2 (issue 31): per-layer heads, the SWA pattern, sinks, the value scale ------------
MM_V, MM_ROPE, MM_EXPERTS, MM_FF_EXP = 4, 4, 4, 8  # V width, rotated dims, experts, their width


def mimo2_base() -> Gguf:
    """A valid two-layer mimo2 as the converter lays it out (one NextN block after the
    trunk: block_count 3, per-layer arrays of 3): layer 0 full with one KV head and a dense
    FFN, layer 1 sliding with two KV heads, sinks and sigmoid-routed experts; V heads
    narrower than K's, the value scale 0.7; on the base's tokenizer."""
    w, ones = _drawers(2)
    arch = "mimo2"
    kvs = _arch_kvs(arch, (".block_count", ".rope.dimension_count", ".attention.head_count_kv"))
    kvs += [
        (f"{arch}.block_count", U32, 3),
        (f"{arch}.nextn_predict_layers", U32, 1),
        (f"{arch}.rope.dimension_count", U32, MM_ROPE),
        (f"{arch}.rope.freq_base_swa", F32, 1000.0),
        (f"{arch}.attention.head_count_kv", ARR, (U32, [1, 2, 2])),
        (f"{arch}.attention.key_length", U32, HEAD_DIM),
        (f"{arch}.attention.value_length", U32, MM_V),
        (f"{arch}.attention.sliding_window", U32, 4),
        (f"{arch}.attention.sliding_window_pattern", ARR, (BOOL, [False, True, True])),
        (f"{arch}.attention.value_scale", F32, 0.7),
        (f"{arch}.expert_count", U32, MM_EXPERTS),
        (f"{arch}.expert_used_count", U32, 2),
        (f"{arch}.expert_group_count", U32, 1),
        (f"{arch}.expert_group_used_count", U32, 1),
        (f"{arch}.expert_feed_forward_length", U32, MM_FF_EXP),
    ]
    t = {"token_embd.weight": w(N_VOCAB, N_EMBD), "output_norm.weight": ones(N_EMBD)}
    for i, kv in enumerate((1, 2)):
        p = f"blk.{i}."
        t |= {
            p + "attn_norm.weight": ones(N_EMBD),
            p + "attn_q.weight": w(N_HEAD * HEAD_DIM, N_EMBD),
            p + "attn_k.weight": w(kv * HEAD_DIM, N_EMBD),
            p + "attn_v.weight": w(kv * MM_V, N_EMBD),
            p + "attn_output.weight": w(N_EMBD, N_HEAD * MM_V),
            p + "ffn_norm.weight": ones(N_EMBD),
        }
    t |= {
        "blk.0.ffn_gate.weight": w(N_FF, N_EMBD),
        "blk.0.ffn_up.weight": w(N_FF, N_EMBD),
        "blk.0.ffn_down.weight": w(N_EMBD, N_FF),
        "blk.1.attn_sinks.weight": w(N_HEAD),
        "blk.1.ffn_gate_inp.weight": w(MM_EXPERTS, N_EMBD),
        "blk.1.exp_probs_b.bias": w(MM_EXPERTS),
        "blk.1.ffn_gate_exps.weight": w(MM_EXPERTS, MM_FF_EXP, N_EMBD),
        "blk.1.ffn_up_exps.weight": w(MM_EXPERTS, MM_FF_EXP, N_EMBD),
        "blk.1.ffn_down_exps.weight": w(MM_EXPERTS, N_EMBD, MM_FF_EXP),
    }
    return Gguf(kvs, [(k, v, 0, None) for k, v in t.items()])


def mimo2_hostile() -> dict[str, tuple[bytes, str]]:
    """mimo2 files with one per-layer or mimo2 field made hostile -> (file, the name the
    refusal must carry)."""
    g = mimo2_base()
    key = "mimo2."
    kv, pattern = key + "attention.head_count_kv", key + "attention.sliding_window_pattern"
    cases: dict[str, tuple[Gguf, str]] = {
        "kv_heads_zero": (_with(g, kv, ARR, (U32, [1, 0, 2])), "KV heads"),
        "kv_heads_huge": (_with(g, kv, ARR, (U32, [2**31, 2, 2])), "head counts"),
        "heads_huge": (
            _with(g, key + "attention.head_count", ARR, (U32, [2**31, 2, 2])),
            "query width",
        ),
        "heads_zero": (_with(g, key + "attention.head_count", ARR, (U32, [2, 0, 2])), "heads"),
        "kv_heads_short": (_with(g, kv, ARR, (U32, [1])), "head_count_kv"),
        "kv_heads_long": (_with(g, kv, ARR, (U32, [1] * 1000)), "head_count_kv"),
        "pattern_short": (_with(g, pattern, ARR, (BOOL, [False])), "sliding_window_pattern"),
        "pattern_missing": (_with(g, pattern, drop=True), "sliding_window_pattern"),
        "window_zero": (_with(g, key + "attention.sliding_window", U32, 0), "sliding_window"),
        "value_scale_nan": (
            _with(g, key + "attention.value_scale", F32, float("nan")),
            "value_scale",
        ),
        "value_scale_zero": (_with(g, key + "attention.value_scale", F32, 0.0), "value_scale"),
        "value_width_huge": (_with(g, key + "attention.value_length", U32, 2**31), "value"),
        "nextn_huge": (_with(g, key + "nextn_predict_layers", U32, 2**31), "block_count"),
        "groups": (_with(g, key + "expert_group_count", U32, 2), "expert_group_count"),
    }
    return {k: (v.encode(), why) for k, (v, why) in cases.items()}


# --- plamo2 (issue 31): the Mamba layers' ssm metadata -------------------------------------
PL_HEADS, PL_STATE, PL_CONV = 2, 4, 4
PL_INNER = PL_HEADS * HEAD_DIM
PL_DT = 64  # llama.cpp's max(64, n_embd / 16)


def plamo2_base() -> Gguf:
    """A valid two-layer plamo2 (attention, then Mamba) on the base's tokenizer."""
    w, ones = _drawers(2)
    arch = "plamo2"
    drop = (".attention.head_count", ".attention.head_count_kv", ".rope.dimension_count")
    kvs = _arch_kvs(arch, drop)
    kvs = [kv for kv in kvs if not kv[0].endswith(".block_count")] + [
        (f"{arch}.block_count", U32, 2),
        (f"{arch}.attention.head_count", ARR, (U32, [N_HEAD, 0])),
        (f"{arch}.attention.head_count_kv", ARR, (U32, [N_HEAD_KV, 0])),
        (f"{arch}.attention.key_length", U32, HEAD_DIM),
        (f"{arch}.attention.value_length", U32, HEAD_DIM),
        (f"{arch}.ssm.state_size", U32, PL_STATE),
        (f"{arch}.ssm.conv_kernel", U32, PL_CONV),
        (f"{arch}.ssm.time_step_rank", U32, PL_HEADS),
        (f"{arch}.ssm.inner_size", U32, PL_INNER),
        (f"{arch}.ssm.group_count", U32, 0),
    ]
    t = {"token_embd.weight": w(N_VOCAB, N_EMBD), "output_norm.weight": ones(N_EMBD)}
    for i in range(2):
        p = f"blk.{i}."
        t |= {
            p + "attn_norm.weight": ones(N_EMBD),
            p + "post_attention_norm": ones(N_EMBD),
            p + "ffn_norm.weight": ones(N_EMBD),
            p + "ffn_up.weight": w(2 * N_FF, N_EMBD),
            p + "ffn_down.weight": w(N_EMBD, N_FF),
            p + "post_ffw_norm": ones(N_EMBD),
        }
    t |= {
        "blk.0.attn_qkv.weight": w((N_HEAD + 2 * N_HEAD_KV) * HEAD_DIM, N_EMBD),
        "blk.0.attn_q_norm.weight": ones(N_HEAD, HEAD_DIM),
        "blk.0.attn_k_norm.weight": ones(N_HEAD_KV, HEAD_DIM),
        "blk.0.attn_output.weight": w(N_EMBD, N_HEAD * HEAD_DIM),
        "blk.1.ssm_in.weight": w(2 * PL_INNER, N_EMBD),
        "blk.1.ssm_conv1d.weight": w(PL_INNER, PL_CONV),
        "blk.1.ssm_x.weight": w(PL_DT + 2 * PL_STATE, PL_INNER),
        "blk.1.ssm_dt.weight": w(PL_HEADS, PL_DT),
        "blk.1.ssm_dt.bias": w(PL_HEADS),
        "blk.1.ssm_a": -ones(PL_HEADS),
        "blk.1.ssm_d": ones(PL_HEADS),
        "blk.1.ssm_out.weight": w(N_EMBD, PL_INNER),
        "blk.1.ssm_dt_norm": ones(PL_DT),
        "blk.1.ssm_b_norm": ones(PL_STATE),
        "blk.1.ssm_c_norm": ones(PL_STATE),
    }
    return Gguf(kvs, [(k, v, 0, None) for k, v in t.items()])


def plamo2_hostile() -> dict[str, tuple[bytes, str]]:
    """plamo2 files with one ssm field made hostile (zero, huge, not dividing, groups where
    plamo2 has none) -> (file, the name the refusal must carry)."""
    g = plamo2_base()
    key = "plamo2.ssm."
    cases: dict[str, tuple[Gguf, str]] = {
        "heads_zero": (_with(g, key + "time_step_rank", U32, 0), "dt rank 0"),
        "heads_not_dividing": (_with(g, key + "time_step_rank", U32, 3), "time_step_rank"),
        "heads_huge": (_with(g, key + "time_step_rank", U32, 2**31), "time_step_rank"),
        "inner_huge": (_with(g, key + "inner_size", U32, 2**31), "inner_size"),
        "inner_zero": (_with(g, key + "inner_size", U32, 0), "inner 0"),
        "state_huge": (_with(g, key + "state_size", U32, 2**31), "state_size"),
        "state_zero": (_with(g, key + "state_size", U32, 0), "state 0"),
        "conv_huge": (_with(g, key + "conv_kernel", U32, 2**31), "conv_kernel"),
        "groups": (_with(g, key + "group_count", U32, 2), "group_count"),
        "groups_missing": (_with(g, key + "group_count", drop=True), "group_count"),
    }
    return {k: (v.encode(), why) for k, (v, why) in cases.items()}


# --- minimax-01 (issue 31): lightning attention metadata --------------------------------------
MX_EXPERTS, MX_LAYERS = 2, 2


def minimax_base() -> Gguf:
    """A valid two-layer minimax-01 (a lightning layer, then a softmax-attention layer, an
    MoE on each) on the base's tokenizer."""
    w, ones = _drawers(2)
    arch = "minimax-01"
    kvs = _arch_kvs(arch, (".block_count",))
    kvs += [
        (f"{arch}.block_count", U32, MX_LAYERS),
        (f"{arch}.expert_count", U32, MX_EXPERTS),
        (f"{arch}.expert_used_count", U32, 1),
        (f"{arch}.residual_scale", F32, 1.5),
        (f"{arch}.attention.recurrent_layers", ARR, (BOOL, [True, False])),
    ]
    width = N_HEAD * HEAD_DIM
    t = {"token_embd.weight": w(N_VOCAB, N_EMBD), "output_norm.weight": ones(N_EMBD)}
    for i in range(MX_LAYERS):
        p = f"blk.{i}."
        t |= {
            p + "attn_norm.weight": ones(N_EMBD),
            p + "attn_output.weight": w(N_EMBD, width),
            p + "ffn_norm.weight": ones(N_EMBD),
            p + "ffn_gate_inp.weight": w(MX_EXPERTS, N_EMBD),
            p + "ffn_gate_exps.weight": w(MX_EXPERTS, N_FF, N_EMBD),
            p + "ffn_up_exps.weight": w(MX_EXPERTS, N_FF, N_EMBD),
            p + "ffn_down_exps.weight": w(MX_EXPERTS, N_EMBD, N_FF),
        }
    t |= {
        "blk.0.attn_qkv.weight": w(3 * width, N_EMBD),
        "blk.0.attn_gate.weight": w(width, N_EMBD),
        "blk.0.attn_norm_2.weight": ones(width),
        "blk.1.attn_q.weight": w(width, N_EMBD),
        "blk.1.attn_k.weight": w(N_HEAD_KV * HEAD_DIM, N_EMBD),
        "blk.1.attn_v.weight": w(N_HEAD_KV * HEAD_DIM, N_EMBD),
    }
    return Gguf(kvs, [(k, v, 0, None) for k, v in t.items()])


def minimax_hostile() -> dict[str, tuple[bytes, str]]:
    """minimax-01 files with one lightning field made hostile -> (file, the name the
    refusal must carry)."""
    g = minimax_base()
    key = "minimax-01."
    cases: dict[str, tuple[Gguf, str]] = {
        "recurrent_layers_short": (
            _with(g, key + "attention.recurrent_layers", ARR, (BOOL, [True])),
            "recurrent_layers",
        ),
        "interval_zero": (
            Gguf(
                [kv for kv in g.kvs if not kv[0].endswith("recurrent_layers")]
                + [(key + "full_attention_interval", U32, 0)],
                g.tensors,
            ),
            "full_attention_interval",
        ),
        "residual_nan": (_with(g, key + "residual_scale", F32, float("nan")), "residual_scale"),
        "head_dim_huge": (_with(g, key + "attention.key_length", U32, 2**20), "key_length"),
    }
    return {k: (v.encode(), why) for k, (v, why) in cases.items()}


def empty_tokens_gguf(n: int = 2_000_000) -> bytes:
    """Many empty token strings in a small file: memory must follow the file, not the count."""
    return _with(base(), "tokenizer.ggml.tokens", ARR, (STR, [""] * n)).encode()


# ---------------------------------------------------------------------------------------
# safetensors directories


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 1,
    "hidden_size": N_EMBD,
    "intermediate_size": N_FF,
    "num_attention_heads": N_HEAD,
    "num_key_value_heads": N_HEAD_KV,
    "vocab_size": N_VOCAB,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": N_CTX,
    "tie_word_embeddings": False,
}


def hf_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": w(N_VOCAB, N_EMBD),
        "model.norm.weight": np.ones(N_EMBD, np.float32),
        "lm_head.weight": w(N_VOCAB, N_EMBD),
        p + "input_layernorm.weight": np.ones(N_EMBD, np.float32),
        p + "post_attention_layernorm.weight": np.ones(N_EMBD, np.float32),
        p + "self_attn.q_proj.weight": w(N_EMBD, N_EMBD),
        p + "self_attn.k_proj.weight": w(HEAD_DIM * N_HEAD_KV, N_EMBD),
        p + "self_attn.v_proj.weight": w(HEAD_DIM * N_HEAD_KV, N_EMBD),
        p + "self_attn.o_proj.weight": w(N_EMBD, N_EMBD),
        p + "mlp.gate_proj.weight": w(N_FF, N_EMBD),
        p + "mlp.up_proj.weight": w(N_FF, N_EMBD),
        p + "mlp.down_proj.weight": w(N_EMBD, N_FF),
    }


def safetensors_bytes(
    tensors: dict[str, np.ndarray], header_text: str | None = None, pad: bool = True
) -> bytes:
    entries, blobs, off = {}, [], 0
    for name, a in tensors.items():
        raw = a.tobytes()
        entries[name] = {
            "dtype": "F32",
            "shape": list(a.shape),
            "data_offsets": [off, off + len(raw)],
        }
        blobs.append(raw)
        off += len(raw)
    text = header_text if header_text is not None else json.dumps(entries)
    head = text.encode("utf-8")
    if pad:
        head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def crafted_hf() -> dict[str, dict[str, bytes]]:
    """name -> {file name: bytes} for a model directory."""
    t = hf_tensors()
    good = safetensors_bytes(t)
    cfg = json.dumps(LLAMA_CONFIG).encode()
    (n,) = struct.unpack("<Q", good[:8])
    entries = json.loads(good[8 : 8 + n])
    first = next(iter(entries))

    def header(mut: Callable[[dict], None]) -> bytes:
        e = json.loads(good[8 : 8 + n])
        mut(e)
        return safetensors_bytes(t, json.dumps(e))

    def cfg_with(**kw: object) -> bytes:
        return json.dumps({**LLAMA_CONFIG, **kw}).encode()

    deep = "[" * 100_000 + "]" * 100_000
    raw_dup = good[8 : 8 + n].decode().rstrip()
    dup_text = raw_dup[:-1] + ', "' + first + '": ' + json.dumps(entries[first]) + "}"
    cases: dict[str, dict[str, bytes]] = {
        "valid": {"model.safetensors": good},
        "header_one_short": {"model.safetensors": struct.pack("<Q", n - 1) + good[8:]},
        "header_one_long": {"model.safetensors": struct.pack("<Q", n + 1) + good[8:]},
        "overlap": {
            "model.safetensors": header(
                lambda e: (
                    e[first].update(data_offsets=[0, e[first]["data_offsets"][1]])
                    or e["model.norm.weight"].update(data_offsets=[0, 4 * N_EMBD])
                )
            )
        },
        "gap": {
            "model.safetensors": header(
                lambda e: e["model.norm.weight"].update(
                    data_offsets=[x + 4 for x in e["model.norm.weight"]["data_offsets"]]
                )
            )
        },
        "dup_key": {"model.safetensors": safetensors_bytes(t, dup_text)},
        "float_shape": {
            "model.safetensors": header(
                lambda e: e[first].update(shape=[float(x) for x in e[first]["shape"]])
            )
        },
        "bool_shape": {
            "model.safetensors": header(
                lambda e: e["model.norm.weight"].update(shape=[True] * N_EMBD and [True])
            )
        },
        "str_shape": {"model.safetensors": header(lambda e: e[first].update(shape=["16", 16]))},
        "neg_shape": {"model.safetensors": header(lambda e: e[first].update(shape=[-1, 16]))},
        "bad_dtype": {"model.safetensors": header(lambda e: e[first].update(dtype="F33"))},
        "dtype_int": {"model.safetensors": header(lambda e: e[first].update(dtype=5))},
        "offsets_reversed": {
            "model.safetensors": header(
                lambda e: e[first].update(data_offsets=e[first]["data_offsets"][::-1])
            )
        },
        "metadata_int": {"model.safetensors": header(lambda e: e.update(__metadata__={"a": 1}))},
        "deep_header": {"model.safetensors": safetensors_bytes(t, '{"x": ' + deep + "}")},
        "not_object": {"model.safetensors": safetensors_bytes(t, "[1, 2]")},
        "bad_utf8_header": {
            "model.safetensors": struct.pack("<Q", 8) + b'{"\xff":1}'[:8] + good[8 + n :]
        },
        "huge_header_len": {"model.safetensors": struct.pack("<Q", 2**62) + good[8:]},
        "deep_config": {"config.json": ('{"a": ' + deep + "}").encode()},
        "dup_config": {"config.json": cfg[:-1] + b', "num_hidden_layers": 2}'},
        "str_layers": {"config.json": cfg_with(num_hidden_layers="1")},
        "bool_layers": {"config.json": cfg_with(num_hidden_layers=True)},
        "str_heads": {"config.json": cfg_with(num_attention_heads="2")},
        "zero_heads": {"config.json": cfg_with(num_attention_heads=0)},
        "str_eps": {"config.json": cfg_with(rms_norm_eps="1e-5")},
        "nan_eps": {"config.json": cfg_with(rms_norm_eps=float("nan"))},
        "neg_eps": {"config.json": cfg_with(rms_norm_eps=-1.0)},
        "nan_theta": {"config.json": cfg_with(rope_theta=float("nan"))},
        "huge_int_theta": {"config.json": cfg_with(rope_theta=10**400)},
        "giga_layers": {"config.json": cfg_with(num_hidden_layers=10**9)},
        "odd_head_dim": {"config.json": cfg_with(head_dim=7)},
        "rope_scaling_list": {"config.json": cfg_with(rope_scaling=[1, 2])},
        "config_not_object": {"config.json": b"[]"},
        "config_bad_utf8": {"config.json": b'{"model_type": "\xff"}'},
        "deep_index": {
            "model.safetensors": None,
            "model.safetensors.index.json":  # type: ignore[dict-item]
            ('{"weight_map": ' + deep + "}").encode(),
        },
        "index_escape": {
            "model.safetensors": None,
            "model.safetensors.index.json":  # type: ignore[dict-item]
            json.dumps({"weight_map": {first: "../../etc/passwd"}}).encode(),
        },
        "deep_tokenizer": {
            "tokenizer_config.json": ('{"a": ' + deep + "}").encode(),
            "tokenizer.json": b"{}",
        },
        "template_bad_utf8": {"chat_template.jinja": b"{{ '\xff' }}", "tokenizer.json": b"{}"},
    }
    out = {}
    for name, files in cases.items():
        d = {"config.json": cfg, "model.safetensors": good}
        d.update(files)
        out[name] = {k: v for k, v in d.items() if v is not None}
    return out


# ---------------------------------------------------------------------------------------
# hostile templates


HOSTILE_TEMPLATES = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'x' * 1000000000 }}",
    "{{ ['x'] * 1000000000 }}",
    "{{ 10 ** 10 ** 8 }}",
    "{{ '%999999999s' % 'a' }}",
    "{{ 'a'.center(1000000000) }}",
    "{{ 'a'|center(1000000000) }}",
    "{{ 'a'|indent(1000000000) }}",
    (
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s|length }}"
    ),
    (
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}"
    ),
    (
        "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}"
        "{% endfor %}"
    ),
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__ }}",
    "{{ raise_exception('no') }}",
    "{{ undefined_thing.attr }}",
    "{{ messages[0]['content'] | tojson(indent=1000000000) }}",
    "{% for m in messages %}{{ m.content }}{% endfor %",
    "{{ '{:>1000000000}'.format('a') }}",
    "{{ 'ab' | replace('a', 'a' * 100000) | replace('a', 'a' * 100000) }}",
    "{{ range(100000) | join(',') }}",
    "{{ (range(100000)|list) * 100000 }}",
    "{{ strftime_now('%Y' * 100000) }}",
    "{% set x = namespace(__init__=1) %}",
    "\x00\x1b[2J{{ 1 }}",
    "{{ 'x' ~ 'y' }}{{ messages|length }}",
]
_TEMPLATE_PARTS = [
    "{{ 'x' * N }}",
    "{% for i in range(N) %}A{% endfor %}",
    "{{ m }}",
    "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "{{ bos_token }}",
    "{{ 'ab' ~ 'cd' }}",
    "{% if add_generation_prompt %}G{% endif %}",
    "{{ messages[0].content|upper }}",
    "{{ N ** N }}",
    "{{ '%Ns' % 'a' }}",
    "{{ 'q'.center(N) }}",
    "{{ 'q'|indent(N) }}",
    "{{ raise_exception('x') }}",
    "{% set ns = namespace(v='ab') %}"
    "{% for i in range(N) %}{% set ns.v = ns.v ~ ns.v %}{% endfor %}",
    "{{ (messages|tojson)[N] }}",
    "{{ messages.pop() }}",
    "{{ ''.join(['a'] * N) }}",
]


def random_template(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        part = rng.choice(_TEMPLATE_PARTS)
        parts.append(part.replace("N", str(rng.choice([0, 1, 7, 64, 10**3, 10**5, 10**9]))))
    return "".join(parts)


# ---------------------------------------------------------------------------------------
# running and classifying


@dataclass
class Case:
    kind: str
    name: str
    run: Callable[[], object]  # returns on a correct run, raises FrinkError on a refusal
    size: int = 0  # bytes of the input, for the memory bound


def classify(case: Case) -> tuple[str, str]:
    """(outcome, detail) of one in-process case."""
    from frink_cli.errors import FrinkError

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        case.run()
        outcome, detail = "correct run", ""
    except FrinkError as e:
        outcome, detail = "clean refusal", str(e)[:200]
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        outcome, detail = "traceback", "".join(traceback.format_exception(e))[-1500:]
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    elapsed = time.perf_counter() - t0
    if elapsed > HANG_S:
        return "hang", f"{elapsed:.1f} s"
    if outcome == "clean refusal" and peak > mem_limit(case.size):
        return "excessive memory", f"{peak / 2**20:.0f} MiB traced"
    return outcome, detail


def _gguf_case(kind: str, name: str, data: bytes, work: Path) -> Case:
    path = work / "case.gguf"

    def run() -> None:
        path.write_bytes(data)
        _run_model(path)

    return Case(kind, name, run, len(data))


def _run_model(path: Path) -> None:
    """What `frink run -p hello -n 2 --temp 0 -c 64` does, in-process."""
    from frink_cli.api import load

    m = load(path)
    ids = m.prompt_ids("hello", n_ctx=N_CTX)
    list(m.generate_ids(ids, max_tokens=2, n_ctx=N_CTX, temperature=0.0))


def _hf_case(name: str, files: dict[str, bytes], work: Path) -> Case:
    d = work / "hf"

    def run() -> None:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        for fname, raw in files.items():
            (d / fname).write_bytes(raw)
        _run_model(d)  # without tokenizer.json it loads, then refuses at the prompt

    return Case("safetensors", name, run, sum(map(len, files.values())))


def _template_case(name: str, template: str) -> Case:
    from frink_cli.chat import render_chat

    def run() -> None:
        render_chat(
            template,
            [{"role": "user", "content": "hi"}],
            bos_token="<s>",
            eos_token="</s>",
            max_chars=N_CTX * 16,
        )

    return Case("template", name, run, len(template))


def cases(n_random: int, seed: int, work: Path) -> Iterator[Case]:
    """The fixed cases, then n_random seeded random ones (flips, config and template
    mutations) in proportion."""
    g = base()
    good = g.encode()
    bounds = sorted({x + d for x in g.boundaries for d in (-1, 0, 1) if 0 <= x + d < len(good)})
    yield _gguf_case("gguf", "valid", good, work)
    for b in bounds:
        yield _gguf_case("truncate", f"at {b}", good[:b], work)
    for name, data in crafted_ggufs().items():
        yield _gguf_case("crafted", name, data, work)
    for name, files in crafted_hf().items():
        yield _hf_case(name, files, work)
    yield _gguf_case("deepseek2", "valid", deepseek2_base().encode(), work)
    for name, (data, _) in deepseek2_hostile().items():
        yield _gguf_case("deepseek2", name, data, work)
    yield _gguf_case("mimo2", "valid", mimo2_base().encode(), work)
    for name, (data, _) in mimo2_hostile().items():
        yield _gguf_case("mimo2", name, data, work)
    yield _gguf_case("plamo2", "valid", plamo2_base().encode(), work)
    for name, (data, _) in plamo2_hostile().items():
        yield _gguf_case("plamo2", name, data, work)
    yield _gguf_case("minimax-01", "valid", minimax_base().encode(), work)
    for name, (data, _) in minimax_hostile().items():
        yield _gguf_case("minimax-01", name, data, work)
    for i, t in enumerate(HOSTILE_TEMPLATES):
        yield _template_case(f"hostile {i}", t)

    rng = random.Random(seed)
    lo, hi = g.regions["header"][0], g.regions["tensor_info"][1]
    hf_good = safetensors_bytes(hf_tensors())
    (hn,) = struct.unpack("<Q", hf_good[:8])
    for i in range(n_random):
        r = rng.random()
        if r < 0.6:  # byte flips over header, metadata and tensor info
            data = bytearray(good)
            for _ in range(rng.choice([1, 1, 2, 4])):
                pos = rng.randrange(lo, hi)
                data[pos] = (
                    rng.randrange(256)
                    if rng.random() < 0.5
                    else data[pos] ^ (1 << rng.randrange(8))
                )
            yield _gguf_case("flip", f"#{i}", bytes(data), work)
        elif r < 0.7:  # flips in the safetensors header
            data = bytearray(hf_good)
            for _ in range(rng.choice([1, 2])):
                pos = rng.randrange(0, 8 + hn)
                data[pos] = rng.randrange(256)
            yield _hf_case(
                f"st flip #{i}",
                {
                    "config.json": json.dumps(LLAMA_CONFIG).encode(),
                    "model.safetensors": bytes(data),
                },
                work,
            )
        elif r < 0.8:  # a config field set to something else
            cfg = dict(LLAMA_CONFIG)
            key = rng.choice(sorted(cfg))
            cfg[key] = rng.choice(
                [
                    0,
                    -1,
                    1,
                    2,
                    10**9,
                    10**30,
                    0.5,
                    float("nan"),
                    float("inf"),
                    "1",
                    "",
                    None,
                    True,
                    [],
                    {},
                    [1, 2],
                    "llama",
                    -0.0,
                    1e-30,
                ]
            )
            text = json.dumps(cfg)
            yield _hf_case(
                f"config {key}={cfg[key]!r} #{i}",
                {"config.json": text.encode(), "model.safetensors": hf_good},
                work,
            )
        else:
            yield _template_case(f"random #{i}", random_template(rng))


def run_cases(n_random: int, seed: int, progress: bool = False) -> tuple[Counter, list]:
    """Counts per outcome, and the (case, outcome, detail) of every bad one."""
    from frink_cli import chat_template

    # Hostile templates meet the deadline by design; its length does not change the outcome,
    # only how long the soak takes.
    chat_template.TEMPLATE_SECONDS = 1.0
    counts: Counter = Counter()
    bad: list = []
    work = Path(tempfile.mkdtemp(prefix="frink-fuzz-"))
    try:
        for k, case in enumerate(cases(n_random, seed, work)):
            outcome, detail = classify(case)
            counts[outcome] += 1
            if outcome in BAD:
                bad.append((f"{case.kind}: {case.name}", outcome, detail))
            if progress and k % 1000 == 0:
                print(f"{k} cases: {dict(counts)}", file=sys.stderr, flush=True)
            if k % 200 == 0:
                chat_template._compile.cache_clear()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return counts, bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=20_000, help="total cases at least")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--http-cases", type=int, default=2000, help="hostile HTTP clients against frink serve"
    )
    args = ap.parse_args()
    n_fixed = sum(1 for _ in cases(0, args.seed, Path(tempfile.gettempdir())))
    t0 = time.perf_counter()
    counts, bad = run_cases(max(0, args.cases - n_fixed), args.seed, progress=True)
    total = sum(counts.values())
    print(
        f"{total} cases in {time.perf_counter() - t0:.0f} s (seed {args.seed}): "
        + ", ".join(f"{k} {counts.get(k, 0)}" for k in ("clean refusal", "correct run", *BAD))
    )
    for name, outcome, detail in bad[:20]:
        print(f"--- {outcome}: {name}\n{detail}")
    if args.http_cases > 0:
        import fuzz_http  # (a sibling: scripts/ is this script's own directory)

        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="frink-fuzz-http-") as d:
            model = Path(d) / "tiny.gguf"
            model.write_bytes(base().encode())
            http_counts, http_bad = fuzz_http.run_http_cases(
                model, args.http_cases, args.seed, progress=True
            )
        print(
            f"{sum(http_counts.values())} HTTP cases in {time.perf_counter() - t0:.0f} s "
            f"(seed {args.seed}): ok {http_counts.get('ok', 0)}, "
            + ", ".join(f"{k} {http_counts.get(k, 0)}" for k in fuzz_http.BAD)
        )
        for name, outcome, detail in http_bad[:20]:
            print(f"--- {outcome}: {name}\n{detail}")
        bad = bad + http_bad
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
