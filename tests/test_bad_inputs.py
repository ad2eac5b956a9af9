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

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from frink_subprocess import Result, assert_error, frink
from script_loader import load_script

# A peak far above an idle `frink` (~60 MiB) but far below any allocation a corrupt
# count (2**60 tensors, 2**40 x 2**40 elements) would ask for.
MAX_RSS_MIB = 1024


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return load_script("make_bad_models").make_all(tmp_path_factory.mktemp("bad_models"))


# --- the cases ----------------------------------------------------------------------------

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
    "unused_tensor": ("1 tensor(s) frink does not use: blk.1.ffn_act.scales",),
    "undequantizable": ("blk.0.attn_q.weight", "Q8_1", "cannot dequantize"),
}
# `frink info` reads the header and config but loads no weights, so only header- and
# config-level faults concern it; a sample of those, to keep the file fast.
INFO_CASES = (
    "empty",
    "text",
    "truncated_data",
    "huge_tensor_count",
    "unknown_arch",
    "bad_key_type",
)
# Cases whose header claims sizes no file could back: the error must come without the
# allocation.
HUGE_CASES = ("huge_tensor_count", "huge_kv_count", "huge_string", "huge_array", "huge_dims")


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
    # Bytes that are not UTF-8 arrive in argv as lone surrogates ("\udce9" is byte 0xE9).
    "prompt_not_utf8": (("-p", "caf\udce9"), ("-p/--prompt", "UTF-8")),
    "system_not_utf8": (("-p", "x", "--system", "caf\udce9"), ("--system", "UTF-8")),
    # Backends are chosen at load, before the tokenizer is needed; CI has no CuPy.
    "backend_cuda": (("--backend", "cuda", "-p", "x"), ("cuda", "not available")),
}
# `frink chat` shares run's sampling flags (one flag group): the same refusals, before load.
CHAT_FLAG_CASES = ("temp_negative", "top_p_above_one", "min_p_above_one", "top_k_negative")


@pytest.fixture(scope="module")
def runs(bad: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Every invocation of this file's tests but the real-model one, run up front and
    concurrently: each is a ~0.5 s interpreter start that waits on nothing, and run one at
    a time they would be most of the suite's CLI time."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "plain_dir").mkdir()
    (d / "plain_dir" / "README.md").write_text("not a model\n")
    (d / "hf_no_weights").mkdir()
    (d / "hf_no_weights" / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 512,
            }
        )
    )
    (d / "hf_bad_config").mkdir()
    (d / "hf_bad_config" / "config.json").write_text("{not json")
    (d / "prompt.txt").write_text("hello")
    (d / "latin1.txt").write_bytes("café".encode("latin-1"))
    valid = bad["valid"]

    jobs: dict[str, tuple[str | Path, ...]] = {}
    jobs |= {f"run:{c}": ("run", bad[c], "-p", "hello") for c in FILE_CASES}
    jobs |= {f"info:{c}": ("info", bad[c]) for c in INFO_CASES}
    jobs |= {f"flag:{c}": ("run", valid, *args) for c, (args, _) in FLAG_CASES.items()}
    jobs |= {f"chat:{c}": ("chat", valid, *FLAG_CASES[c][0][:2]) for c in CHAT_FLAG_CASES}
    jobs |= {
        "valid:run": ("run", valid, "-p", "hello"),
        "valid:info": ("info", valid),
        "verbose": ("run", bad["truncated_data"], "-p", "hello", "-v"),
        "missing:run": ("run", d / "nope.gguf", "-p", "hello"),
        "missing:info": ("info", d / "nope.gguf"),
        "plain_dir": ("run", d / "plain_dir", "-p", "hello"),
        "hf_no_weights": ("run", d / "hf_no_weights", "-p", "hello"),
        "hf_bad_config": ("run", d / "hf_bad_config", "-p", "hello"),
        "unknown_command": ("bogus",),
        "pull_unknown_model": ("pull", "no-such-model"),
        "prompt_and_file": ("run", valid, "-p", "hi", "-f", d / "prompt.txt"),
        "prompt_file_missing": ("run", valid, "-f", d / "absent.txt"),
        "prompt_file_dir": ("run", valid, "-f", d / "plain_dir"),
        "prompt_file_latin1": ("run", valid, "-f", d / "latin1.txt"),
    }
    stdin = {"stdin_latin1": "café".encode("latin-1")}
    jobs |= {key: ("run", valid, "-p", "-") for key in stdin}
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        futures = {
            key: pool.submit(frink, *args, stdin=stdin.get(key, b"")) for key, args in jobs.items()
        }
        return {key: f.result() for key, f in futures.items()}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_bad_file_run(runs: dict[str, Result], case: str) -> None:
    result = runs[f"run:{case}"]
    assert_error(result, *FILE_CASES[case])
    if case in HUGE_CASES:
        assert result.peak_rss_mib < MAX_RSS_MIB, (
            f"peak {result.peak_rss_mib:.0f} MiB\n" + result.describe()
        )


