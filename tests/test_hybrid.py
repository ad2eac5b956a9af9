"""Hybrid recurrent models (Qwen3.5 `qwen35`, Qwen3-Next `qwen3next`) beyond plain parity.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: test_conformance.py already holds frink's logits against transformers and llama.cpp
on the tiny hybrids (every position, batched and step by step, GGUF and HF dir). What it
cannot see on its own:
  - the decode path after a batched prefill, where recurrent state is handed from the
    chunked prefill to the one-token step: checked against llama.cpp's own greedy decode;
  - the gated delta net's state itself (conv tail and delta-rule matrix), checked against a
    per-token loop written here straight from the formulas, in float64;
  - the chunked prefill form against the per-token form, at chunk boundaries;
  - that the fixtures can tell a wrong value-head -> key-head mapping (4 value heads on 2
    key heads), and that the HF reader's tensor transforms (value-head reorder, -exp(A_log),
    +1 norms, qkvz split, expert stacking) give exactly the converter's tensors;
  - that a cache holding recurrent state refuses truncation, and that a failed step
    leaves that state untouched.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import host_blocks
import numpy as np
import pytest
from frink_subprocess import frink

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.archs.decoder import with_ext
from frink_cli.backends.host import gdn as gdn_mod
from frink_cli.backends.host import rowwise
from frink_cli.cache import KvCache
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError
from frink_cli.quant import kernels

REF_TOL = 2e-3


def _load(tiny_model: Callable, name: str, source: str = "gguf") -> frink_cli.api.Model:
    tm = tiny_model(name)
    path = tm.gguf if source == "gguf" else tm.hf_dir
    if path is None:
        pytest.skip(f"{name}: no GGUF")
    return frink_cli.load(path)


# --- the gated delta net against its formulas --------------------------------------------------


def _formula_gdn(x: np.ndarray, w, cfg) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One token at a time, straight from the definitions, in float64. Returns the block's
    outputs [T, n_embd], the final conv tail [K-1, conv_dim] and delta state [n_v, dk, dv]."""
    f = np.float64
    n_k, n_v, dk, dv = (
        cfg.ext.gdn.n_k_heads,
        cfg.ext.gdn.n_v_heads,
        cfg.ext.gdn.head_dim_k,
        cfg.ext.gdn.head_dim_v,
    )
    K, C, eps = cfg.ext.gdn.conv_kernel, cfg.ext.gdn.conv_dim, cfg.norm_eps
    w_in, taps, w_out = w.in_proj.w.astype(f), w.conv.astype(f), w.out.w.astype(f)
    # Which key head value head h reads, by the architecture's convention.
    if cfg.ext.gdn.v_head_order == "tiled":
        key_head = [h % n_k for h in range(n_v)]
    else:
        key_head = [h // (n_v // n_k) for h in range(n_v)]

    def sigmoid(u):
        return 1.0 / (1.0 + np.exp(-u))

    history = np.zeros((K - 1, C))  # the conv's previous inputs, oldest first
    S = np.zeros((n_v, dk, dv))
    outs = []
    for t in range(x.shape[0]):
        p = w_in @ x[t].astype(f)
        mixed, z = p[:C], p[C : C + n_v * dv].reshape(n_v, dv)
        b, a = p[C + n_v * dv : C + n_v * dv + n_v], p[C + n_v * dv + n_v :]
        window = np.vstack([history, mixed])  # K rows: t-K+1 .. t
        conv = np.array([taps[c] @ window[:, c] for c in range(C)])
        history = window[1:]
        h = conv * sigmoid(conv)
        q = h[: n_k * dk].reshape(n_k, dk)
        k = h[n_k * dk : 2 * n_k * dk].reshape(n_k, dk)
        v = h[2 * n_k * dk :].reshape(n_v, dv)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps) / np.sqrt(dk)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
        beta = sigmoid(b)
        g = w.a.astype(f) * np.log1p(np.exp(a + w.dt_bias.astype(f)))
        o = np.zeros((n_v, dv))
        for hd in range(n_v):
            kh, qh = k[key_head[hd]], q[key_head[hd]]
            S[hd] = np.exp(g[hd]) * S[hd]
            S[hd] = S[hd] + np.outer(kh, beta[hd] * (v[hd] - S[hd].T @ kh))
            o[hd] = S[hd].T @ qh
        o = o / np.sqrt((o * o).mean(-1, keepdims=True) + eps) * w.norm.astype(f) * (z * sigmoid(z))
        outs.append(w_out @ o.reshape(-1))
    return np.stack(outs), history, S


