"""The gemma4 tokenizer (SentencePiece-style BPE) against llama.cpp, live.

The vocabulary is scripts/make_gemma4_vocab.py's: trained here, written with the keys
llama.cpp's converter writes for Gemma 4 (no real Gemma 4 tokenizer can be fetched). Every
expected id list and piece comes from llama-cpp-python loading that file (vocab_only).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from script_loader import load_script
from test_tokenizer import COMBOS, Ref, _llama_ref, _mismatches

from frink_cli.archs import open_checkpoint
from frink_cli.chat import fallback_template, prompt_ids, render_chat
from frink_cli.tokenizer import Tokenizer, load_tokenizer

pytest.importorskip("llama_cpp")
_maker = load_script("make_gemma4_vocab")

_SPECIALS = [
    "<bos>",
    "<eos>",
    "<pad>",
    "<unk>",
    "<mask>",
    "<|turn>",
    "<turn|>",
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<unused3>",
    "</s>",
    "<b>",
    "</b>",
    "<table>",
    "<td>",
]


def _edge_cases() -> list[str]:
    out = ["", " ", "  ", "   ", "\t", "\r", "\r\n", "\v\f", " " * 33, "\t" * 9]
    for k in range(1, 11):  # newline runs, bare and mixed with spaces and tabs
        nl = "\n" * k
        out += [nl, " " + nl, nl + " ", "\t" + nl + "\t", "a" + nl + "b", nl + "x" + nl]
        out += [" \n" * k, "\n \n" * k, "\t\n" * k, nl + "  " + nl, "x " + nl + " y"]
    out += [
        " leading",
        "trailing ",
        "  both  ",
        "many     inner    spaces",
        "Hello world",
        "hello\tworld\t\t",
        "line\r\nbreak\r\n",
        "\u2581already\u2581escaped",
        "\u2581 \u2581",
        "<bos>text after bos",
        "text<eos>",
        "<|turn>user\nhi<turn|>\n<|turn>model\n",
        "<|channel>thought\n<channel|>answer",
        '<|tool_call>call:f{x:<|"|>1<|"|>}<tool_call|>',
        "<|tool_response>ok<tool_response|>",
        "a</s>b </s> </s>",
        "<b>bold</b> <table><td>x</td></table>",
        "<unused3><mask><pad><unk>",
        " <bos> ",
        "\n<eos>\n\n",
        # invalid-ish: fragments of special tokens and byte-token lookalikes
        "<",
        "<|",
        "<bos",
        "bos>",
        "<<bos>>",
        "<0x41>",
        "<0xZZ>",
        "<0x",
        "\x00",
        "a\x00b",
        "\x1b[31mred\x1b[0m",
        "\ufeffbom",
        "\ufffd\uffff\ufffe",
    ]
    # every plane that has characters (surrogates excluded: not encodable)
    out += [
        "héllo wörld café naïve Ångström",  # Latin-1 / BMP
        "你好，世界！这是一个测试。",  # CJK
        "日本語のテキスト、カタカナ 한국어",
        "Привет мир",
        "שלום עולם \u200fRTL mark",  # RTL: Hebrew
        "مرحبا بالعالم",  # RTL: Arabic
        "e\u0301 a\u0308\u0323 combining \u0301",  # combining marks
        "emoji 😀🎉👍🏽 👨\u200d👩\u200d👧 flags 🇫🇷",  # SMP (plane 1)
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙",  # SMP math
        "\U00020000\U0002a6d6 \U00030000",  # CJK ext B / G (planes 2, 3)
        "\U000e0001\U000e0041 tags",  # plane 14
        "\ue000 \U000f0000 \U0010fffd private use",  # BMP, planes 15 and 16 PUA
        "nbsp\u00a0here\u3000ideographic\u2003em",
        "\u200bzero width\u200c\u200d",
    ]
    return out


def _random_strings(n: int, seed: int) -> list[str]:
    """Pieces of words, specials and whitespace runs, with characters from every plane."""
    rng = random.Random(seed)
    ranges = [
        (0x20, 0x7E),
        (0xA0, 0x2FF),
        (0x300, 0x36F),
        (0x590, 0x6FF),
        (0x4E00, 0x9FFF),
        (0xAC00, 0xD7A3),
        (0xE000, 0xF8FF),
        (0xFF00, 0xFFFD),
        (0x1F300, 0x1FAFF),
        (0x1D400, 0x1D7FF),
        (0x20000, 0x2A6DF),
        (0x30000, 0x3134F),
        (0xE0000, 0xE007F),
        (0xF0000, 0xFFFFD),
        (0x100000, 0x10FFFD),
    ]
    words = list(_maker._WORDS)
    glue = [" ", "  ", "    ", "\t", "\n", "\n\n", "\n\n\n", " \n ", "\r\n", "\u2581"]

    def piece() -> str:
        r = rng.random()
        if r < 0.35:
            return rng.choice(words)
        if r < 0.6:
            return rng.choice(glue) * rng.randint(1, 4)
        if r < 0.7:
            return rng.choice(_SPECIALS)
        lo, hi = rng.choice(ranges)
        return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 3)))

    return ["".join(piece() for _ in range(rng.randint(0, 16))) for _ in range(n)]


CORPUS = _edge_cases() + _random_strings(1200, seed=16)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Ref, Tokenizer]:
    path = _maker.write(tmp_path_factory.mktemp("gemma4") / "vocab.gguf")
    tok = load_tokenizer(open_checkpoint(path))
    assert tok is not None
    return _llama_ref(path), tok


def test_vocab_facts_match_llama_cpp(gemma4: tuple[Ref, Tokenizer]) -> None:
    import llama_cpp

    ref, tok = gemma4
    v = ref.vocab
    assert tok.n_vocab == llama_cpp.llama_vocab_n_tokens(v)
    assert tok.bos_id == llama_cpp.llama_vocab_bos(v)
    assert tok.eos_id == llama_cpp.llama_vocab_eos(v)
    assert tok.add_bos and llama_cpp.llama_vocab_get_add_bos(v)
    assert tok.add_eos == llama_cpp.llama_vocab_get_add_eos(v)
    eog = {i for i in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(v, i)}
    assert set(tok.eog_ids) == eog


def test_vocabulary_exercises_the_gemma4_rules(gemma4: tuple[Ref, Tokenizer]) -> None:
    """The fixture really has what the corpus is meant to hit (so the test can fail)."""
    ref, tok = gemma4
    ids = ref.tokenize("a\n\n\nb \U0001f9ff\U00030000", False, False)
    # "\n\n\n" has no merge path, llama.cpp takes it whole; the SMP characters are bytes
    assert tok.token_id("\n\n\n") in ids
    assert sum(tok.token_text(i).startswith("<0x") for i in ids) == 8
    # merges that cross "▁" (a line is one BPE word)
    ids = ref.tokenize("it was the first time", False, False)
    assert any(len(t) > 1 and t.endswith("\u2581") for t in map(tok.token_text, ids))


def test_encode_corpus_matches_llama_cpp(gemma4: tuple[Ref, Tokenizer]) -> None:
    ref, tok = gemma4
    bad = _mismatches(ref, tok, CORPUS)
    assert len(CORPUS) > 1000
    assert not bad, f"{len(bad)} of {len(CORPUS) * len(COMBOS)} differ:\n" + "\n".join(bad[:20])


def test_decode_matches_llama_cpp(gemma4: tuple[Ref, Tokenizer]) -> None:
    ref, tok = gemma4
    bad = []
    for text in CORPUS:
        for add in (True, False):
            ids = ref.tokenize(text, add, True)
            if tok.decode(ids) != ref.detokenize(ids):
                bad.append(repr(text))
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:20])


def test_every_piece_matches_llama_cpp(gemma4: tuple[Ref, Tokenizer]) -> None:
    ref, tok = gemma4
    bad = [i for i in range(tok.n_vocab) if tok.token_bytes(i) != ref.piece(i)]
    assert not bad, f"{len(bad)} pieces differ, first ids {bad[:10]}"


@pytest.mark.parametrize(
    "model, pre, add_bos",
    [
        ("gemma4", None, False),  # llama.cpp forces BOS on for Gemma 4 anyway
        ("gpt2", "gemma4", True),
        ("gpt2", "granite-embed-multi-311m", False),
    ],
)
def test_gemma4_pre_tokenizer_variants_match_llama_cpp(
    model: str, pre: str | None, add_bos: bool, tmp_path: Path
) -> None:
    path = _maker.write(tmp_path / "v.gguf", model=model, pre=pre, add_bos=add_bos)
    ref, tok = _llama_ref(path), load_tokenizer(open_checkpoint(path))
    assert tok is not None and tok.add_bos
    texts = CORPUS[:: len(CORPUS) // 200]
    bad = _mismatches(ref, tok, texts)
    bad += [
        repr(t)
        for t in texts
        if tok.decode(ref.tokenize(t, True, True)) != ref.detokenize(ref.tokenize(t, True, True))
    ]
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:20])


# --- the chat format a Gemma 4 file without a template falls back to --------------------------


def _googles_template() -> str:
    """Google's Gemma 4 chat template as llama.cpp ships it (models/templates/)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import llama_cpp_converter

    root = llama_cpp_converter.ensure_converter()
    return (root / "models" / "templates" / "google-gemma-4-31B-it.jinja").read_text()


CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": "What is 2+2? Ünïcödé 你好"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?\n\n"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["user", "system-and-turns"])
def test_no_template_falls_back_to_googles_format(
    messages: list[dict], gemma4: tuple[Ref, Tokenizer]
) -> None:
    """A vocabulary with Gemma 4's turn markers and no template: frink's fallback renders
    what Google's own template renders (through transformers) for a plain conversation,
    and the prompt's ids are that text's, tokenized with specials as llama.cpp does."""
    from test_chat import hf_render

    ref, tok = gemma4
    assert tok.chat_template is None
    fallback = fallback_template(tok)
    assert fallback is not None and fallback[0] == "gemma4"
    want = hf_render(_googles_template(), messages, "<bos>", "<eos>")
    got = render_chat(fallback[1], messages, bos_token="<bos>", eos_token="<eos>")
    assert got == want
    assert "<|turn>model\n" in got and got.count("<turn|>") == len(messages)
    notes: list[str] = []
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    turns = messages[1:] if system is not None else messages
    if len(turns) == 1:
        ids = prompt_ids(tok, turns[0]["content"], system=system, notes=notes)
        assert ids == ref.tokenize(want, False, True)
        assert notes and "gemma4" in notes[0]
