"""The metal (MLX) backend against the host body, on MLX's CPU device.

The host body is itself held to transformers and llama.cpp (test_conformance.py); here
the backend must compute the same model as the host body: logits within 1e-3 and the same
argmax over a prefill and 32 greedy decode steps, one device submission per token when
every layer is eligible, every refusal named and the result still right.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from model_checks import configured  # noqa: E402

import frink_cli  # noqa: E402
from frink_cli.backends import Refusal  # noqa: E402
from frink_cli.backends.mlx import eligibility  # noqa: E402
from frink_cli.backends.mlx.quant import affine_from_blocks, pack  # noqa: E402

DENSE = ["llama", "llama_tied", "mistral", "qwen2", "qwen3", "gemma3_text", "qwen3moe"]
HYBRID = [
    "qwen35",
    "qwen35_vl",
    "qwen3next",
    "qwen35moe",
]  # GDN + gated attention (+ MoE for qwen3next)
MODELS = DENSE + HYBRID
STEPS = 32


@pytest.mark.parametrize("name", MODELS)
def test_backend_matches_host_over_prefill_and_decode(tiny_model, name):
    tm = tiny_model(name)
    host = frink_cli.load(tm.gguf)
    dev = frink_cli.load(tm.gguf, backend="metal")
    ids = [int(t) for t in tm.ref["tokens"][:12]]
    hc, dc = host.decoder.new_cache(64), dev.decoder.new_cache(64)
    lh = host.decoder.step(np.asarray(ids), hc, all_logits=True)
    ld = dev.decoder.step(np.asarray(ids), dc, all_logits=True)
    assert np.abs(lh - ld).max() <= 1e-3
    assert (lh.argmax(-1) == ld.argmax(-1)).all()
    token = int(lh[-1].argmax())
    for _ in range(STEPS):
        a = host.decoder.step(np.asarray([token]), hc)[-1]
        b = dev.decoder.step(np.asarray([token]), dc)[-1]
        assert np.abs(a - b).max() <= 1e-3
        assert a.argmax() == b.argmax()
        token = int(a.argmax())
    # The device mirrors stayed in step with the authoritative host cache.
    assert dc.n_past == hc.n_past == len(ids) + STEPS
    for layer in range(host.config.n_layer):
        if host.config.is_recurrent(layer):
            assert np.abs(dc.delta_state[layer] - hc.delta_state[layer]).max() <= 1e-4
            assert np.abs(dc.conv_state[layer] - hc.conv_state[layer]).max() <= 1e-4
        else:
            assert np.abs(dc.k[layer][:, : dc.n_past] - hc.k[layer][:, : hc.n_past]).max() <= 1e-4


@pytest.mark.parametrize("name", MODELS)
def test_one_submission_per_token(tiny_model, name):
    # Pinned: a stray mx.eval or host conversion anywhere in a token shows up here.
    dev = frink_cli.load(tiny_model(name).gguf, backend="metal")
    ledger = dev.decoder.backend.ledger
    cache = dev.decoder.new_cache(64)
    dev.decoder.step(np.arange(1, 9), cache)
    assert ledger.total() == 1, dict(ledger.submissions)
    for t in range(10):
        ledger.reset()
        dev.decoder.step(np.asarray([t + 3]), cache)
        kind = "gdn-run+lm-head" if name in HYBRID else "dense-run+lm-head"
        assert dict(ledger.submissions) == {kind: 1}
    assert not ledger.refusals


def test_step_api_equals_batched_on_backend(tiny_model):
    dev = frink_cli.load(tiny_model("qwen3").gguf, backend="metal")
    ids = tiny_model("qwen3").ref["tokens"][:10]
    assert np.abs(dev.logits(ids) - dev.logits(ids, step=True)).max() <= 1e-4


@pytest.mark.parametrize("name", ["gemma3_text", "qwen35"])
def test_refused_layers_alternate_with_device_runs(tiny_model, monkeypatch, name):
    # Host and device layers alternate within each token; for qwen35 the host then runs
    # GDN layers between device runs, so the recurrent state crosses over both ways.
    tm = tiny_model(name)
    real = eligibility.layer_refusals

    def refuse_odd(cfg, layer, source=None):
        return real(cfg, layer, source) + (["forced for test"] if layer % 2 else [])

    monkeypatch.setattr(eligibility, "layer_refusals", refuse_odd)
    monkeypatch.setattr("frink_cli.backends.mlx.backend.layer_refusals", refuse_odd)
    host = frink_cli.load(tm.gguf)
    dev = frink_cli.load(tm.gguf, backend="metal")
    ids = tm.ref["tokens"][:20]
    assert np.abs(host.logits(ids, step=True) - dev.logits(ids, step=True)).max() <= 1e-3
    assert np.abs(host.logits(ids) - dev.logits(ids)).max() <= 1e-3
    ledger = dev.decoder.backend.ledger
    n_layer = dev.config.n_layer
    # step=True: 20 tokens; then one batched prefill
    assert ledger.refusals["forced for test"] == 21 * (n_layer // 2)
    assert ledger.total() == 21 * ((n_layer + 1) // 2)  # one run per device layer per step


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(attn_logit_softcap=30.0), "attention: softcap"),
        (dict(ffn_act="relu"), "glu: act"),
    ],
)
def test_every_refusal_is_named(tiny_model, change, reason):
    cfg = configured(frink_cli.load(tiny_model("llama").gguf).config, **change)
    for layer in range(cfg.n_layer):
        assert reason in eligibility.layer_refusals(cfg, layer)


def test_refused_model_runs_on_host_and_stays_correct(tiny_model, monkeypatch):
    # A feature the graph does not carry: every layer refused, the answer unchanged.
    tm = tiny_model("llama")
    monkeypatch.setattr(
        "frink_cli.backends.mlx.backend.layer_refusals",
        lambda cfg, layer, source=None: ["attention: softcap"],
    )
    dev = frink_cli.load(tm.gguf, backend="metal")
    plan = dev.decoder.backend.plan("decode", 0, 1, dev.decoder.new_cache(8))
    assert plan == Refusal("attention: softcap")
    got = dev.logits(tm.ref["tokens"])
    assert np.abs(got - tm.ref["logits_llamacpp"]).max() <= 2e-3
    assert dev.decoder.backend.ledger.total() == 0


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_map_exactly_onto_mlx_affine(qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    t = GGMLQuantizationType[qtype]
    raw = quantize(w, t)
    want = dequantize(raw, t).reshape(8, 128)
    q, scales, biases, bits = affine_from_blocks(raw.reshape(-1).view(np.uint8), qtype, 8, 128)
    got = mx.dequantize(
        mx.array(pack(q, bits)), mx.array(scales), mx.array(biases), group_size=32, bits=bits
    )
    assert np.array_equal(np.asarray(got), want)


@pytest.mark.real
def test_parity_command_on_real_quantized_model(smollm2_path):
    frink = Path(sys.executable).parent / "frink"
    proc = subprocess.run(
        [
            str(frink),
            "parity",
            str(smollm2_path),
            "--backend",
            "metal",
            "-p",
            "The capital of France is",
            "--steps",
            "16",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["verdict"] == "MATCH", r
    assert r["quantized"] and r["submissions_per_decode_token"] == 1.0
    # A MATCH is worth something only if the device computed it.
    assert sum(r["submissions_by_kind"].values()) > 0 and any(r["layer_on_backend"]), r
    assert r["failures"] == {}, r


def _refuse_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "frink_cli.backends.mlx.backend.layer_refusals",
        lambda cfg, layer, source=None: ["forced for test"],
    )


def _fail_every_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    from frink_cli.backends import LaunchFailed
    from frink_cli.backends.mlx.backend import MlxBackend

    def fail(*args, **kwargs):
        raise LaunchFailed("mlx: forced for test")

    monkeypatch.setattr(MlxBackend, "run", fail)
    monkeypatch.setattr(MlxBackend, "run_head", fail)


@pytest.mark.parametrize(
    "sabotage, verdict",
    [(None, "MATCH"), (_refuse_every_layer, "NOT RUN"), (_fail_every_launch, "FAILED")],
    ids=["device-runs", "every-layer-refused", "every-launch-fails"],
)
def test_parity_command_passes_only_when_the_device_ran(tiny_model, monkeypatch, sabotage, verdict):
    # The host body answers for every refused or failed layer, so the logits agree either
    # way: only the ledger tells a real MATCH from a comparison of the host with itself.
    from typer.testing import CliRunner

    from frink_cli.cli import app

    if sabotage is not None:
        sabotage(monkeypatch)
    result = CliRunner().invoke(
        app,
        ["parity", str(tiny_model("llama").gguf), "--backend", "metal", "--steps", "4", "--json"],
    )
    r = json.loads(result.stdout)
    assert r["verdict"] == verdict, r
    assert max(r["step_kl"]) < r["kl_bar"] and all(r["step_top1_agree"]), r
    if sabotage is None:
        assert result.exit_code == 0 and r["ok"], r
        assert all(r["layer_on_backend"]) and sum(r["submissions_by_kind"].values()) > 0, r
        assert r["failures"] == {}, r
    else:
        assert result.exit_code == 1 and not r["ok"], r
        assert verdict != "FAILED" or r["failures"], r


@pytest.mark.parametrize("name", ["gemma3_text", "qwen35", "qwen3next"])
def test_prefill_in_chunks_one_submission_each(tiny_model, monkeypatch, name):
    # Small chunks so a 23-token prompt spans several: every chunk one submission, the
    # K/V rows and recurrent state handed from chunk to chunk, the decode after it right.
    monkeypatch.setattr("frink_cli.backends.mlx.backend.PREFILL_CHUNK", 7)
    monkeypatch.setattr("frink_cli.backends.mlx.backend.GDN_CHUNK", 5)
    tm = tiny_model(name)
    host = frink_cli.load(tm.gguf)
    dev = frink_cli.load(tm.gguf, backend="metal")
    ids = tm.ref["tokens"][:23]
    hc, dc = host.decoder.new_cache(64), dev.decoder.new_cache(64)
    ledger = dev.decoder.backend.ledger
    lh = host.decoder.step(ids, hc, all_logits=True)
    ld = dev.decoder.step(ids, dc, all_logits=True)
    assert np.abs(lh - ld).max() <= 1e-3
    chunk = 5 if name in HYBRID else 7
    assert ledger.total() == -(-23 // chunk)
    for t in (5, 9, 11):
        a, b = host.decoder.step(np.asarray([t]), hc), dev.decoder.step(np.asarray([t]), dc)
        assert np.abs(a - b).max() <= 1e-3


# --- every GGUF type that is MLX-affine with group 32, K-quants included ------------------

AFFINE_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K"]


def _random_blocks(rng, qtype: str, n_weights: int) -> np.ndarray:
    """Valid raw blocks of `qtype` with every bit random (qs, qh, packed 6-bit scales)
    except the f16 d/dmin/m fields, which are random finite halves, subnormals and both
    signs included: the whole input space gguf-py's dequantize accepts."""
    from frink_cli.backends.mlx.quant import _BLOCK_BYTES, GROUP, QK_K

    n = n_weights // (QK_K if qtype.endswith("_K") else GROUP)
    b = rng.integers(0, 256, (n, _BLOCK_BYTES[qtype]), dtype=np.uint8)
    for off in (0, 2) if qtype in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else (0,):
        h = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        h = np.where((h & 0x7C00) == 0x7C00, h & 0xBFFF, h).astype(np.uint16)  # no inf/nan
        b[:, off : off + 2] = h.view(np.uint8).reshape(n, 2)
    return b.reshape(-1)


