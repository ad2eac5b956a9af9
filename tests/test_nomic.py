"""nomic-embed-text-v1.5 (nomic-bert, F16 GGUF) against llama.cpp on the same file: its BERT
WordPiece tokenization (llama-cpp-python's tokenize and pieces), its embeddings (llama.cpp's
embedding mode, mean pooling as the file's pooling_type says) and `frink embed` on it.

No tiny random nomic-bert against transformers: transformers has no nomic-bert class (the
model's modeling code is remote code), so llama.cpp on the real file is the reference."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from frink_subprocess import child_env, embed_json, frink_command
from model_checks import cosines

from frink_cli import api

llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.real

# ~20 texts for the embeddings: short and long, the task prefixes nomic-embed expects,
# punctuation, accents, scripts, digits, whitespace, code, an unknown word.
EMBED_TEXTS = [
    "search_query: What is TSNE?",
    "search_document: TSNE is a dimensionality reduction algorithm by Laurens van der Maaten",
    "Hello world",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital and most populous city of France.",
    "!!!???...;;;:::",
    "e-mail: someone@example.com, web: https://example.org/path?q=1&r=2",
    "3.14159 2.71828 1.41421 -0.5e10 42",
    "Ünïcödé tëxt with àccents, café naïve résumé",
    "日本語のテキストです。東京は日本の首都です。",
    "Русский текст: быстрая коричневая лиса.",
    "Emoji: 😀🎉🚀 ☃ ♥",
    "Tabs\tand\nnewlines\r\nmixed",
    "UPPER CASE SHOUTING TEXT and mIxEd CaSe WoRdS",
    "def f(x): return x ** 2  # python code",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "한국어 문장입니다. Ελληνικά κείμενο. العربية نص قصير",
    "one two three four five six seven eight nine ten " * 8,
    "A long sentence about nothing in particular, " * 60,
]
# More for the tokenizer: control and format characters, combining marks, CJK beside
# Latin, symbols ASCII and not, special tokens written as text, ligatures, empty.
TOKEN_TEXTS = EMBED_TEXTS + [
    "",
    "   ",
    "cafe\u0301 re\u0301sume\u0301 (combining accents)",
    "a\x1cb\x00c\ufffdd\u200be\u200df",
    "İstanbul ǅemal ß Σίσυφος",
    "mixed中文english日本語テキスト한국어",
    "it's $5 #tag @me a+b=c ~x^2 `tick` |pipe| <tag> {x} [y]",
    "x [SEP] y [MASK] z [UNK] [PAD]",
    "ﬁ ligature ½ ² ① Ⅻ",
    "€50,25 £3 ¥100 © ® ™ § ¶ • …",
    "\u00a0non\u2003breaking\u3000spaces\u2028line",
    "x" * 300,
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𠀀𠀁 𪜀",
    "ÀÉÎÕÜ àéîõü ÇçÑñ Øø Åå Ææ",
    "hello-world_foo.bar/baz\\qux",
]


@pytest.fixture(scope="module")
def nomic(nomic_path: Path) -> api.Model:
    return api.load(nomic_path)


@pytest.fixture(scope="module")
def vocab_ref(nomic_path: Path) -> Any:
    return llama_cpp.Llama(model_path=str(nomic_path), vocab_only=True, verbose=False)


@pytest.fixture(scope="module")
def embed_ref(nomic_path: Path) -> Any:
    """llama.cpp's embedding mode on the file, the whole input in one ubatch (an encoder's
    input may not be split), mean pooling as the file's pooling_type (1) says."""
    return llama_cpp.Llama(
        model_path=str(nomic_path),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        n_ctx=2048,
        n_batch=2048,
        n_ubatch=2048,
        n_threads=2,
        verbose=False,
    )


def test_vocab_facts_match_llama_cpp(nomic: api.Model, vocab_ref: Any) -> None:
    tok, v = nomic.tokenizer, llama_cpp.llama_model_get_vocab(vocab_ref.model)
    assert tok.n_vocab == llama_cpp.llama_vocab_n_tokens(v)
    assert tok.bos_id == llama_cpp.llama_vocab_bos(v)
    assert tok.eos_id == llama_cpp.llama_vocab_eos(v)
    assert tok.sep_id == llama_cpp.llama_vocab_sep(v)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(v)
    assert tok.add_eos == llama_cpp.llama_vocab_get_add_eos(v)
    assert tok.add_sep == llama_cpp.llama_vocab_get_add_sep(v)
    buf = (llama_cpp.ctypes.c_char * 256)()
    bad = []
    for i in range(tok.n_vocab):
        n = llama_cpp.llama_token_to_piece(v, i, buf, 256, 0, False)
        if tok.token_bytes(i) != bytes(buf[:n]):
            bad.append(i)
    assert bad == []


@pytest.mark.parametrize("special", [True, False], ids=["special", "plain"])
def test_tokenization_matches_llama_cpp(nomic: api.Model, vocab_ref: Any, special: bool) -> None:
    """With and without special tokens (and parsing them), text by text."""
    tok = nomic.tokenizer
    for text in TOKEN_TEXTS:
        want = vocab_ref.tokenize(text.encode(), add_bos=special, special=special)
        got = tok.encode(text, add_special=special, parse_special=special)
        assert got == want, text


def test_embed_tokens_are_llama_cpps(nomic: api.Model, vocab_ref: Any) -> None:
    """What embed() feeds: [CLS] text [SEP], special tokens written as text parsed (as
    llama-server and sentence-transformers read them)."""
    for text in TOKEN_TEXTS[1:]:  # embed refuses an input with no tokens; this has two
        want = vocab_ref.tokenize(text.encode(), add_bos=True, special=True)
        assert nomic.embed_tokens(text) == want, text


def test_embeddings_match_llama_cpp(nomic: api.Model, embed_ref: Any) -> None:
    got = nomic.embed(EMBED_TEXTS)
    ref = np.array(embed_ref.embed(EMBED_TEXTS, normalize=True), np.float32)
    assert got.shape == ref.shape == (len(EMBED_TEXTS), 768)
    cos = cosines(got, ref)
    assert cos.min() >= 0.9999, dict(zip(EMBED_TEXTS, cos.round(6).tolist()))


def test_cli_embed(nomic_path: Path, embed_ref: Any) -> None:
    """`frink embed nomic.gguf TEXT` end to end, plain and --json, against llama.cpp."""
    texts = ["search_query: what is frink?", "Hello world"]
    ref = np.array(embed_ref.embed(texts, normalize=True), np.float32)
    run: dict[str, Any] = dict(capture_output=True, text=True, env=child_env(), timeout=300)
    got = embed_json(nomic_path, texts)
    assert cosines(got, ref).min() >= 0.9999
    plain = subprocess.run([*frink_command(), "embed", str(nomic_path), texts[0]], **run)
    assert plain.returncode == 0, plain.stderr
    one = np.array(plain.stdout.split(), np.float32)[None, :]
    assert cosines(one, ref[:1]).min() >= 0.9999