@pytest.mark.parametrize("case", INFO_CASES)
def test_bad_file_info(runs: dict[str, Result], case: str) -> None:
    assert_error(runs[f"info:{case}"], *FILE_CASES[case])


def test_valid_fixture_fails_only_at_the_tokenizer(runs: dict[str, Result]) -> None:
    # The control for every case above: unbroken, the file loads and stops at the tokenizer.
    assert_error(runs["valid:run"], "no tokenizer")
    info = runs["valid:info"]
    assert info.returncode == 0, info.describe()
    assert "tokenizer:      none" in info.stdout


def test_missing_file(runs: dict[str, Result]) -> None:
    assert_error(runs["missing:run"], "not found", "nope.gguf")
    assert_error(runs["missing:info"], "not found", "nope.gguf")


def test_directory_without_config(runs: dict[str, Result]) -> None:
    assert_error(runs["plain_dir"], "config.json")


def test_hf_directory_without_weights(runs: dict[str, Result]) -> None:
    assert_error(runs["hf_no_weights"], "model.safetensors")


def test_hf_directory_with_broken_config(runs: dict[str, Result]) -> None:
    assert_error(runs["hf_bad_config"], "config.json")


def test_verbose_adds_the_traceback(runs: dict[str, Result]) -> None:
    result = runs["verbose"]
    assert result.returncode == 1 and result.stdout == "", result.describe()
    assert "Traceback" in result.stderr, result.describe()
    assert result.lines()[-1].startswith("frink: error:"), result.describe()


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_bad_flag(runs: dict[str, Result], case: str) -> None:
    line = assert_error(runs[f"flag:{case}"], *FLAG_CASES[case][1])
    assert "tokenizer" not in line


@pytest.mark.parametrize("case", CHAT_FLAG_CASES)
def test_bad_chat_flag(runs: dict[str, Result], case: str) -> None:
    line = assert_error(runs[f"chat:{case}"], *FLAG_CASES[case][1])
    assert "tokenizer" not in line


def test_unknown_command(runs: dict[str, Result]) -> None:
    assert_error(runs["unknown_command"], "bogus")


def test_pull_unknown_model(runs: dict[str, Result]) -> None:
    # Refused from the catalogue, before pip or the network is involved.
    assert_error(runs["pull_unknown_model"], "no-such-model", "smollm2-135m")


def test_prompt_and_file_both_given(runs: dict[str, Result]) -> None:
    assert_error(runs["prompt_and_file"], "-p", "-f")


def test_prompt_file_missing(runs: dict[str, Result]) -> None:
    assert_error(runs["prompt_file_missing"], "prompt file", "absent.txt")


def test_prompt_file_is_a_directory(runs: dict[str, Result]) -> None:
    assert_error(runs["prompt_file_dir"], "prompt file", "plain_dir")


def test_prompt_file_not_utf8(runs: dict[str, Result]) -> None:
    assert_error(runs["prompt_file_latin1"], "UTF-8", "latin1.txt")


def test_stdin_not_utf8(runs: dict[str, Result]) -> None:
    assert_error(runs["stdin_latin1"], "stdin", "UTF-8")


# --- on the real model --------------------------------------------------------------------

LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


def test_prompt_longer_than_context(smollm2_path: Path) -> None:
    result = frink("run", smollm2_path, "-c", "16", "--raw", "-p", LONG_PROMPT, "-n", "4", "--json")
    assert_error(result, "too long", "16")


