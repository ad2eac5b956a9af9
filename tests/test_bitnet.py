"""BitNet b1.58 (`bitnet`) against transformers and llama.cpp, on every backend.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: BitNet adds two decorations to the llama block -- an RMSNorm on the attention output
before o_proj (`attn_sub_norm`) and one on the FFN's gated activation before ffn_down
(`ffn_sub_norm`) -- and ternary weights, which published files store as TQ1_0 / TQ2_0.

The fixture (scripts/tiny_specs.py, _BITNET): transformers' BitNetForCausalLM with
every projection ternary without zeros (sign * c, c f16-exact per tensor), a fixed point of
the converter's ternarization (s = mean|W| = c) and of TQ1_0/TQ2_0 (block scale max|W| =
c), so transformers, the F32 GGUF and its TQ requants all hold the same weights; SiLU, the
activation llama.cpp's bitnet graph applies (transformers' default relu2 is not what
llama.cpp runs); sub-norm weights random around 1, so each sub-norm matters. The
converter's tensor map knows the sub-norms by their 1bitLLM names only, so the fixture
maker hands it a copy with those names; the HF dir keeps transformers' names.

What is checked: frink from the GGUF and from the HF dir, batch and step, against both
references (2e-3, identical argmax) on numpy and metal (the device ran), and on cuda (NumPy
stand-in and the kernel emulator). The ternary files, requantized by llama.cpp's own
quantizer (every projection TQ1_0 or TQ2_0, the embedding left F32): the dequantized
matrices equal the F32 GGUF's bit for bit, so frink's logits on them meet the same bar
against transformers and llama.cpp's F32 run; against llama.cpp on the TQ file itself,
which multiplies in 8-bit activations (q8_K) where frink stays in f32, teacher-forced top-1
agreement of at least 0.95 and at least llama.cpp's own F32 run's agreement less 1
position (measured: 39/40 on both types, numpy and metal, as llama.cpp's own F32 run; max
|d| against llama.cpp on the TQ file 0.32, its activation rounding). The HF reader's
ternarization is the converter's own weight_quant, checked on a matrix with zeros against
the converter's code itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import fixture_cache_root
from fixture_copies import copy_gguf
from llama_quantize import llama_quantize
from model_checks import (
    _against_references,
    _assert_device_ran,
    _path,
    _tokens,
)

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.errors import FrinkError

NAME = "bitnet"
N_LAYER, N_EMBD, N_FF = 2, 256, 512
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
TQ_TYPES = ("TQ1_0", "TQ2_0")
# Teacher-forced top-1 agreement with llama.cpp on the TQ file (its 8-bit activations).
TOP1_BAR = 0.95
TOP1_SLACK = 1  # positions


# --- the fixture itself ---------------------------------------------------------------------------


def test_the_converter_wrote_bitnet(tiny_model: Callable) -> None:
    """What llama.cpp's converter makes of it: both sub-norms per layer ([n_embd], [n_ff]),
    ternary projections (one magnitude each), no output tensor, no per-tensor scales."""
    ckpt = open_checkpoint(_path(tiny_model, NAME, "gguf"))
    assert ckpt.metadata["general.architecture"] == NAME
    names = set(ckpt.tensors.names())
    assert "output.weight" not in names
    assert not [n for n in names if n.endswith(".scale")]
    for i in range(N_LAYER):
        assert ckpt.tensors.info(f"blk.{i}.attn_sub_norm.weight").shape == (N_EMBD,)
        assert ckpt.tensors.info(f"blk.{i}.ffn_sub_norm.weight").shape == (N_FF,)
        for t in PROJECTIONS:
            w = ckpt.tensors.load(f"blk.{i}.{t}.weight")
            assert len(np.unique(np.abs(w))) == 1, f"blk.{i}.{t}: not ternary without zeros"


# --- the host body (numpy) ------------------------------------------------------------------------


def test_config_reads_the_decorations(tiny_model: Callable) -> None:
    gg = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "gguf")))
    hf = config_from_checkpoint(open_checkpoint(_path(tiny_model, NAME, "hf")))
    assert hf == gg
    assert gg.ext.attn_sub_norm and gg.ext.ffn_sub_norm
    assert gg.rope_type == "neox" and gg.tied_embeddings and gg.ffn_act == "silu"
    assert {"attn_sub_norm", "ffn_sub_norm"} <= gg.features()


def _converter_weight_quant() -> Callable[[Any], Any]:
    """The converter's own BitnetModel.weight_quant (llama.cpp's conversion/bitnet.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import llama_cpp_converter

    root = llama_cpp_converter.cache_dir()
    if not (root / "conversion" / "bitnet.py").is_file():
        pytest.skip("llama.cpp's converter is not extracted (make the tiny models first)")
    for p in (root / "gguf-py", root):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    from conversion.bitnet import BitnetModel  # type: ignore[import-not-found]

    return lambda w: BitnetModel.weight_quant(None, w)


