"""Every tensor type gguf-py dequantizes loads, means what llama.cpp means by it, and runs.

Why: people run the GGUF they downloaded, and published files use the whole zoo of types
(IQ1_S..IQ4_XS, the ternary TQ1_0/TQ2_0, MXFP4, NVFP4). frink's reader takes block sizes
from gguf-py's GGML_QUANT_SIZES and dequantizes with gguf-py, so these tests check that the
result is llama.cpp's meaning on real files, not on hand-made bytes.

The files: the tiny `llama_q` fixture (scripts/make_tiny_models.py; rows 256 wide, so every
matrix is whole K/IQ super-blocks) requantized by llama.cpp's own quantizer
(`llama_cpp.llama_model_quantize`), every 2-D weight forced to the type under test by a
tensor-type override (`pure`; norms stay f32). llama.cpp refuses IQ1_S, IQ1_M, IQ2_XXS,
IQ2_XS, IQ2_S and IQ3_XXS without an importance matrix; for those the test passes a uniform one (all
ones: every column equally important), which is llama.cpp's quantizer all the same. No
type here needs blocks built by gguf-py. Quantizing takes about a minute in all (IQ1_S's
search is the slow one); the files are cached beside the tiny models.

What is checked, per type:
  1. every tensor frink loads equals gguf-py's dequantize of the same bytes bit for bit,
     and llama.cpp's own dequantization too (the file requantized by llama.cpp to F32);
  2. frink's logits (numpy and metal, batch) over 64 teacher-forced tokens:
     - against llama.cpp on the F32 requantized file (the same weights, f32 activations):
       the project's parity bar, <= 2e-3 and identical argmax;
     - against llama.cpp on the quantized file itself: top-1 agreement >= 0.8. llama.cpp
       rounds activations to 8 bits (Q8_0 / Q8_K, bf16 for BF16) before each quantized
       matmul, which moves these random tiny models' logits by ~0.1-0.6 against top-2 gaps
       of the same order, so a few positions flip; a wrong dequantization (a scale, a grid,
       a sign) agrees at chance (~1/512). Measured: 53/64 (IQ2_XXS) to 64/64, and
       llama.cpp's own f32 run of the same weights flips exactly the same positions, so
       the issue's 0.95 is out of reach of any f32-activation runner on these random
       fixtures; the bar is 0.8 absolute. It also requires frink to agree with it at
       least as often as llama.cpp's own f32 run of the same weights does (less 2 positions),
       so the flips are llama.cpp's rounding, not frink's.
     On metal, a type the device keeps in the file's blocks (QUANTIZED_TYPES: the affine
     ones and MXFP4, MLX's mxfp4 mode) must be held that way, not as f32, for the logits to
     say anything about the quantized path.
  3. MXFP4's repack for MLX's mxfp4 mode: MLX's dequantize of it equals gguf-py's of the same
     bytes bit for bit, and a tensor holding blocks MLX cannot reproduce goes dense, named.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import fixture_cache_root
from llama_quantize import quantized_with_references
from script_loader import load_script

import frink_cli
from frink_cli.archs import open_checkpoint
from frink_cli.quant import kernels
from frink_cli.quant.blocks import KERNEL_TYPES

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402 - after importorskip
from gguf.quants import dequantize  # noqa: E402

_make_tiny = load_script("make_tiny_models")

FIXTURE = "llama_q"
# Every type gguf-py dequantizes except F32 (the fixture's own type), in ggml's order.
TYPES = (
    "F16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ3_XXS",
    "IQ1_S",
    "IQ4_NL",
    "IQ3_S",
    "IQ2_S",
    "IQ4_XS",
    "IQ1_M",
    "BF16",
    "TQ1_0",
    "TQ2_0",
    "MXFP4",
    "NVFP4",
)
# llama.cpp's quantizer refuses these without an importance matrix (llama-quant.cpp).
NEEDS_IMATRIX = frozenset({"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ1_S", "IQ1_M"})
N_TOKENS = 64
TOKEN_SEED = 4321
REF_TOL = 2e-3
TOP1_BAR = 0.8
TOP1_SLACK = 2  # positions


def _dequantizable() -> set[str]:
    """The types gguf-py's dequantize handles (tried on one zero block each)."""
    out = set()
    for t in T:
        block, size = gguf.GGML_QUANT_SIZES[t]
        try:
            dequantize(np.zeros((1, size * (256 // block if block < 256 else 1)), np.uint8), t)
        except (NotImplementedError, ValueError, TypeError):
            continue
        out.add(t.name)
    return out


def test_every_type_gguf_py_dequantizes_is_tested() -> None:
    assert _dequantizable() - {"F32"} == set(TYPES)


# --- the quantized files (made once, by llama.cpp, in a child process: llama_quantize.py) --


class QuantFile:
    def __init__(self, qtype: str, path: Path, f32: Path, ref: dict[str, np.ndarray]) -> None:
        self.qtype, self.path, self.f32, self.ref = qtype, path, f32, ref


@pytest.fixture(scope="session")
def quant_file(tiny_model: Callable) -> Callable[..., QuantFile]:
    """quant_file(type[, fixture]) -> the fixture (default llama_q) quantized to `type` by
    llama.cpp, its F32 requant by llama.cpp, and llama.cpp's logits on both over the test
    tokens (cached)."""
    tokens = _make_tiny.fixture_tokens(seed=TOKEN_SEED, length=N_TOKENS, vocab=512)
    made: dict[tuple[str, str], QuantFile] = {}

    def get(qtype: str, fixture: str = FIXTURE) -> QuantFile:
        if (qtype, fixture) not in made:
            src = tiny_model(fixture).gguf
            assert src is not None
            path, f32, ref = quantized_with_references(
                src,
                fixture_cache_root() / "quant" / fixture,
                qtype,
                int(T[qtype]),
                qtype in NEEDS_IMATRIX,
                tokens,
                _make_tiny.llama_cpp_logits,
            )
            made[qtype, fixture] = QuantFile(qtype, path, f32, ref)
        return made[qtype, fixture]

    return get


# --- 1. the loaded tensors ----------------------------------------------------------------


@pytest.mark.parametrize("qtype", TYPES)
def test_tensors_equal_gguf_py_and_llama_cpp(qtype: str, quant_file: Callable) -> None:
    from gguf import GGUFReader

    q = quant_file(qtype)
    ckpt, f32 = open_checkpoint(q.path), open_checkpoint(q.f32)
    matrices = 0
    for t in GGUFReader(q.path).tensors:
        info = ckpt.tensors.info(t.name)
        if len(info.shape) == 2:
            assert info.dtype == qtype, f"{t.name}: {info.dtype}, not {qtype}"
            matrices += 1
        got = ckpt.tensors.load(t.name)
        want = np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(info.shape)
        assert got.dtype == np.float32 and got.shape == info.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
            f"{qtype} {t.name}: differs from gguf-py's dequantize"
        )
        cpp = f32.tensors.load(t.name)
        assert np.array_equal(got.view(np.uint32), cpp.view(np.uint32)), (
            f"{qtype} {t.name}: differs from llama.cpp's dequantization"
        )
    assert matrices == 16  # 2 layers x 7 + token_embd + output


# --- 2. the model on them -----------------------------------------------------------------


def _check_logits(got: np.ndarray, q: QuantFile, what: str, top1_bar: float = TOP1_BAR) -> None:
    ref = q.ref["f32"]
    assert np.all(np.isfinite(got)), f"{what}: non-finite logits"
    diff = float(np.max(np.abs(got.astype(np.float64) - ref)))
    assert diff <= REF_TOL, f"{what}: max |d| vs llama.cpp on the same weights in f32 = {diff:.3g}"
    bad = np.nonzero(got.argmax(-1) != ref.argmax(-1))[0]
    assert bad.size == 0, f"{what}: argmax differs from llama.cpp (f32) at {bad.tolist()}"
    top = q.ref["quantized"].argmax(-1)
    agree = int(np.sum(got.argmax(-1) == top))
    cpp_own = int(np.sum(ref.argmax(-1) == top))  # llama.cpp f32 vs llama.cpp quantized
    n = len(top)
    assert agree >= top1_bar * n and agree >= cpp_own - TOP1_SLACK, (
        f"{what}: teacher-forced top-1 agreement with llama.cpp on the {q.qtype} file "
        f"{agree}/{n} (llama.cpp's own f32 run of these weights: {cpp_own}/{n})"
    )


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.usefixtures("exact_activations")  # against llama.cpp in f32 on the same weights
def test_numpy_agrees_with_llama_cpp(qtype: str, quant_file: Callable) -> None:
    q = quant_file(qtype)
    m = frink_cli.load(q.path)
    got = m.logits([int(t) for t in q.ref["tokens"]])
    _check_logits(got, q, f"{qtype} numpy")


@pytest.mark.parametrize("qtype", [t.name for t in KERNEL_TYPES if t.name not in ("F16", "BF16")])
def test_numpy_8bit_activations_compute_llama_cpps_quantized_logits(
    qtype: str, quant_file: Callable
) -> None:
    """By default the host rounds activations to 8 bits before each product with a
    quantized weight, as llama.cpp's CPU backend does (per type: Q8_0, Q8_1 or Q8_K blocks):
    its logits are then llama.cpp's own on the quantized file, not just near its f32 run's,
    through the prompt path and the decode path alike."""
    from frink_cli.quant import kernels

    q = quant_file(qtype)
    with kernels.exact_activations(False):
        if kernels.activations() != "8-bit":
            pytest.skip(f"no 8-bit dots here: {kernels.kernel_path()}")
        m = frink_cli.load(q.path)
        ids = [int(t) for t in q.ref["tokens"]]
        batch, step = m.logits(ids), m.logits(ids, step=True)
    ref, f32 = q.ref["quantized"], q.ref["f32"]
    # How far llama.cpp's own quantized run sits from its f32 run of the same weights
    # (0.29-0.54 on these fixtures): frink's 8-bit logits must sit well inside it.
    # Measured, max |d| to llama.cpp's quantized logits, step (batch): 0.08-0.17 (0.08-0.21),
    # IQ4_XS and MXFP4 2e-6 (2e-2, 2e-6). The rest is rounding boundaries crossed by x's own
    # float differences, and in a prompt's rows the Q4_1 / Q5_1 min term (llama.cpp's Q8_1
    # keeps a half-rounded sum; the prompt path multiplies the exact one).
    far = float(np.max(np.abs(f32 - ref)))
    for what, got, share in (("step", step, 0.5), ("batch", batch, 0.75)):
        diff = float(np.max(np.abs(got.astype(np.float64) - ref)))
        assert diff <= share * far, f"{qtype} {what}: {diff:.3g} from llama.cpp (f32 at {far:.3g})"
        agree = int(np.sum(got.argmax(-1) == ref.argmax(-1)))
        assert agree >= TOP1_BAR * len(ref), f"{qtype} {what}: top-1 {agree}/{len(ref)}"


@pytest.mark.parametrize("qtype", TYPES)
def test_metal_agrees_with_llama_cpp(qtype: str, quant_file: Callable) -> None:
    pytest.importorskip("mlx.core")
    q = quant_file(qtype)
    m = frink_cli.load(q.path, backend="metal")
    assert m.backend_name == "metal"
    got = m.logits([int(t) for t in q.ref["tokens"]])
    _check_logits(got, q, f"{qtype} metal")
    backend = m.decoder.backend
    ledger = backend.ledger
    assert ledger.total() > 0, f"{qtype} metal: the device ran nothing"
    assert not ledger.failures, f"{qtype} metal: launches failed: {dict(ledger.failures)}"
    assert not ledger.refusals, f"{qtype} metal: layers refused: {dict(ledger.refusals)}"
    _check_held(backend, q.path, qtype)


@pytest.mark.parametrize("qtype", [t.name for t in KERNEL_TYPES])
@pytest.mark.usefixtures("exact_activations")  # the host body as the f32 reference for decode
def test_cuda_kernels_agree_with_llama_cpp(
    qtype: str, quant_file: Callable, emulated_launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cuda backend holding the file's blocks on the "device" (NumPy standing in for
    CuPy) and multiplying with kernels/quant.cu on the CPU emulator: a prompt (its tiles
    dequantized by dequant_<type>_f32, then GEMM) gives llama.cpp's logits as the host body
    must, and decode rows (gemv_<type>, straight from the blocks) the host body's."""
    from frink_cli.backends.cupy.ops import DeviceQuant, KernelOps
    from frink_cli.backends.cupy.stack import DeviceLinear

    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    q = quant_file(qtype)
    m = frink_cli.load(q.path, backend="cuda")
    backend = m.decoder.backend
    backend.ops = KernelOps(np, emulated_launcher)
    tokens = [int(t) for t in q.ref["tokens"]]
    first = len(emulated_launcher.launches)
    _check_logits(m.logits(tokens), q, f"{qtype} cuda (emulated kernels)")

    # Decode rows against the host body on the same weights.
    host = frink_cli.load(q.path, backend="numpy")
    got, want = [], []
    for model, out in ((m, got), (host, want)):
        cache = model.decoder.new_cache(32)
        out.append(model.decoder.step(np.asarray(tokens[:20]), cache)[-1:])
        out.append(model.decoder.step(np.asarray(tokens[20:21]), cache))
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(want), rtol=0, atol=1e-4)

    k = qtype.lower()
    launched = set(emulated_launcher.launches[first:])
    assert {f"dequant_{k}_f32", f"gemv_{k}"} <= launched, launched
    ledger = backend.ledger
    assert ledger.total() > 0 and not ledger.failures and not ledger.refusals, ledger
    # Every matrix the device multiplies is held in the file's blocks of this type.
    linears = [
        v
        for layer in backend.layers.values()
        for v in vars(layer).values()
        if isinstance(v, DeviceLinear)
    ] + [backend.head.output]
    assert len(linears) == 2 * 4 + 1  # (qkv, o, gate_up, down) x 2 layers, the head
    for lin in linears:
        assert isinstance(lin.w, DeviceQuant), type(lin.w)
        assert {p.qtype.name for p in lin.w.parts} == {qtype}
        assert all(p.data.dtype == np.uint8 for p in lin.w.parts)


def _device_linears(backend) -> list:
    """Every resident DeviceLinear of the backend's layers and lm head, fused parts split."""
    from dataclasses import fields, is_dataclass

    from frink_cli.backends.mlx.graph import DeviceLinear

    found: list[DeviceLinear] = []

    def walk(v) -> None:
        if isinstance(v, DeviceLinear):
            found.extend(v.parts or (v,))
        elif is_dataclass(v) and not isinstance(v, type):
            for f in fields(v):
                walk(getattr(v, f.name))

    for layer in backend.layers:
        walk(layer)
    walk(backend.head[1])
    return found


def _check_held(backend, path: Path, qtype: str) -> None:
    """A type the device keeps quantized is held in the file's blocks, every matrix the
    device multiplies (all but the host's embedding table): its integers, not f32."""
    import mlx.core as mx

    from frink_cli.backends.mlx.quant import QUANTIZED_TYPES

    if qtype not in QUANTIZED_TYPES:
        return
    ckpt = open_checkpoint(path)
    matrices = {
        n
        for n in ckpt.tensors.names()
        if len(ckpt.tensors.info(n).shape) == 2 and n != "token_embd.weight"
    }
    held = backend.tensor_held
    assert matrices <= held.keys(), sorted(matrices - held.keys())
    mode = "mxfp4" if qtype == "MXFP4" else "affine"
    for n in matrices:
        assert held[n].startswith("quantized " + ("mxfp4 " if mode == "mxfp4" else "")), (
            n,
            held[n],
        )
    linears = _device_linears(backend)
    assert {n for lin in linears for n in lin.sources} == matrices
    for lin in linears:
        assert lin.mode == mode and lin.w.dtype == mx.uint32, (lin.sources, lin.mode, lin.w.dtype)
        if mode == "mxfp4":
            assert lin.scales.dtype == mx.uint8 and lin.biases is None, lin.sources


# --- 3. MXFP4 in MLX's mxfp4 mode -------------------------------------------------------


def test_mxfp4_repack_dequantizes_on_mlx_as_gguf_py(quant_file: Callable) -> None:
    # Every MXFP4 tensor llama.cpp wrote, repacked for the device: MLX's own dequantize of
    # the repacked words and e8m0 bytes is gguf-py's dequantize of the file's bytes, f32 bit
    # for bit (the sign of zeros included).
    mx = pytest.importorskip("mlx.core")
    from gguf import GGUFReader

    from frink_cli.backends.mlx.quant import quantized_stack

    q = quant_file("MXFP4")
    ckpt = open_checkpoint(q.path)
    checked = 0
    for t in GGUFReader(q.path).tensors:
        if t.tensor_type != T.MXFP4:
            continue
        shape = tuple(ckpt.tensors.info(t.name).shape)
        want = np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
        r = quantized_stack(ckpt.tensors.raw(t.name)[2], "MXFP4", shape)
        assert r.mode == "mxfp4" and r.bits == 4 and r.biases is None
        assert r.w.dtype == np.uint32 and r.w.shape == (*shape[:-1], shape[-1] // 8)
        assert r.scales.dtype == np.uint8 and r.scales.shape == (*shape[:-1], shape[-1] // 32)
        got = mx.dequantize(
            mx.array(r.w),
            mx.array(r.scales),
            group_size=32,
            bits=4,
            mode="mxfp4",
            dtype=mx.float32,
        )
        got = np.asarray(got)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name
        checked += 1
    assert checked == 16


def _patch_first_block(path: Path, name: str, block: bytes) -> None:
    """Overwrite the first 17-byte MXFP4 block of tensor `name` in the file at `path`."""
    from gguf import GGUFReader

    t = next(t for t in GGUFReader(path).tensors if t.name == name)
    assert t.tensor_type == T.MXFP4 and len(block) == 17
    with path.open("r+b") as f:
        f.seek(int(t.data_offset))
        f.write(block)


@pytest.mark.usefixtures("exact_activations")  # metal against the host body in f32
def test_mxfp4_blocks_mlx_cannot_reproduce_stay_dense(quant_file: Callable, tmp_path) -> None:
    # Two blocks where MLX's mxfp4 and ggml part ways: an e8m0 byte of 255 over zero codes
    # (0 to ggml, NaN * 0 to MLX) and a byte of 0 over non-zero codes (subnormal weights,
    # which a GPU may flush). Their fused matrices are held dense, each naming why; every
    # other matrix stays mxfp4, and the model is still the host body's.
    pytest.importorskip("mlx.core")
    q = quant_file("MXFP4")
    path = tmp_path / "edges.gguf"
    path.write_bytes(q.path.read_bytes())
    _patch_first_block(path, "blk.0.attn_k.weight", bytes([255]) + bytes(16))
    _patch_first_block(path, "blk.1.ffn_down.weight", bytes([0]) + bytes(range(1, 17)))
    tokens = [int(t) for t in q.ref["tokens"]]
    want = frink_cli.load(path).logits(tokens)
    m = frink_cli.load(path, backend="metal")
    got = m.logits(tokens)
    assert np.all(np.isfinite(got)) and np.abs(got - want).max() <= 1e-4
    assert (got.argmax(-1) == want.argmax(-1)).all()
    backend = m.decoder.backend
    ledger = backend.ledger
    assert ledger.total() > 0 and not ledger.failures and not ledger.refusals
    held = backend.tensor_held
    dense = {
        **{
            f"blk.0.attn_{x}.weight": "blk.0.attn_k.weight has an e8m0 scale byte of 255"
            for x in "qkv"
        },
        "blk.1.ffn_down.weight": "blk.1.ffn_down.weight has subnormal weights",
    }
    for n, why in dense.items():
        assert held[n].startswith(f"f32 (dequantized at load: {why}"), (n, held[n])
    others = [n for n in held if n not in dense]
    assert len(others) == 11 and all(held[n].startswith("quantized mxfp4") for n in others)
    modes = {n: lin.mode for lin in _device_linears(backend) for n in lin.sources}
    assert all(modes[n] == "mxfp4" for n in others)
    assert all(
        lin.scales is None for lin in _device_linears(backend) if set(lin.sources) & dense.keys()
    )


# --- frink info ---------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "IQ2_XXS", "TQ1_0", "MXFP4"])
def test_info_names_the_type_and_how_metal_holds_it(qtype: str, quant_file: Callable) -> None:
    from frink_cli.backends.mlx.quant import QUANTIZED_TYPES
    from frink_cli.report import describe

    q = quant_file(qtype)
    d = describe(q.path, "metal")
    assert d["tensor_types"] == {qtype: 16, "F32": 5}
    how = d["backend"]["tensor_formats"][qtype]
    if qtype in QUANTIZED_TYPES:
        assert how.startswith("quantized"), how
    else:
        assert how.startswith("f32 (dequantized at load"), how
    cuda = describe(q.path, "cuda")["backend"]["tensor_formats"][qtype]
    if qtype in {t.name for t in KERNEL_TYPES}:  # as the host holds it: the file's blocks
        assert cuda == f"{qtype} blocks as stored (dequantized in the kernels)", cuda
    else:
        assert "at load" in cuda, cuda


@pytest.mark.parametrize("qtype", [t.name for t in KERNEL_TYPES])
def test_host_keeps_the_files_blocks_and_batches_invariantly(
    qtype: str, quant_file: Callable
) -> None:
    """Every type with host kernels stays in the file's blocks on the host (about the
    file's bytes, no f32 copy), and a sequence's logits in a batch are its alone logits
    bit for bit: decode rows beside others, and its prompt beside a chunk long enough for
    the tiled GEMM (a server's answers rely on it)."""
    from frink_cli.backends.host.linear import SMALL_ROWS
    from frink_cli.quant.blocks import QuantRows

    if not kernels.compiled():
        pytest.skip("the host keeps blocks only with the compiled kernels (native C)")
    q = quant_file(qtype)
    m = frink_cli.load(q.path, backend="numpy")
    dec = m.decoder
    lins = [lin for lw in dec.host.w.layers for lin in (lw.qkv, lw.wo, lw.gate_up, lw.down)]
    assert all(isinstance(lin.w, QuantRows) for lin in lins), qtype
    held = sum(lin.w.nbytes for lin in lins)  # type: ignore[union-attr]
    assert held <= q.path.stat().st_size
    rng = np.random.default_rng(1)
    prompt, steps = rng.integers(0, m.n_vocab, 9), rng.integers(0, m.n_vocab, 4)
    cache = dec.new_cache(64)
    alone = [dec.step_batch([(prompt, cache)])[0]]
    alone += [dec.step_batch([(steps[i : i + 1], cache)])[0] for i in range(4)]
    cache, a, b = dec.new_cache(64), dec.new_cache(64), dec.new_cache(64)
    dec.step_batch([(rng.integers(0, m.n_vocab, 3), a)])
    long = rng.integers(0, m.n_vocab, SMALL_ROWS + 5)
    got = [dec.step_batch([(rng.integers(0, m.n_vocab, 1), a), (prompt, cache), (long, b)])[1]]
    for i in range(4):
        feeds = [(rng.integers(0, m.n_vocab, 1), a), (steps[i : i + 1], cache)]
        got.append(dec.step_batch(feeds[:: 1 - 2 * (i % 2)])[1 - i % 2])
    for i, (x, y) in enumerate(zip(alone, got)):
        assert np.array_equal(x, y), (qtype, i, float(np.abs(x - y).max()))


@pytest.mark.parametrize(
    ("qtype", "fixture"), [("Q8_0", "qwen3moe"), ("Q4_0", "qwen3moe"), ("MXFP4", "gpt_oss")]
)
@pytest.mark.usefixtures("exact_activations")  # against llama.cpp in f32 on the same weights
def test_host_moe_experts_stay_in_blocks(qtype: str, fixture: str, quant_file: Callable) -> None:
    """A quantized MoE file's expert stacks stay in its blocks on the host (each step reads
    only the chosen experts' bytes; f32 would be ~7x the file for Qwen3-30B-A3B), and the
    model still computes llama.cpp's logits on the same weights. gpt-oss ships its experts
    as MXFP4, which the host multiplies packed, biases and all."""
    from frink_cli.quant.blocks import QuantExperts

    if not kernels.compiled():
        pytest.skip("the host keeps blocks only with the compiled kernels (native C)")
    q = quant_file(qtype, fixture)
    m = frink_cli.load(q.path, backend="numpy")
    moes = [lw.moe for lw in m.decoder.host.w.layers]
    assert moes and all(e is not None for e in moes)
    stacks = [s for e in moes for s in (e.gate_up_exps, e.down_exps)]  # type: ignore[union-attr]
    assert all(isinstance(s, QuantExperts) for s in stacks), [type(s) for s in stacks]
    assert sum(s.nbytes for s in stacks) <= q.path.stat().st_size
    got = m.logits([int(t) for t in q.ref["tokens"]])
    _check_logits(got, q, f"{qtype} {fixture} numpy")


def test_metal_keeps_gpt_oss_mxfp4_experts_packed(quant_file: Callable) -> None:
    """gpt-oss's MXFP4 experts stay MXFP4 on metal (MLX's mxfp4 mode, gathered per row's
    experts), and with their biases the model computes llama.cpp's logits."""
    pytest.importorskip("mlx.core")
    q = quant_file("MXFP4", "gpt_oss")
    m = frink_cli.load(q.path, backend="metal")
    got = m.logits([int(t) for t in q.ref["tokens"]])
    _check_logits(got, q, "MXFP4 gpt_oss metal")
    ledger = m.decoder.backend.ledger
    assert ledger.total() > 0 and not ledger.failures and not ledger.refusals, (
        ledger.total(),
        dict(ledger.failures),
        dict(ledger.refusals),
    )
    held = m.decoder.backend.tensor_held
    experts = {n: h for n, h in held.items() if "_exps." in n}
    assert experts, sorted(held)
    assert all(h.startswith("quantized mxfp4") for h in experts.values()), experts


# The recurrent mixers' projections, per fixture: (LayerWeights field, its Linear fields).
_RECURRENT = {
    "qwen35": ("gdn", ("in_proj", "out")),
    "mamba": ("mamba", ("in_proj", "out")),
    "mamba2": ("mamba2", ("in_proj", "out")),
    "lfm2": ("shortconv", ("in_proj", "out")),
}


@pytest.mark.parametrize("fixture", sorted(_RECURRENT))
@pytest.mark.usefixtures("exact_activations")  # against llama.cpp in f32 on the same weights
def test_host_recurrent_projections_stay_in_blocks(fixture: str, quant_file: Callable) -> None:
    """A quantized hybrid or recurrent file's mixer projections (GDN, Mamba, Mamba-2, short
    convolutions) stay in its blocks on the host like attention's, and the model computes
    llama.cpp's logits on the same weights."""
    from frink_cli.quant.blocks import QuantRows

    if not kernels.compiled():
        pytest.skip("the host keeps blocks only with the compiled kernels (native C)")
    q = quant_file("Q8_0", fixture)
    m = frink_cli.load(q.path, backend="numpy")
    field, names = _RECURRENT[fixture]
    mixers = [getattr(lw, field) for lw in m.decoder.host.w.layers]
    lins = [getattr(x, n) for x in mixers if x is not None for n in names]
    assert lins, fixture
    assert all(isinstance(lin.w, QuantRows) for lin in lins), [type(lin.w) for lin in lins]
    got = m.logits([int(t) for t in q.ref["tokens"]])
    # No absolute top-1 bar: these random hybrids' logits are close to ties, and llama.cpp's
    # own f32 run of the weights agrees with its quantized run only ~50/64 on qwen35 (its
    # activations are rounded to 8 bits there); frink must match the f32 run and do as
    # well against the quantized one.
    _check_logits(got, q, f"Q8_0 {fixture} numpy", top1_bar=0.0)
