"""gpt-oss's harmony output split by channel (frink_cli/channels.py).

The token streams are OpenAI's harmony format as its documentation spells a reply: an
analysis message, then `<|start|>assistant` and the final message ended by `<|return|>`;
a commentary message addressed to a tool (` to=functions.x <|constrain|>json`); a reply
with no header. The vocabulary is a stand-in with harmony's marker tokens, each other token
one word, so the split alone is under test (the tokenizer is tested against llama.cpp
elsewhere).
"""

from __future__ import annotations

from frink_cli.channels import FINAL, ChannelSplit, is_harmony

MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"]


class _Stream:
    def __init__(self, tok: _Vocab) -> None:
        self.tok = tok

    def push(self, token_id: int) -> str:
        return self.tok.words[token_id]

    def flush(self) -> str:
        return ""


class _Vocab:
    def __init__(self, words: list[str]) -> None:
        self.words = MARKERS + words

    def token_id(self, text: str) -> int | None:
        return self.words.index(text) if text in self.words else None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.words[i] for i in ids)

    def stream(self) -> _Stream:
        return _Stream(self)

    def ids(self, text: list[str]) -> list[int]:
        return [self.words.index(t) for t in text]


def _split(tok: _Vocab, tokens: list[str]) -> dict[str, str]:
    split = ChannelSplit(tok)  # type: ignore[arg-type]
    out: dict[str, str] = {}
    for t in tok.ids(tokens):
        for channel, text in split.push(t):
            out[channel] = out.get(channel, "") + text
    for channel, text in split.flush():
        out[channel] = out.get(channel, "") + text
    return out


WORDS = [
    "analysis",
    "final",
    "commentary",
    " to=functions.get",
    "<|constrain|>",
    "json",
    "User",
    " asks",
    " 2+2",
    ".",
    "4",
    " is",
    " the",
    " answer",
    "{}",
    "assistant",
]


def test_reasoning_then_answer() -> None:
    tok = _Vocab(WORDS)
    assert is_harmony(tok)  # type: ignore[arg-type]
    got = _split(
        tok,
        [
            "<|channel|>",
            "analysis",
            "<|message|>",
            "User",
            " asks",
            " 2+2",
            ".",
            "<|end|>",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "final",
            "<|message|>",
            "4",
            " is",
            " the",
            " answer",
            ".",
            "<|return|>",
        ],
    )
    assert got == {"analysis": "User asks 2+2.", FINAL: "4 is the answer."}


def test_tool_call_header() -> None:
    got = _split(
        _Vocab(WORDS),
        [
            "<|channel|>",
            "commentary",
            " to=functions.get",
            "<|constrain|>",
            "json",
            "<|message|>",
            "{}",
            "<|call|>",
        ],
    )
    assert got == {"commentary": "{}"}


def test_no_header_is_the_answer() -> None:
    assert _split(_Vocab(WORDS), ["4", " is", " the", " answer"]) == {FINAL: "4 is the answer"}


def test_other_vocabularies_are_not_harmony() -> None:
    class Plain(_Vocab):
        def token_id(self, text: str) -> int | None:
            return None if text.startswith("<|") else super().token_id(text)

    assert not is_harmony(Plain(WORDS))  # type: ignore[arg-type]
