"""The cuda backend without a GPU: its orchestration with NumPy standing in for CuPy, its
kernels on the CPU emulator, every refusal, and what happens when a launch fails.

Why each part:
- The dense stack (stack.py) is the same code on CI and on a GPU; only the ops table and
  the array module differ. With the NumPy references it must give the host body's logits
  (1e-4) over a prefill, a second prefill over a cached prefix and decode steps (each
  decode token one submission, the lm head in it), on tiny llama, qwen2, qwen3 and gemma3
  models (the host body itself is held to llama.cpp and transformers by
  test_conformance.py); gemma3's local layers keep a sliding window of 6 over 40 tokens.
- The device KV cache re-syncs from the host cache whenever the host rows changed behind
  it (a failed launch the host body covered, a truncation and a rewrite).
- With the kernels themselves (kernels/*.cu compiled against tests/kernel_emu for the CPU)
  each kernel must match its NumPy reference and the whole stack the host body, so grids,
  strides and offsets are tested without a GPU.
- Every refusal of eligibility.py is provoked by a config or cache that has the feature.
- A launch that fails after admission leaves the caches untouched, is reported once, and
  the host body gives the same answer.
The GPU halves of these checks are tests/test_cuda_gpu.py (marked gpu).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import nvrtc
import pytest
from cuda_emulator import EmulatedLauncher
from frink_subprocess import frink
from host_blocks import attention
from model_checks import cuda_models, prefill_prefix_decode
from script_loader import load_script

import frink_cli
from frink_cli.archs.alibi import AlibiConfig
from frink_cli.archs.decoder import DecoderConfig, with_ext
from frink_cli.archs.gdn import GdnHybridConfig
from frink_cli.backends import LaunchFailed, Refusal, Run, layer_support, select_backend
from frink_cli.backends.capability import trace_refusals
from frink_cli.backends.cupy import CudaBackend, eligibility, make_cuda_backend
from frink_cli.backends.cupy.ops import (
    KERNEL_FILES,
    AttentionGeometry,
    KernelOps,
    ReferenceOps,
    kernel_names,
    kernel_source,
)
from frink_cli.backends.host.ffn import glu, silu
from frink_cli.backends.host.norms import rms_norm
from frink_cli.backends.host.rope import Rope
from frink_cli.cache import KvCache
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError
from frink_cli.graph.blocks.gdn import GdnConfig
from frink_cli.graph.blocks.moe import MoeConfig
from frink_cli.graph.trace import OpCall, model_traces
from frink_cli.model.config import LayerShape, ModelConfig

_synthetic = load_script("synthetic_models")
synthetic_config, synthetic_weights = _synthetic.synthetic_config, _synthetic.synthetic_weights

SELF_TOL = 1e-4
DENSE_TINY = ("llama", "qwen2", "qwen3", "gemma3_text")
N_DECODE = 4


# --- fixtures ---------------------------------------------------------------------------------


def _assert_close(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    assert got.shape == want.shape, what
    d = float(np.max(np.abs(got.astype(np.float64) - want)))
    assert d <= tol, f"{what}: max |d| = {d:.3g} > {tol:g}"


# --- the stack with NumPy standing in for CuPy -------------------------------------------------


@pytest.mark.parametrize("name", DENSE_TINY)
def test_numpy_stack_equals_host_body(name: str, tiny_model: Callable) -> None:
    tm = tiny_model(name)
    host, dev = cuda_models(tm.gguf)
    assert eligibility.layer_refusals(dev.config) == [None] * dev.config.n_layer, (
        f"{name}: the stack refuses layers of a plain dense model; a ModelConfig field it does "
        f"not know is refused by name (classify it in backends/cupy/eligibility.py): "
        f"{eligibility.layer_refusals(dev.config)}"
    )
    tokens = [int(t) for t in tm.ref["tokens"]]
    want = prefill_prefix_decode(host, tokens, split=17)
    got = prefill_prefix_decode(dev, tokens, split=17)
    _assert_close(got, want, SELF_TOL, f"{name}: numpy stack vs host body")
    ledger = dev.decoder.backend.ledger
    # Two prefills and each decode token: one submission each, the whole run of layers
    # and the lm head.
    assert ledger.submissions == {"prefill-stack+lm-head": 2, "decode-stack+lm-head": N_DECODE}
    assert not ledger.refusals
    assert not ledger.failures


@pytest.mark.parametrize("name", DENSE_TINY)
def test_api_load_with_backend_cuda_standing_in(
    name: str, tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load(path, backend="cuda")`, the path the CLI takes, with FRINK_CUDA_ARRAY_MODULE:
    the stack's logits against transformers' and llama.cpp's own (2e-3, as
    test_conformance.py holds the host body) and the same argmax everywhere."""
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    tm = tiny_model(name)
    m = frink_cli.load(tm.gguf, backend="cuda")
    assert m.backend_name == "cuda"
    tokens = [int(t) for t in tm.ref["tokens"]]
    got = m.logits(tokens)
    for key in ("logits_hf", "logits_llamacpp"):
        if key in tm.ref:
            _assert_close(got, tm.ref[key], 2e-3, f"{name}: cuda (numpy) vs {key}")
            np.testing.assert_array_equal(got.argmax(-1), tm.ref[key].argmax(-1))
    assert m.decoder.backend.ledger.submissions == {"prefill-stack+lm-head": 1}