@pytest.mark.parametrize("backend", ["numpy", "metal", "cuda"])
def test_a_tensor_no_part_of_the_model_reads_is_refused_on_every_backend(
    bad: dict[str, Path], backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever body holds the layers, a tensor the loader never read is a dropped feature:
    load() refuses the file by the tensor's name instead of running another model."""
    if backend == "metal":
        pytest.importorskip("mlx.core")
    monkeypatch.setenv("FRINK_CUDA_ARRAY_MODULE", "numpy")
    import frink_cli
    from frink_cli.errors import FrinkError

    with pytest.raises(FrinkError, match=r"does not use: blk\.1\.ffn_act\.scales"):
        frink_cli.load(bad["unused_tensor"], backend=backend)
    frink_cli.load(bad["valid"], backend=backend)  # the same file without it loads


# --- issue 36's leftovers, on scripts/fuzz_inputs.py's tiny models -------------------------


def test_overflowing_weights_are_one_line(tmp_path: Path) -> None:
    """K weights of 3e38 overflow the attention scores: the NaN guard's line alone, with
    no NumPy RuntimeWarning (and its source line) printed before it."""
    F = load_script("fuzz_inputs")
    k = F.base_tensors()[4][1].copy()
    k[:] = 3e38
    path = tmp_path / "overflow.gguf"
    path.write_bytes(F._tensor(F.base(), "blk.0.attn_k.weight", arr=k).encode())
    assert_error(frink("run", path, "-p", "hi", "-n", "2", "--temp", "0"), "non-finite")


@pytest.mark.parametrize(
    ("key", "vtype", "value"),
    [
        ("tokenizer.ggml.eos_token_id", "STR", "2"),
        ("tokenizer.ggml.eos_token_id", "F32", 2.0),
        ("tokenizer.ggml.eos_token_id", "BOOL", True),
        ("tokenizer.ggml.model", "U32", 5),
        ("tokenizer.ggml.model", "ARR", ("STR", ["llama"])),
        ("tokenizer.chat_template", "ARR", ("STR", ["{{ 1 }}"])),
    ],
)
def test_wrongly_typed_tokenizer_metadata_is_refused(
    tmp_path: Path, key: str, vtype: str, value: object
) -> None:
    F = load_script("fuzz_inputs")
    if isinstance(value, tuple):
        value = (getattr(F, value[0]), value[1])
    path = tmp_path / "typed.gguf"
    path.write_bytes(F._with(F.base(), key, getattr(F, vtype), value).encode())
    assert_error(frink("run", path, "-p", "hi", "-n", "2"), key)


def _hf_dir(tmp_path: Path, **config: object) -> Path:
    F = load_script("fuzz_inputs")
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**F.LLAMA_CONFIG, **config}))
    (d / "model.safetensors").write_bytes(F.safetensors_bytes(F.hf_tensors()))
    return d


@pytest.mark.parametrize(
    "missing", ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]
)
def test_llama3_rope_scaling_needs_its_fields(tmp_path: Path, missing: str) -> None:
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    del rope[missing]
    d = _hf_dir(tmp_path, rope_scaling=rope)
    assert_error(frink("run", d, "-p", "hi", "-n", "2"), "llama3", missing)


def test_llama3_rope_scaling_fields_are_checked(tmp_path: Path) -> None:
    rope = {
        "rope_type": "llama3",
        "factor": "8",
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    d = _hf_dir(tmp_path, rope_scaling=rope)
    assert_error(frink("run", d, "-p", "hi", "-n", "2"), "llama3", "factor")


@pytest.mark.parametrize(
    "template",
    [
        [{"name": "default"}],
        [{"name": "default", "template": 5}],
        ["{{ messages }}"],
        [{"template": "{{ 1 }}"}],
        5,
    ],
)
def test_malformed_hf_chat_template_is_refused(tmp_path: Path, template: object) -> None:
    from tokenizers import Tokenizer, models

    d = _hf_dir(tmp_path)
    F = load_script("fuzz_inputs")
    vocab = {t: i for i, t in enumerate(F.TOKENS)}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    assert_error(frink("run", d, "-p", "hi", "-n", "2"), "chat_template")


# --- issue 30: a forced kernel variant this CPU cannot run ---------------------------------


def test_a_forced_kernel_variant_this_cpu_lacks_is_one_line(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FRINK_NATIVE_ISA naming a variant the CPU lacks (or no variant at all) is refused by
    name with the variants it does run: never NumPy instead, never SIGILL."""
    from isa_variants import ISAS, runnable_isas

    runs = runnable_isas()
    if not runs:
        pytest.skip("the compiled kernels are not built here")
    lacking = next((name for name in ISAS if name not in runs), "sse9")
    monkeypatch.setenv("FRINK_NATIVE_ISA", lacking)
    for args in (("info", smollm2_path), ("run", smollm2_path, "--raw", "-p", "hi", "-n", "1")):
        assert_error(frink(*args), f"FRINK_NATIVE_ISA={lacking}", *runs)
    monkeypatch.setenv("FRINK_NATIVE_ISA", runs[-1])
    assert f"native C ({runs[-1]}" in frink("info", smollm2_path).stdout


def test_a_kv_pool_beyond_memory_is_one_line(smollm2_path: Path) -> None:
    """`frink serve --kv-pool` asking for more than the machine can map is refused in one
    line naming the option, before the server listens (never a traceback)."""
    result = frink("serve", smollm2_path, "--port", "0", "--kv-pool", str(10**15))
    assert_error(result, "--kv-pool", "cannot be allocated")
