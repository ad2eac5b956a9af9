"""The cuda backend on a real GPU: each kernel against its NumPy reference, and the whole
dense stack (prefill, a prefill over a cached prefix, decode tokens with the lm head on the
device) against the host body. Marked `gpu`; skipped without CuPy and a GPU.

Why these and not the tiny fixtures: the GPU machine can download nothing and has no
llama.cpp to make fixtures, so models are random and built in memory
(scripts/synthetic_models.py). The host body they are compared with is itself held to
llama.cpp and transformers by test_conformance.py, and the same stack code is held to the
host body on CI with NumPy standing in (test_cuda_backend.py). Run all of it, plus a pp512
timing, with scripts/gpu_check.sh.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from quant_weights import assert_close, random_weights, reference
from script_loader import load_script

from frink_cli.backends.cupy import CudaBackend, cuda_available, cupy_kernel_ops
from frink_cli.backends.cupy.ops import (
    GEMV_MAX_X,
    AttentionGeometry,
    DeviceQuantPart,
    ReferenceOps,
)
from frink_cli.decoder import Decoder
from frink_cli.quant import kernels
from frink_cli.quant.blocks import KERNEL_TYPES

_synthetic = load_script("synthetic_models")
synthetic_config, synthetic_weights = _synthetic.synthetic_config, _synthetic.synthetic_weights
quantized_weights = _synthetic.quantized_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs CuPy and an NVIDIA GPU"),
]

N_DECODE = 4


@pytest.fixture(scope="module")
def gpu_ops():
    return cupy_kernel_ops()


def _close(got, want: np.ndarray, what: str, rel: float = 1e-4) -> None:
    got = np.asarray(got)
    scale = max(1.0, float(np.abs(want).max()))
    d = float(np.abs(got.astype(np.float64) - want).max())
    assert d <= rel * scale, f"{what}: max |d| = {d:.3g} > {rel:g} x {scale:.3g}"


SHAPES = {
    # (T, H, Hkv, head_dim, rope_dim, prefixes)
    "small": (6, 4, 2, 32, 24, (0, 300)),
    "smollm2": (512, 9, 3, 64, 64, (0, 100)),
    "qwen3": (70, 16, 8, 128, 128, (0, 1000)),
    "wide_heads": (5, 2, 1, 256, 256, (0, 129)),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("neox", [False, True])
def test_kernels_match_references(gpu_ops, shape: str, neox: bool) -> None:
    cp = gpu_ops.xp
    T, H, Hkv, hd, rope_dim, prefixes = SHAPES[shape]
    rng = np.random.default_rng(len(shape) + neox)
    ref = ReferenceOps()

    def r(*s: int) -> np.ndarray:
        return rng.standard_normal(s, dtype=np.float32)

    def dev(a: np.ndarray):
        return cp.asarray(a)

    stride = (H + 2 * Hkv) * hd
    qkv = r(T, stride)
    x, w = r(T, 576), r(576)
    _close(cp.asnumpy(gpu_ops.rms_norm(dev(x), dev(w), 1e-5)), ref.rms_norm(x, w, 1e-5), "rms_norm")

    hw = r(hd)
    a, b = qkv.copy(), dev(qkv)
    ref.rms_norm_heads(a, 0, H, hd, hw, 1e-6)
    gpu_ops.rms_norm_heads(b, 0, H, hd, dev(hw), 1e-6)
    _close(cp.asnumpy(b), a, "rms_norm on Q heads in place")

    ang = rng.uniform(0, 500, (T, rope_dim // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    a, b = qkv.copy(), dev(qkv)
    ref.rope(a, H * hd, Hkv, hd, cos, sin, rope_dim, neox)
    gpu_ops.rope(b, H * hd, Hkv, hd, dev(cos), dev(sin), rope_dim, neox)
    _close(cp.asnumpy(b), a, "rope on K heads in place")

    for P in prefixes:
        # The device KV cache as the stack leaves it: prefix rows, the batch's own rows,
        # then rows that must never be read (NaN).
        kc = np.full((Hkv, P + T + 5, hd), np.nan, np.float32)
        vc = kc.copy()
        kc[:, :P], vc[:, :P] = r(Hkv, P, hd), r(Hkv, P, hd)
        kc[:, P : P + T] = qkv[:, H * hd : (H + Hkv) * hd].reshape(T, Hkv, hd).transpose(1, 0, 2)
        vc[:, P : P + T] = qkv[:, (H + Hkv) * hd :].reshape(T, Hkv, hd).transpose(1, 0, 2)
        scale = 1.0 / np.sqrt(hd)
        for window in (None, 7, 300):
            geo = AttentionGeometry(P, H, Hkv, hd, hd, scale, window)
            want = ref.attention(qkv, 0, kc, vc, geo)
            got = gpu_ops.attention(dev(qkv), 0, dev(kc), dev(vc), geo)
            _close(cp.asnumpy(got), want, f"attention, prefix {P}, window {window}")

    gu = r(T, 2 * 1536)
    for act in ("silu", "gelu_tanh"):
        _close(cp.asnumpy(gpu_ops.glu(dev(gu), 1536, act)), ref.glu(gu, 1536, act), f"glu {act}")
        _close(cp.asnumpy(gpu_ops.act(dev(gu), act)), ref.act(gu, act), f"act {act}")

    # The LayerNorm families' kernels: LayerNorm (with and without a bias, rows off a large
    # mean), the QKV clamp, and ALiBi inside the attention kernel.
    xm, bias = x + np.float32(30.0), r(576)
    for b_ in (bias, None):
        got = gpu_ops.layer_norm(dev(xm), dev(w), None if b_ is None else dev(b_), 1e-5)
        want = ref.layer_norm(xm, w, b_, 1e-5)
        _close(cp.asnumpy(got), want, f"layer_norm bias={b_ is not None}")
    a, b = qkv.copy(), dev(qkv)
    ref.clamp(a, 0.8)
    gpu_ops.clamp(b, 0.8)
    _close(cp.asnumpy(b), a, "clamp")
    slopes = np.asarray(
        synthetic_config(n_head=H, n_head_kv=Hkv, alibi_bias=8.0).ext.alibi_slopes(H), np.float32
    )
    P = prefixes[-1]
    kc = np.zeros((Hkv, P + T, hd), np.float32)
    vc = kc.copy()
    kc[:, :P], vc[:, :P] = r(Hkv, P, hd), r(Hkv, P, hd)
    kc[:, P:] = qkv[:, H * hd : (H + Hkv) * hd].reshape(T, Hkv, hd).transpose(1, 0, 2)
    vc[:, P:] = qkv[:, (H + Hkv) * hd :].reshape(T, Hkv, hd).transpose(1, 0, 2)
    scale = 1.0 / np.sqrt(hd)
    geo = AttentionGeometry(P, H, Hkv, hd, hd, scale)
    want = ref.attention(qkv, 0, kc, vc, geo, slopes)
    got = gpu_ops.attention(dev(qkv), 0, dev(kc), dev(vc), geo, dev(slopes))
    _close(cp.asnumpy(got), want, f"attention with ALiBi, prefix {P}")
    y, bias = r(T, stride), r(stride)
    a, b = y + bias, dev(y)
    gpu_ops.add_bias(b, dev(bias))
    _close(cp.asnumpy(b), a, "add_bias")
    a, b = y + y, dev(y)
    gpu_ops.add(b, dev(y))
    _close(cp.asnumpy(b), a, "add")


MODELS = {
    "llama": {
        "kind": "llama",
        "n_layer": 4,
        "n_embd": 256,
        "n_head": 8,
        "n_head_kv": 2,
        "head_dim": 32,
        "n_ff": 512,
        "n_vocab": 1000,
    },
    "qwen2": {
        "kind": "qwen2",
        "n_layer": 3,
        "n_embd": 256,
        "n_head": 8,
        "n_head_kv": 4,
        "head_dim": 32,
        "n_ff": 512,
        "n_vocab": 1000,
    },
    "qwen3": {
        "kind": "qwen3",
        "n_layer": 3,
        "n_embd": 256,
        "n_head": 8,
        "n_head_kv": 2,
        "head_dim": 64,
        "n_ff": 512,
        "n_vocab": 1000,
    },
    "smollm2_partial_rope": {
        "kind": "llama",
        "n_layer": 2,
        "n_embd": 576,
        "n_head": 9,
        "n_head_kv": 3,
        "head_dim": 64,
        "n_ff": 1536,
        "n_vocab": 1000,
        "rope_dim": 32,
    },
    # Gemma 3's decorations: GeGLU, QK norm, post norms, local layers (window 32, their own
    # rope base) around a global one, a scaled embedding.
    "gemma3": {
        "kind": "qwen3",
        "n_layer": 3,
        "n_embd": 256,
        "n_head": 4,
        "n_head_kv": 1,
        "head_dim": 64,
        "n_ff": 512,
        "n_vocab": 1000,
        "ffn_act": "gelu_tanh",
        "post_attn_norm": True,
        "post_ffn_norm": True,
        "sliding_window": 32,
        "swa_layers": (True, False, True),
        "rope_base_swa": 10000.0,
        "rope_base": 1000000.0,
        "embd_scale": 16.0,
    },
    # StarCoder2's: LayerNorm with biases, biases on every linear, the plain GELU FFN.
    "starcoder2": {
        "kind": "qwen2",
        "n_layer": 2,
        "n_embd": 256,
        "n_head": 8,
        "n_head_kv": 2,
        "head_dim": 32,
        "n_ff": 1024,
        "n_vocab": 1000,
        "ffn_act": "gelu_tanh",
        "layer_norm": True,
        "plain_ffn": True,
    },
    # BLOOM / MPT's: ALiBi instead of rope (6 heads: both slope series), the QKV clamp.
    "alibi": {
        "kind": "llama",
        "n_layer": 2,
        "n_embd": 192,
        "n_head": 6,
        "n_head_kv": 6,
        "head_dim": 32,
        "n_ff": 768,
        "n_vocab": 1000,
        "ffn_act": "gelu_tanh",
        "layer_norm": True,
        "plain_ffn": True,
        "alibi_bias": 8.0,
        "clamp_kqv": 1.5,
    },
}


def _logits(dec: Decoder, tokens: np.ndarray, split: int) -> np.ndarray:
    cache = dec.new_cache(len(tokens) + 8)
    second = len(tokens) - N_DECODE
    out = [
        dec.step(tokens[:split], cache, all_logits=True),
        dec.step(tokens[split:second], cache, all_logits=True),
    ]
    out += [dec.step(tokens[i : i + 1], cache) for i in range(second, len(tokens))]
    return np.concatenate(out)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_stack_matches_host_body(gpu_ops, model: str, dtype: str) -> None:
    """Prefill, a second prefill over the cached prefix, decode steps (one submission each,
    the lm head on the device): logits within 1e-2 of their scale and (f32 operands) the
    same argmax at every row."""
    cfg = synthetic_config(**MODELS[model])
    w = synthetic_weights(cfg, seed=21)
    tokens = np.random.default_rng(2).integers(0, cfg.n_vocab, 160)
    want = _logits(Decoder(cfg, w), tokens, split=100)
    backend = CudaBackend(cfg, gpu_ops, dtype)
    got = _logits(Decoder(cfg, w, backend), tokens, split=100)
    scale = float(np.abs(want).max())
    d = float(np.abs(got.astype(np.float64) - want).max())
    print(f"{model} {dtype}: max|d| = {d:.3g}, scale {scale:.3g}")
    assert not backend.ledger.failures, dict(backend.ledger.failures)
    assert backend.ledger.submissions == {
        "prefill-stack+lm-head": 2,
        "decode-stack+lm-head": N_DECODE,
    }
    assert not backend.ledger.refusals, dict(backend.ledger.refusals)
    assert d <= 1e-2 * scale, f"{model} {dtype}: max |d| = {d:.3g} > 1e-2 x {scale:.3g}"
    if dtype == "float32":
        bad = np.nonzero(got.argmax(-1) != want.argmax(-1))[0]
        assert bad.size == 0, f"{model}: argmax differs at rows {bad.tolist()}"


# --- weights in the file's blocks (kernels/quant.cu) ---------------------------------------


@pytest.mark.parametrize("qtype", [t.name for t in KERNEL_TYPES])
def test_quant_kernels_match_references(gpu_ops, qtype: str) -> None:
    """dequant_<type>_f32 / _f16 give gguf-py's values bit for bit (f16: rounded as NumPy
    rounds); gemv_<type> gives x @ dequantize(W).T to 1e-5 relative, and a row of x the same
    product alone or beside others."""
    cp = gpu_ops.xp
    qt = T[qtype]
    cols = 2050 if qt in (T.F16, T.BF16) else 2048
    w = random_weights(qt, 301, cols, seed=3)
    part = DeviceQuantPart(cp.asarray(w.data), qt, w.rows, w.cols)
    ref = reference(w)
    got = cp.asnumpy(gpu_ops.dequantize(part, 0, w.rows, np.float32))
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), f"{qtype} dequant f32"
    half = cp.asnumpy(gpu_ops.dequantize(part, 7, 300, np.float16))
    with np.errstate(over="ignore"):
        want16 = ref[7:300].astype(np.float16)
    assert np.array_equal(half.view(np.uint16), want16.view(np.uint16)), f"{qtype} dequant f16"
    x = np.random.default_rng(4).standard_normal((GEMV_MAX_X, cols)).astype(np.float32)
    ys = {}
    for n in (1, GEMV_MAX_X):
        y = cp.zeros((n, w.rows), cp.float32)
        gpu_ops.gemv(part, cp.asarray(x[:n]), y, 0)
        ys[n] = cp.asnumpy(y)
        assert_close(ys[n], x[:n] @ ref.T)
    assert np.array_equal(ys[GEMV_MAX_X][:1], ys[1]), f"{qtype}: gemv is not batch invariant"


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q5_1", "BF16"])
@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_quantized_stack_matches_host_body(gpu_ops, model: str, qtype: str) -> None:
    """The stack on weights resident in blocks (prefills through dequantized tiles and
    cuBLAS, decode tokens through gemv) against the host body on the same blocks in exact
    f32 activations: logits within 1e-3 of their scale, the same argmax at every row."""
    cfg = synthetic_config(**MODELS[model])
    w = quantized_weights(synthetic_weights(cfg, seed=21), qtype)
    tokens = np.random.default_rng(2).integers(0, cfg.n_vocab, 160)
    with kernels.exact_activations():
        want = _logits(Decoder(cfg, w), tokens, split=100)
    backend = CudaBackend(cfg, gpu_ops, "float32")
    got = _logits(Decoder(cfg, w, backend), tokens, split=100)
    scale = float(np.abs(want).max())
    d = float(np.abs(got.astype(np.float64) - want).max())
    print(f"{model} {qtype}: max|d| = {d:.3g}, scale {scale:.3g}")
    assert not backend.ledger.failures and not backend.ledger.refusals, backend.ledger
    assert backend.ledger.submissions == {
        "prefill-stack+lm-head": 2,
        "decode-stack+lm-head": N_DECODE,
    }
    assert d <= 1e-3 * scale, f"{model} {qtype}: max |d| = {d:.3g} > 1e-3 x {scale:.3g}"
    bad = np.nonzero(got.argmax(-1) != want.argmax(-1))[0]
    assert bad.size == 0, f"{model} {qtype}: argmax differs at rows {bad.tolist()}"