@pytest.mark.parametrize("name", ["qwen35", "qwen3next"])
def test_gdn_block_and_state_match_per_token_formulas(name: str, tiny_model: Callable) -> None:
    """A prefill past one chunk, a second prefill, then decode rows, through the cache's
    real slot: outputs, conv tail and delta state all as the per-token formulas say."""
    m = _load(tiny_model, name)
    cfg, weights = m.config, m.decoder.host.w
    layer = next(i for i in range(cfg.n_layer) if cfg.is_recurrent(i))
    w = weights.layers[layer].gdn
    rng = np.random.default_rng(0)
    splits = [gdn_mod.CHUNK + 7, 9, 1, 1]
    x = rng.standard_normal((sum(splits), cfg.n_embd)).astype(np.float32)

    cache = KvCache(cfg, len(x))
    got = []
    start = 0
    for n in splits:
        got.append(host_blocks.gdn(x[start : start + n], w, cfg, cache.slot(layer)))
        cache.commit(n)
        start += n
    want, want_tail, want_state = _formula_gdn(x, w, cfg)
    tail, state = cache.slot(layer).recurrent_state()

    scale = np.abs(want).max()
    assert np.abs(np.concatenate(got) - want).max() <= 1e-4 * scale
    assert np.abs(tail - want_tail).max() <= 1e-5 * np.abs(want_tail).max()
    assert np.abs(state - want_state).max() <= 1e-4 * np.abs(want_state).max()
    assert np.abs(want_state).max() > 0.1  # the state is not trivially small


def _delta_inputs(seed: int, T: int = 37, H: int = 3, dk: int = 8, dv: int = 6) -> tuple:
    """q, k (unit rows), v, g, beta, state for a delta rule over T tokens and H heads."""
    rng = np.random.default_rng(seed)

    def unit(shape):
        u = rng.standard_normal(shape).astype(np.float32)
        return u / np.linalg.norm(u, axis=-1, keepdims=True)

    q, k = unit((T, H, dk)), unit((T, H, dk))
    v = rng.standard_normal((T, H, dv)).astype(np.float32)
    # Decays from ~1 (long memory) to e^-8 (forgets at once), by head.
    rates = np.array([0.01, 0.5, 8.0], np.float32)[np.arange(H) % 3]
    g = -rates * rng.uniform(0.5, 1.5, (T, H)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (T, H)).astype(np.float32)
    s0 = rng.standard_normal((H, dk, dv)).astype(np.float32)
    return q, k, v, g, beta, s0


