"""gpt-oss's harmony output, split into its channels as the tokens arrive (ChannelSplit), and
a model's generation as (channel, text) pairs (generated_channels).

After the prompt's `<|start|>assistant`, a harmony model writes messages of the form
`<|channel|>NAME<|message|>TEXT<|end|>`, each later one opened by
`<|start|>assistant` again; the answer is the `final` channel, ended by `<|return|>` (or
`<|call|>` for a tool call), which stop generation. `analysis` carries the reasoning and
`commentary` tool preambles (OpenAI's harmony format). The header between `<|channel|>` and
`<|message|>` may add ` to=...` or `<|constrain|>...`: the channel is its first word.
Text outside any message (a model that skips the header) counts as final.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .tokenizer import StreamDecoder, Tokenizer

FINAL = "final"
_HEADER_END = ("<|message|>",)
_MESSAGE_END = ("<|end|>", "<|return|>", "<|call|>")


def is_harmony(tok: Tokenizer) -> bool:
    """The vocabulary is o200k_harmony's: it has the markers the split reads."""
    return all(
        tok.token_id(m) is not None for m in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")
    )


class ChannelSplit:
    """push(token id) -> [(channel, text)]: the text the token completes, by channel."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        ids = {
            m: tok.token_id(m) for m in ("<|start|>", "<|channel|>", *_HEADER_END, *_MESSAGE_END)
        }
        self._role = ids["<|start|>"]
        self._channel = ids["<|channel|>"]
        self._message = ids["<|message|>"]
        self._ends = {ids[m] for m in _MESSAGE_END if ids[m] is not None}
        self.state = "text"  # "role" | "header" | "text"
        self.channel = FINAL
        self._header: list[int] = []
        self._stream: StreamDecoder = tok.stream()

    def push(self, token_id: int) -> list[tuple[str, str]]:
        if token_id == self._role:
            out = self._close()
            self.state = "role"
            return out
        if token_id == self._channel:
            out = self._close()
            self.state, self._header = "header", []
            return out
        if token_id == self._message and self.state == "header":
            words = self.tok.decode(self._header).split()
            self.channel = words[0] if words else FINAL
            self.state, self._stream = "text", self.tok.stream()
            return []
        if token_id in self._ends:
            out = self._close()
            self.state, self.channel = "role", FINAL
            return out
        if self.state == "header":
            self._header.append(token_id)
            return []
        if self.state == "role":
            return []  # the role after <|start|> ("assistant")
        piece = self._stream.push(token_id)
        return [(self.channel, piece)] if piece else []

    def flush(self) -> list[tuple[str, str]]:
        return self._close()

    def _close(self) -> list[tuple[str, str]]:
        tail = self._stream.flush() if self.state == "text" else ""
        self._stream = self.tok.stream()
        return [(self.channel, tail)] if tail else []


def generated_channels(
    m: Any,
    ids: list[int],
    raw: bool,
    max_tokens: int,
    n_ctx: int | None,
    stats: Any,
    sampling: dict[str, Any],
    constraint: Any = None,
) -> Iterator[tuple[str, str]]:
    """(channel, text) as generated: every piece "final", except from a harmony model
    (gpt-oss) in chat mode, whose messages are split by channel (channels.ChannelSplit).
    `constraint` (Model.constraint) masks every generated token."""
    tok = m.tokenizer
    if raw or tok is None or not is_harmony(tok):
        stream = tok.stream() if tok is not None else None
        for token in m.generate_ids(
            ids, max_tokens=max_tokens, n_ctx=n_ctx, stats=stats, constraint=constraint, **sampling
        ):
            piece = stream.push(token) if stream is not None else ""
            if piece:
                yield FINAL, piece
        tail = stream.flush() if stream is not None else ""
        if tail:
            yield FINAL, tail
        return
    split = ChannelSplit(tok)
    for token in m.generate_ids(
        ids, max_tokens=max_tokens, n_ctx=n_ctx, stats=stats, constraint=constraint, **sampling
    ):
        yield from split.push(token)
    yield from split.flush()
