"""minimax-01 beyond the conformance table: lightning attention's blocked prefill against
its own one-token recurrence, hostile metadata refused by name, `frink info`, the released
checkpoints' own config.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
from model_checks import assert_refused_by_name
from script_loader import load_script

import frink_cli
from frink_cli.backends.host.lightning import BLOCK, lightning_attention
from frink_cli.graph.blocks.lightning import LightningConfig
from frink_cli.report import describe


def test_blocked_prefill_equals_the_recurrence() -> None:
    """The blocked prompt path (three blocks, the last partial) gives the outputs and state
    of S = exp(-s) S + k^T v; o = q S taken one token at a time, from a non-zero state,
    in float64 arithmetic."""
    rng = np.random.default_rng(0)
    T, H, d = 2 * BLOCK + 19, 4, 8
    q, k, v = (rng.standard_normal((T, H, d)).astype(np.float32) * 0.5 for _ in range(3))
    slopes = LightningConfig((True,) * 4, H, d).slopes(1)
    S0 = rng.standard_normal((H, d, d)).astype(np.float32) * 0.1
    o, S = lightning_attention(q, k, v, slopes, S0)
    ref_S = S0.astype(np.float64)
    decay = np.exp(-np.asarray(slopes))[:, None, None]
    ref_o = np.empty((T, H, d))
    for t in range(T):
        ref_S = decay * ref_S + k[t][:, :, None].astype(np.float64) * v[t][:, None, :]
        ref_o[t] = np.einsum("hd,hde->he", q[t], ref_S)
    np.testing.assert_allclose(o, ref_o, atol=2e-5)
    np.testing.assert_allclose(S, ref_S, atol=2e-5)


def test_slopes_follow_llama_cpp() -> None:
    """2^(-8 (h + 1) / H) times 1 - layer / (n_layer - 1) + 1e-5 (minimax-01.cpp)."""
    lc = LightningConfig((True,) * 5, 8, 4)
    assert lc.slopes(0)[0] == pytest.approx(2**-1 * (1 + 1e-5))
    assert lc.slopes(2)[7] == pytest.approx(2**-8 * (0.5 + 1e-5))
    assert lc.slopes(4)[3] == pytest.approx(2**-4 * 1e-5)


def test_hostile_metadata_is_refused_by_name(tmp_path) -> None:
    """Each lightning field made hostile (a layer pattern of the wrong length, interval 0, a
    NaN residual scale, a huge head) is one FrinkError naming it, before anything large is
    allocated; the valid file they start from runs and `frink info` names the mixer."""
    F = load_script("fuzz_inputs")
    base = F.minimax_base().encode()
    assert_refused_by_name(tmp_path, base, F.minimax_hostile())  # the valid file runs first
    good = tmp_path / "good.gguf"
    info = describe(good)
    assert info["lightning"]["layers"] == 1, info["lightning"]
    assert info["layer_pattern"].startswith("LIGHTNING"), info["layer_pattern"]
    assert "lightning" in info["lightning"]["cache"]
    cuda = describe(good, backend="cuda")["layers"]
    assert "lightning_attention: not implemented" in cuda[0]["refusal"], cuda[0]


def test_the_released_config_gives_llama_cpps_logits(tiny_model, tmp_path) -> None:
    """The released checkpoints' own config.json (model_type MiniMaxText01: layernorm_*
    alphas and betas, attn_type_list, rotary_dim; what llama.cpp's converter reads) over the
    fixture's tensors gives llama.cpp's logits, as transformers' config does."""
    fixture = tiny_model("minimax")
    hf = fixture.hf_dir
    cfg = json.loads((hf / "config.json").read_text())
    for k in [k for k in cfg if k.endswith(("_alpha_factor", "_beta_factor"))] + ["layer_types"]:
        del cfg[k]
    alpha = 1.7
    cfg |= {
        "model_type": "MiniMaxText01",
        "architectures": ["MiniMaxText01ForCausalLM"],
        "attn_type_list": [0] * 7 + [1],
        **{f"layernorm_{k}_alpha": alpha for k in ("full_attention", "linear_attention", "mlp")},
        **{f"layernorm_{k}_beta": 1.0 for k in ("full_attention", "linear_attention", "mlp")},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for f in hf.glob("*.safetensors"):
        (tmp_path / f.name).symlink_to(f)
    m = frink_cli.load(tmp_path)
    tokens = [int(t) for t in fixture.ref["tokens"]]
    got = np.asarray(m.logits(tokens))
    assert np.abs(got - fixture.ref["logits_llamacpp"]).max() < 2e-3
