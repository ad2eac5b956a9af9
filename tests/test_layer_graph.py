"""The one layer graph: the composition's guarantees that no single model test states.

- Every backend runs the SAME composition (the architecture's layer): a decoration set in
  the config moves the host body, the cuda stack (NumPy stand-in) and the metal graph
  alike, and each still agrees with the host body.
- A decoration a backend does not carry is refused by name, never dropped.
- A Python bug inside a backend's ops fails loudly; only device errors fall back.

Correctness against transformers and llama.cpp is the parity tests' job; here the host
body is the reference only for what the backends compute from the same weights.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from script_loader import load_script

from frink_cli.archs.decoder import DecoderConfig
from frink_cli.backends import Refusal
from frink_cli.backends.cupy.backend import CudaBackend
from frink_cli.backends.cupy.ops import ReferenceOps
from frink_cli.cache import KvCache
from frink_cli.decoder import Decoder
from frink_cli.model.config import ModelConfig

_synthetic = load_script("synthetic_models")
synthetic_config, synthetic_weights = _synthetic.synthetic_config, _synthetic.synthetic_weights

DECORATIONS = {
    "residual_scale": {"residual_scale": 0.3},
    "logit_scale": {"logit_scale": 4.0},
    "embd_scale": {"embd_scale": 3.0},
    "final_logit_softcap": {"final_logit_softcap": 2.0},
    "post_norms": {"post_attn_norm": True, "post_ffn_norm": True},
    # starcoder2's block (LayerNorm with biases, the plain GELU FFN), then bloom / mpt's
    # position scheme on it (ALiBi instead of rope, the QKV clamp).
    "layer_norm_plain_ffn": {"layer_norm": True, "plain_ffn": True, "ffn_act": "gelu_tanh"},
    "alibi_clamp": {
        "layer_norm": True,
        "plain_ffn": True,
        "ffn_act": "gelu_tanh",
        "alibi_bias": 8.0,
        "clamp_kqv": 0.5,
    },
}


def _logits(cfg: ModelConfig, backend=None) -> np.ndarray:  # type: ignore[no-untyped-def]
    w = synthetic_weights(cfg, seed=3)
    dec = Decoder(cfg, w, backend)
    cache = KvCache(cfg, 32)
    ids = np.arange(10) % cfg.n_vocab
    out = [dec.step(ids, cache, all_logits=True)]
    out += [dec.step(np.asarray([t]), cache) for t in (5, 7)]
    if backend is not None:
        assert backend.ledger.total() > 0 and not backend.ledger.failures, backend.ledger.failures
        assert not backend.ledger.refusals, backend.ledger.refusals
    return np.concatenate(out)


@pytest.mark.parametrize("name", sorted(DECORATIONS))
def test_each_decoration_moves_every_backend_alike(name: str) -> None:
    base = synthetic_config("qwen3", n_layer=2)
    cfg = synthetic_config("qwen3", n_layer=2, **DECORATIONS[name])
    plain, host = _logits(base), _logits(cfg)
    assert np.abs(host - plain).max() > 1e-2, f"{name} changed nothing on the host"
    cuda = _logits(cfg, CudaBackend(cfg, ReferenceOps()))
    assert np.abs(cuda - host).max() < 1e-4, name
    if pytest.importorskip("mlx.core") is not None:
        from frink_cli.backends.mlx.backend import MlxBackend

        metal = _logits(cfg, MlxBackend(cfg))
        assert np.abs(metal - host).max() < 1e-3, name


@dataclasses.dataclass(frozen=True)
class _FutureConfig(DecoderConfig):
    """An architecture whose FFN calls a primitive no backend has declared yet."""

    def ffn(self, ops, cfg, shape, w, x, h):  # type: ignore[no-untyped-def]
        return super().ffn(ops, cfg, shape, w, x, ops.future_op(h))


def test_an_unknown_op_is_refused_by_name_on_every_backend() -> None:
    """A backend plans by the layer's trace: a run of layers calling an op it does not
    declare is refused, the reason naming that op, before any state is touched."""
    cfg = dataclasses.replace(synthetic_config("llama", n_layer=2), ext=_FutureConfig())
    cuda = CudaBackend(cfg, ReferenceOps())
    refused = Refusal("future_op: not implemented")
    assert cuda.plan("decode", 0, 1, KvCache(cfg, 8)) == refused
    pytest.importorskip("mlx.core")
    from frink_cli.backends.mlx.backend import MlxBackend

    assert MlxBackend(cfg).plan("decode", 0, 1, KvCache(cfg, 8)) == refused


class _BuggyOps(ReferenceOps):
    def add(self, x, a):  # type: ignore[no-untyped-def]
        raise TypeError("a bug in the backend")


def test_a_bug_in_a_backend_is_not_a_silent_host_fallback() -> None:
    cfg = synthetic_config("llama", n_layer=2)
    dec = Decoder(cfg, synthetic_weights(cfg, seed=1), CudaBackend(cfg, _BuggyOps()))
    with pytest.raises(TypeError, match="a bug in the backend"):
        dec.step(np.arange(6) % cfg.n_vocab, KvCache(cfg, 16))


def test_a_device_error_is_a_launch_failure_the_host_recovers_from() -> None:
    class _DeviceLost(ReferenceOps):
        def add(self, x, a):  # type: ignore[no-untyped-def]
            raise RuntimeError("device lost")

    cfg = synthetic_config("llama", n_layer=2)
    w = synthetic_weights(cfg, seed=1)
    dec, host = Decoder(cfg, w, CudaBackend(cfg, _DeviceLost())), Decoder(cfg, w)
    ids = np.arange(6) % cfg.n_vocab
    got = dec.step(ids, KvCache(cfg, 16), all_logits=True)
    want = host.step(ids, KvCache(cfg, 16), all_logits=True)
    np.testing.assert_array_equal(got, want)
    assert any("device lost" in m for m in dec.backend.ledger.failures)