def test_weights_f16_standing_in(tiny_model: Callable) -> None:
    """The f16 GEMM path (FRINK_CUDA_DTYPE=float16) changes only rounding."""
    tm = tiny_model("llama")
    host = frink_cli.load(tm.gguf)
    dev = frink_cli.load(tm.gguf)
    backend = make_cuda_backend(dev.config, array_module="numpy", weight_dtype="float16")
    dev.decoder = Decoder(dev.config, dev.decoder.host.w, backend)
    tokens = [int(t) for t in tm.ref["tokens"]]
    want, got = host.logits(tokens), dev.logits(tokens)
    scale = float(np.abs(want).max())
    _assert_close(got, want, 1e-2 * scale, "f16 weights vs host body")
    assert backend.ledger.submissions == {"prefill-stack+lm-head": 1}


# --- kernels on the CPU emulator --------------------------------------------------------------


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _kv_cache(
    rng: np.random.Generator, qkv: np.ndarray, P: int, H: int, Hkv: int, hd: int, hv: int
) -> tuple[np.ndarray, np.ndarray]:
    """A device KV cache as the stack leaves it before attention: P random prefix rows,
    then the batch's own K/V rows from qkv, then rows nobody may read (NaN)."""
    T = qkv.shape[0]
    rows = P + T + 7
    kc = np.full((Hkv, rows, hd), np.nan, np.float32)
    vc = np.full((Hkv, rows, hv), np.nan, np.float32)
    kc[:, :P], vc[:, :P] = _rand(rng, Hkv, P, hd), _rand(rng, Hkv, P, hv)
    kc[:, P : P + T] = qkv[:, H * hd : (H + Hkv) * hd].reshape(T, Hkv, hd).transpose(1, 0, 2)
    vc[:, P : P + T] = qkv[:, (H + Hkv) * hd :].reshape(T, Hkv, hv).transpose(1, 0, 2)
    return kc, vc


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_emulated_kernels_match_references(
    emulated_launcher: EmulatedLauncher, neox: bool, qk_norm: bool
) -> None:
    rng = np.random.default_rng(7 + 2 * neox + qk_norm)
    ref, emu = ReferenceOps(), KernelOps(np, emulated_launcher)
    T, H, Hkv, hd, rope_dim = 6, 4, 2, 32, 24  # partial rope; 3 query heads... per KV head: 2
    stride = (H + 2 * Hkv) * hd
    qkv = _rand(rng, T, stride)

    x = _rand(rng, T, 80)
    w = _rand(rng, 80)
    _assert_close(emu.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5), 1e-5, "rms_norm")

    hw = _rand(rng, hd)
    a, b = qkv.copy(), qkv.copy()
    ref.rms_norm_heads(a, H * hd, Hkv, hd, hw, 1e-6)
    emu.rms_norm_heads(b, H * hd, Hkv, hd, hw, 1e-6)
    _assert_close(b, a, 1e-5, "rms_norm on K heads in place")

    ang = rng.uniform(0, 50, (T, rope_dim // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    a, b = qkv.copy(), qkv.copy()
    ref.rope(a, 0, H, hd, cos, sin, rope_dim, neox)
    emu.rope(b, 0, H, hd, cos, sin, rope_dim, neox)
    _assert_close(b, a, 1e-5, "rope on Q heads in place")
    np.testing.assert_array_equal(b[:, H * hd :], qkv[:, H * hd :])  # K, V untouched

    # Prefix long enough for several 128-key chunks of the online softmax; windows that
    # cut into the prefix, into the new rows, and none at all.
    for P in (0, 300) if qk_norm else (0, 5):
        for window in (None, 3, 140):
            kc, vc = _kv_cache(rng, qkv, P, H, Hkv, hd, hd)
            args = (qkv, 0, kc, vc, AttentionGeometry(P, H, Hkv, hd, hd, 0.17, window))
            _assert_close(
                emu.attention(*args),
                ref.attention(*args),
                1e-5,
                f"attention, prefix {P}, window {window}",
            )

    # Head dims past one thread each (128 threads): the kernel's second accumulator.
    wide = _rand(rng, 3, (2 + 2) * 192)
    kc, vc = _kv_cache(rng, wide, 130, 2, 1, 192, 192)
    args = (wide, 0, kc, vc, AttentionGeometry(130, 2, 1, 192, 192, 0.07, None))
    _assert_close(emu.attention(*args), ref.attention(*args), 1e-5, "attention, head dim 192")

    gu = _rand(rng, T, 2 * 40)
    for act in ("silu", "gelu_tanh"):
        _assert_close(emu.glu(gu, 40, act), ref.glu(gu, 40, act), 1e-5, f"glu {act}")
    y, b_ = _rand(rng, T, 33), _rand(rng, 33)
    a, b = y.copy(), y.copy()
    ref.add_bias(a, b_)
    emu.add_bias(b, b_)
    _assert_close(b, a, 0, "add_bias")
    a, b = y.copy(), y.copy()
    ref.add(a, y)
    emu.add(b, y)
    _assert_close(b, a, 0, "add")


def test_emulated_layer_norm_activations_clamp_match_references(
    emulated_launcher: EmulatedLauncher,
) -> None:
    """The LayerNorm families' kernels (starcoder2, bloom, mpt): layer_norm_f32 with and
    without a bias (rows wider than a block, and a large mean: the centered variance),
    act_f32 in both forms, clamp_f32 in place."""
    rng = np.random.default_rng(17)
    ref, emu = ReferenceOps(), KernelOps(np, emulated_launcher)
    for d in (64, 300):
        x = _rand(rng, 5, d) + np.float32(40.0)
        w, b = _rand(rng, d), _rand(rng, d)
        for bias in (b, None):
            _assert_close(
                emu.layer_norm(x, w, bias, 1e-5),
                ref.layer_norm(x, w, bias, 1e-5),
                1e-4,
                f"layer_norm d={d} bias={bias is not None}",
            )
    x = 3 * _rand(rng, 7, 130)
    for act in ("silu", "gelu_tanh"):
        _assert_close(emu.act(x, act), ref.act(x, act), 1e-5, f"act {act}")
    a, b_ = x.copy(), x.copy()
    ref.clamp(a, 1.5)
    emu.clamp(b_, 1.5)
    _assert_close(b_, a, 0, "clamp")
    assert float(np.abs(a).max()) == 1.5


@pytest.mark.parametrize("window", [None, 5])
def test_emulated_alibi_attention_matches_reference(
    emulated_launcher: EmulatedLauncher, window: int | None
) -> None:
    """ALiBi inside causal_gqa_attention_f32: 6 query heads (not a power of two: both slope
    series) over 2 KV heads, with a prefix past one 128-key chunk, as the reference adds
    -slope_h * (q pos - k pos)."""
    rng = np.random.default_rng(19)
    ref, emu = ReferenceOps(), KernelOps(np, emulated_launcher)
    T, H, Hkv, hd = 5, 6, 2, 16
    slopes = np.asarray(AlibiConfig(alibi_bias=8.0).alibi_slopes(H), np.float32)
    qkv = _rand(rng, T, (H + 2 * Hkv) * hd)
    for P in (0, 140):
        kc, vc = _kv_cache(rng, qkv, P, H, Hkv, hd, hd)
        args = (qkv, 0, kc, vc, AttentionGeometry(P, H, Hkv, hd, hd, 0.25, window))
        want = ref.attention(*args, slopes)
        _assert_close(emu.attention(*args, slopes), want, 1e-5, f"alibi, prefix {P}")
        # The slopes matter: without them the answer moves far.
        assert float(np.abs(ref.attention(*args) - want).max()) > 0.1


@pytest.mark.parametrize("name", DENSE_TINY)
def test_emulated_kernel_stack_equals_host_body(
    name: str, tiny_model: Callable, emulated_launcher: EmulatedLauncher
) -> None:
    tm = tiny_model(name)
    host, dev = cuda_models(tm.gguf, lambda: KernelOps(np, emulated_launcher))
    tokens = [int(t) for t in tm.ref["tokens"]][:24]
    want = prefill_prefix_decode(host, tokens, split=9)
    first_launch = len(emulated_launcher.launches)
    got = prefill_prefix_decode(dev, tokens, split=9)
    _assert_close(got, want, SELF_TOL, f"{name}: emulated kernels vs host body")
    # The emulator itself ran them (not the NumPy references the backend was made with).
    launched = set(emulated_launcher.launches[first_launch:])
    assert {"rms_norm_f32", "causal_gqa_attention_f32", "glu_f32"} <= launched, launched
    assert dev.decoder.backend.ledger.submissions == {
        "prefill-stack+lm-head": 2,
        "decode-stack+lm-head": N_DECODE,
    }
    assert not dev.decoder.backend.ledger.failures


# --- the references are the host body's math --------------------------------------------------


def test_references_are_the_host_body_blocks() -> None:
    """Each NumPy reference against the host body's own block on the same numbers."""
    rng = np.random.default_rng(3)
    ref = ReferenceOps()
    x, w = _rand(rng, 7, 64), _rand(rng, 64)
    np.testing.assert_allclose(ref.rms_norm(x, w, 1e-5), rms_norm(x, w, 1e-5), rtol=0, atol=1e-6)
    g = _rand(rng, 7, 2 * 48)
    np.testing.assert_allclose(
        ref.glu(g, 48, "silu"), silu(g[:, :48]) * g[:, 48:], rtol=0, atol=1e-6
    )
    np.testing.assert_allclose(ref.glu(g, 48, "gelu_tanh"), glu(g, "gelu_tanh"), rtol=0, atol=1e-6)
    for layout in ("norm", "neox"):
        T, H, hd = 5, 3, 16
        rope = Rope(12, 10000.0, 1.0, layout)
        pos = np.arange(40, 40 + T)
        q = _rand(rng, T, H * hd)
        a = q.copy()
        cos, sin = rope._tables(pos)
        ref.rope(a, 0, H, hd, cos, sin, 12, layout == "neox")
        np.testing.assert_allclose(
            a.reshape(T, H, hd), rope.apply(q.reshape(T, H, hd), pos), rtol=0, atol=1e-6
        )


@pytest.mark.parametrize("T", [1, 5])
def test_reference_alibi_is_the_host_attend(T: int) -> None:
    """The attention reference with ALiBi slopes equals the host body's attend (its
    blocked prefill and its decode row) on the same scaled queries and cache rows."""
    from frink_cli.backends.host.attention import attend

    rng = np.random.default_rng(23)
    H, Hkv, hd, P = 8, 4, 16, 6
    slopes = np.asarray(AlibiConfig(alibi_bias=8.0).alibi_slopes(H), np.float32)
    qkv = _rand(rng, T, (H + 2 * Hkv) * hd)
    kc, vc = _kv_cache(rng, qkv, P, H, Hkv, hd, hd)
    got = ReferenceOps().attention(
        qkv, 0, kc, vc, AttentionGeometry(P, H, Hkv, hd, hd, 0.3), slopes
    )
    q = qkv[:, : H * hd].reshape(T, H, hd) * np.float32(0.3)
    S = P + T
    want = attend(q, kc[:, :S], vc[:, :S], 0, np.arange(P, S), None, None, slopes)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("window", [None, 4])
def test_reference_attention_is_the_host_attention_block(window: int | None) -> None:
    """The attention reference over the cache (prefix + new rows) equals backends/host/attention.py
    fed the same Q/K/V through a cache slot, with and without a sliding window."""
    cfg = synthetic_config(
        "qwen2", n_layer=1, sliding_window=window, swa_layers=(window is not None,)
    )
    w = synthetic_weights(cfg, seed=11).layers[0]
    rng = np.random.default_rng(5)
    P, T = 6, 5
    cache = KvCache(cfg, 32)
    cache.slot(0).append(_rand(rng, P, 2, 16), _rand(rng, P, 2, 16))
    cache.commit(P)
    x = _rand(rng, T, cfg.n_embd)
    pos = np.arange(P, P + T)
    # Identity rope (position scale 0: every angle 0) so the reference sees what the block saw.
    rope = Rope(cfg.rope_dim, 10000.0, 0.0, cfg.rope_type)
    want = attention(x, w, cfg, cfg.layer_shape(0), rope, pos, cache.slot(0))
    qkv = x @ w.qkv.w.T + w.qkv.b
    H, Hkv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k
    # The host block appended the new rows to the cache: the state the stack attends over.
    kc, vc = cache.k[0][:, : P + T].copy(), cache.v[0][:, : P + T].copy()
    att = ReferenceOps().attention(
        qkv, 0, kc, vc, AttentionGeometry(P, H, Hkv, hd, hd, cfg.attn_scale, window)
    )
    np.testing.assert_allclose(att @ w.wo.w.T, want, rtol=0, atol=1e-5)


# --- kernels build with CUDA's own compiler -----------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
@pytest.mark.parametrize("name", KERNEL_FILES)
def test_kernel_sources_compile_with_nvcc(name: str, tmp_path: Path) -> None:
    """The exact source RawModule hands NVRTC (common.cuh pasted in) compiles for Hopper."""
    src = tmp_path / name
    src.write_text(kernel_source(name))
    proc = subprocess.run(
        ["nvcc", "--ptx", "-arch=sm_90", "--std=c++14", str(src), "-o", str(tmp_path / "out.ptx")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning" not in proc.stderr.lower(), proc.stderr[-3000:]


@pytest.mark.skipif(
    nvrtc.library() is None,
    reason="NVRTC not installed (the test extra installs nvidia-cuda-nvrtc)",
)
@pytest.mark.parametrize("name", KERNEL_FILES)
def test_kernel_sources_compile_with_nvrtc(name: str) -> None:
    """The exact source RawModule hands NVRTC compiles with NVRTC, with no warning, for
    Hopper (the GPU machine) and Ampere, and every extern "C" kernel is in the PTX."""
    source = kernel_source(name)
    kernels = kernel_names(name)
    assert kernels, name
    for arch in ("compute_90", "compute_80"):
        ok, log, ptx = nvrtc.compile_ptx(source, name, [f"--gpu-architecture={arch}"])
        assert ok, f"{name} ({arch}):\n{log[-3000:]}"
        assert "warning" not in log.lower(), log[-3000:]
        for k in kernels:
            assert f".entry {k}(" in ptx, f"{k} missing from the PTX"


# --- refusals ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _ShapedConfig(ModelConfig):
    """A config whose layers are another kind (gdn mixer, MoE ffn), without that kind's weights."""

    forced_mixer: str = "attention"
    forced_ffn: str = "dense"

    def layer_shape(self, layer: int) -> LayerShape:
        s = super().layer_shape(layer)
        return dataclasses.replace(s, mixer=self.forced_mixer, ffn=self.forced_ffn)


def _base() -> ModelConfig:
    return synthetic_config("llama", n_layer=2)


def _gdn_config(base: ModelConfig) -> ModelConfig:
    """base with every layer a gated delta net."""
    gdn = GdnConfig((True,) * base.n_layer, 4, 2, 2, 16, 16)
    return dataclasses.replace(base, ext=GdnHybridConfig(gdn=gdn))


def _config_cases() -> dict[str, tuple[ModelConfig, str]]:
    base = _base()
    cases = {
        "activation": (dataclasses.replace(base, ffn_act="relu"), eligibility.ACTIVATION),
        "attn_softcap": (with_ext(base, attn_logit_softcap=50.0), eligibility.SOFTCAP),
        "kv_widths": (dataclasses.replace(base, head_dim_v=32), eligibility.KV_WIDTHS),
        "head_dim": (
            dataclasses.replace(base, head_dim_k=512, head_dim_v=512, rope_dim=512),
            eligibility.HEAD_DIM,
        ),
        "rope_dims": (dataclasses.replace(base, rope_dim=15), eligibility.ROPE_DIMS),
        "rope_type": (dataclasses.replace(base, rope_type="mrope"), eligibility.ROPE_TYPE),
        "gdn": (_gdn_config(base), "softplus: not implemented"),
        "moe": (with_ext(base, moe=MoeConfig((True, True), 4, 2, 32)), eligibility.MOE),
    }
    cases["output_gate"] = (with_ext(base, attn_output_gate=True), eligibility.OUTPUT_GATE)
    return cases


@pytest.mark.parametrize("case", sorted(_config_cases()))
def test_layer_refusals_are_named(case: str) -> None:
    cfg, reason = _config_cases()[case]
    assert eligibility.layer_refusals(cfg) == [reason] * cfg.n_layer
    assert eligibility.layer_refusals(_base()) == [None, None]


def test_post_norms_geglu_and_windows_are_carried() -> None:
    cfg = dataclasses.replace(
        with_ext(_base(), post_attn_norm=True, post_ffn_norm=True),
        ffn_act="gelu_tanh",
        sliding_window=8,
        swa_layers=(True, False),
        rope_base_swa=5000.0,
    )
    assert eligibility.layer_refusals(cfg) == [None, None]


def test_a_layer_without_an_ffn_is_carried() -> None:
    """No call of an attention-only layer is refused (it writes its K/V rows)."""
    base = _base()
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    assert eligibility.layer_refusals(_ShapedConfig(**fields, forced_ffn="none")) == [None] * 2


@dataclasses.dataclass(frozen=True)
class _NewOpConfig(DecoderConfig):
    """An architecture whose layer calls a primitive no backend has declared yet."""

    def layer(self, ops: Any, cfg: ModelConfig, shape: LayerShape, w: Any, *rest: Any) -> Any:
        x = ops.fancy_op(rest[0])
        return super().layer(ops, cfg, shape, w, x, *rest[1:])


def test_an_op_a_backend_does_not_declare_is_refused_by_its_name() -> None:
    """Capabilities by tracing: the recorded call of an op a backend's table lacks refuses
    the layer, the reason naming the op; one its predicate refuses names the argument."""
    cfg = dataclasses.replace(_base(), ext=_NewOpConfig())
    assert [c.op for c in model_traces(cfg)[0]][:2] == ["fancy_op", "rms_norm"]
    assert eligibility.layer_reasons(cfg, 0) == ["fancy_op: not implemented"]
    assert layer_support("metal", cfg) == ["fancy_op: not implemented"] * 2
    table = {"fancy_op": lambda call: "shape" if call.shapes[0] != (1, 64) else None}
    assert trace_refusals(table, [OpCall("fancy_op", ((1, 64),))]) == []
    assert trace_refusals(table, [OpCall("fancy_op", ((2, 64),))]) == ["fancy_op: shape"]
    assert trace_refusals({}, [OpCall("attention")]) == ["attention: not implemented"]


def test_gemma3_is_carried(tiny_model: Callable) -> None:
    """Gemma 3 (GeGLU, post norms, QK norm, local layers with a window and their own rope
    base, a scaled embedding) is carried whole; its logits are checked in
    test_numpy_stack_equals_host_body and against llama.cpp in test_real_models."""
    for name in ("gemma3_text", "gemma3"):
        cfg = frink_cli.load(tiny_model(name).gguf).config
        assert any(cfg.swa_layers) and cfg.ffn_act == "gelu_tanh"
        assert eligibility.layer_refusals(cfg) == [None] * cfg.n_layer


def _bound_backend(cfg: ModelConfig | None = None) -> tuple[CudaBackend, KvCache]:
    cfg = cfg or _base()
    backend = make_cuda_backend(cfg, array_module="numpy")
    backend.bind(synthetic_weights(cfg))
    cache = KvCache(cfg, 64)
    return backend, cache


def test_step_refusals() -> None:
    backend, cache = _bound_backend()
    cache.check_room(8)
    pos = np.arange(8)
    assert backend.plan("prefill", 0, 8, cache, positions=pos) == Run(0, 2)
    assert backend.plan("prefill", 1, 8, cache, positions=pos) == Run(1, 2)
    assert backend.plan("prefill", 0, 3, cache, positions=pos[:3]) == Refusal(eligibility.BATCH)
    assert backend.plan("decode", 0, 1, cache, positions=pos[:1]) == Run(0, 2)
    assert backend.plan("verify", 0, 8, cache, positions=pos) == Refusal(eligibility.STEP_KIND)
    assert backend.plan("decode", 0, 1, cache, positions=pos[3:4]) == Refusal(eligibility.POSITIONS)
    assert backend.plan("prefill", 0, 8, cache, positions=pos + 3) == Refusal(eligibility.POSITIONS)
    assert backend.plan("prefill", 0, 8, cache, positions=pos[::-1].copy()) == Refusal(
        eligibility.POSITIONS
    )

    class Evicting:  # slots holding positions 16..19 only: a full layer's earlier rows are gone
        n_past = 20

        def slot(self, layer: int) -> SimpleNamespace:
            return SimpleNamespace(first=16)

    assert backend.plan("prefill", 0, 8, Evicting(), positions=np.arange(20, 28)) == Refusal(
        eligibility.EVICTED
    )

    class Paged:
        n_past = 0

    assert backend.plan("prefill", 0, 8, Paged(), positions=pos) == Refusal(eligibility.CACHE_TYPE)

    unbound = make_cuda_backend(_base(), array_module="numpy")
    assert unbound.plan("prefill", 0, 8, cache, positions=pos) == Refusal(eligibility.NOT_RESIDENT)


def test_run_stops_at_a_refused_layer() -> None:
    """A run is the longest stretch of eligible layers; a refused layer splits it. (Which
    layers a model has that the stack refuses is the predicate's business, tested above; here
    layer 2 is marked refused by hand, as a MoE layer in a dense model would be.)"""
    cfg = synthetic_config("llama", n_layer=5)
    backend, cache = _bound_backend(cfg)
    backend.layer_refusals[2] = eligibility.MOE
    cache.check_room(6)
    pos = np.arange(6)
    assert backend.plan("prefill", 0, 6, cache, positions=pos) == Run(0, 2)
    assert backend.plan("prefill", 2, 6, cache, positions=pos) == Refusal(eligibility.MOE)
    assert backend.plan("prefill", 3, 6, cache, positions=pos) == Run(3, 5)
    # Through the decoder: two runs, one refusal, host-equal hidden states and logits.
    w = synthetic_weights(cfg, seed=4)
    ids = np.arange(6) % cfg.n_vocab
    host, host_cache = Decoder(cfg, w), KvCache(cfg, 16)
    backend = make_cuda_backend(cfg, array_module="numpy")
    dec = Decoder(cfg, w, backend)
    backend.layer_refusals[2] = eligibility.MOE
    dev_cache = KvCache(cfg, 16)
    _assert_close(
        dec.hidden(ids, dev_cache), host.hidden(ids, host_cache), 1e-5, "split runs vs host"
    )
    assert backend.ledger.submissions == {"prefill-stack": 2}
    assert backend.ledger.refusals == {eligibility.MOE: 1}
    # A decode token: the second run ends the model and brings the logits back with it.
    _assert_close(
        dec.step(np.asarray([3]), dev_cache), host.step(np.asarray([3]), host_cache), 1e-5, "decode"
    )
    assert backend.ledger.submissions == {
        "prefill-stack": 2,
        "decode-stack": 1,
        "decode-stack+lm-head": 1,
    }


# --- a launch that fails after admission ----------------------------------------------------------


class _FailingOps(ReferenceOps):
    """The references, except attention fails on its second call (the run's second layer)."""

    def __init__(self, message: str = "simulated launch failure") -> None:
        self.calls = 0
        self.message = message

    def attention(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls % 2 == 0:
            raise RuntimeError(self.message)
        return super().attention(*args, **kwargs)


def test_failure_after_admission_leaves_caches_untouched(caplog: pytest.LogCaptureFixture) -> None:
    cfg = synthetic_config("qwen3", n_layer=3)
    w = synthetic_weights(cfg, seed=9)
    backend = CudaBackend(cfg, _FailingOps())
    backend.bind(w)
    cache = KvCache(cfg, 32)
    cache.check_room(8)
    before_k = [k.copy() for k in cache.k]
    before_v = [v.copy() for v in cache.v]
    x = synthetic_weights(cfg, seed=1).token_embd[:8].copy()
    x_before = x.copy()
    plan = backend.plan("prefill", 0, 8, cache, positions=np.arange(8))
    assert plan == Run(0, 3)
    with pytest.raises(LaunchFailed, match="simulated launch failure"):
        backend.run(plan, x, np.arange(8), cache)
    for a, b in zip(cache.k + cache.v, before_k + before_v):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(x, x_before)
    assert cache.n_past == 0
    assert not backend.ledger.submissions

    # Through the decoder: the host body runs the layers, the answer is the host's, the
    # failure is counted at every step but logged once.
    ids = np.arange(8) % cfg.n_vocab
    host = Decoder(cfg, w)
    want_cache = KvCache(cfg, 32)
    want = [
        host.step(ids, want_cache, all_logits=True),
        host.step(ids, want_cache, all_logits=True),
    ]
    dec = Decoder(cfg, w, CudaBackend(cfg, _FailingOps()))
    got_cache = KvCache(cfg, 32)
    with caplog.at_level(logging.WARNING, logger="frink"):
        got = [dec.step(ids, got_cache, all_logits=True), dec.step(ids, got_cache, all_logits=True)]
    for g, h in zip(got, want):
        _assert_close(g, h, 0, "host fallback after a failed launch")
    for a, b in zip(got_cache.k + got_cache.v, want_cache.k + want_cache.v):
        np.testing.assert_array_equal(a[:, :16], b[:, :16])
    ledger = dec.backend.ledger
    assert len(ledger.failures) == 1 and sum(ledger.failures.values()) == 2
    assert "simulated launch failure" in next(iter(ledger.failures))
    assert not ledger.submissions
    warnings = [r for r in caplog.records if "simulated launch failure" in r.getMessage()]
    assert len(warnings) == 1


class _FailOnce(ReferenceOps):
    """The references, except the attention call numbered `fail_at` raises."""

    def __init__(self, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def attention(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("simulated launch failure")
        return super().attention(*args, **kwargs)


def test_device_kv_cache_resyncs_when_the_host_rows_change() -> None:
    """The device KV cache follows the host cache through a failed decode launch (the host
    body writes that row), a truncation (rows the device wrote stay valid) and a truncation
    followed by host-written rows of the same length (they must be re-read)."""
    cfg = synthetic_config("qwen3", n_layer=2)
    w = synthetic_weights(cfg, seed=21)
    host = Decoder(cfg, w)
    ops = _FailOnce(fail_at=2 * 2 + 1)  # the prefill's 2 layers, 2 decode tokens, then fails
    dec = Decoder(cfg, w, CudaBackend(cfg, ops))
    bare = Decoder(cfg, w)  # the host body alone, writing into the device run's cache
    hc, dc = KvCache(cfg, 64), KvCache(cfg, 64)
    prompt = np.arange(9) % cfg.n_vocab

    def both(ids: list[int], host_cache: KvCache = hc, dev: Decoder = dec) -> None:
        a = host.step(np.asarray(ids), host_cache, all_logits=True)
        b = dev.step(np.asarray(ids), dc, all_logits=True)
        _assert_close(b, a, 1e-5, f"step {ids}")

    both(list(prompt))
    for t in (5, 6, 7, 8):  # the third decode launch fails; the host body covers it
        both([t])
    ledger = dec.backend.ledger
    assert sum(ledger.failures.values()) == 1
    assert ledger.submissions == {"prefill-stack+lm-head": 1, "decode-stack+lm-head": 3}

    hc.truncate(6)
    dc.truncate(6)
    both([11])  # on the device, over rows it wrote itself
    both([12])
    hc.truncate(6)
    dc.truncate(6)
    # Rows 6 and 7 rewritten by the host body alone: the device KV cache has as many rows,
    # but not these; then the device decodes over them.
    for t in (13, 14):
        a = host.step(np.asarray([t]), hc)
        b = bare.step(np.asarray([t]), dc)
        _assert_close(b, a, 1e-5, "host body on the shared cache")
    both([15])
    assert ledger.submissions == {"prefill-stack+lm-head": 1, "decode-stack+lm-head": 6}


def test_decode_uploads_no_kv_history() -> None:
    """After the prompt, a decode token sends only its own row and rope tables up: the K/V
    history lives on the device (per-token work does not grow with the context)."""

    class Counting(ReferenceOps):
        def __init__(self) -> None:
            self.uploaded = 0

        def to_device(self, a, dtype=np.float32):  # type: ignore[no-untyped-def]
            self.uploaded += np.asarray(a).size
            return super().to_device(a, dtype)

    cfg = synthetic_config("llama", n_layer=3)
    ops = Counting()
    dec = Decoder(cfg, synthetic_weights(cfg, seed=2), CudaBackend(cfg, ops))
    cache = KvCache(cfg, 256)
    dec.step(np.arange(100) % cfg.n_vocab, cache)
    for t in range(3):
        before = ops.uploaded
        dec.step(np.asarray([t]), cache)
        # the hidden row, cos and sin: nothing per cached row
        assert ops.uploaded - before == cfg.n_embd + cfg.rope_dim
    assert dec.backend.ledger.submissions == {"prefill-stack+lm-head": 1, "decode-stack+lm-head": 3}


def test_failed_weight_upload_leaves_layers_on_the_host() -> None:
    class NoMemory(ReferenceOps):
        def to_device(self, a, dtype=np.float32):  # type: ignore[no-untyped-def]
            raise MemoryError("out of device memory")

    cfg = _base()
    backend = CudaBackend(cfg, NoMemory())
    backend.bind(synthetic_weights(cfg))
    cache = KvCache(cfg, 16)
    assert backend.plan("prefill", 0, 8, cache) == Refusal(eligibility.NOT_RESIDENT)
    assert list(backend.ledger.failures) == [
        "weight upload: MemoryError: out of device memory "
        "(0 of 2 layers resident, the rest run on the host)"
    ]


def test_layers_that_fit_stay_resident() -> None:
    """The device fills up after two layers' weights: those two run on the device, the rest
    and the logits on the host, and the answer is the host body's."""

    class SmallDevice(ReferenceOps):
        def __init__(self, budget: int) -> None:
            self.left = budget

        def to_device(self, a, dtype=np.float32):  # type: ignore[no-untyped-def]
            a = np.asarray(a)
            if a.ndim == 2:  # weight matrices count against the budget
                if a.size > self.left:
                    raise MemoryError("out of device memory")
                self.left -= a.size
            return super().to_device(a, dtype)

    cfg = synthetic_config("qwen2", n_layer=4)
    w = synthetic_weights(cfg, seed=6)
    per_layer = sum(
        x.w.size for x in (w.layers[0].qkv, w.layers[0].wo, w.layers[0].gate_up, w.layers[0].down)
    )
    backend = CudaBackend(cfg, SmallDevice(2 * per_layer + per_layer // 2))
    dec, host = Decoder(cfg, w, backend), Decoder(cfg, w)
    assert sorted(backend.layers) == [0, 1] and backend.head is None and not backend.runs_head
    assert list(backend.ledger.failures) == [
        "weight upload: MemoryError: out of device memory "
        "(2 of 4 layers resident, the rest run on the host)"
    ]
    ids = np.arange(10) % cfg.n_vocab
    hc, dc = KvCache(cfg, 32), KvCache(cfg, 32)
    _assert_close(
        dec.step(ids, dc, all_logits=True), host.step(ids, hc, all_logits=True), 1e-5, "prefill"
    )
    _assert_close(dec.step(np.asarray([4]), dc), host.step(np.asarray([4]), hc), 1e-5, "decode")
    assert backend.ledger.submissions == {"prefill-stack": 1, "decode-stack": 1}
    assert backend.ledger.refusals == {eligibility.NOT_RESIDENT: 4}


# --- choosing the backend, info, the CLI --------------------------------------------------------


def _cupy_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("cupy") is not None


@pytest.mark.skipif(_cupy_importable(), reason="CuPy is installed here")
def test_cuda_without_cupy_is_a_clear_error() -> None:
    with pytest.raises(
        FrinkError, match=r"backend 'cuda' is not available: CuPy is not installed \(pip install"
    ):
        select_backend("cuda", _base())
    assert select_backend("auto", _base()) is None  # auto stays on the host body
    with pytest.raises(FrinkError, match="FRINK_CUDA_ARRAY_MODULE"):
        make_cuda_backend(_base(), array_module="torch")


def test_tensor_formats_name_the_gemm_operands() -> None:
    from frink_cli.backends.cupy import tensor_format

    assert tensor_format("Q4_K", "float32") == "f32 (dequantized at load)"
    assert (
        tensor_format("Q4_K", "float16", host_blocks=True)
        == "Q4_K blocks as stored (dequantized in the kernels)"
    )
    assert tensor_format("F16", "float16") == "f16 as stored"
    assert tensor_format("BF16", "float16") == "f16 (converted at load)"
    assert tensor_format("F32", "float16") == "f32 vectors; matrices to f16 at load"


def test_layer_support_needs_no_device() -> None:
    assert (
        layer_support("cuda", dataclasses.replace(_base(), ffn_act="relu"))
        == [eligibility.ACTIVATION] * 2
    )
    assert layer_support("numpy", _base()) == [None, None]


def test_info_says_which_layers_cuda_takes(tiny_model: Callable) -> None:
    import json

    r = frink("info", tiny_model("qwen3").gguf, "--backend", "cuda", "--json")
    assert r.returncode == 0, r.describe()
    data = json.loads(r.stdout)
    assert data["backend"]["name"] == "cuda"
    assert [row["backend"] for row in data["layers"]] == ["cuda"] * 3
    assert data["backend"]["tensor_formats"] == {"F32": "f32 as stored"}

    r = frink("info", tiny_model("qwen35").gguf, "--backend", "cuda")
    assert r.returncode == 0, r.describe()
    assert "cuda takes 0 of 8 layers" in r.stdout
    gdn_rows = [line for line in r.stdout.splitlines() if line.strip().startswith("blk.0 ")]
    assert "delta_rule: not implemented" in gdn_rows[0], r.stdout
    assert f"host ({eligibility.OUTPUT_GATE})" in r.stdout


@pytest.mark.usefixtures("exact_activations")  # the host body as the f32 reference
def test_run_with_backend_cuda_standing_in(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`frink run --backend cuda` end to end (NumPy standing in for CuPy): the same greedy
    tokens as the host body, and the backend named in the JSON."""
    import json

    args = (
        "run",
        smollm2_path,
        "-p",
        "The capital of France is",
        "--raw",
        "--temp",
        "0",
        "-n",
        "6",
        "--json",
    )
    host = frink(*args, "--backend", "numpy")
    assert host.returncode == 0, host.describe()
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    r = frink(*args, "--backend", "cuda")
    assert r.returncode == 0, r.describe()
    dev = json.loads(r.stdout)
    assert dev["backend"] == "cuda"
    assert dev["token_ids"] == json.loads(host.stdout)["token_ids"]
    # The ledger of the run: one prefill submission, then one per decode token (the last
    # sampled token is never fed back).
    assert dev["device"]["by_kind"] == {"prefill-stack+lm-head": 1, "decode-stack+lm-head": 5}
    assert dev["device"]["refusals"] == {} and dev["device"]["failures"] == {}
    assert json.loads(host.stdout)["device"] is None


@pytest.mark.real
def test_parity_command_on_gemma3_standing_in(
    gemma3_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`frink parity --backend cuda` on the real Gemma 3 270M (Q4_K_M, dequantized at load):
    every layer carried, per-layer prefill state and a greedy decode matching the host body,
    one submission per decode token."""
    import json

    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    r = frink(
        "parity",
        gemma3_path,
        "--backend",
        "cuda",
        "-p",
        "The capital of France is",
        "--steps",
        "8",
        "--json",
    )
    assert r.returncode == 0, r.describe()
    report = json.loads(r.stdout)
    assert report["verdict"] == "MATCH", report
    assert report["submissions_per_decode_token"] == 1.0
    assert sum(report["submissions_by_kind"].values()) > 0 and all(report["layer_on_backend"]), (
        report
    )
    assert report["failures"] == {}, report


# --- the CuPy wiring, with a stand-in CuPy whose kernels run on the emulator -----------------


def _fake_cupy(launcher: EmulatedLauncher, sources: list[str]) -> object:
    """Just the CuPy surface the backend touches: arrays are NumPy's, RawModule compiles
    nothing (it records the source it was given) and launches on the CPU emulator."""
    import importlib.machinery
    import types

    cupy = types.ModuleType("cupy")
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    for name in (
        "asarray",
        "empty",
        "empty_like",
        "matmul",
        "ascontiguousarray",
        "float32",
        "float16",
    ):
        setattr(cupy, name, getattr(np, name))
    cupy.asnumpy = lambda a: np.array(a)  # a copy, like a device-to-host download

    class RawModule:
        def __init__(self, code: str) -> None:
            sources.append(code)

        def get_function(self, name: str) -> Callable:
            def call(grid: tuple, block: tuple, args: tuple) -> None:
                launcher(name, grid[0], block[0], args)

            return call

    cupy.RawModule = RawModule
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)
    cupy.cuda = types.SimpleNamespace(runtime=runtime)
    return cupy


def test_cupy_wiring_with_a_stand_in(
    tiny_model: Callable, emulated_launcher: EmulatedLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make_cuda_backend's CuPy path end to end (RawModule per kernel file, kernel lookup by
    name, CuPy's launch convention, asnumpy downloads), with NumPy arrays and the emulator
    under it: everything but NVRTC and the device."""
    import sys

    sources: list[str] = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(emulated_launcher, sources))
    tm = tiny_model("qwen2")
    host = frink_cli.load(tm.gguf)
    m = frink_cli.load(tm.gguf, backend="auto")  # auto: CuPy (the stand-in) sees a GPU
    assert m.backend_name == "cuda"
    tokens = [int(t) for t in tm.ref["tokens"]][:20]
    _assert_close(m.logits(tokens), host.logits(tokens), SELF_TOL, "stand-in CuPy vs host body")
    assert len(sources) == len(KERNEL_FILES)
    assert all('#include "common.cuh"' not in s for s in sources)
    launched = set(emulated_launcher.launches)
    assert {
        "rms_norm_f32",
        "rope_f32",
        "causal_gqa_attention_f32",
        "glu_f32",
        "add_f32",
        "add_bias_f32",
    } <= launched
    assert m.decoder.backend.ledger.submissions == {"prefill-stack+lm-head": 1}