@pytest.mark.parametrize("shape", [(16, 512), (3, 8, 768)], ids=["2d", "expert-stack"])
@pytest.mark.parametrize("qtype", AFFINE_TYPES)
def test_random_blocks_of_every_affine_type_dequantize_bit_exactly(qtype, shape):
    # MLX's dequantize of the repacked blocks against gguf-py's: the same f32 bits. The one
    # allowed difference is the sign of a zero (gguf-py's d * (q - 8) with d < 0 and q = 8
    # is -0, MLX's scale * q + bias is +0), which no product or sum can tell apart.
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from frink_cli.backends.mlx.quant import quantized_stack

    raw = _random_blocks(
        np.random.default_rng(AFFINE_TYPES.index(qtype)), qtype, int(np.prod(shape))
    )
    want = dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32).reshape(shape)
    q = quantized_stack(raw, qtype, shape)
    assert q.mode == "affine" and q.biases is not None
    packed, scales, biases, bits = q.w, q.scales, q.biases, q.bits
    assert bits == {"Q8_0": 8, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5}.get(qtype, 4)
    assert packed.shape == (*shape[:-1], shape[-1] * bits // 32) and scales.shape == (
        *shape[:-1],
        shape[-1] // 32,
    )
    got = np.asarray(
        mx.dequantize(
            mx.array(packed), mx.array(scales), mx.array(biases), group_size=32, bits=bits
        )
    )
    differ = got.view(np.uint32) != want.view(np.uint32)
    assert (got[differ] == 0).all() and (want[differ] == 0).all(), (qtype, int(differ.sum()))


