"""llama.cpp's own tokenizer suite (models/ggml-vocab-*.gguf in the llama-cpp-python sdist,
the files llama.cpp's test-tokenizer-0 reads) through frink's GGUF tokenizers.

Each vocabulary file comes with `.inp` (texts, separated by a line `__ggml_vocab_test__`)
and `.out` (llama.cpp's ids for each text, no special tokens added, special tokens in
the text parsed): frink must give exactly those ids, on every vocabulary type it reads
(gpt2-style BPE with each pre-tokenizer, SentencePiece, BERT's WordPiece, gemma4's). A
vocabulary frink does not read is refused in one line naming its tokenizer model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from script_loader import load_script

from frink_cli.archs import open_checkpoint
from frink_cli.errors import FrinkError
from frink_cli.tokenizer import load_tokenizer

pytestmark = pytest.mark.real

# Every vocabulary of llama-cpp-python 0.3.36's suite (test_the_suite_is_every_file holds
# this list to the directory): the ones with test cases, and the ones shipped without.
WITH_CASES = (
    "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2",
    "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder",
)  # fmt: skip
WITHOUT_CASES = ("aquila", "baichuan", "gpt-neox")
# Vocabularies frink refuses: name -> what the one-line refusal names.
REFUSED = {"nomic-bert-moe": "tokenizer model 't5'"}
SEPARATOR = "\n__ggml_vocab_test__\n"


@pytest.fixture(scope="module")
def suite() -> Path:
    return load_script("llama_cpp_converter").ensure_converter() / "models"


def test_the_suite_is_every_file(suite: Path) -> None:
    names = sorted(
        p.name.removeprefix("ggml-vocab-").removesuffix(".gguf")
        for p in suite.glob("ggml-vocab-*.gguf")
    )
    assert names == sorted([*WITH_CASES, *WITHOUT_CASES, *REFUSED])
    for name in WITH_CASES:
        assert (suite / f"ggml-vocab-{name}.gguf.inp").is_file()


def cases(suite: Path, name: str) -> list[tuple[str, list[int]]]:
    """The suite's (text, ids) pairs for one vocabulary, as test-tokenizer-0 reads them."""
    path = suite / f"ggml-vocab-{name}.gguf"
    texts = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split(SEPARATOR)
    lines = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    if len(lines) == len(texts) + 1 and lines[-1] == "":
        lines.pop()  # a trailing newline
    assert len(lines) == len(texts), (name, len(lines), len(texts))
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


@pytest.mark.parametrize("name", WITH_CASES)
def test_ids_match_llama_cpps_suite(suite: Path, name: str) -> None:
    tok = load_tokenizer(open_checkpoint(suite / f"ggml-vocab-{name}.gguf"))
    pairs = cases(suite, name)
    assert len(pairs) >= 40
    wrong = [
        (text, got[:16], want[:16])
        for text, want in pairs
        if (got := tok.encode(text, add_special=False, parse_special=True)) != want
    ]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("name", WITHOUT_CASES)
def test_vocabularies_without_cases_load(suite: Path, name: str) -> None:
    tok = load_tokenizer(open_checkpoint(suite / f"ggml-vocab-{name}.gguf"))
    ids = tok.encode("Hello world", add_special=False)
    assert ids and tok.decode(ids).strip() == "Hello world"


@pytest.mark.parametrize(("name", "needle"), sorted(REFUSED.items()))
def test_unread_vocabularies_are_refused_by_name(suite: Path, name: str, needle: str) -> None:
    with pytest.raises(FrinkError, match=needle) as e:
        load_tokenizer(open_checkpoint(suite / f"ggml-vocab-{name}.gguf"))
    assert "\n" not in str(e.value)
