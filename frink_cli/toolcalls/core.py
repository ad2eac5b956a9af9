"""The shared part of tool calls: a call (ToolCall), what a format is (ToolFormat) and
what its parser does (Parser), and the helpers the formats build on.

Why a table of formats: every model family was trained to write calls its own way
(Hermes/Qwen's `<tool_call>{json}</tool_call>`, Mistral's `[TOOL_CALLS][...]`, ...), and
its chat template shows that way to the model; each family's format lives in its own
module of this package, and detect.py picks one from a template's markers.

Calls are made valid by the constraint mask (constraint.py): a forced call (`required`,
a named function) is under the grammar from the first token; with `auto` the grammar
wakes up at the format's opening marker (llama.cpp's lazy grammar), so once a call is
opened its arguments follow the function's JSON schema.

Parsers stream: push(text) returns content to show now and the calls completed so far,
holding back any tail that could be the start of a marker, so a marker split across
tokens never leaks into content (MarkedParser does this for calls between markers).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..constraint import Grammar


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI's API carries it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    @property
    def args(self) -> dict:
        """The arguments as parsed JSON (a parser only makes calls whose arguments are
        a JSON object)."""
        return json.loads(self.arguments)


# An event of a parser: ("content", str) or ("call", ToolCall).
Event = tuple[str, Any]

WS = r"/[ \t\r\n]{0,4}/"


def literal(marker: str, tok: Any) -> str:
    """`marker` as a Lark terminal: by its token id when the vocabulary holds it as a
    control token (which spells no text, so a quoted string could not match it)."""
    if tok is not None:
        i = tok.token_id(marker)
        if i is not None and not tok.token_bytes(i):
            return f"<[{i}]>"
    return json.dumps(marker)


def call_schema(tools: list[dict], arguments_key: str = "arguments") -> dict:
    """The JSON schema of one call of any of `tools` (OpenAI function tools):
    {"name": <one of the names>, "arguments": <that function's parameters>}."""
    options = []
    for t in tools:
        f = t["function"]
        params = f.get("parameters")
        options.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": f["name"]},
                    arguments_key: params if params else {"type": "object"},
                },
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def call_list_schema(tools: list[dict], parallel: bool) -> dict:
    """The JSON schema of a list of calls of `tools`: at least one, and one at most
    unless `parallel`."""
    calls: dict = {"type": "array", "items": call_schema(tools), "minItems": 1}
    if not parallel:
        calls["maxItems"] = 1
    return calls


class ToolFormat:
    """How one family writes calls: its name, whether it needs the generic system prompt,
    the constraint for a call, and a fresh parser per answer."""

    name = ""
    marker = ""  # what a chat template that teaches this format writes
    native = True  # the template renders the tools itself

    @property
    def openers(self) -> tuple[str, ...]:
        """The markers that open a call (tool_choice none bans those that are tokens)."""
        return (self.marker,) if self.marker else ()

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker the parser reads (a vocabulary may hold one as a control token,
        which the answer's text must then spell for the parser)."""
        return self.openers

    def matches(self, template: str) -> bool:
        """Whether a chat template teaches this format (its markers are in it)."""
        return bool(self.marker) and self.marker in template

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        """(grammar, triggers): forced (required or named) calls from the first token, or
        (auto) a call from the first trigger the model writes on (a lazy grammar). `tok`
        (the model's Tokenizer) spells markers that are control tokens by their ids."""
        raise NotImplementedError

    def parser(self, tools: list[dict] | None = None) -> Parser:
        """A fresh streaming parser for one answer (`tools`: the offered tools, for
        formats whose arguments are not JSON)."""
        raise NotImplementedError

    def conversation(self, msgs: list[dict]) -> list[dict]:
        """The conversation as this family's template takes it (past calls and tool
        results included): as it is, unless the family writes them otherwise."""
        return msgs


class Parser:
    def push(self, text: str) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError


def partial_tail(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class Content:
    """Content as it may be sent: trailing whitespace is held back (the newline before a
    call is not part of the answer) and sent with the next text, so content is the same
    however the text was split."""

    def __init__(self) -> None:
        self.held = ""

    def send(self, text: str) -> list[Event]:
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body) :]
        return [("content", body)] if body else []

    def flush(self) -> list[Event]:
        held, self.held = self.held, ""
        return [("content", held)] if held else []


