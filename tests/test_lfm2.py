"""Liquid LFM2 (`lfm2`: Lfm2ForCausalLM) and LFM2-MoE (`lfm2moe`) against transformers and
llama.cpp.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: LFM2 brings a third recurrent mixer, the gated short convolution (in_proj -> B, C, x;
y = C * conv(B * x), a causal depthwise conv without bias; out_proj), whose state is the
conv tail alone, mixed with attention layers that norm each query and key head (RMSNorm).
Which layers are convs is the GGUF's per-layer head_count_kv (0: a conv layer), and the
final norm is stored as token_embd_norm. LFM2-MoE adds a sigmoid router whose expert bias
moves the selection but not the weights, after a few dense FFN layers.

What is checked: frink from the GGUF (llama.cpp's own converter) and from the HF dir,
batched and one row at a time, against transformers' and llama.cpp's logits (the fixture's
80 tokens cross metal's 64-row recurrent prefill chunk); the prompt + 24 greedy decode
steps against llama.cpp's; the whole model, conv tails included, against a float64
per-token loop written here from the block formulas (not frink's code); prefill split
anywhere against stepping; the HF reader gives exactly the converter's tensors and
metadata; a cache holding short-conv state refuses truncation and a failed step leaves
it untouched; each piece matters (QK norm, the conv, the expert bias, the sigmoid gating);
`metal` (MLX's CPU device on Linux) with the device having run every layer, one submission
per decode token, its conv tails the host's; `cuda` refuses the mixer by name.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fixture_copies import copy_gguf, copy_hf_dir
from frink_subprocess import frink
from model_checks import (
    REF_TOL,
    _against_references,
    _assert_device_ran,
    _compare,
    _last_logits,
    _max_diff,
    _path,
    _split_against_stepped,
    _tokens,
    q8_0_requant,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.errors import FrinkError

NAMES = ("lfm2", "lfm2moe")
D, N_HEAD, N_KV, HEAD_DIM, L_CACHE = 64, 4, 2, 16, 3
# The fixtures' layer kinds (scripts/make_tiny_models.py): True = a short conv.
CONV = {
    "lfm2": (True, False, True, True, False, True),
    "lfm2moe": (True, True, False, True, False, True),
}
PATTERN = {
    "lfm2": "CONV x1 ATTN x1 CONV x2 ATTN x1 CONV x1",
    "lfm2moe": "CONV x2 ATTN x1 CONV x1 ATTN x1 CONV x1",
}
N_FF = {"lfm2": 160, "lfm2moe": 128}  # lfm2's: int(2 * 200 / 3) = 133 rounded up to 32s
N_DENSE, N_EXPERT, TOP_K, FF_EXP = 2, 8, 3, 32


# --- the fixtures themselves ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_the_converter_wrote_lfm2(name: str, tiny_model: Callable) -> None:
    """What llama.cpp's converter makes of Lfm2ForCausalLM / Lfm2MoeForCausalLM: head_count_kv
    per layer (0 for a conv layer), the shortconv.* tensors on conv layers, the QK norms on
    attention layers, the final norm as token_embd_norm, the expert bias as exp_probs_b."""
    ckpt = open_checkpoint(_path(tiny_model, name, "gguf"))
    md = ckpt.metadata
    assert md["general.architecture"] == name
    kv = [int(v) for v in md[f"{name}.attention.head_count_kv"]]
    assert kv == [0 if c else N_KV for c in CONV[name]]
    assert md[f"{name}.shortconv.l_cache"] == L_CACHE
    names = set(ckpt.tensors.names())
    assert "token_embd_norm.weight" in names and "output_norm.weight" not in names
    assert "output.weight" not in names  # tied
    for i, conv in enumerate(CONV[name]):
        have = {n.removeprefix(f"blk.{i}.") for n in names if n.startswith(f"blk.{i}.")}
        mixer = (
            {"shortconv.in_proj.weight", "shortconv.conv.weight", "shortconv.out_proj.weight"}
            if conv
            else {f"attn_{x}.weight" for x in ("q", "k", "v", "output", "q_norm", "k_norm")}
        )
        routed = name == "lfm2moe" and i >= N_DENSE
        ffn = (
            {"ffn_gate_inp.weight", "exp_probs_b.bias"}
            | {f"ffn_{x}_exps.weight" for x in ("gate", "up", "down")}
            if routed
            else {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}
        )
        want = mixer | ffn | {"attn_norm.weight", "ffn_norm.weight"}
        assert have == want, (i, sorted(have ^ want))
    if name == "lfm2moe":
        assert md["lfm2moe.expert_gating_func"] == 2  # sigmoid
        assert md["lfm2moe.leading_dense_block_count"] == N_DENSE


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_config_and_layer_shape(name: str, tiny_model: Callable) -> None:
    """Both sources give the same ModelConfig: the conv layers from head_count_kv, the
    attention layers with QK norms, the final norm's tensor, the router's decorations."""
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "hf")))
    assert hf == gg
    sc = gg.ext.shortconv
    assert sc is not None and sc.layers == CONV[name] and sc.conv_kernel == L_CACHE
    assert (gg.n_head, gg.n_head_kv, gg.head_dim_k, gg.n_ff) == (N_HEAD, N_KV, HEAD_DIM, N_FF[name])
    assert gg.rope_type == "neox" and gg.ext.qk_norm
    assert gg.ext.output_norm_tensor == "token_embd_norm"
    assert {"shortconv", "qk_norm", "output_norm_tensor"} <= gg.features()
    for i, conv in enumerate(CONV[name]):
        shape = gg.layer_shape(i)
        routed = name == "lfm2moe" and i >= N_DENSE
        assert shape.mixer == ("shortconv" if conv else "attention")
        assert shape.n_head_kv == (0 if conv else N_KV)
        assert shape.ffn == ("moe" if routed else "dense")
        assert gg.is_recurrent(i) == conv
        if conv:
            assert gg.recurrent_shapes(i) == ((L_CACHE - 1, D), (0,))
    assert gg.layer_pattern() == PATTERN[name]
    assert gg.recurrent_state_bytes() == 4 * (L_CACHE - 1) * D * sum(CONV[name])
    if name == "lfm2moe":
        moe = gg.ext.moe
        assert moe is not None
        assert (moe.n_expert, moe.n_expert_used, moe.n_ff_exp) == (N_EXPERT, TOP_K, FF_EXP)
        assert (moe.gating, moe.expert_bias, moe.norm_topk, moe.weights_scale) == (
            "sigmoid",
            True,
            True,
            1.0,
        )
    else:
        assert gg.ext.moe is None


def test_info_shows_the_model(tiny_model: Callable) -> None:
    """`frink info`: the conv / attention pattern, the short conv's size and state, the
    router; metal takes every layer, cuda refuses the conv layers by the mixer's name."""
    result = frink("info", _path(tiny_model, "lfm2moe", "gguf"), "--backend", "metal")
    assert result.returncode == 0, result.describe()
    out = result.stdout
    assert f"layers:         6 ({PATTERN['lfm2moe']})" in out
    assert "short conv:     4 layers, conv 3 over 64" in out
    assert "2.0 KiB state per sequence (f32 conv tail)" in out  # 4 x 4 x (2 x 64)
    assert "experts:        8, top 3, expert ffn 32, sigmoid router + expert bias" in out
    assert "blk.0   shortconv (conv 3) + dense ffn 128  [metal]" in out
    assert "blk.2   attention (4q/2kv x 16, rope 1e+06) + moe ffn 8x32  [metal]" in out
    assert "metal takes 6 of 6 layers" in out
    cuda = frink("info", _path(tiny_model, "lfm2", "gguf"), "--backend", "cuda", "--json")
    data = json.loads(cuda.stdout)
    refusals = [e["refusal"] for e in data["layers"]]
    assert [r is not None and "causal_conv: not implemented" in r for r in refusals] == list(
        CONV["lfm2"]
    )
    assert [r is None for r in refusals] == [not c for c in CONV["lfm2"]]
    assert data["shortconv"] == {"layers": 4, "conv_kernel": 3}


