"""gpt-oss's harmony output, split into its channels as the tokens arrive (ChannelSplit), and
a model's generation as (channel, text) pairs (generated_channels).

After the prompt's `<|start|>assistant`, a harmony model writes messages of the form
`<|channel|>NAME<|message|>TEXT<|end|>`, each later one opened by
`<|start|>assistant` again; the answer is the `final` channel, ended by `<|return|>` (or
`<|call|>` for a tool call), which stop generation. `analysis` carries the reasoning and
`commentary` tool preambles (OpenAI's harmony format). The header between `<|channel|>` and
`<|message|>` may add ` to=...` or `<|constrain|>...`: the channel is its first word.
Text outside any message (a model that skips the header) counts as final. A call is a
message addressed `to=functions.NAME`; when tools were offered it goes to the tool-call
parser as final text, markers spelled (ChannelSplit's `calls`), else to reasoning.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .tokenizer import StreamDecoder, Tokenizer

FINAL = "final"
_HEADER_END = ("<|message|>",)
_MESSAGE_END = ("<|end|>", "<|return|>", "<|call|>")
_RECIPIENT = "to=functions."


def is_harmony(tok: Tokenizer) -> bool:
    """The vocabulary is o200k_harmony's: it has the markers the split reads."""
    return all(
        tok.token_id(m) is not None for m in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")
    )


class ChannelSplit:
    """push(token id) -> [(channel, text)]: the text the token completes, by channel.

    `calls` (a chat request that offered tools): a message addressed to a function (a
    header with `to=functions.NAME`, after `<|start|>` or `<|channel|>`) is passed on
    as "final" text, its markers spelled -- `<|start|>ROLE<|channel|>HEADER<|message|>`
    and everything after it -- for the harmony tool-call parser (toolcalls/harmony.py);
    at the answer's start, text that may still become such a recipient is held back."""

    def __init__(self, tok: Tokenizer, calls: bool = False) -> None:
        self.tok = tok
        ids = {
            m: tok.token_id(m) for m in ("<|start|>", "<|channel|>", *_HEADER_END, *_MESSAGE_END)
        }
        self._role = ids["<|start|>"]
        self._channel = ids["<|channel|>"]
        self._message = ids["<|message|>"]
        self._ends = {ids[m] for m in _MESSAGE_END if ids[m] is not None}
        self.calls = calls
        # "lead" (calls only: the answer's first text, maybe a recipient) | "role" |
        # "header" | "text"
        self.state = "lead" if calls else "text"
        self.channel = FINAL
        self._roles: list[int] = []  # the tokens after <|start|> (or in the lead)
        self._header: list[int] = []
        self._call = False  # the open message is a call, passed on as text
        self._stream: StreamDecoder = tok.stream()

    def push(self, token_id: int) -> list[tuple[str, str]]:
        if self._call:
            return self._call_text(token_id)
        if token_id == self._role:
            out = self._close()
            self.state, self._roles = "role", []
            return out
        if token_id == self._channel:
            if self.state == "header":  # `to=functions.X<|channel|>...`: the recipient first
                self._roles += self._header
            out = self._close()
            self.state, self._header = "header", []
            return out
        if token_id == self._message and self.state == "header":
            return self._open()
        if token_id in self._ends:
            out = self._close()
            self.state, self.channel, self._roles = "role", FINAL, []
            return out
        if self.state == "header":
            self._header.append(token_id)
            return []
        if self.state == "role":
            self._roles.append(token_id)  # the role after <|start|> ("assistant")
            return []
        if self.state == "lead":
            return self._lead(token_id)
        piece = self._stream.push(token_id)
        return [(self.channel, piece)] if piece else []

    def flush(self) -> list[tuple[str, str]]:
        if self.state == "lead":  # the answer's whole text
            self.state, held, self._roles = "text", self._roles, []
            return [p for t in held for p in self.push(t)] + self._close()
        return self._close()

    def _lead(self, token_id: int) -> list[tuple[str, str]]:
        """The answer's first text: held while it may be a recipient (` to=functions.`,
        which a header then follows), else sent as final text."""
        self._roles.append(token_id)
        lead = self.tok.decode(self._roles).lstrip()
        if lead.startswith(_RECIPIENT) or _RECIPIENT.startswith(lead):
            return []
        self.state, held, self._roles = "text", self._roles, []
        return [p for t in held for p in self.push(t)]

    def _open(self) -> list[tuple[str, str]]:
        """<|message|> after a header: the message's channel, or a call's spelled head."""
        role, header = self.tok.decode(self._roles), self.tok.decode(self._header)
        self.state, self._stream = "text", self.tok.stream()
        if self.calls and (_RECIPIENT in role or _RECIPIENT in header):
            self.channel, self._call = FINAL, True
            return [(FINAL, f"<|start|>{role}<|channel|>{header}<|message|>")]
        words = header.split()
        self.channel = words[0] if words else FINAL
        return []

    def _call_text(self, token_id: int) -> list[tuple[str, str]]:
        """A token after a call's head: text, a control token spelled. A call is the
        answer's last message (`<|call|>` ends generation), and the parser reads where
        its JSON ends (a marker's text may be inside a string of it)."""
        if self.tok.token_bytes(token_id):
            piece = self._stream.push(token_id)
            return [(FINAL, piece)] if piece else []
        return [(FINAL, self._stream.flush() + self.tok.token_text(token_id))]

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
