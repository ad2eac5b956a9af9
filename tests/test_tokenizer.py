"""frink's tokenizer against llama.cpp (llama-cpp-python), on the real models.

Every expected id list, piece and end-of-generation set comes from llama.cpp loading the
same GGUF file (vocab_only); frink's own numbers are never the reference. The Hugging Face
directory path is checked the same way, on directories transformers writes from each GGUF.
"""

from __future__ import annotations

import ctypes
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixture_copies import write_out

from frink_cli.archs import open_checkpoint
from frink_cli.errors import FrinkError
from frink_cli.formats import Checkpoint
from frink_cli.tokenizer import Tokenizer, load_tokenizer

# Edge cases: whitespace runs (spaces, tabs, trailing, "\r\n", newline runs), scripts and
# accents, emoji (multi-codepoint, ZWJ, flags), code, numbers, contractions, special tokens
# of both models written as text, text that looks like byte tokens or SentencePiece
# spaces, HTML-ish text (Gemma has such user-defined tokens), empty and one-char strings.
CORPUS = [
    "Hello world",
    "Hello, world!",
    " leading space",
    "trailing space ",
    "  two leading",
    "many     inner    spaces",
    "tabs\tand\t\ttabs\t",
    "line\nbreak",
    "crlf\r\nline\r\n",
    "\n\n\nthree newlines",
    "   \n  \t \n",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    " " * 40,
    "\n" * 40,
    "héllo wörld café naïve Ångström",
    "你好，世界！这是一个测试。",
    "日本語のテキスト、カタカナ",
    "한국어 텍스트",
    "Привет мир",
    "مرحبا بالعالم",
    "emoji 😀🎉👍🏽 👨‍👩‍👧‍👦 flags 🇫🇷",
    "math ∑∫√∞ ≠ ≤",
    "nbsp\u00a0here\u3000ideographic",
    "\u200bzero width",
    "ﬁ ligature",
    "e\u0301 combining",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and \ue000 private use",
    "ctrl\x01\x7fchars",
    "def f(x):\n    return x ** 2  # comment\n\nprint(f(3))\n",
    "if (a && b) { return -1; } else { x += 0x1F; }",
    "1234567",
    "3.14159 and 1,000,000 and 007",
    "numbers12345letters",
    "\t\t37 and \n\n42",
    "I'm you're they've we'll it's don't",
    "ALL CAPS SHOUTING",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after bos",
    "text <eos> middle",
    "<|endoftext|>",
    "<reponame>x<unused5><mask>",
    "<s>html-ish</s> <b>bold</b> <table><tr><td>x</td></tr></table>",
    "<0x41> literal byte token text",
    "▁already▁escaped",
    "▁     ▁",
    "a" * 300,
    "The quick brown fox jumps over the lazy dog. " * 5,
    "",
]

# Characters and fragments the seeded random strings are drawn from.
_POOL = (
    list("abcXYZ  \t\n\r0123456789.,;:'!?-_()[]{}<>/\\\"|@#$%^&*+=~`")
    + list("éüßñçøÅ你好世界日本語한국어Приветمرحبا😀🎉👍🏽‍🇫🇷∑∫√∞≠≤")
    + [
        "\u00a0",
        "\u3000",
        "\u200b",
        "\u0301",
        "𝔘",
        "\ue000",
        "\x01",
        "\x7f",
        "\u2581",
        "'s",
        "'ll",
        "<|im_start|>",
        "<|im_end|>",
        "<start_of_turn>",
        "<end_of_turn>",
        "<bos>",
        "<eos>",
        "</s>",
        "<s>",
        "<b>",
        "<0x41>",
        "<unused5>",
        "<mask>",
        "<|endoftext|>",
        "<reponame>",
        "    ",
        "\n\n",
        "\t\t",
    ]
)


def random_strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_POOL) for _ in range(rng.randint(0, 40))) for _ in range(n)]


# (add_special, parse_special)
COMBOS = [(True, True), (False, True), (True, False), (False, False)]


@dataclass
class Ref:
    """llama.cpp's view of one GGUF file."""

    path: Path
    llama: Any
    vocab: Any

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.llama.tokenize(text.encode(), add_bos=add_special, special=parse_special)

    def piece(self, token_id: int) -> bytes:
        """llama_token_to_piece(special=False). llama-cpp-python's own detokenize uses a
        32-byte buffer and silently drops longer pieces, so the C API is called here with
        room to spare."""
        import llama_cpp

        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self.vocab, token_id, buf, size, 0, False)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def detokenize(self, ids: list[int]) -> str:
        """Llama.detokenize(ids) (special=False): the pieces joined, minus one leading
        space when the ids start with BOS, decoded as UTF-8."""
        import llama_cpp

        out = b"".join(self.piece(i) for i in ids)
        if ids and ids[0] == llama_cpp.llama_vocab_bos(self.vocab) and out[:1] == b" ":
            out = out[1:]
        return out.decode("utf-8", errors="replace")