def _delta_rule_f64(q, k, v, g, beta, s0) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence as its definition writes it, in float64."""
    s = s0.astype(np.float64)
    o = np.empty(v.shape, np.float64)
    for t in range(q.shape[0]):
        s = s * np.exp(g[t].astype(np.float64))[:, None, None]
        kt = k[t].astype(np.float64)
        u = (v[t] - np.einsum("hi,hij->hj", kt, s)) * beta[t][:, None]
        s = s + kt[:, :, None] * u[:, None, :]
        o[t] = np.einsum("hi,hij->hj", q[t].astype(np.float64), s)
    return o, s


@pytest.mark.parametrize("rule", ["steps", "chunk 1", "chunk 5", "chunk 16", "chunk 64", "C"])
def test_each_delta_rule_equals_the_definition(rule: str) -> None:
    """NumPy's token loop, its chunked (WY/UT) form at several chunk sizes and the C loop
    (rowwise_delta.h) against the recurrence in float64."""
    q, k, v, g, beta, s0 = _delta_inputs(len(rule))
    want_o, want_s = _delta_rule_f64(q, k, v, g, beta, s0)
    if rule == "C":
        if not rowwise.compiled():
            pytest.skip(rowwise.path())
        got = rowwise.delta_rule(q, k, v, np.exp(g), beta, s0)
        assert got is not None
        o, s = got
    elif rule == "steps":
        o, s = gdn_mod.delta_rule_steps(q, k, v, g, beta, s0)
    else:
        o, s = gdn_mod.delta_rule_chunked(q, k, v, g, beta, s0.copy(), chunk=int(rule[6:]))
    assert np.abs(o - want_o).max() <= 1e-5 * np.abs(want_o).max()
    assert np.abs(s - want_s).max() <= 1e-5 * np.abs(want_s).max()
    assert s.dtype == np.float32 and o.dtype == np.float32


@pytest.mark.skipif(not rowwise.compiled(), reason=rowwise.path())
def test_the_c_delta_rule_gives_a_token_the_same_bits_wherever_it_is_cut() -> None:
    """Batch invariance's piece for the gated delta net: the C rule over a whole prompt
    equals the same prompt fed in any two parts, then token by token, bit for bit, on one
    thread and on two (heads split between them); the state passed in is left as it was."""
    q, k, v, g, beta, s0 = _delta_inputs(3, T=23, H=5, dk=32, dv=16)
    g = np.exp(g)  # the decays the C takes
    kept = s0.copy()
    whole_o, whole_s = rowwise.delta_rule(q, k, v, g, beta, s0)
    assert np.array_equal(s0, kept)
    for threads in (1, 2):
        with kernels.threads(threads):
            for cut in (1, 7, 22):
                a_o, a_s = rowwise.delta_rule(q[:cut], k[:cut], v[:cut], g[:cut], beta[:cut], s0)
                parts = [a_o]
                s = a_s
                for t in range(cut, 23):
                    o_t, s = rowwise.delta_rule(
                        q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s
                    )
                    parts.append(o_t)
                assert np.array_equal(np.concatenate(parts), whole_o), (threads, cut)
                assert np.array_equal(s, whole_s), (threads, cut)


# --- value heads and the HF reader's transforms ---------------------------------------------------


@pytest.mark.parametrize("name", ["qwen35", "qwen3next"])
def test_wrong_value_head_order_breaks_parity(name: str, tiny_model: Callable) -> None:
    """The fixtures have 4 value heads on 2 key heads, so the two conventions differ: with
    the other order the logits move far from llama.cpp's (and with the right one they match,
    as test_conformance shows)."""
    tm = tiny_model(name)
    m = _load(tiny_model, name)
    other = "grouped" if m.config.ext.gdn.v_head_order == "tiled" else "tiled"
    wrong = Decoder(
        with_ext(m.config, gdn=dataclasses.replace(m.config.ext.gdn, v_head_order=other)),
        m.decoder.host.w,
    )
    tokens = tm.ref["tokens"]
    logits = wrong.step(np.asarray(tokens), wrong.new_cache(len(tokens)), all_logits=True)
    assert np.abs(logits - tm.ref["logits_llamacpp"]).max() > 50 * REF_TOL


def test_value_head_order_follows_the_architecture(tiny_model: Callable) -> None:
    assert _load(tiny_model, "qwen35").config.ext.gdn.v_head_order == "tiled"
    assert _load(tiny_model, "qwen3next").config.ext.gdn.v_head_order == "grouped"
    assert gdn_mod.key_head_of_value_head(_load(tiny_model, "qwen35").config.ext.gdn).tolist() == [
        0,
        1,
        0,
        1,
    ]
    assert gdn_mod.key_head_of_value_head(
        _load(tiny_model, "qwen3next").config.ext.gdn
    ).tolist() == [
        0,
        0,
        1,
        1,
    ]


def test_hf_norm_topk_prob_false_is_carried(tiny_model: Callable, tmp_path: Path) -> None:
    """transformers renormalizes the top-k router weights only with norm_topk_prob."""
    src = tiny_model("qwen3next").hf_dir
    dst = tmp_path / "hf"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["norm_topk_prob"] = False
    (dst / "config.json").write_text(json.dumps(cfg))
    assert config_from_checkpoint(open_checkpoint(src)).ext.moe.norm_topk is True
    assert config_from_checkpoint(open_checkpoint(dst)).ext.moe.norm_topk is False


def test_hf_qwen3_5_ignores_the_vision_tower_with_a_note(tiny_model: Callable) -> None:
    ckpt = open_checkpoint(tiny_model("qwen35_vl").hf_dir)
    assert any("vision" in n for n in ckpt.notes), ckpt.notes
    assert not any("visual" in n for n in ckpt.tensors.names())


def test_imrope_sections_that_need_a_fourth_position_are_refused(tiny_model: Callable) -> None:
    ckpt = open_checkpoint(tiny_model("qwen35").gguf)
    # 3 sectors, repeating: pair 2 falls in sector 2, which has no (width) section.
    ckpt.metadata["qwen35.rope.dimension_sections"] = [1, 1, 0, 1]
    with pytest.raises(FrinkError, match="dimension_sections"):
        config_from_checkpoint(ckpt)


# --- what a user sees ----------------------------------------------------------------------------


def test_layer_pattern_and_recurrent_state_size(tiny_model: Callable) -> None:
    q35, q3n = _load(tiny_model, "qwen35").config, _load(tiny_model, "qwen3next").config
    assert q35.layer_pattern() == "GDN x3 ATTN x1 (x2)"
    assert q3n.layer_pattern() == "GDN x2 ATTN x1 (x2)"  # from the GGUF's recurrent_layers
    assert [q3n.layer_shape(i).ffn for i in range(q3n.n_layer)] == ["moe"] * 6
    # Per GDN layer: (kernel - 1) x (2*2*16 + 4*16) conv tail + 4 x 16 x 16 delta state, f32.
    assert q35.recurrent_state_bytes() == 6 * 4 * (3 * 128 + 4 * 16 * 16)
    assert q3n.recurrent_state_bytes() == 4 * 4 * (3 * 128 + 4 * 16 * 16)


def test_info_shows_the_pattern_and_state_size(tiny_model: Callable) -> None:
    result = frink("info", tiny_model("qwen3next").gguf)
    assert result.returncode == 0, result.describe()
    assert "GDN x2 ATTN x1 (x2)" in result.stdout
    assert "22.0 KiB state per sequence" in result.stdout
    assert "experts:        4, top 2" in result.stdout
    data = json.loads(frink("info", tiny_model("qwen35").hf_dir, "--json").stdout)
    assert data["layer_pattern"] == "GDN x3 ATTN x1 (x2)"
    assert data["recurrent_state_bytes"] == 6 * 4 * (3 * 128 + 4 * 16 * 16)
    assert [entry["mixer"] for entry in data["layers"]][:4] == ["gdn", "gdn", "gdn", "attention"]
