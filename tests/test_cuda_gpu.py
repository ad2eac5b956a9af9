"""The cuda backend on a real GPU: each kernel against its NumPy reference, and the whole
dense stack (prefill, a prefill over a cached prefix, decode tokens with the lm head on the
device) against the host body. Marked `gpu`; skipped without CuPy and a GPU.

Why these and not the tiny fixtures: the GPU machine can download nothing and has no
llama.cpp to make fixtures, so models are random and built in memory
(scripts/synthetic_models.py). The host body they are compared with is itself held to
llama.cpp and transformers by test_parity_tiny.py, and the same stack code is held to the
host body on CI with NumPy standing in (test_cuda_backend.py). Run all of it, plus a pp512
timing, with scripts/gpu_check.sh.
"""

from __future__ import annotations

import numpy as np
import pytest
from script_loader import load_script

from frink_cli.backends.cupy import CudaBackend, cuda_available, cupy_kernel_ops
from frink_cli.backends.cupy.ops import ReferenceOps
from frink_cli.decoder import Decoder

_synthetic = load_script("synthetic_models")
synthetic_config, synthetic_weights = _synthetic.synthetic_config, _synthetic.synthetic_weights

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
            want = ref.attention(qkv, 0, kc, vc, P, H, Hkv, hd, hd, scale, window)
            got = gpu_ops.attention(dev(qkv), 0, dev(kc), dev(vc), P, H, Hkv, hd, hd, scale, window)
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
        synthetic_config(n_head=H, n_head_kv=Hkv, alibi_bias=8.0).alibi_slopes(), np.float32
    )
    P = prefixes[-1]
    kc = np.zeros((Hkv, P + T, hd), np.float32)
    vc = kc.copy()
    kc[:, :P], vc[:, :P] = r(Hkv, P, hd), r(Hkv, P, hd)
    kc[:, P:] = qkv[:, H * hd : (H + Hkv) * hd].reshape(T, Hkv, hd).transpose(1, 0, 2)
    vc[:, P:] = qkv[:, (H + Hkv) * hd :].reshape(T, Hkv, hd).transpose(1, 0, 2)
    scale = 1.0 / np.sqrt(hd)
    want = ref.attention(qkv, 0, kc, vc, P, H, Hkv, hd, hd, scale, None, slopes)
    got = gpu_ops.attention(
        dev(qkv), 0, dev(kc), dev(vc), P, H, Hkv, hd, hd, scale, None, dev(slopes)
    )
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