# --- the whole model in float64, one token at a time ----------------------------------------------


def _formula_loop(
    name: str, tiny_model: Callable, tokens: list[int]
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """LFM2 from the GGUF's tensors and the block formulas, one token at a time in float64:
    per layer r += mixer(rms(r) w_op), then r += ffn(rms(r) w_ffn); the short conv
    B, C, x = W_in u, y = C * sum_k w_k (B x)_{t-L+1+k}, W_out y; attention with per-head
    RMS-normed q and k, NeoX rope, GQA; SwiGLU, or the sigmoid router (top k of sigmoid(l) +
    bias, weights sigmoid(l) renormalized). Returns (last logits, per conv layer: the last
    L-1 rows of B x)."""
    ckpt = open_checkpoint(_path(tiny_model, name, "gguf"))
    md = ckpt.metadata
    eps = float(md[f"{name}.attention.layer_norm_rms_epsilon"])
    base = float(md[f"{name}.rope.freq_base"])

    def t(n: str) -> np.ndarray:
        return ckpt.tensors.load(n).astype(np.float64)

    def rms(v: np.ndarray, w: np.ndarray) -> np.ndarray:
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * w

    def silu(v: np.ndarray) -> np.ndarray:
        return v / (1.0 + np.exp(-v))

    def rope(v: np.ndarray, pos: int) -> np.ndarray:  # [heads, hd], NeoX halves
        half = HEAD_DIM // 2
        ang = pos * base ** (-np.arange(half) * 2.0 / HEAD_DIM)
        a, b = v[:, :half], v[:, half:]
        return np.concatenate(
            [a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1
        )

    names = set(ckpt.tensors.names())
    emb = t("token_embd.weight")
    n_layer = len(CONV[name])
    W = [
        {n.removeprefix(f"blk.{i}."): t(n) for n in names if n.startswith(f"blk.{i}.")}
        for i in range(n_layer)
    ]
    history = {i: np.zeros((L_CACHE - 1, D)) for i in range(n_layer) if CONV[name][i]}
    keys: dict[int, list[np.ndarray]] = {i: [] for i in range(n_layer)}
    values: dict[int, list[np.ndarray]] = {i: [] for i in range(n_layer)}
    logits = np.zeros(0)
    for pos, tok in enumerate(tokens):
        r = emb[tok].copy()
        for i, w in enumerate(W):
            u = rms(r, w["attn_norm.weight"])
            if CONV[name][i]:
                bcx = w["shortconv.in_proj.weight"] @ u
                b, c, x = bcx[:D], bcx[D : 2 * D], bcx[2 * D :]
                window = np.vstack([history[i], b * x])  # [L, d], oldest first
                history[i] = window[1:]
                conv = (window * w["shortconv.conv.weight"].T).sum(0)
                r = r + w["shortconv.out_proj.weight"] @ (c * conv)
            else:
                q = rms((w["attn_q.weight"] @ u).reshape(N_HEAD, HEAD_DIM), w["attn_q_norm.weight"])
                k = rms((w["attn_k.weight"] @ u).reshape(N_KV, HEAD_DIM), w["attn_k_norm.weight"])
                v = (w["attn_v.weight"] @ u).reshape(N_KV, HEAD_DIM)
                keys[i].append(rope(k, pos))
                values[i].append(v)
                q = rope(q, pos)
                K, V = np.stack(keys[i]), np.stack(values[i])  # [S, Hkv, hd]
                o = []
                for h in range(N_HEAD):
                    g = h // (N_HEAD // N_KV)
                    s = K[:, g] @ q[h] / np.sqrt(HEAD_DIM)
                    p = np.exp(s - s.max())
                    o.append((p / p.sum()) @ V[:, g])
                r = r + w["attn_output.weight"] @ np.concatenate(o)
            u = rms(r, w["ffn_norm.weight"])
            if "ffn_gate_inp.weight" in w:
                prob = 1.0 / (1.0 + np.exp(-(w["ffn_gate_inp.weight"] @ u)))
                ids = np.argsort(-(prob + w["exp_probs_b.bias"]))[:TOP_K]
                wts = prob[ids] / prob[ids].sum()
                f = np.zeros(D)
                for e, we in zip(ids, wts):
                    gate = w["ffn_gate_exps.weight"][e] @ u
                    up = w["ffn_up_exps.weight"][e] @ u
                    f += we * (w["ffn_down_exps.weight"][e] @ (silu(gate) * up))
            else:
                gate, up = w["ffn_gate.weight"] @ u, w["ffn_up.weight"] @ u
                f = w["ffn_down.weight"] @ (silu(gate) * up)
            r = r + f
        logits = emb @ rms(r, t("token_embd_norm.weight"))
    return logits, history


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("name", NAMES)
def test_state_after_a_prompt_matches_the_formula_loop(
    name: str, step: bool, tiny_model: Callable
) -> None:
    tokens = _tokens(tiny_model, name)[:20]
    want_logits, want_conv = _formula_loop(name, tiny_model, tokens)
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    last, cache = _last_logits(m, tokens, 32, step)
    assert np.max(np.abs(last - want_logits)) <= 1e-4
    for i, conv in enumerate(cache.conv_state):
        if not CONV[name][i]:
            assert conv is None
            continue
        assert conv is not None and conv.shape == (L_CACHE - 1, D)
        np.testing.assert_allclose(conv, want_conv[i], rtol=0, atol=1e-5)
        assert np.abs(conv).max() > 1e-2  # a state that carries something


@pytest.mark.parametrize("name", NAMES)
def test_prefill_is_exact_against_stepping(name: str, tiny_model: Callable) -> None:
    """A prefill split anywhere (shorter than the conv's tail too), then decode rows, gives
    the logits and conv tails of the same tokens stepped one at a time."""
    m = frink_cli.load(_path(tiny_model, name, "gguf"))
    tokens = _tokens(tiny_model, name)
    got, want, split, stepped = _split_against_stepped(m, tokens, (13, 14, 60))
    assert _max_diff(got, want) <= 1e-4
    for a, b in zip(split.conv_state, stepped.conv_state):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_hf_conv_bias_is_refused_by_name(tiny_model: Callable, tmp_path: Path) -> None:
    """Short-conv biases (HF conv_bias) are in no llama.cpp lfm2 graph: refused."""
    with pytest.raises(FrinkError, match="conv_bias"):
        frink_cli.load(
            copy_hf_dir(_path(tiny_model, "lfm2", "hf"), tmp_path / "hf", conv_bias=True)
        )


def test_hf_without_expert_bias_is_refused_by_name(tiny_model: Callable, tmp_path: Path) -> None:
    """llama.cpp's lfm2moe requires the expert bias: a config without it is refused."""
    with pytest.raises(FrinkError, match="use_expert_bias"):
        frink_cli.load(
            copy_hf_dir(_path(tiny_model, "lfm2moe", "hf"), tmp_path / "hf", use_expert_bias=False)
        )


def test_hf_router_options_are_carried(tiny_model: Callable, tmp_path: Path) -> None:
    """norm_topk_prob and routed_scaling_factor, which transformers honours, reach the
    router as expert_weights_norm / expert_weights_scale."""
    src = _path(tiny_model, "lfm2moe", "hf")
    hf = copy_hf_dir(src, tmp_path / "hf", norm_topk_prob=False, routed_scaling_factor=2.5)
    moe = config_from_checkpoint(open_checkpoint(hf)).ext.moe
    assert moe is not None and not moe.norm_topk and moe.weights_scale == 2.5


def test_hf_released_config_spellings(tiny_model: Callable, tmp_path: Path) -> None:
    """Released LFM2 configs spell things their own way: the attention layers in
    full_attn_idxs only, tie_embedding, block_ff_dim (transformers' aliases). Read alike."""
    hf = tmp_path / "hf"
    shutil.copytree(_path(tiny_model, "lfm2", "hf"), hf)
    cfg = json.loads((hf / "config.json").read_text())
    for key in ("layer_types", "tie_word_embeddings", "intermediate_size"):
        cfg.pop(key)
    cfg.update(full_attn_idxs=[1, 4], tie_embedding=True, block_ff_dim=200)
    (hf / "config.json").write_text(json.dumps(cfg))
    gguf = config_from_checkpoint(open_checkpoint(_path(tiny_model, "lfm2", "gguf")))
    assert config_from_checkpoint(open_checkpoint(hf)) == gguf


@pytest.mark.parametrize(
    ("name", "key", "value", "vtype", "match"),
    [
        ("lfm2", "attention.sliding_window", 8, "UINT32", "sliding window"),
        ("lfm2", "attention.causal", False, "BOOL", "non-causal"),
        ("lfm2moe", "expert_gating_func", 3, "UINT32", "expert_gating_func 3"),
    ],
    ids=["sliding-window", "non-causal", "gating-3"],
)
def test_what_lfm2_files_may_say_but_frink_refuses(
    name: str, key: str, value: object, vtype: str, match: str, tiny_model: Callable, tmp_path: Path
) -> None:
    """llama.cpp's other LFM2 graphs (the audio tokenizer's sliding window, the
    bidirectional embedding model) and gating functions frink lacks: refused by name."""
    src = _path(tiny_model, name, "gguf")
    path = copy_gguf(src, tmp_path / "m.gguf", {f"{name}.{key}": (value, vtype)})
    with pytest.raises(FrinkError, match=match):
        frink_cli.load(path)


# --- cuda: the mixer refused by name --------------------------------------------------------------


def test_cuda_refuses_the_short_conv_by_name(
    tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cuda stack carries no short-conv primitive: each conv layer is refused by the
    mixer's name (the MoE layers by theirs) and the host body runs them, still matching both
    references."""
    from frink_cli.backends.cupy.eligibility import MOE, layer_reasons

    for name in NAMES:
        cfg = config_from_checkpoint(open_checkpoint(_path(tiny_model, name, "gguf")))
        for i, conv in enumerate(CONV[name]):
            reasons = layer_reasons(cfg, i)
            assert ("causal_conv: not implemented" in reasons) == conv, (name, i, reasons)
            assert (MOE in reasons) == (name == "lfm2moe" and i >= N_DENSE), (name, i, reasons)
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    m = frink_cli.load(_path(tiny_model, "lfm2", "gguf"), backend="cuda")
    got = m.logits(_tokens(tiny_model, "lfm2"))
    _against_references(got, tiny_model("lfm2").ref, "lfm2 cuda (conv layers on the host)")
    assert "causal_conv: not implemented" in m.decoder.backend.ledger.refusals


# --- quantized: Q8_0 matrices (llama.cpp's quantizer) ---------------------------------------------

# Top-2 margin of llama.cpp's quantized run from which its argmax is compared. Its 8-bit
# activations move these logits by up to 0.25 (lfm2; lfm2moe: 0.9, where one flips a close
# router choice), mostly by hundredths: most positions keep a margin above this.
_Q8_MARGIN = 0.1


@pytest.fixture(scope="module", params=NAMES)
def q8(request: pytest.FixtureRequest, tiny_model: Callable) -> tuple[str, Path, dict]:
    """A fixture quantized to Q8_0 by llama.cpp (the projections, expert stacks and the
    embedding; the conv taps and vectors stay F32), and llama.cpp's logits on it and on its
    own F32 requant of it (cached beside the tiny models)."""
    name = request.param
    return (name, *q8_0_requant(tiny_model, name))


@pytest.mark.parametrize("backend", ["numpy", "metal"])
@pytest.mark.usefixtures("exact_activations")  # against llama.cpp in f32 on the same weights
def test_q8_0_agrees_with_llama_cpp(
    backend: str, q8: tuple[str, Path, dict], tiny_model: Callable
) -> None:
    """On the Q8_0 file: llama.cpp's logits on the same weights in f32 at the parity bar,
    and its own quantized run's argmax wherever that run's top two are clearly apart (it
    rounds activations to 8 bits before each Q8_0 matmul, which frink does not: its logits
    move by a few hundredths, past these fixtures' narrowest margins). metal multiplies the
    file's own Q8_0 blocks."""
    if backend == "metal":
        pytest.importorskip("mlx.core")
    name, path, ref = q8
    ckpt = open_checkpoint(path)
    assert ckpt.tensors.info("blk.0.shortconv.in_proj.weight").dtype == "Q8_0"
    m = frink_cli.load(path, backend=backend)
    got = m.logits(_tokens(tiny_model, name))
    _compare(got, ref["f32"], REF_TOL, f"{name} Q8_0 {backend} vs llama.cpp (f32 requant)")
    top2 = np.sort(ref["quantized"], axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > _Q8_MARGIN
    assert clear.mean() > 0.5, "too few clear positions to judge"
    # Where llama.cpp's 8-bit activations flip a routing decision (lfm2moe), its quantized
    # run leaves its own f32 run even at a clear margin: frink must agree with it wherever
    # llama.cpp's two runs agree, and as often overall.
    top = ref["quantized"].argmax(-1)
    own = ref["f32"].argmax(-1) == top
    agree = got.argmax(-1) == top
    assert agree[clear & own].all(), np.nonzero(~agree & clear & own)[0].tolist()
    assert agree[clear].sum() >= own[clear].sum()
    if backend == "metal":
        _assert_device_ran(m, f"{name} Q8_0 metal")
        tensors = m.decoder.backend.resident[0].shortconv
        assert tensors.in_proj.scales is not None  # held in the file's own blocks
