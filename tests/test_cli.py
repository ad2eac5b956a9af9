"""`frink` end to end through a real process: what a user sees on the happy paths.

Why: the CLI's contract is about streams as much as text. The answer (generated text, or
exactly one JSON object with --json) is alone on stdout so it can be piped; stats and
progress go to stderr. These tests hold that contract on SmolLM2 (llama arch, gpt2 BPE,
chat template) and on the tiny tokenizer-less models, and check that every way of giving
a prompt (-p, -p - for stdin, -f) reaches the model as the same tokens. Real-model runs
are few and short (-n 8). Whether frink's greedy text equals llama.cpp's is a parity
test's job, not this file's; bad inputs are tests/test_bad_inputs.py's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from frink_subprocess import Result, assert_error, frink

PROMPT = "The capital of France is"
N = "8"
GREEDY = ("--temp", "0", "-n", N)
JSON_KEYS = {"text", "token_ids", "prompt_tokens", "timings"}


def ok(result: Result) -> Result:
    assert result.returncode == 0, result.describe()
    assert "Traceback" not in result.stderr and "frink: error" not in result.stderr, (
        result.describe()
    )
    return result


def one_json_object(result: Result) -> dict[str, Any]:
    """stdout must be exactly one JSON object (one line), nothing before or after it."""
    ok(result)
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.describe()
    data = json.loads(lines[0])
    assert isinstance(data, dict), result.describe()
    return data


@pytest.fixture(scope="module")
def raw_json(smollm2_path: Path) -> dict[str, Any]:
    """The reference run the other prompt paths are compared with."""
    return one_json_object(frink("run", smollm2_path, "-p", PROMPT, "--raw", *GREEDY, "--json"))


# --- run -------------------------------------------------------------------------------------


def test_json_is_one_object_with_the_documented_keys(
    raw_json: dict[str, Any], smollm2_path: Path
) -> None:
    assert JSON_KEYS <= raw_json.keys()
    assert raw_json["text"].strip(), raw_json
    ids = raw_json["token_ids"]
    assert 0 < len(ids) <= int(N) and all(isinstance(i, int) for i in ids)
    assert raw_json["prompt_tokens"] == len(raw_json["prompt_ids"]) > 0
    assert {"prompt_seconds", "generate_seconds", "generated_tokens"} <= raw_json["timings"].keys()
    assert raw_json["timings"]["generated_tokens"] == len(ids)
    assert Path(raw_json["model"]) == smollm2_path


def test_run_prints_the_text_alone_on_stdout(raw_json: dict[str, Any], smollm2_path: Path) -> None:
    result = ok(frink("run", smollm2_path, "-p", PROMPT, "--raw", *GREEDY))
    # Greedy is deterministic, so the streamed text is the JSON run's text, plus the
    # newline that ends the output; the stats line is on stderr, not mixed into it.
    assert result.stdout == raw_json["text"] + "\n", result.describe()
    assert "tok/s" not in result.stdout
    stats = [line for line in result.lines() if "tok/s" in line]
    assert len(stats) == 1, result.describe()
    assert f"generated: {len(raw_json['token_ids'])} tokens" in stats[0]


def test_prompt_from_stdin(raw_json: dict[str, Any], smollm2_path: Path) -> None:
    data = one_json_object(
        frink("run", smollm2_path, "-p", "-", "--raw", *GREEDY, "--json", stdin=PROMPT)
    )
    assert data["prompt_ids"] == raw_json["prompt_ids"]
    assert data["token_ids"] == raw_json["token_ids"]


def test_prompt_from_file(raw_json: dict[str, Any], smollm2_path: Path, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPT, encoding="utf-8")  # no trailing newline: same text as -p
    data = one_json_object(frink("run", smollm2_path, "-f", prompt, "--raw", *GREEDY, "--json"))
    assert data["prompt_ids"] == raw_json["prompt_ids"]
    assert data["token_ids"] == raw_json["token_ids"]


def test_chat_template_on_the_default_model(raw_json: dict[str, Any], smollm2_path: Path) -> None:
    # No MODEL: frink resolves the default (smollm2-135m) through its store, the one the
    # conftest fixture filled; no --raw: the prompt goes through the chat template.
    data = one_json_object(frink("run", "-p", PROMPT, *GREEDY, "--json"))
    assert Path(data["model"]) == smollm2_path
    assert data["text"].strip(), data
    chat, raw = data["prompt_ids"], raw_json["prompt_ids"]
    # The template wraps the user's text: its tokens appear inside, with more around them.
    assert len(chat) > len(raw)
    assert any(chat[i : i + len(raw)] == raw for i in range(len(chat) - len(raw) + 1)), (chat, raw)


# --- info, models --------------------------------------------------------------------------


def test_info(smollm2_path: Path) -> None:
    out = ok(frink("info", smollm2_path)).stdout
    assert "architecture:   llama" in out
    assert "layers:         30 " in out  # SmolLM2-135M: 30 blocks
    assert "tokenizer:      gpt2, 49152 tokens" in out
    assert "chat template:  yes" in out
    assert out.count("  blk.") == 30


def test_info_json(smollm2_path: Path) -> None:
    data = one_json_object(frink("info", smollm2_path, "--json"))
    assert data["architecture"] == "llama"
    assert data["format"] == "gguf"
    assert data["n_layer"] == 30 and len(data["layers"]) == 30
    assert data["n_vocab"] == 49152
    assert data["tokenizer"]["model"] == "gpt2"
    assert data["chat_template"] is True
    assert Path(data["path"]) == smollm2_path


def test_models_lists_the_fetched_default(smollm2_path: Path) -> None:
    out = ok(frink("models")).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("smollm2-135m")), None)
    assert line is not None, out
    assert str(smollm2_path) in line


# Per command, words its own help has and no other command's help has (checked below, so
# a word shared by two helps cannot pass for either): a command wired to another's
# function, or a help that lost its options, fails. Short words: help text wraps at 80.
HELP_WORDS: dict[str, tuple[str, ...]] = {
    "run": ("Generate text", "--max-tokens", "--temp", "--raw", "--system"),
    "info": ("Describe a model",),
    "bench": ("llama-bench style", "--n-prompt", "--repetitions", "--compare", "--submissions"),
    "parity": ("host body", "--steps", "--tokens"),
    "pull": ("model store",),
    "models": ("knows how to fetch",),
}


def test_help() -> None:
    listing = ok(frink("--help")).stdout
    for command, words in HELP_WORDS.items():
        # Listed as a command (its name first on a line), not merely a word of the app's help.
        assert re.search(rf"^\s+{command}\s", listing, re.MULTILINE), listing
        out = ok(frink(command, "--help")).stdout
        for word in words:
            assert word in out, f"{command} --help lacks {word!r}\n{out}"
        for other, other_words in HELP_WORDS.items():
            if other != command:
                assert not any(w in out for w in other_words), (command, other, out)


# --- tiny models: no tokenizer ---------------------------------------------------------------


@pytest.mark.parametrize("form", ["gguf", "hf_dir"])
def test_tiny_model_info_works_and_run_names_the_missing_tokenizer(
    tiny_model: Callable[[str], Any], form: str
) -> None:
    tiny = tiny_model("llama")
    path = getattr(tiny, form)
    if path is None:
        pytest.skip("llama.cpp's converter made no GGUF of the tiny llama")
    info = ok(frink("info", path))
    assert "architecture:   llama" in info.stdout
    assert "tokenizer:      none" in info.stdout
    assert "chat template:  no" in info.stdout
    assert_error(frink("run", path, "-p", "hello"), "no tokenizer")


@pytest.mark.parametrize(
    ("name", "positions", "decorations"),
    [
        ("mpt", "alibi (max bias 8, no rope)", "alibi_bias 8, clamp_kqv 1, layer_norm, plain_ffn"),
        ("granite", "rope norm, base 30000", "embd_scale 0.35, logit_scale 8, residual_scale 0.22"),
        ("llama_yarn", "yarn x8 (original context 32)", "rope_scaling"),
        (
            "gemma3",
            "rope neox, base 200000",
            "embd_scale 8, post_attn_norm, post_ffn_norm, qk_norm",
        ),
    ],
)
def test_info_shows_positions_and_decorations(
    tiny_model: Callable[[str], Any], name: str, positions: str, decorations: str
) -> None:
    """`frink info` says how a model places tokens (ALiBi, or rope and its scaling) and
    names every decoration, with its number where it has one; --json carries the same."""
    path = tiny_model(name).gguf
    out = ok(frink("info", path)).stdout
    line = {
        ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in out.splitlines() if ":" in ln
    }
    assert positions in line["positions"], out
    assert decorations in line["decorations"], out
    if name == "mpt":
        assert "alibi)" in out and "rope 10000" not in out  # per layer too
    d = one_json_object(frink("info", path, "--json"))
    assert d["positions"] == line["positions"]
    assert set(d["decoration_values"]) <= set(d["decorations"])


@pytest.mark.parametrize("name", ["granitehybrid", "llama"])
def test_info_layer_lines_rotate_as_the_metadata_says(
    tiny_model: Callable[[str], Any], name: str
) -> None:
    """Each attention layer's line names a rope base only where the file turns rope on, as
    gguf-py reads its metadata: granitehybrid's rope.scaling.finetuned false is NoPE (llama.cpp's
    has_rope off: "no rope" on every attention layer), llama rotates by its rope.freq_base."""
    from gguf import GGUFReader

    path = tiny_model(name).gguf
    if path is None:
        pytest.skip(f"llama.cpp's converter made no GGUF of the tiny {name}")
    reader = GGUFReader(path)

    def meta(key: str) -> Any:
        found = reader.get_field(f"{name}.{key}")
        return None if found is None else found.contents()

    rotates = meta("rope.scaling.finetuned") is not False  # true when absent, as llama.cpp
    want = f"rope {meta('rope.freq_base'):g}" if rotates else "no rope"
    out = ok(frink("info", path)).stdout
    lines = [ln for ln in out.splitlines() if re.match(r"\s+blk\.\d+\s+attention \(", ln)]
    assert lines, out
    for ln in lines:
        assert want in ln and ("rope " in ln) == rotates, ln
    rows = one_json_object(frink("info", path, "--json"))["layers"]
    assert [r["rotates"] for r in rows if r["mixer"] == "attention"] == [rotates] * len(lines)


def test_run_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`frink run ... | head -c 1`: SIGPIPE keeps its default action for the CLI (the
    server ignores it while serving), so frink ends as cat does, saying nothing."""
    import signal
    import subprocess

    from frink_subprocess import child_env, frink_command
    from script_loader import load_script

    path = tmp_path / "tiny.gguf"
    path.write_bytes(load_script("fuzz_inputs").base().encode())
    proc = subprocess.Popen(
        [*frink_command(), "run", str(path), "-p", "hi", "-n", "60", "--temp", "0"]
        + ["--raw", "-c", "64"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(1)
    proc.stdout.close()  # the reader goes away, as head does
    err = proc.stderr.read().decode()
    code = proc.wait(60)
    assert code in (0, -signal.SIGPIPE), (code, err)
    assert "Traceback" not in err and "Broken pipe" not in err, err