def test_5_bit_packing_is_mlx_own():
    # pack's 5-bit words straddle uint32 boundaries: they must be the words mx.quantize writes.
    w = mx.array(np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32))
    packed, scales, biases = mx.quantize(w, group_size=32, bits=5)
    dq = np.asarray(mx.dequantize(packed, scales, biases, group_size=32, bits=5))
    q = np.rint((dq - np.repeat(np.asarray(biases), 32, 1)) / np.repeat(np.asarray(scales), 32, 1))
    assert np.array_equal(pack(q.astype(np.uint8), 5), np.asarray(packed))


@pytest.mark.real
def test_gemma_q4_k_m_held_quantized_and_matches_host(gemma3_path):
    # The common Q4_K_M file: its Q4_K and Q5_0 tensors stay in the file's blocks on the
    # device (Q6_K, 16-weight sub-blocks, is dequantized), and the model still matches the
    # host body over a prefill and greedy decode.
    from frink_cli.parity import check_parity

    m = frink_cli.load(gemma3_path, backend="metal")
    held = m.decoder.backend.tensor_held
    src = m.checkpoint.tensors
    for n, how in held.items():
        dtype = src.info(n).dtype
        if dtype == "Q4_K":
            assert how.startswith("quantized 4-bit"), (n, how)
        elif dtype == "Q6_K":
            assert how.startswith("f32"), (n, how)
    assert any(
        src.info(n).dtype == "Q5_0" and h.startswith("quantized 5-bit") for n, h in held.items()
    )
    r = check_parity(m, m.tokenize("The capital of France is"), 3)
    assert r.verdict == "MATCH", r.as_dict()
    assert r.submissions_per_decode_token == 1.0 and max(r.step_kl) <= r.kl_bar
    assert sum(r.submissions_by_kind.values()) > 0 and any(r.layer_on_backend), r.as_dict()
    assert not r.failures, r.as_dict()


