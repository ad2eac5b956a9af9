"""OpenELM (`openelm`) and DeciLM (`deci`) against llama.cpp, on numpy, metal and cuda.

Why: both give every layer its own sizes (ModelConfig.layer_sizes, read by every
per-layer reader through layer_shape(l): the composition, the weights, the KV slots, the
MLX mirrors), and deci adds layers without attention (mixer "none"), with wo alone
(mixer "linear") and without an FFN (ffn "none"). transformers has neither (remote code),
so the reference is llama.cpp alone: the fixtures (scripts/make_tiny_per_layer.py) are
tiny random GGUFs written with gguf-py in llama.cpp's layout (array-valued head counts and
FFN widths, as its converters write them), and llama.cpp's own logits for them (an f32
KV cache; a batch, and a greedy decode one token at a time).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_checks import (
    FAR,
    REF_TOL,
    SELF_TOL,
    _assert_device_ran,
    _assert_greedy_matches_llamacpp,
    _assert_one_submission_per_token,
    _compare,
    _decode_after_prefill,
    configured,
    cuda_models,
    prefill_prefix_decode,
)
from script_loader import load_script

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError

load_script("make_tiny_models")  # make_tiny_per_layer imports it as a sibling
_maker = load_script("make_tiny_per_layer")
ARCHS = ("openelm", "deci")
# The layer kinds each fixture's layers are, as layer_shape names them.
KINDS = {
    "openelm": [("attention", "dense")] * 4,
    "deci": [
        ("attention", "dense"),
        ("linear", "dense"),
        ("none", "dense"),
        ("none", "none"),
        ("attention", "dense"),
        ("attention", "dense"),
    ],
}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """Per arch: (the GGUF, llama.cpp's reference) -- made in a few seconds each."""
    out = {}
    for arch in ARCHS:
        d = tmp_path_factory.mktemp(arch)
        out[arch] = (d / "model.gguf", _maker.make(arch, d))
    return out


def _tokens(ref: dict[str, np.ndarray]) -> list[int]:
    return [int(t) for t in ref["tokens"]]


def _against_llamacpp(got: np.ndarray, ref: dict[str, np.ndarray], what: str) -> None:
    _compare(got, ref["logits_llamacpp"], REF_TOL, what)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_fixture_is_llama_cpps(arch: str, made: Any) -> None:
    """llama.cpp loaded each file as its arch, per-layer arrays and all, and its logits
    separate their top two."""
    path, ref = made[arch]
    md = open_checkpoint(path).metadata
    assert md["general.architecture"] == arch
    layers = _maker.LAYERS[arch]
    assert list(md[f"{arch}.attention.head_count"]) == [h for h, _, _ in layers]
    assert list(md[f"{arch}.attention.head_count_kv"]) == [k for _, k, _ in layers]
    assert list(md[f"{arch}.feed_forward_length"]) == [f for _, _, f in layers]
    lg = ref["logits_llamacpp"]
    assert lg.shape == (len(ref["tokens"]), _maker.N_VOCAB) and lg.std() > 1.0


@pytest.mark.parametrize("arch", ARCHS)
def test_layer_shape_says_each_layers_sizes(arch: str, made: Any) -> None:
    cfg = config_from_checkpoint(open_checkpoint(made[arch][0]))
    assert "layer_sizes" in cfg.features()
    layers = _maker.LAYERS[arch]
    for i, ((h, kv, ff), (mixer, ffn)) in enumerate(zip(layers, KINDS[arch])):
        s = cfg.layer_shape(i)
        assert (s.mixer, s.ffn, s.n_head, s.n_head_kv, s.n_ff) == (mixer, ffn, h, kv, ff), i
    # The model-wide sizes are the largest, so anything sized from them fits every layer.
    assert cfg.n_head == max(h for h, _, _ in layers)
    assert cfg.n_head_kv == max(k for _, k, _ in layers)
    assert cfg.n_ff == max(f for _, _, f in layers)


def test_layer_pattern_and_info_show_the_shapes(made: Any) -> None:
    from frink_cli.report import describe

    cfg = config_from_checkpoint(open_checkpoint(made["deci"][0]))
    assert cfg.layer_pattern() == (
        "ATTN 4/2 ff128 x1 LINEAR ff96 x1 NONE ff160 x1 NONE ff0 x1 ATTN 4/4 ff64 x1 "
        "ATTN 4/1 ff128 x1"
    )
    d = describe(made["openelm"][0])
    assert d["per_layer_sizes"] and d["layer_pattern"].startswith("ATTN 4/1 ff96 x1")
    got = [(s["n_head"], s["n_head_kv"], s["n_ff"]) for s in d["layers"]]
    assert got == list(_maker.OPENELM_LAYERS)


def test_uniform_sizes_are_no_feature(tmp_path: Path) -> None:
    """A deci file whose layers are all alike is a llama stack: no layer_sizes, so no new
    feature for a backend to refuse (the cuda stack carries it)."""
    from frink_cli.backends.cupy import eligibility

    path = _maker.write("deci", tmp_path / "m.gguf", layers=((4, 2, 128), (4, 2, 128)))
    cfg = config_from_checkpoint(open_checkpoint(path))
    assert cfg.layer_sizes is None and "layer_sizes" not in cfg.features()
    assert (cfg.n_head, cfg.n_head_kv, cfg.n_ff) == (4, 2, 128)
    assert eligibility.layer_reasons(cfg, 0) == []


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_slots_are_sized_per_layer(arch: str, made: Any) -> None:
    """Each layer's cache holds its own KV heads; a layer that attends to nothing, none."""
    path, ref = made[arch]
    dec = frink_cli.load(path).decoder
    cache = dec.new_cache(16)
    dec.step(np.asarray(_tokens(ref)[:5]), cache)
    for i, (_, kv, _) in enumerate(_maker.LAYERS[arch]):
        assert cache.k[i].shape[0] == kv and cache.v[i].shape[0] == kv, i


# --- the host body (numpy) ------------------------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("arch", ARCHS)
def test_numpy_matches_llamacpp(arch: str, step: bool, made: Any) -> None:
    path, ref = made[arch]
    got = frink_cli.load(path).logits(_tokens(ref), step=step)
    _against_llamacpp(got, ref, f"{arch} numpy({'step' if step else 'batch'})")


@pytest.mark.parametrize("arch", ARCHS)
def test_numpy_decode_after_prefill_matches_llamacpp(arch: str, made: Any) -> None:
    path, ref = made[arch]
    m = frink_cli.load(path)
    _assert_greedy_matches_llamacpp(m, ref, "decode")


# --- every new piece matters ----------------------------------------------------------------------


def _sizes_changed(cfg: Any, layer: int, **what: int) -> Any:
    """cfg with layer `layer`'s entries of layer_sizes replaced (n_head=, n_head_kv=, n_ff=)."""
    s = cfg.layer_sizes
    new = {}
    for name in ("n_head", "n_head_kv", "n_ff"):
        vals = list(getattr(s, name))
        if name in what:
            vals[layer] = what[name]
        new[name] = tuple(vals)
    return dataclasses.replace(cfg, layer_sizes=dataclasses.replace(s, **new))


# arch, name -> (ModelConfig change, per-layer weight changes {layer: fields}).
VARIANTS: dict[str, tuple[str, Any, dict[int, dict[str, Any]]]] = {
    # openelm's per-head Q and K norms.
    "openelm: no QK norms": (
        "openelm",
        lambda c: configured(c, qk_norm=False),
        {i: {"q_norm": None, "k_norm": None} for i in range(4)},
    ),
    # deci's linear-attention layer (wo on the normed input) dropped: the layer as a
    # plain attention-free one.
    "deci: linear attention dropped": (
        "deci",
        lambda c: _sizes_changed(c, 1, n_head=0, n_head_kv=0),
        {1: {"attn_norm": None}},
    ),
    # deci's attention-free layer 2 given no FFN either: its FFN matters.
    "deci: attention-free layer's FFN dropped": (
        "deci",
        lambda c: _sizes_changed(c, 2, n_ff=0),
        {2: {"ffn_norm": None, "gate_up": None, "down": None}},
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_piece_moves_the_graph(variant: str, made: Any) -> None:
    arch, change, weight_changes = VARIANTS[variant]
    path, ref = made[arch]
    m = frink_cli.load(path)
    w = m.decoder.host.w
    layers = list(w.layers)
    for i, fields in weight_changes.items():
        layers[i] = dataclasses.replace(layers[i], **fields)
    off = Decoder(change(m.config), dataclasses.replace(w, layers=layers))
    tokens = np.asarray(_tokens(ref))
    got = off.step(tokens, off.new_cache(len(tokens)), all_logits=True)
    diff = float(np.max(np.abs(got - ref["logits_llamacpp"])))
    assert diff > FAR, f"{variant} still matches llama.cpp ({diff:.3g})"


# --- bad files ------------------------------------------------------------------------------------


def test_deci_ffn_free_layer_with_attention_is_refused(tmp_path: Path) -> None:
    """llama.cpp discards such a layer's output, the original model adds it: refused."""
    layers = ((4, 2, 128), (4, 2, 0), (4, 1, 128))
    bad = _maker.write("deci", tmp_path / "m.gguf", layers=layers)
    with pytest.raises(FrinkError, match="layer 1 has attention but no FFN"):
        frink_cli.load(bad)


def test_deci_biases_are_refused(tmp_path: Path) -> None:
    extra = {"blk.0.ffn_down.bias": np.zeros(_maker.N_EMBD, np.float32)}
    bad = _maker.write("deci", tmp_path / "m.gguf", extra=extra)
    with pytest.raises(FrinkError, match="bias tensors are not supported"):
        frink_cli.load(bad)


def test_openelm_own_output_head_is_refused(tmp_path: Path) -> None:
    extra = {"output.weight": np.zeros((_maker.N_VOCAB, _maker.N_EMBD), np.float32)}
    bad = _maker.write("openelm", tmp_path / "m.gguf", extra=extra)
    with pytest.raises(FrinkError, match="output head is its token_embd"):
        frink_cli.load(bad)


def test_openelm_layer_without_heads_is_refused(tmp_path: Path) -> None:
    layers = ((4, 1, 96), (0, 0, 128))
    bad = _maker.write("openelm", tmp_path / "m.gguf", layers=layers)
    with pytest.raises(FrinkError, match="layer 1 has 0 query / 0 KV heads"):
        frink_cli.load(bad)


def test_a_short_per_layer_array_is_refused(tmp_path: Path) -> None:
    bad = _maker.write("openelm", tmp_path / "m.gguf", head_count_kv=[1, 2, 3])
    with pytest.raises(FrinkError, match="head_count_kv has 3 entries for 4 layers"):
        frink_cli.load(bad)


def test_kv_heads_not_dividing_the_heads_are_refused(tmp_path: Path) -> None:
    bad = _maker.write("openelm", tmp_path / "m.gguf", head_count_kv=[1, 3, 3, 2])
    with pytest.raises(FrinkError, match="bad head counts in layer 1"):
        frink_cli.load(bad)


def test_the_cli_refuses_in_one_line(tmp_path: Path) -> None:
    from frink_subprocess import assert_error, frink

    layers = ((4, 2, 128), (4, 2, 0))
    bad = _maker.write("deci", tmp_path / "m.gguf", layers=layers)
    assert_error(frink("info", bad), "layer 1 has attention but no FFN")


# --- metal (MLX; its CPU device on Linux) ---------------------------------------------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("arch", ARCHS)
def test_metal_matches_llamacpp(arch: str, step: bool, made: Any) -> None:
    pytest.importorskip("mlx.core")
    path, ref = made[arch]
    m = frink_cli.load(path, backend="metal")
    assert m.backend_name == "metal"
    got = m.logits(_tokens(ref), step=step)
    _against_llamacpp(got, ref, f"{arch} metal({'step' if step else 'batch'})")
    _assert_device_ran(m, f"{arch} metal")


@pytest.mark.parametrize("arch", ARCHS)
def test_metal_decode_after_prefill_matches_llamacpp(arch: str, made: Any) -> None:
    pytest.importorskip("mlx.core")
    path, ref = made[arch]
    m = frink_cli.load(path, backend="metal")
    _compare(_decode_after_prefill(m, ref), ref["greedy_logits_llamacpp"], REF_TOL, "metal decode")
    _assert_device_ran(m, f"{arch} metal")


@pytest.mark.parametrize("arch", ARCHS)
def test_metal_one_submission_per_decode_token(arch: str, made: Any) -> None:
    pytest.importorskip("mlx.core")
    m = frink_cli.load(made[arch][0], backend="metal")
    _assert_one_submission_per_token(m)


def test_metal_split_runs_hand_over_per_layer_caches(made: Any) -> None:
    """deci's layers split between the device and the host body (the linear and no-op
    layers on the host): the KV slots of both sides stay sized per layer."""
    pytest.importorskip("mlx.core")
    path, ref = made["deci"]
    m = frink_cli.load(path, backend="metal")
    backend = m.decoder.backend
    plan = backend.plan
    backend.plan = lambda kind, layer, *a, **k: (  # type: ignore[method-assign]
        None if layer in (1, 3) else plan(kind, layer, *a, **k)
    )
    try:
        got = m.logits(_tokens(ref), step=True)
    finally:
        backend.plan = plan  # type: ignore[method-assign]
    _against_llamacpp(got, ref, "deci metal split")
    assert backend.ledger.total() > 0 and not backend.ledger.failures


# --- cuda: NumPy standing in for CuPy, and the kernels on the CPU emulator -----------------------


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_standing_in_matches_llamacpp(
    arch: str, step: bool, made: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load(path, backend="cuda")` with NumPy for CuPy: the stack carries per-layer sizes
    (every openelm layer; deci's attention layers) and refuses deci's other layers by
    their names, which the host body then runs; llama.cpp's logits either way."""
    from frink_cli.backends.cupy import eligibility

    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    path, ref = made[arch]
    m = frink_cli.load(path, backend="cuda")
    assert m.backend_name == "cuda"
    got = m.logits(_tokens(ref), step=step)
    _against_llamacpp(got, ref, f"{arch} cuda-numpy({'step' if step else 'batch'})")
    ledger = m.decoder.backend.ledger
    assert ledger.total() > 0 and not ledger.failures, dict(ledger.failures)
    refused = {i: eligibility.layer_refusal(m.config, i) for i in range(m.config.n_layer)}
    if arch == "openelm":
        assert not ledger.refusals and set(refused.values()) == {None}
    else:
        assert refused == {
            0: None,
            1: eligibility.NO_KV_ROWS,
            2: eligibility.NO_KV_ROWS,
            3: eligibility.NO_KV_ROWS,
            4: None,
            5: None,
        }
        # Layer 3 has neither branch: no call at all, and no K/V rows for the stack.
        assert eligibility.layer_reasons(m.config, 3) == [eligibility.NO_KV_ROWS]
        assert set(ledger.refusals) == {eligibility.NO_KV_ROWS}


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_emulated_kernel_stack_equals_host_body(
    arch: str,
    made: Any,
    emulated_launcher: Any,
) -> None:
    """kernels/*.cu on the CPU emulator, each layer's own KV heads in the device cache: the
    host body's logits, and llama.cpp's."""
    from frink_cli.backends.cupy.ops import KernelOps

    path, ref = made[arch]
    host, dev = cuda_models(path, lambda: KernelOps(np, emulated_launcher))
    tokens = _tokens(ref)[:24]
    want = prefill_prefix_decode(host, tokens, split=9)
    got = prefill_prefix_decode(dev, tokens, split=9)
    assert float(np.max(np.abs(got - want))) <= SELF_TOL
    _compare(got, ref["logits_llamacpp"][:24], REF_TOL, f"{arch} emulated")
    ledger = dev.decoder.backend.ledger
    assert ledger.total() > 0 and not ledger.failures
