"""Every bad input a user can hand `frink` ends in one clear line, through a real process.

Why: a local runner meets truncated downloads, wrong files, typos in flags and models it
cannot run. Each must end the same way (non-zero exit, stdout empty, one stderr line that
starts "frink: error:" and names the problem, no traceback unless -v) and must never hang
or allocate what a corrupt header claims. The broken files come from
scripts/make_bad_models.py: one valid tiny llama GGUF written by gguf-py's GGUFWriter, and
variants of it with one thing wrong each.

The valid tiny GGUF has no tokenizer, so `frink run` on it fails at the tokenizer, after
the checkpoint, config and weights have loaded and the backend has been chosen. A bad
flag or file that frink failed to catch would therefore reach that later error instead
of its own, and the fragments each case asserts tell the two apart.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from frink_subprocess import assert_error, frink

_MAKE_BAD = Path(__file__).resolve().parent.parent / "scripts" / "make_bad_models.py"
# A peak far above an idle `frink` (~100 MiB) but far below any allocation a corrupt
# count (2**60 tensors, 2**40 x 2**40 elements) would ask for.
MAX_RSS_MIB = 1024


def _load_maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_bad_models", _MAKE_BAD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_bad_models", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _load_maker().make_all(tmp_path_factory.mktemp("bad_models"))


# --- files ------------------------------------------------------------------------------

# case -> fragments the error line must contain. Every case is tried with `frink run`.
FILE_CASES: dict[str, tuple[str, ...]] = {
    "empty": ("empty file",),
    "text": ("not a GGUF file", "notes.txt"),
    "magic_only": ("truncated",),
    "bad_version": ("version 99",),
    "truncated_metadata": ("truncated",),
    "truncated_value": ("truncated", "frink.test.array"),
    "truncated_tensor_info": ("truncated", "blk.0.attn_q.weight"),
    "truncated_data": ("truncated", "tensor"),
    "huge_tensor_count": ("corrupt",),
    "huge_kv_count": ("corrupt",),
    "huge_string": ("corrupt", "metadata key"),
    "huge_array": ("corrupt", "frink.test.array"),
    "huge_dims": ("truncated", "blk.0.attn_q.weight"),
    "many_dims": ("blk.0.attn_q.weight", "1000 dimensions"),
    "unknown_tensor_type": ("blk.0.attn_q.weight", "unknown tensor type 9999"),
    "no_architecture": ("general.architecture",),
    "unknown_arch": ("unknown architecture", "'foo'"),
    "missing_key": ("llama.block_count",),
    "bad_key_type": ("metadata", "'three'"),
    "bad_head_counts": ("head counts",),
    "bad_tokenizer": ("tokenizer model 'bogus'",),
    "wrong_shape": ("blk.0.attn_q.weight", "shape [24, 32]", "expected [32, 32]"),
    "missing_tensor": ("missing tensor blk.0.ffn_down.weight",),
    "undequantizable": ("blk.0.attn_q.weight", "Q8_1", "cannot dequantize"),
}
# `frink info` reads the header and config but loads no weights, so only header- and
# config-level faults concern it; a sample of those, to keep the file fast.
INFO_CASES = ("empty", "text", "truncated_data", "huge_tensor_count", "unknown_arch", "bad_key_type")
# Cases whose header claims sizes no file could back: the error must come without the
# allocation.
HUGE_CASES = ("huge_tensor_count", "huge_kv_count", "huge_string", "huge_array", "huge_dims")


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_bad_file_run(bad: dict[str, Path], case: str) -> None:
    result = frink("run", bad[case], "-p", "hello")
    assert_error(result, *FILE_CASES[case])
    if case in HUGE_CASES:
        assert result.peak_rss_mib < MAX_RSS_MIB, result.describe()


@pytest.mark.parametrize("case", INFO_CASES)
def test_bad_file_info(bad: dict[str, Path], case: str) -> None:
    assert_error(frink("info", bad[case]), *FILE_CASES[case])


def test_valid_fixture_fails_only_at_the_tokenizer(bad: dict[str, Path]) -> None:
    # The control for every case above: unbroken, the file loads and stops at the tokenizer.
    assert_error(frink("run", bad["valid"], "-p", "hello"), "no tokenizer")
    info = frink("info", bad["valid"])
    assert info.returncode == 0, info.describe()
    assert "tokenizer:      none" in info.stdout


def test_missing_file(tmp_path: Path) -> None:
    assert_error(frink("run", tmp_path / "nope.gguf", "-p", "hello"), "not found", "nope.gguf")
    assert_error(frink("info", tmp_path / "nope.gguf"), "not found", "nope.gguf")


def test_directory_without_config(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not a model\n")
    assert_error(frink("run", tmp_path, "-p", "hello"), "config.json")


def test_hf_directory_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,'
        ' "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,'
        ' "num_key_value_heads": 2, "vocab_size": 512}'
    )
    assert_error(frink("run", tmp_path, "-p", "hello"), "model.safetensors")


def test_hf_directory_with_broken_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    assert_error(frink("run", tmp_path, "-p", "hello"), "config.json")


def test_verbose_adds_the_traceback(bad: dict[str, Path]) -> None:
    result = frink("run", bad["truncated_data"], "-p", "hello", "-v")
    assert result.returncode == 1 and result.stdout == "", result.describe()
    assert "Traceback" in result.stderr, result.describe()
    assert result.lines()[-1].startswith("frink: error:"), result.describe()


# --- flags and prompts --------------------------------------------------------------------

# Each flag case runs against the valid tiny model: a flag frink let through would end at
# its missing tokenizer instead, which the fragments rule out.
FLAG_CASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "temp_negative": (("--temp", "-1", "-p", "x"), ("--temp", "-1")),
    "top_p_above_one": (("--top-p", "2", "-p", "x"), ("--top-p", "2")),
    "min_p_above_one": (("--min-p", "1.5", "-p", "x"), ("--min-p",)),
    "top_k_negative": (("--top-k", "-3", "-p", "x"), ("--top-k",)),
    "n_not_a_number": (("-n", "abc", "-p", "x"), ("--max-tokens",)),
    "n_negative": (("-n", "-5", "-p", "x"), ("--max-tokens",)),
    "ctx_negative": (("-c", "-1", "-p", "x"), ("--ctx-size",)),
    "temp_not_a_number": (("--temp", "hot", "-p", "x"), ("--temp",)),
    "backend_unknown": (("--backend", "foo", "-p", "x"), ("--backend", "foo")),
    "unknown_flag": (("--bogus", "-p", "x"), ("--bogus",)),
    "prompt_flag_without_value": (("-p",), ("-p",)),
    "no_prompt": ((), ("no prompt",)),
}


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_bad_flag(bad: dict[str, Path], case: str) -> None:
    args, fragments = FLAG_CASES[case]
    line = assert_error(frink("run", bad["valid"], *args), *fragments)
    assert "tokenizer" not in line


def test_unknown_command() -> None:
    assert_error(frink("bogus"), "bogus")


@pytest.mark.parametrize("backend", ["metal", "cuda"])
def test_unavailable_backend_refuses(bad: dict[str, Path], backend: str) -> None:
    # Backends are chosen at load, before the tokenizer is needed.
    line = assert_error(frink("run", bad["valid"], "--backend", backend, "-p", "x"), backend)
    assert "not available" in line


def test_prompt_and_file_both_given(bad: dict[str, Path], tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    assert_error(frink("run", bad["valid"], "-p", "hi", "-f", prompt), "-p", "-f")


def test_prompt_file_missing(bad: dict[str, Path], tmp_path: Path) -> None:
    assert_error(frink("run", bad["valid"], "-f", tmp_path / "absent.txt"), "prompt file", "absent.txt")


def test_prompt_file_is_a_directory(bad: dict[str, Path], tmp_path: Path) -> None:
    assert_error(frink("run", bad["valid"], "-f", tmp_path), "prompt file")


def test_prompt_file_not_utf8(bad: dict[str, Path], tmp_path: Path) -> None:
    prompt = tmp_path / "latin1.txt"
    prompt.write_bytes("café".encode("latin-1"))
    assert_error(frink("run", bad["valid"], "-f", prompt), "UTF-8", "latin1.txt")


# --- on the real model --------------------------------------------------------------------

LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


def test_prompt_longer_than_context(smollm2_path: Path) -> None:
    result = frink("run", smollm2_path, "-c", "16", "--raw", "-p", LONG_PROMPT, "-n", "4", "--json")
    assert_error(result, "too long", "16")