def _llama_ref(path: Path) -> Ref:
    llama_cpp = pytest.importorskip("llama_cpp")
    ll = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return Ref(path, ll, llama_cpp.llama_model_get_vocab(ll.model))


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request: pytest.FixtureRequest) -> tuple[str, Ref, Tokenizer]:
    path = request.getfixturevalue(f"{request.param}_path")
    ref = _llama_ref(path)
    tok = load_tokenizer(open_checkpoint(path))
    assert tok is not None
    return request.param, ref, tok


def _expected(ref: Ref, tok: Tokenizer, text: str, add: bool, special: bool) -> list[int]:
    ids = ref.tokenize(text, add, special)
    # The one deliberate difference (Tokenizer.encode's docstring): no second BOS when the
    # text starts with the BOS token, nor a second EOS when it ends with EOS. llama.cpp adds
    # them and warns.
    if add and tok.add_bos and ids[:2] == [tok.bos_id, tok.bos_id]:
        ids = ids[1:]
    if add and tok.add_eos and ids[-2:] == [tok.eos_id, tok.eos_id]:
        ids = ids[:-1]
    return ids


def _mismatches(ref: Ref, tok: Tokenizer, texts: list[str]) -> list[str]:
    bad = []
    for text in texts:
        for add, special in COMBOS:
            want = _expected(ref, tok, text, add, special)
            got = tok.encode(text, add_special=add, parse_special=special)
            if got != want:
                bad.append(
                    f"{text!r} add_special={add} parse_special={special}: "
                    f"llama.cpp {want[:24]} frink {got[:24]}"
                )
    return bad


real = pytest.mark.real


@real
def test_vocab_facts_match_llama_cpp(model: tuple[str, Ref, Tokenizer]) -> None:
    import llama_cpp

    _, ref, tok = model
    v = ref.vocab
    assert tok.n_vocab == llama_cpp.llama_vocab_n_tokens(v)
    assert tok.bos_id == llama_cpp.llama_vocab_bos(v)
    assert tok.eos_id == llama_cpp.llama_vocab_eos(v)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(v)
    assert tok.add_eos == llama_cpp.llama_vocab_get_add_eos(v)
    eog = {i for i in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(v, i)}
    assert set(tok.eog_ids) == eog


@real
def test_encode_corpus_matches_llama_cpp(model: tuple[str, Ref, Tokenizer]) -> None:
    _, ref, tok = model
    bad = _mismatches(ref, tok, CORPUS)
    assert not bad, f"{len(bad)} of {len(CORPUS) * len(COMBOS)} differ:\n" + "\n".join(bad[:20])


@real
def test_encode_random_strings_match_llama_cpp(model: tuple[str, Ref, Tokenizer]) -> None:
    _, ref, tok = model
    texts = random_strings(400, seed=1234)
    bad = _mismatches(ref, tok, texts)
    assert not bad, f"{len(bad)} of {len(texts) * len(COMBOS)} differ:\n" + "\n".join(bad[:20])


@real
def test_bos_written_as_text_is_not_doubled(gemma3_path: Path) -> None:
    ref = _llama_ref(gemma3_path)
    tok = load_tokenizer(open_checkpoint(gemma3_path))
    assert tok is not None and tok.add_bos
    llama_ids = ref.tokenize("<bos>Hi", True, True)
    assert llama_ids[:2] == [tok.bos_id, tok.bos_id]  # llama_tokenize doubles it
    assert tok.encode("<bos>Hi") == llama_ids[1:]
    # Without parse_special "<bos>" is plain text, and BOS is added as usual.
    assert tok.encode("<bos>Hi", parse_special=False) == ref.tokenize("<bos>Hi", True, False)


@real
def test_decode_matches_llama_cpp(model: tuple[str, Ref, Tokenizer]) -> None:
    _, ref, tok = model
    for text in CORPUS:
        for add in (True, False):
            ids = ref.tokenize(text, add, True)
            want = ref.detokenize(ids)
            assert tok.decode(ids) == want, text
            if all(len(ref.piece(i)) <= 32 for i in ids):  # the helper is llama-cpp-python's
                assert want == ref.llama.detokenize(ids).decode("utf-8", errors="replace")


@real
def test_every_piece_matches_llama_cpp(model: tuple[str, Ref, Tokenizer]) -> None:
    _, ref, tok = model
    bad = [i for i in range(tok.n_vocab) if tok.token_bytes(i) != ref.piece(i)]
    assert not bad, f"{len(bad)} pieces differ, first ids {bad[:10]}"


