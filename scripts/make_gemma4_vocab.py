"""A vocab-only GGUF with a Gemma 4 style tokenizer (tokenizer.ggml.model "gemma4").

Why: no Gemma 4 tokenizer is on disk (and there is no hub access), so a vocabulary of the
same shape is trained here, deterministically, with `tokenizers`' BPE trainer, and written
with the keys llama.cpp's converter writes for Gemma 4 (conversion/gemma.py,
Gemma4Model.set_vocab: model "gemma4", tokens, scores, token types, merges, the special ids,
add_space_prefix false, add_bos true; no tokenizer.ggml.pre, which llama.cpp forces to
"gemma4").

What makes it representative of Gemma 4's vocabulary:
- BPE over SentencePiece-normalized text: spaces are "▁" inside tokens, and a "word" is a
  whole line (no pre-splitting on spaces), so merges cross "▁" ("▁the▁" can be a token) and
  runs of "▁" are tokens, as in Gemma's vocabulary;
- <0x00>..<0xFF> byte-fallback tokens, and an alphabet capped so rarer characters (SMP,
  CJK extensions, private use, most emoji) have no token of their own and fall back to bytes;
- newline-run tokens "\\n" .. "\\n" * 8 of which only the 2- and 4-runs are reachable by merges,
  the case llama.cpp's Gemma 4 fix (a run of newlines that is a token is taken whole)
  exists for;
- Gemma's layout of special tokens: <pad> <eos> <bos> <unk> <mask> control tokens first, the
  turn markers, "unused" control tokens, a normal "</s>", and the tokens the converter makes
  USER_DEFINED so they are always rendered (<|channel>, <|tool_response>, ...), plus
  HTML-ish user-defined tokens as Gemma has.

Usage: python scripts/make_gemma4_vocab.py OUT.gguf
"""

from __future__ import annotations

import functools
import random
import sys
from pathlib import Path

SEED = 4
N_LINES = 3000
TRAIN_VOCAB = 2500  # merges + alphabet learned by the trainer
ALPHABET = 160  # characters kept as tokens; the rest fall back to bytes

# gguf TokenType values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4

SPECIALS = [
    ("<pad>", CONTROL),
    ("<eos>", CONTROL),
    ("<bos>", CONTROL),
    ("<unk>", UNKNOWN),
    ("<mask>", CONTROL),
    ("[multimodal]", CONTROL),
    ("<|turn>", CONTROL),
    ("<turn|>", CONTROL),
    # the converter's visible_tokens: USER_DEFINED so the chat parser sees them
    ("<|tool_response>", USER_DEFINED),
    ("<tool_response|>", USER_DEFINED),
    ("<|channel>", USER_DEFINED),
    ("<channel|>", USER_DEFINED),
    ("<|tool_call>", USER_DEFINED),
    ("<tool_call|>", USER_DEFINED),
    ('<|"|>', USER_DEFINED),
    *[(f"<unused{i}>", CONTROL) for i in range(6)],
    ("</s>", NORMAL),  # an ordinary token in Gemma 4 (llama.cpp drops it from the EOG set)
]
USER_TOKENS = ["<b>", "</b>", "<table>", "<td>", "</td>", "<br>"]
NEWLINE_RUNS = ["\n" * k for k in range(1, 9)]
NEWLINE_MERGES = ["\n \n", "\n\n \n\n"]

_WORD_TEXT = (
    "the of and to in is that for it with as was on be at by this had not are but from or "
    "have an they which one you were her all she there would their we him been has when who "
    "will more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even most "
    "made after also did many before must through back years where much your way well down "
    "hello world model token tokenizer gemma llama frink python return print def class "
    "café naïve résumé Ångström über straße año niño façade élève "
    "привет мир спасибо да нет "
    "مرحبا بالعالم شكرا "
    "你好 世界 这是 一个 测试 中文 日本語 テキスト カタカナ ひらがな 한국어 텍스트 "
    "😀 🎉 👍 ❤ ✓ ∑ ∫ √ ∞ ≠ ≤ € £ ¥ © ® "
    "0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 1,000 007 0x1F "
    "( ) [ ] { } < > = + - * / % & | ^ ~ ! ? . , ; : ' \" # @ $ _ `"
)
_WORDS = _WORD_TEXT.split()


def corpus(n: int, seed: int) -> list[str]:
    """Lines of words joined by space runs and tabs, spaces already written as "▁"."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(3, 14)):
            parts.append(rng.choice(_WORDS))
            parts.append(rng.choice([" "] * 12 + ["  ", "   ", "    ", "\t", " \t", "\t\t"]))
        lead = rng.choice(["", "", "", " ", "    ", "\t"])
        lines.append((lead + "".join(parts)).replace(" ", "\u2581"))
    return lines


def train() -> tuple[list[str], list[str]]:
    """The trained vocabulary (tokens in id order) and merges ("a b", rank order)."""
    import json

    from tokenizers import Tokenizer, models, trainers

    tk = Tokenizer(models.BPE(byte_fallback=True))
    trainer = trainers.BpeTrainer(
        vocab_size=TRAIN_VOCAB,
        limit_alphabet=ALPHABET,
        initial_alphabet=["\u2581", "\t"],
        show_progress=False,
    )
    tk.train_from_iterator(corpus(N_LINES, SEED), trainer=trainer)
    model = json.loads(tk.to_str())["model"]
    vocab = sorted(model["vocab"], key=model["vocab"].__getitem__)
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    return vocab, merges


@functools.cache
def build() -> dict:
    """The tokenizer.* keys of the vocabulary, as the converter would write them."""
    tokens: list[str] = []
    types: list[int] = []

    def add(text: str, ttype: int) -> None:
        tokens.append(text)
        types.append(ttype)

    for text, ttype in SPECIALS:
        add(text, ttype)
    for b in range(256):
        add(f"<0x{b:02X}>", 6)  # BYTE
    for text in NEWLINE_RUNS:
        add(text, NORMAL)
    trained, merges = train()
    have = set(tokens)
    for text in trained:
        if text not in have:
            add(text, NORMAL)
    for text in USER_TOKENS:
        add(text, USER_DEFINED)
    ids = {t: i for i, t in enumerate(tokens)}
    return {
        "tokens": tokens,
        "types": types,
        "merges": NEWLINE_MERGES + merges,
        "bos": ids["<bos>"],
        "eos": ids["<eos>"],
        "unk": ids["<unk>"],
        "pad": ids["<pad>"],
    }


def write(path: Path, model: str = "gemma4", pre: str | None = None, add_bos: bool = True) -> Path:
    """The GGUF as the converter writes it; `model`, `pre` and `add_bos` make the variants
    llama.cpp also reads with the gemma4 pre-tokenizer ("gpt2" + pre "gemma4")."""
    from gguf import GGUFWriter

    v = build()
    w = GGUFWriter(str(path), "llama")  # vocab-only: the architecture is a formality
    for key, val in (
        ("context_length", 256),
        ("embedding_length", 64),
        ("block_count", 1),
        ("feed_forward_length", 128),
        ("attention.head_count", 2),
    ):
        w.add_uint32(f"llama.{key}", val)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(v["tokens"])
    w.add_token_scores([0.0] * len(v["tokens"]))
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    w.add_unk_token_id(v["unk"])
    w.add_pad_token_id(v["pad"])
    w.add_add_space_prefix(False)
    w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(write(Path(sys.argv[1])))
