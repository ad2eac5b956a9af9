"""The metal backend's MoE on quantized expert stacks, against the host body.

The tiny MoE fixtures are F32; here a copy of each is written with its expert stacks (and
the shared expert and attention projections) requantized by gguf-py into Q8_0 / Q4_0 /
Q4_1 / MXFP4 blocks, so the backend's resident-quantized path (MLX's affine and mxfp4
modes) is what runs. The host body
dequantizes those same blocks, and the host body itself is held to transformers and
llama.cpp elsewhere (test_conformance.py, test_moe.py), so the bar here is the two
computing one model: logits within 1e-4 over a prefill and greedy decode steps, one
submission per decode token, the expert stacks held as the file's blocks on the device,
and every expert product a gather_qmm / gather_mm on the resident stack (never a gather
of whole expert matrices per token).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixture_copies import copy_gguf

mx = pytest.importorskip("mlx.core")

import frink_cli  # noqa: E402
from frink_cli.backends.mlx import graph  # noqa: E402

# Metal keeps x in f32 in its quantized matmuls: the host body it is held to must too.
pytestmark = pytest.mark.usefixtures("exact_activations")

STEPS = 12
EXPERT_STACKS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# Besides the expert stacks, these are requantized too: the shared expert's gate/up (its
# down, [n_embd, 48], has rows no block of 32 divides) and the attention projections.
OTHERS = ("ffn_gate_shexp", "ffn_up_shexp", "attn_q.", "attn_k.", "attn_v.", "attn_output")


def requantize(src: Path, dst: Path, types: dict[str, str]) -> None:
    """Copy GGUF `src` to `dst`, each tensor whose name holds a key of `types` stored in
    that type (gguf-py's own quantizer); everything else, metadata included, as it was."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    def convert(t: Any) -> tuple[np.ndarray, Any]:
        data = np.asarray(t.data)
        qtype = next((q for key, q in types.items() if key in t.name), None)
        if qtype is None or t.tensor_type != GGMLQuantizationType.F32 or data.shape[-1] % 32:
            return data, t.tensor_type
        if qtype == "F16":
            return data.astype(np.float16), None
        q = GGMLQuantizationType[qtype]
        return quantize(data, q), q

    copy_gguf(src, dst, tensor=convert)


# (fixture, what its expert stacks become). "mixed" gives gate, up and down three different
# block types, so gate and up cannot share one fused stack on the device; "mixed-mxfp4"
# puts MLX's two modes side by side (stacks, and parts of one fused q/k/v).
CASES = [
    ("qwen3moe", "Q8_0"),
    ("qwen3moe", "Q4_0"),
    ("qwen3moe", "mixed"),
    ("qwen3moe", "MXFP4"),
    ("qwen3moe", "mixed-mxfp4"),
    ("qwen35moe", "Q4_0"),
    ("qwen3next", "Q8_0"),
]


def _types(kind: str) -> dict[str, str]:
    if kind == "F16":
        return {k: kind for k in EXPERT_STACKS}
    if kind == "mixed":
        return {
            "ffn_gate_exps": "Q4_0",
            "ffn_up_exps": "Q8_0",
            "ffn_down_exps": "Q4_1",
            **{k: "Q4_1" for k in OTHERS},
        }
    if kind == "mixed-mxfp4":
        return {
            "ffn_gate_exps": "MXFP4",
            "ffn_up_exps": "Q8_0",
            "ffn_down_exps": "MXFP4",
            **{k: "MXFP4" for k in OTHERS},
            "attn_v.": "Q8_0",
        }
    return {k: kind for k in EXPERT_STACKS + OTHERS}


def _held_as(qtype: str) -> str:
    """How tensor_held begins for a tensor of `qtype` kept in the file's blocks."""
    return {"MXFP4": "quantized mxfp4 4-bit", "Q8_0": "quantized 8-bit"}.get(
        qtype, "quantized 4-bit"
    )


@pytest.fixture(scope="module")
def quantized_copy(tiny_model, tmp_path_factory):
    made: dict[tuple[str, str], Path] = {}

    def get(name: str, kind: str) -> Path:
        if (name, kind) not in made:
            dst = tmp_path_factory.mktemp("moeq") / f"{name}-{kind}.gguf"
            requantize(tiny_model(name).gguf, dst, _types(kind))
            made[name, kind] = dst
        return made[name, kind]

    return get


@pytest.fixture
def gather_calls(monkeypatch):
    """Counts of mx.gather_qmm / mx.gather_mm calls, made while a graph is traced (once per
    compiled shape, not per token)."""
    counts = {"gather_qmm": 0, "gather_mm": 0}
    for fn in counts:
        real = getattr(mx, fn)

        def counted(*a, _real=real, _fn=fn, **k):
            counts[_fn] += 1
            return _real(*a, **k)

        monkeypatch.setattr(mx, fn, counted)
    return counts


def _moe_primitives(backend, cfg, rows: int) -> set[str]:
    """The primitives of the last MoE layer's block on `rows` rows, read off MLX's graph."""
    import io
    import re

    h = mx.array(np.random.default_rng(0).standard_normal((rows, cfg.n_embd)).astype(np.float32))
    out = graph._moe(cfg, backend.layers[-1].moe, h)
    dot = io.StringIO()
    mx.export_to_dot(dot, out)
    return set(re.findall(r'label ="(\w+)"', dot.getvalue()))


def _expert_arrays(backend) -> list[graph.DeviceExperts]:
    return [
        s
        for layer in backend.layers
        if layer is not None and layer.moe is not None
        for s in layer.moe.gate_up_exps + [layer.moe.down_exps]
    ]


@pytest.mark.parametrize("name, kind", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_quantized_moe_matches_host(quantized_copy, tiny_model, gather_calls, name, kind):
    path = quantized_copy(name, kind)
    host = frink_cli.load(path)
    dev = frink_cli.load(path, backend="metal")
    backend = dev.decoder.backend
    cfg = dev.config
    n_moe = sum(cfg.ext.moe.layers)

    # Resident in the file's own blocks: uint32 words, 32 weights a group, per expert.
    types = _types(kind)
    for i in range(cfg.n_layer):
        for stack in EXPERT_STACKS:
            n = f"blk.{i}.{stack}.weight"
            assert backend.tensor_held[n].startswith(_held_as(types[stack])), (
                n,
                backend.tensor_held[n],
            )
    stacks = _expert_arrays(backend)
    assert len(stacks) == n_moe * (3 if kind.startswith("mixed") else 2)
    for s in stacks:
        assert s.w.dtype == mx.uint32 and s.w.ndim == 3 and s.w.shape[0] == cfg.ext.moe.n_expert
        cols = s.w.shape[2] * 32 // s.bits
        assert s.scales.shape == (*s.w.shape[:2], cols // 32)
        if s.mode == "mxfp4":  # e8m0 exponent bytes, no biases
            assert s.scales.dtype == mx.uint8 and s.biases is None and s.bits == 4
        else:
            assert s.mode == "affine" and s.biases.shape == s.scales.shape
    modes = {s.mode for s in stacks}
    assert modes == {"MXFP4": {"mxfp4"}, "mixed-mxfp4": {"mxfp4", "affine"}}.get(
        kind, {"affine"}
    ), modes
    if kind == "mixed-mxfp4":
        qkv = backend.layers[0].qkv  # q/k MXFP4 beside a Q8_0 v: one part per mode
        assert [p.mode for p in qkv.parts] == ["mxfp4", "affine"], qkv.parts
    f32_bytes = n_moe * cfg.ext.moe.n_expert * 3 * cfg.ext.moe.n_ff_exp * cfg.n_embd * 4
    held = sum(
        s.w.nbytes + s.scales.nbytes + (0 if s.biases is None else s.biases.nbytes) for s in stacks
    )
    assert held < 0.45 * f32_bytes  # 8-bit: 0.31 of f32 (scales and biases are f32)
    if cfg.ext.moe.n_ff_shexp:
        assert backend.layers[-1].moe.gate_up_shexp.scales is not None

    ids = tiny_model(name).ref["tokens"][:24]  # 24 rows x top k >= 64: sorted by expert
    hc, dc = host.decoder.new_cache(64), dev.decoder.new_cache(64)
    lh = host.decoder.step(np.asarray(ids), hc, all_logits=True)
    ld = dev.decoder.step(np.asarray(ids), dc, all_logits=True)
    worst = np.abs(lh - ld).max()
    assert (lh.argmax(-1) == ld.argmax(-1)).all()
    ledger = backend.ledger
    token = int(lh[-1].argmax())
    for _ in range(STEPS):
        ledger.reset()
        a = host.decoder.step(np.asarray([token]), hc)[-1]
        b = dev.decoder.step(np.asarray([token]), dc)[-1]
        assert ledger.total() == 1, dict(ledger.submissions)
        worst = max(worst, np.abs(a - b).max())
        assert a.argmax() == b.argmax()
        token = int(a.argmax())
    assert worst <= 1e-4, worst
    assert not ledger.refusals and not ledger.failures

    # Two traced graphs (prefill, decode): each MoE layer made one gather_qmm per stack.
    assert gather_calls["gather_qmm"] == 2 * len(stacks)
    assert gather_calls["gather_mm"] == 0
    # A decode token's MoE block, primitive by primitive: the stacks are read by GatherQMM
    # alone; no Gather (indexing a stack by the routing ids: a copy of k whole experts),
    # no AsType (a stack converted) and no Dequantize anywhere in it.
    ops = _moe_primitives(backend, cfg, 1)
    assert "GatherQMM" in ops and not ops & {"Gather", "AsType", "Dequantize", "GatherMM"}, ops


@pytest.mark.parametrize("sort_min", [1, 10**6], ids=["sorted", "unsorted"])
def test_prefill_rows_sorted_by_expert_or_not_agree(
    quantized_copy, tiny_model, monkeypatch, sort_min
):
    # The same prefill through gather_qmm's sorted (rows grouped by expert) and broadcast
    # forms, decode included (a decode token is sorted too when the threshold is 1).
    monkeypatch.setattr(graph, "SORT_MIN_ROWS", sort_min)
    path = quantized_copy("qwen3moe", "Q4_0")
    host = frink_cli.load(path)
    dev = frink_cli.load(path, backend="metal")
    ids = tiny_model("qwen3moe").ref["tokens"][:17]
    assert np.abs(host.logits(ids) - dev.logits(ids)).max() <= 1e-4
    assert np.abs(host.logits(ids[:6], step=True) - dev.logits(ids[:6], step=True)).max() <= 1e-4
    ledger = dev.decoder.backend.ledger
    assert ledger.total() == 7 and not ledger.failures


@pytest.mark.parametrize("dtype", ["F32", "F16"])
def test_dense_expert_stacks_use_gather_mm(quantized_copy, tiny_model, gather_calls, dtype):
    # F32 stacks (the plain fixture) and F16 ones, read by gather_mm. On the GPU an F16
    # stack stays f16 and takes f16 activations (promoting the stack to f32 would copy it
    # every call), hence the looser bar there; MLX's CPU gather_mm is f32 only, so on the
    # CPU device (CI) the stack is held f32 and must match the host as closely as F32.
    tm = tiny_model("qwen3moe")
    path = tm.gguf if dtype == "F32" else quantized_copy("qwen3moe", dtype)
    host = frink_cli.load(path)
    dev = frink_cli.load(path, backend="metal")
    half = dtype == "F16" and mx.default_device() == mx.gpu
    stacks = _expert_arrays(dev.decoder.backend)
    assert all(
        s.scales is None and s.w.dtype == (mx.float16 if half else mx.float32) for s in stacks
    )
    ids = tm.ref["tokens"][:24]
    ledger = dev.decoder.backend.ledger
    d = np.abs(host.logits(ids) - dev.logits(ids)).max()
    assert ledger.total() == 1
    d = max(d, np.abs(host.logits(ids[:4], step=True) - dev.logits(ids[:4], step=True)).max())
    assert ledger.total() == 5 and not ledger.failures
    assert d <= (1e-2 if half else 1e-4), d
    assert gather_calls["gather_mm"] > 0 and gather_calls["gather_qmm"] == 0
    ops = _moe_primitives(dev.decoder.backend, dev.config, 1)
    assert "GatherMM" in ops and "Gather" not in ops, ops
    if dtype == "F32" or not half:
        assert "AsType" not in ops, ops  # the stack is multiplied as held, never converted


def test_info_reports_how_expert_stacks_are_held(quantized_copy):
    import json

    from typer.testing import CliRunner

    from frink_cli.cli import app

    path = quantized_copy("qwen3moe", "Q4_0")
    r = CliRunner().invoke(app, ["info", str(path), "--backend", "metal", "--json"])
    assert r.exit_code == 0, r.output
    formats = json.loads(r.stdout)["backend"]["tensor_formats"]
    assert "expert stacks" in formats["Q4_0"] and "gather_qmm" in formats["Q4_0"]


# A Q4_K_M file's fusions mix types (Q4_K q/k beside a Q6_K v, Gemma 3's Q5_0 q/k beside a
# Q8_0 v): each run of one type must stay in the file's blocks as its own part of the fused
# linear, not send the whole projection to f32. qwen2 adds the q/k/v bias, applied after the parts.
MIXED_FUSIONS = {
    "attn_q.weight": "Q4_0",
    "attn_k.weight": "Q4_0",
    "attn_v.weight": "Q8_0",
    "ffn_gate.weight": "Q4_0",
    "ffn_up.weight": "Q8_0",
}
# The same with MLX's mxfp4 mode beside its affine one in each fusion.
MIXED_MXFP4_FUSIONS = {**MIXED_FUSIONS, "attn_q.weight": "MXFP4", "attn_k.weight": "MXFP4"}
MIXED_MXFP4_FUSIONS["ffn_gate.weight"] = "MXFP4"


@pytest.mark.parametrize(
    "name, fusions",
    [("llama", MIXED_FUSIONS), ("qwen2", MIXED_FUSIONS), ("llama", MIXED_MXFP4_FUSIONS)],
    ids=["llama", "qwen2", "llama-mxfp4"],
)
def test_mixed_type_fusions_stay_quantized(tiny_model, tmp_path, name, fusions):
    path = tmp_path / f"{name}-mixed.gguf"
    requantize(tiny_model(name).gguf, path, fusions)
    host = frink_cli.load(path)
    dev = frink_cli.load(path, backend="metal")
    backend = dev.decoder.backend
    for i, layer in enumerate(backend.layers):
        for key, qtype in fusions.items():
            how = backend.tensor_held[f"blk.{i}.{key}"]
            assert how.startswith(_held_as(qtype)), (i, key, how)
        # q and k (one type) share a part; v, gate and up are their own.
        for lin, n_parts in ((layer.qkv, 2), (layer.gate_up, 2)):
            assert len(lin.parts) == n_parts
            assert all(part.w.dtype == mx.uint32 and part.scales is not None for part in lin.parts)
            first = fusions[lin.parts[0].sources[0].split(".", 2)[2]]  # q's type, or gate's
            assert lin.parts[0].mode == ("mxfp4" if first == "MXFP4" else "affine")
        assert (layer.qkv.bias is not None) == (name == "qwen2")

    ids = tiny_model(name).ref["tokens"][:16]
    hc, dc = host.decoder.new_cache(64), dev.decoder.new_cache(64)
    worst = np.abs(
        host.decoder.step(np.asarray(ids), hc, all_logits=True)
        - dev.decoder.step(np.asarray(ids), dc, all_logits=True)
    ).max()
    ledger = backend.ledger
    token = int(ids[-1])
    for _ in range(4):
        ledger.reset()
        a = host.decoder.step(np.asarray([token]), hc)[-1]
        b = dev.decoder.step(np.asarray([token]), dc)[-1]
        assert ledger.total() == 1, dict(ledger.submissions)
        worst = max(worst, np.abs(a - b).max())
        token = int(a.argmax())
    print(f"{name}: max |d| = {worst:.3g}")
    assert worst <= 1e-4, worst
    assert not ledger.refusals and not ledger.failures