@real
def test_stream_decoder_holds_partial_characters(model: tuple[str, Ref, Tokenizer]) -> None:
    _, ref, tok = model
    held_back = False
    for text in CORPUS:
        ids = ref.tokenize(text, False, True)
        s = tok.stream()
        parts = []
        for i in ids:
            out = s.push(i)
            if not out and tok.token_bytes(i):
                held_back = True  # bytes arrived but no whole character yet
            parts.append(out)
        parts.append(s.flush())
        assert "".join(parts) == ref.detokenize(ids), text
    assert held_back, "no corpus string split a character across tokens"


# --- the same vocabularies under other tokenizer settings -------------------------------
#
# llama.cpp picks its pre-tokenizer regexes by tokenizer.ggml.pre name and its BOS/EOS and
# space-prefix policy by flags. Rewriting the real models' vocabularies into vocab-only
# GGUF files with other settings checks frink's tables against llama.cpp's for every
# regex family, not only the two the real models use.

# One name per regex family in llama-vocab.cpp (llama-bpe also turns on ignore_merges and
# add_bos; chatglm-bpe drops BOS; glm4 adds ignore_merges).
PRE_NAMES = [
    "default",
    "llama-bpe",
    "dbrx",
    "chatglm-bpe",
    "glm4",
    "jais-2",
    "deepseek-llm",
    "deepseek-v3",
    "spark2_5",
    "deepseek-coder",
    "falcon",
    "starcoder",
    "gpt-2",
    "qwen2",
    "qwen35",
    "bloom",
    "viking",
    "tekken",
    "chameleon",
    "gpt-4o",
    "bailingmoe",
    "seed-coder",
    "ufakzeka",
    "grok-2",
    "laguna",
    "exaone-moe",
    "minicpm5",
]


def write_vocab_gguf(path: Path, source: dict, overrides: dict) -> Path:
    """A vocab-only GGUF (llama arch, no tensors) with `source`'s tokenizer.* keys, as
    changed by `overrides` (a None value removes the key)."""
    import numpy as np
    from gguf import GGUFValueType, GGUFWriter

    w = GGUFWriter(str(path), "llama")
    for key, val in (
        ("context_length", 256),
        ("embedding_length", 64),
        ("block_count", 1),
        ("feed_forward_length", 128),
        ("attention.head_count", 2),
    ):
        w.add_uint32(f"llama.{key}", val)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    md = {k: v for k, v in source.items() if k.startswith("tokenizer.")}
    md.update(overrides)
    for k, v in md.items():
        if v is None:
            continue
        if isinstance(v, np.ndarray):
            sub = GGUFValueType.FLOAT32 if v.dtype == np.float32 else GGUFValueType.INT32
            w.add_key_value(k, v.tolist(), GGUFValueType.ARRAY, sub_type=sub)
        elif isinstance(v, list):
            w.add_array(k, v)
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        else:
            w.add_string(k, str(v))
    write_out(w)
    return path


def _variant_mismatches(path: Path) -> list[str]:
    ref = _llama_ref(path)
    tok = load_tokenizer(open_checkpoint(path))
    assert tok is not None
    bad = _mismatches(ref, tok, CORPUS + random_strings(100, seed=7))
    for text in CORPUS:
        ids = ref.tokenize(text, True, True)
        if tok.decode(ids) != ref.detokenize(ids):
            bad.append(f"decode {text!r}")
    return bad


@pytest.fixture(scope="module")
def smollm2_md(smollm2_path: Path) -> dict:
    return open_checkpoint(smollm2_path).metadata


@real
@pytest.mark.parametrize("pre", PRE_NAMES)
def test_pre_tokenizer_families_match_llama_cpp(pre: str, smollm2_md: dict, tmp_path: Path) -> None:
    path = write_vocab_gguf(
        tmp_path / "v.gguf",
        smollm2_md,
        {"tokenizer.ggml.pre": pre, "tokenizer.ggml.add_bos_token": None},
    )
    bad = _variant_mismatches(path)
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:20])


@real
@pytest.mark.parametrize(
    "overrides",
    [
        {"tokenizer.ggml.add_space_prefix": True},  # llama-2 style "▁" word prefix
        {"tokenizer.ggml.add_space_prefix": None, "tokenizer.ggml.add_bos_token": None},  # defaults
        {"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True},
    ],
    ids=["space-prefix", "spm-defaults", "eos-not-bos"],
)
def test_sentencepiece_flags_match_llama_cpp(
    overrides: dict, gemma3_path: Path, tmp_path: Path
) -> None:
    md = open_checkpoint(gemma3_path).metadata
    bad = _variant_mismatches(write_vocab_gguf(tmp_path / "v.gguf", md, overrides))
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:20])


# --- Hugging Face directories written by transformers from the same GGUF files -----------