def parse_call(obj: Any, arguments_key: str = "arguments") -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(arguments_key, obj.get("arguments", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


# A bare call opens as `{"name"`, JSON's whitespace allowed inside (as llama.cpp reads
# Llama's and Qwen's bare calls); a buffer's tail that may still become one is held back.
_BARE = re.compile(r'\{\s*"name"')
_BARE_PARTIAL = re.compile(r'\{\s*(?:"(?:n(?:a(?:m(?:e)?)?)?)?)?$')


class MarkedParser(Parser):
    """Calls between a start and an end marker, or bare JSON objects opening with
    `bare`, and content around them."""

    def __init__(
        self,
        start: str,
        end: str | None,
        bare: str | None = None,
        arguments_key: str = "arguments",
    ) -> None:
        # end None: the start marker is followed by one JSON object (Llama's python_tag).
        self.start, self.end, self.bare = start, end, bare
        self.arguments_key = arguments_key
        self.buf = ""
        self.state = "content"  # | "tagged" | "bare"
        self.content = Content()

    def _opening(self) -> tuple[int, str]:
        """The first opening marker in the buffer: (position, "tagged" | "bare")."""
        found = [(self.buf.find(self.start), "tagged")]
        if self.bare is not None:
            m = _BARE.search(self.buf)
            found.append((m.start() if m else -1, "bare"))
        found = [f for f in found if f[0] >= 0]
        return min(found) if found else (-1, "")

    def push(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        while True:
            if self.state == "content":
                at, kind = self._opening()
                if at >= 0:
                    before = self.buf[:at]
                    if before.strip():
                        out += self.content.send(before)
                    self.content.held = ""
                    skip = len(self.start) if kind == "tagged" else 0
                    if kind == "tagged" and self.end is None:
                        kind, self.opened = "bare", self.start
                        skip += len(self.buf[at + skip :]) - len(self.buf[at + skip :].lstrip())
                    self.buf, self.state = self.buf[at + skip :], kind
                    continue
                keep = partial_tail(self.buf, self.start)
                if self.bare is not None:
                    m = _BARE_PARTIAL.search(self.buf)
                    keep = max(keep, len(m.group()) if m else 0)
                if len(self.buf) > keep:
                    out += self.content.send(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                return out
            if self.state == "tagged":
                assert self.end is not None
                at = self.buf.find(self.end)
                if at < 0:
                    return out
                out += self._call(self.buf[:at], self.start, self.end)
                self.buf, self.state = self.buf[at + len(self.end) :], "content"
                continue
            try:  # bare: one JSON object from the marker on
                obj, at = json.JSONDecoder().raw_decode(self.buf)
            except ValueError:
                return out  # not complete yet
            out += self._call(self.buf[:at], self.opened, "")
            self.buf, self.state, self.opened = self.buf[at:], "content", ""

    opened = ""  # the start marker a bare object came after (Llama's python_tag)

    def _call(self, body: str, before: str, after: str) -> list[Event]:
        try:
            call = parse_call(json.loads(body), self.arguments_key)
        except ValueError:
            call = None
        if call is None:  # not a call after all: the text as the model wrote it
            return self.content.send(before + body + after)
        return [("call", call)]

    def finish(self) -> list[Event]:
        text, self.buf = self.buf, ""
        if self.state != "content":  # the answer ended inside a call: a call if it parses
            opened = self.start if self.state == "tagged" else self.opened
            self.state, self.opened = "content", ""
            return self._call(text, opened, "") + self.content.flush()
        return (self.content.send(text) if text else []) + self.content.flush()