@pytest.mark.parametrize("qtype", ["Q5_0", "Q4_K", "Q5_K"])
def test_repacked_expert_stack_multiplies_in_place(qtype):
    # A 3-D stack of the new types straight into gather_qmm (the MoE graph's call) and
    # quantized_matmul: the dequantized experts' product. Scales are kept small so the
    # product's rounding, not the weights' range, sets the tolerance.
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from frink_cli.backends.mlx.quant import quantized_stack

    E, out, cols = 4, 16, 512
    raw = _random_blocks(np.random.default_rng(1), qtype, E * out * cols).reshape(-1, 1)
    blocks = raw.reshape(E * out * cols // (256 if qtype.endswith("_K") else 32), -1)
    for off in (0, 2) if qtype.endswith("_K") else (0,):  # |d|, |dmin| in [2^-9, 2^-8)
        blocks[:, off + 1] = (blocks[:, off + 1] & 0x83) | 0x18
    raw = blocks.reshape(-1)
    w = dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32).reshape(E, out, cols)
    q = quantized_stack(raw, qtype, (E, out, cols))
    assert q.biases is not None
    packed, scales, biases, bits = mx.array(q.w), mx.array(q.scales), mx.array(q.biases), q.bits
    x = np.random.default_rng(2).standard_normal((3, 1, cols)).astype(np.float32)
    idx = np.array([2, 0, 3])
    got = mx.gather_qmm(
        mx.array(x),
        packed,
        scales,
        biases,
        rhs_indices=mx.array(idx),
        transpose=True,
        group_size=32,
        bits=bits,
    )
    want = np.einsum("bk,bok->bo", x[:, 0], w[idx])
    assert np.abs(np.asarray(got).reshape(3, out) - want).max() <= 1e-4 * max(
        1.0, np.abs(want).max()
    )
    one = mx.quantized_matmul(
        mx.array(x[0]), packed[2], scales[2], biases[2], transpose=True, group_size=32, bits=bits
    )
    assert np.abs(np.asarray(one)[0] - want[0]).max() <= 1e-4 * max(1.0, np.abs(want).max())