@pytest.fixture(scope="module")
def hf_model(
    model: tuple[str, Ref, Tokenizer], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Ref, Tokenizer, Any]:
    transformers = pytest.importorskip("transformers")
    name, ref, _ = model
    hf = transformers.AutoTokenizer.from_pretrained(str(ref.path.parent), gguf_file=ref.path.name)
    out = tmp_path_factory.mktemp(f"hf_{name}")
    hf.save_pretrained(str(out))
    # Until the safetensors reader builds the Checkpoint, build one around the directory.
    ckpt = Checkpoint(path=out, format="safetensors", metadata={}, tensors=None, hf_dir=out)  # type: ignore[arg-type]
    tok = load_tokenizer(ckpt)
    assert tok is not None
    return name, ref, tok, hf


@real
def test_hf_dir_vocab_facts_match_llama_cpp(hf_model: tuple[str, Ref, Tokenizer, Any]) -> None:
    import llama_cpp

    _, ref, tok, _ = hf_model
    v = ref.vocab
    assert tok.n_vocab == llama_cpp.llama_vocab_n_tokens(v)
    assert (tok.bos_id, tok.eos_id) == (llama_cpp.llama_vocab_bos(v), llama_cpp.llama_vocab_eos(v))
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(v)
    assert set(tok.eog_ids) == {i for i in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(v, i)}


@real
def test_hf_dir_encode_matches_llama_cpp(hf_model: tuple[str, Ref, Tokenizer, Any]) -> None:
    """frink reading the directory == llama.cpp reading the GGUF.

    transformers' GGUF -> tokenizer.json conversion is not exact, and frink follows
    tokenizer.json, so strings on which transformers' own tokenizer already disagrees with
    llama.cpp are set aside (decided by those two tools alone), and the rest must match:
    - SmolLM2: the conversion keeps ByteLevel's GPT-2 regex but drops the "smollm"
      pre-tokenizer's separate digit split, so whitespace runs before a digit split
      differently ("\\t\\t37").
    - Gemma 3: the user-defined whitespace tokens come out normalized, so a literal "▁"
      next to spaces merges with them ("▁     ").
    """
    name, ref, tok, hf = hf_model
    texts = CORPUS + random_strings(200, seed=99)
    agree = [
        t for t in texts if hf.encode(t, add_special_tokens=False) == ref.tokenize(t, False, True)
    ]
    set_aside = len(texts) - len(agree)
    assert set_aside <= len(texts) // 4, f"{name}: transformers differs from llama.cpp {set_aside}x"
    bad = _mismatches(ref, tok, agree)
    assert not bad, f"{len(bad)} of {len(agree) * len(COMBOS)} differ:\n" + "\n".join(bad[:20])
    for text in CORPUS:
        if text in agree:
            ids = ref.tokenize(text, True, True)
            assert tok.decode(ids) == ref.detokenize(ids), text


# --- no models needed ---------------------------------------------------------------------


def _ckpt(metadata: dict, hf_dir: Path | None = None) -> Checkpoint:
    return Checkpoint(
        path=Path("x.gguf"),
        format="gguf",
        metadata=metadata,
        tensors=None,  # type: ignore[arg-type]
        hf_dir=hf_dir,
    )


@pytest.mark.parametrize(
    "md", [{}, {"tokenizer.ggml.model": "none"}, {"tokenizer.ggml.model": "no_vocab"}]
)
def test_no_tokenizer_in_gguf(md: dict) -> None:
    assert load_tokenizer(_ckpt(md)) is None


def test_no_tokenizer_json_in_hf_dir(tmp_path: Path) -> None:
    assert load_tokenizer(_ckpt({}, hf_dir=tmp_path)) is None


_TINY_BPE = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.tokens": ["a", "b", "ab"],
    "tokenizer.ggml.merges": ["a b"],
}


@pytest.mark.parametrize(
    "md, needle",
    [
        ({"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["a"]}, "'t5'"),
        ({**_TINY_BPE, "tokenizer.ggml.pre": "no-such-pre"}, "no-such-pre"),
        ({**_TINY_BPE, "tokenizer.ggml.pre": "kimi-k2"}, "kimi-k2"),
        (
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.tokens": ["a"],
                "tokenizer.ggml.pre": "gpt-2",
            },
            "merges",
        ),
    ],
)
def test_unsupported_vocabularies_are_refused(md: dict, needle: str) -> None:
    with pytest.raises(FrinkError, match=needle):
        load_tokenizer(_ckpt(md))


def test_missing_pre_falls_back_to_default_with_a_note() -> None:
    ckpt = _ckpt(dict(_TINY_BPE))
    tok = load_tokenizer(ckpt)
    assert tok is not None and any("tokenizer.ggml.pre" in n for n in ckpt.notes)
