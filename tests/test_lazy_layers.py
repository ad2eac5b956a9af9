"""Host layer copies with a backend: only the layers the host body runs stay on the host.

load_weights keeps layers in a LayerStore; with a backend, bind() borrows each layer it
uploads and the decoder releases what the backend holds whole, loading the rest at once.
A launch failing after admission must still give the host body's answer, reloading the
released layers from the checkpoint. The default (no backend) path loads every layer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from frink_subprocess import frink

import frink_cli
from frink_cli.backends import LaunchFailed
from frink_cli.model.weights import LayerStore


def _store(model: frink_cli.Model) -> LayerStore:
    layers = model.decoder.host.w.layers
    assert isinstance(layers, LayerStore)
    return layers


def test_default_path_loads_every_layer(tiny_model):
    m = frink_cli.load(tiny_model("llama").gguf)
    store = _store(m)
    assert store.loaded() == set(range(m.config.n_layer))
    assert store.on_load is None
    # Release and reload give the same arrays back (from the checkpoint).
    before = store[0].qkv.w.copy()
    store.release(0)
    assert 0 not in store.loaded()
    np.testing.assert_array_equal(store[0].qkv.w, before)
    assert store.loaded() == set(range(m.config.n_layer))


def test_cuda_standing_in_keeps_no_host_layers_and_falls_back(tiny_model, monkeypatch):
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    tm = tiny_model("llama")
    host = frink_cli.load(tm.gguf)
    dev = frink_cli.load(tm.gguf, backend="cuda")
    backend = dev.decoder.backend
    assert backend.resident_layers() == set(range(dev.config.n_layer))
    assert _store(dev).loaded() == set()
    tokens = [int(t) for t in tm.ref["tokens"]]
    want = host.logits(tokens)
    np.testing.assert_allclose(dev.logits(tokens), want, atol=1e-4, rtol=0)

    class Broken:  # every kernel fails: each launch raises LaunchFailed after admission
        xp = np  # the array module survives a device loss; its kernels do not

        def __getattr__(self, name):
            raise RuntimeError("simulated device loss")

    backend.ops = Broken()
    got = dev.logits(tokens)
    assert backend.ledger.failures
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert _store(dev).loaded() == set(range(dev.config.n_layer))


def _metal_or_skip() -> None:
    pytest.importorskip("mlx.core")


def test_metal_releases_held_layers_keeps_refused_ones(tiny_model, monkeypatch):
    _metal_or_skip()
    from frink_cli.backends.mlx import eligibility

    real = eligibility.layer_refusals

    def refuse_odd(cfg, layer, source=None):
        return real(cfg, layer, source) + (["forced for test"] if layer % 2 else [])

    monkeypatch.setattr("frink_cli.backends.mlx.backend.layer_refusals", refuse_odd)
    tm = tiny_model("qwen3")
    host = frink_cli.load(tm.gguf)
    dev = frink_cli.load(tm.gguf, backend="metal")
    n = dev.config.n_layer
    odd = {i for i in range(n) if i % 2}
    assert dev.decoder.backend.resident_layers() == set(range(n)) - odd
    assert _store(dev).loaded() == odd  # refused layers were loaded at load, not per token
    ids = tm.ref["tokens"][:12]
    want = host.logits(ids)
    assert np.abs(dev.logits(ids) - want).max() <= 1e-3
    assert _store(dev).loaded() == odd


def test_metal_launch_failure_after_release_gives_host_answer(tiny_model):
    _metal_or_skip()
    tm = tiny_model("llama")
    host = frink_cli.load(tm.gguf)
    dev = frink_cli.load(tm.gguf, backend="metal")
    backend = dev.decoder.backend
    assert _store(dev).loaded() == set()
    ids = tm.ref["tokens"][:12]
    want_prefill = host.logits(ids)
    want_steps = host.logits(ids, step=True)

    def broken(*args, **kwargs):
        raise RuntimeError("simulated launch failure")

    backend._function = broken  # fails inside _launch: LaunchFailed after admission
    cache = dev.decoder.new_cache(8)
    x = np.zeros((1, dev.config.n_embd), np.float32)
    with pytest.raises(LaunchFailed):
        backend.run(backend.plan("decode", 0, 1, cache), x, np.arange(1), cache)
    got_prefill = dev.logits(ids)
    got_steps = dev.logits(ids, step=True)
    assert backend.ledger.failures
    np.testing.assert_allclose(got_prefill, want_prefill, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got_steps, want_steps, atol=1e-5, rtol=0)
    assert (got_steps.argmax(-1) == want_steps.argmax(-1)).all()
    # The released layers came back from the checkpoint for the host body.
    assert _store(dev).loaded() == set(range(dev.config.n_layer))


@pytest.mark.real
def test_metal_real_model_holds_no_host_layers(smollm2_path):
    _metal_or_skip()
    m = frink_cli.load(smollm2_path, backend="metal")
    held = m.decoder.backend.resident_layers()
    assert held == set(range(m.config.n_layer))  # SmolLM2: every layer eligible
    assert _store(m).loaded() == set(range(m.config.n_layer)) - held


@pytest.mark.real
def test_metal_run_peak_memory_below_host_only(monkeypatch):
    # Measured on the 2-core Linux box (MLX CPU device), SmolLM2 Q4_1: host-only with f32
    # weights (FRINK_F32_WEIGHTS, the layout before the host kept blocks) ~710 MiB, metal
    # ~470 (before the layer store metal peaked at ~866: every layer's f32 copy beside
    # MLX's), host-only in the file's blocks ~300. The bound leaves room for the device's
    # own choices: holding the tied 49k-row head as f32 instead of Q4 blocks alone adds
    # ~110 MiB to the metal run.
    _metal_or_skip()
    peaks = {}
    for backend, f32 in (("numpy", True), ("numpy", False), ("metal", False)):
        if f32:
            monkeypatch.setenv("FRINK_F32_WEIGHTS", "1")
        else:
            monkeypatch.delenv("FRINK_F32_WEIGHTS", raising=False)
        r = frink("run", "smollm2-135m", "--backend", backend, "-n", "4", "--json", "-p", "Hi")
        assert r.returncode == 0, r.describe()
        assert json.loads(r.stdout)["backend"] == backend
        # frink's own figure (VmHWM), not the harness's wait4 ru_maxrss: Linux carries the
        # RSS of the forked pytest process into the child's ru_maxrss across exec, so after
        # an in-process test loaded a big model both runs would read the same number.
        peaks[backend + (" f32" if f32 else "")] = json.loads(r.stdout)["peak_memory_mib"]
    # No host f32 copy of the layers the device holds; the host's blocks far below f32.
    assert peaks["metal"] <= peaks["numpy f32"] - 100, peaks
    assert peaks["numpy"] <= peaks["numpy f32"] - 300, peaks