# --- MXFP4 in MLX's mxfp4 mode --------------------------------------------------------------


def _mxfp4_blocks(rng, n_weights: int, lo: int = 2, hi: int = 254) -> np.ndarray:
    """Random MXFP4 blocks: every code, e8m0 scale bytes in [lo, hi]."""
    b = rng.integers(0, 256, (n_weights // 32, 17), dtype=np.uint8)
    b[:, 0] = rng.integers(lo, hi + 1, n_weights // 32)
    return b.reshape(-1)


def _mxfp4_dequantize(q) -> np.ndarray:
    return np.asarray(
        mx.dequantize(
            mx.array(q.w), mx.array(q.scales), group_size=32, bits=4, mode="mxfp4", dtype=mx.float32
        )
    )


def test_mxfp4_layout_is_mlx_own():
    # gguf-py's MXFP4 blocks of a matrix mx.quantize holds exactly (every group's largest
    # magnitude 6 * 2^k, every weight 2^k times an e2m1 value), repacked, must be the very
    # words and scale bytes mx.quantize(mode="mxfp4") writes: MLX's nibble order, code
    # table and e8m0 meaning, measured rather than assumed.
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from frink_cli.backends.mlx.quant import quantized_stack

    rng = np.random.default_rng(0)
    rows, cols = 8, 256
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    w = e2m1[rng.integers(0, 8, (rows, cols))] * rng.choice([-1, 1], (rows, cols))
    w = w.reshape(rows, cols // 32, 32)
    w[..., 0] = 6 * rng.choice([-1, 1], (rows, cols // 32))
    w = (w * 2.0 ** rng.integers(-20, 20, (rows, cols // 32, 1))).reshape(rows, cols)
    w = w.astype(np.float32)
    wq, scales = mx.quantize(mx.array(w), group_size=32, bits=4, mode="mxfp4")
    raw = quantize(w, GGMLQuantizationType.MXFP4).reshape(-1).view(np.uint8)
    q = quantized_stack(raw, "MXFP4", (rows, cols))
    assert np.array_equal(q.w, np.asarray(wq)) and np.array_equal(q.scales, np.asarray(scales))
    assert np.array_equal(_mxfp4_dequantize(q), w)


@pytest.mark.parametrize("shape", [(16, 512), (3, 8, 768)], ids=["2d", "expert-stack"])
def test_random_mxfp4_blocks_dequantize_bit_exactly(shape):
    # Every code in every nibble, every scale byte MLX and ggml agree on (2..254, up to
    # infinities), and all-zero blocks with bytes 0 and 1: MLX's dequantize of the repack is
    # gguf-py's dequantize of the bytes, f32 bit for bit (zeros' signs included).
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from frink_cli.backends.mlx.quant import quantized_stack

    rng = np.random.default_rng(3)
    raw = _mxfp4_blocks(rng, int(np.prod(shape))).reshape(-1, 17)
    zero = rng.random(len(raw)) < 0.1  # all-zero codes (0 and 8) under bytes 0 and 1
    raw[zero, 0] = rng.integers(0, 2, int(zero.sum()))
    raw[zero, 1:] = rng.choice(np.array([0x00, 0x08, 0x80, 0x88], np.uint8), (int(zero.sum()), 16))
    raw = raw.reshape(-1)
    with np.errstate(over="ignore"):  # 6 * 2^127: infinities, on both sides
        want = dequantize(raw, GGMLQuantizationType.MXFP4).astype(np.float32).reshape(shape)
    q = quantized_stack(raw, "MXFP4", shape)
    assert q.mode == "mxfp4" and q.bits == 4 and q.biases is None
    assert q.w.shape == (*shape[:-1], shape[-1] // 8) and q.scales.dtype == np.uint8
    assert q.scales.shape == (*shape[:-1], shape[-1] // 32)
    got = _mxfp4_dequantize(q)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(
    "scale, codes",
    [(255, 0x00), (255, 0x21), (0, 0x10), (1, 0x90)],
    ids=["255-zeros", "255", "0-subnormal", "1-subnormal"],
)
def test_mxfp4_blocks_mlx_would_misread_are_refused(scale, codes):
    # Scale byte 255 is NaN to MLX (2^127, or 0 over zero codes, to ggml); bytes 0 and 1 over
    # non-zero codes are subnormal weights a GPU may flush. One such block refuses the tensor.
    from frink_cli.backends.mlx.quant import NotExact, quantized_stack

    raw = _mxfp4_blocks(np.random.default_rng(4), 4 * 128).reshape(-1, 17)
    raw[5, 0], raw[5, 1:] = scale, 0
    raw[5, 9] = codes
    with pytest.raises(NotExact):
        quantized_stack(raw.reshape(-1), "MXFP4", (4, 128))


def test_mxfp4_expert_stack_multiplies_in_place():
    # A 3-D MXFP4 stack straight into gather_qmm (the MoE graph's call, mode="mxfp4") and
    # quantized_matmul: the product of gguf-py's dequantized experts.
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from frink_cli.backends.mlx.quant import quantized_stack

    E, out, cols = 4, 16, 512
    raw = _mxfp4_blocks(np.random.default_rng(5), E * out * cols, 118, 124)
    w = dequantize(raw, GGMLQuantizationType.MXFP4).astype(np.float32).reshape(E, out, cols)
    q = quantized_stack(raw, "MXFP4", (E, out, cols))
    packed, scales = mx.array(q.w), mx.array(q.scales)
    x = np.random.default_rng(6).standard_normal((3, 1, cols)).astype(np.float32)
    idx = np.array([2, 0, 3])
    got = mx.gather_qmm(
        mx.array(x),
        packed,
        scales,
        None,
        rhs_indices=mx.array(idx),
        transpose=True,
        group_size=32,
        bits=4,
        mode="mxfp4",
    )
    want = np.einsum("bk,bok->bo", x[:, 0].astype(np.float64), w[idx].astype(np.float64))
    tol = 1e-5 * max(1.0, np.abs(want).max())
    assert np.abs(np.asarray(got).reshape(3, out) - want).max() <= tol
    one = mx.quantized_matmul(
        mx.array(x[0]), packed[2], scales[2], transpose=True, group_size=32, bits=4, mode="mxfp4"
    )
    assert np.abs(np.asarray(one)[0] - want[0]).max() <= tol


def test_window_caches_on_metal_match_the_host_over_full_caches(tiny_model):
    """gemma3's local layers keep only their window on the host; the device mirrors re-sync
    from those held rows (a 3-row prefill runs on the host body between device steps)."""
    from frink_cli.cache import KvCache, WindowKv

    tm = tiny_model("gemma3_text")
    host = frink_cli.load(tm.gguf)
    dev = frink_cli.load(tm.gguf, backend="metal")
    cfg = host.config
    ref = [int(t) for t in tm.ref["tokens"]]
    tokens = (ref * 4)[:40]
    hc, dc = KvCache(cfg, 64, windowed=False), dev.decoder.new_cache(64)
    for chunk in (tokens[:20], tokens[20:23], *([t] for t in tokens[23:])):
        want = host.decoder.step(np.asarray(chunk), hc, all_logits=True)
        got = dev.decoder.step(np.asarray(chunk), dc, all_logits=True)
        assert np.abs(got - want).max() <= 1e-3
        assert (got.argmax(-1) == want.argmax(-1)).all()
        for s in dc.slots:
            if isinstance(s, WindowKv):
                assert s.n_past - s.held()[0] <= cfg.sliding_window
    assert dev.decoder.backend.ledger.total() > 0