def test_hf_ternarization_is_the_converters() -> None:
    """On a plain random matrix (about a third of it rounds to 0), frink's HF-side
    ternarization equals the converter's weight_quant bit for bit."""
    torch = pytest.importorskip("torch")
    from frink_cli.archs.bitnet import ternarize

    w = np.random.default_rng(5).standard_normal((96, 64)).astype(np.float32) * 0.1
    want = _converter_weight_quant()(torch.from_numpy(w)).numpy()
    got = ternarize(w)
    assert 0.2 < float(np.mean(got == 0)) < 0.5
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_per_tensor_scales_are_refused_by_name(tiny_model: Callable, tmp_path: Path) -> None:
    """llama.cpp multiplies a projection by its optional `*.scale` tensor; frink refuses a
    file that has one rather than run without it."""
    scale = {"blk.0.attn_q.scale": np.asarray([0.5], np.float32)}
    copy_gguf(_path(tiny_model, NAME, "gguf"), tmp_path / "scaled.gguf", extra=scale)
    with pytest.raises(FrinkError, match=r"blk\.0\.attn_q\.scale"):
        frink_cli.load(tmp_path / "scaled.gguf")


# --- the ternary types, written by llama.cpp's quantizer -----------------------------------------

# llama.cpp's quantizer (base ftype Q8_0, pure): the projections to the type under test,
# the random (not ternary) embedding kept F32.
_LLAMA_FTYPE_MOSTLY_Q8_0 = 7
_PROJECTIONS = r"(attn_(q|k|v|output)|ffn_(gate|up|down))[.]weight"


def _quantize(src: Path, dst: Path, qtype: str) -> None:
    from gguf import GGMLQuantizationType

    ttype = int(GGMLQuantizationType[qtype])
    rules = [(_PROJECTIONS, ttype), ("token_embd", int(GGMLQuantizationType.F32))]
    llama_quantize(src, dst, ttype, False, _LLAMA_FTYPE_MOSTLY_Q8_0, rules)


@pytest.fixture(scope="module")
def tq_file(tiny_model: Callable) -> Callable[[str], tuple[Path, np.ndarray]]:
    """tq_file(type) -> (the fixture requantized to `type` by llama.cpp, llama.cpp's logits
    on it over the fixture tokens), cached beside the tiny models."""
    import json

    from script_loader import load_script

    make_tiny = load_script("make_tiny_models")
    src = _path(tiny_model, NAME, "gguf")
    root = fixture_cache_root() / "quant" / NAME
    root.mkdir(parents=True, exist_ok=True)
    key = (src.parent / "stamp.json").read_text() + json.dumps({"v": 1})
    if (root / "key.json").is_file() and (root / "key.json").read_text() != key:
        for f in root.iterdir():
            f.unlink()
    (root / "key.json").write_text(key)

    def get(qtype: str) -> tuple[Path, np.ndarray]:
        path, npz = root / f"{qtype}.gguf", root / f"{qtype}.npz"
        if not path.is_file():
            _quantize(src, path, qtype)
        if not npz.is_file():
            np.savez(npz, logits=make_tiny.llama_cpp_logits(path, tiny_model(NAME).ref["tokens"]))
        with np.load(npz) as z:
            return path, z["logits"]

    return get


@pytest.mark.parametrize("qtype", TQ_TYPES)
def test_tq_weights_equal_the_f32_files(qtype: str, tq_file: Callable) -> None:
    """Every projection is stored as `qtype` and dequantizes to the F32 GGUF's values bit
    for bit (the fixture's weights are exact in the ternary types)."""
    path, _ = tq_file(qtype)
    q = open_checkpoint(path)
    f = open_checkpoint(path.parents[2] / "tiny" / NAME / "model.gguf")
    n = 0
    for i in range(N_LAYER):
        for t in PROJECTIONS:
            name = f"blk.{i}.{t}.weight"
            assert q.tensors.info(name).dtype == qtype, name
            assert np.array_equal(q.tensors.load(name), f.tensors.load(name)), name
            n += 1
    assert n == 7 * N_LAYER
    assert q.tensors.info("token_embd.weight").dtype == "F32"


def _check_tq(got: np.ndarray, cpp_tq: np.ndarray, ref: dict[str, np.ndarray], what: str) -> None:
    _against_references(got, ref, what)
    top = cpp_tq.argmax(-1)
    agree = int(np.sum(got.argmax(-1) == top))
    cpp_own = int(np.sum(ref["logits_llamacpp"].argmax(-1) == top))
    n = len(top)
    assert agree >= TOP1_BAR * n and agree >= cpp_own - TOP1_SLACK, (
        f"{what}: teacher-forced top-1 agreement with llama.cpp on the file {agree}/{n} "
        f"(llama.cpp's own f32 run: {cpp_own}/{n})"
    )


@pytest.mark.parametrize("qtype", TQ_TYPES)
def test_numpy_on_tq_files(qtype: str, tq_file: Callable, tiny_model: Callable) -> None:
    path, cpp_tq = tq_file(qtype)
    m = frink_cli.load(path)
    got = m.logits(_tokens(tiny_model, NAME))
    _check_tq(got, cpp_tq, tiny_model(NAME).ref, f"{qtype} numpy")


@pytest.mark.parametrize("qtype", TQ_TYPES)
def test_metal_on_tq_files(qtype: str, tq_file: Callable, tiny_model: Callable) -> None:
    pytest.importorskip("mlx.core")
    path, cpp_tq = tq_file(qtype)
    m = frink_cli.load(path, backend="metal")
    got = m.logits(_tokens(tiny_model, NAME))
    _check_tq(got, cpp_tq, tiny_model(NAME).ref, f"{qtype} metal")
    _assert_device_ran(m, f"{qtype} metal")
