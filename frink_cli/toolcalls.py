"""Tool calls in a model's output: which format a model writes them in, the grammar that
makes it write a valid one, and the parser that turns its text back into calls.

Why a table of formats: every model family was trained to write calls its own way
(Hermes/Qwen's `<tool_call>{json}</tool_call>`, Mistral's `[TOOL_CALLS][...]`, ...), and
its chat template shows that way to the model. The format is picked from the template's
markers, as mlx-lm and llama.cpp pick theirs. A template that does not take tools at all
gets the generic format (llama.cpp's fallback): the tools described in a system message
and the whole answer a JSON object, `{"tool_call": {...}}` or `{"response": "..."}`,
always under the grammar.

Calls are made valid by the constraint mask (constraint.py): a forced call (`required`,
a named function) is under the grammar from the first token; with `auto` the grammar
wakes up at the format's opening marker (llama.cpp's lazy grammar), so once a call is
opened its arguments follow the function's JSON schema.

Parsers stream: push(text) returns content to show now and the calls completed so far,
holding back any tail that could be the start of a marker, so a marker split across
tokens never leaks into content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from .constraint import Grammar


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI's API carries it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])


# An event of a parser: ("content", str) or ("call", ToolCall).
Event = tuple[str, Any]

_WS = r"/[ \t\r\n]{0,4}/"


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


class ToolFormat:
    """How one family writes calls: its name, whether it needs the generic system prompt,
    the constraint for a call, and a fresh parser per answer."""

    name = ""
    marker = ""  # what a chat template that teaches this format writes
    native = True  # the template renders the tools itself

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool
    ) -> tuple[Grammar, tuple[str, ...]]:
        """(grammar, triggers): forced (required or named) calls from the first token, or
        (auto) a call from the first trigger the model writes on (a lazy grammar)."""
        raise NotImplementedError

    def parser(self) -> Parser:
        raise NotImplementedError


class Parser:
    def push(self, text: str) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError


def _partial_tail(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class _Content:
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


def _parse_call(obj: Any, arguments_key: str = "arguments") -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(arguments_key, {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class HermesFormat(ToolFormat):
    """Hermes, Qwen 2.5 / 3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.

    Small Qwen 2.5 models often write the JSON object without the tags; as llama.cpp,
    an answer that opens with `{"name"` is taken as a call too (and triggers the grammar).
    """

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"
    bare = '{"name"'
    marker = start

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool
    ) -> tuple[Grammar, tuple[str, ...]]:
        body = "body: %json " + json.dumps(call_schema(tools))
        tagged = f'"{self.start}" {_WS} body {_WS} "{self.end}"'
        if not forced:
            lark = f"start: {tagged} | body\n{body}"
            return Grammar("lark", lark, "tools"), (self.start, self.bare)
        repeat = "+" if parallel else ""
        lark = f"start: call{repeat}\ncall: {tagged} {_WS}\n{body}"
        return Grammar("lark", lark, "tools"), ()

    def parser(self) -> Parser:
        return _MarkedParser(self.start, self.end, self.bare)


class _MarkedParser(Parser):
    """Calls between a start and an end marker, or bare JSON objects opening with
    `bare`, and content around them."""

    def __init__(self, start: str, end: str, bare: str | None = None) -> None:
        self.start, self.end, self.bare = start, end, bare
        self.buf = ""
        self.state = "content"  # | "tagged" | "bare"
        self.content = _Content()

    def _opening(self) -> tuple[int, str]:
        """The first opening marker in the buffer: (position, "tagged" | "bare")."""
        found = [(self.buf.find(self.start), "tagged")]
        if self.bare is not None:
            found.append((self.buf.find(self.bare), "bare"))
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
                    self.buf, self.state = self.buf[at + skip :], kind
                    continue
                keep = max(
                    _partial_tail(self.buf, m) for m in (self.start, self.bare or self.start)
                )
                if len(self.buf) > keep:
                    out += self.content.send(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                return out
            if self.state == "tagged":
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
            out += self._call(self.buf[:at], "", "")
            self.buf, self.state = self.buf[at:], "content"

    def _call(self, body: str, before: str, after: str) -> list[Event]:
        try:
            call = _parse_call(json.loads(body))
        except ValueError:
            call = None
        if call is None:  # not a call after all: the text as the model wrote it
            return self.content.send(before + body + after)
        return [("call", call)]

    def finish(self) -> list[Event]:
        text, self.buf = self.buf, ""
        if self.state != "content":  # the answer ended inside a call: a call if it parses
            opened = self.start if self.state == "tagged" else ""
            self.state = "content"
            return self._call(text, opened, "") + self.content.flush()
        return (self.content.send(text) if text else []) + self.content.flush()


class GenericFormat(ToolFormat):
    """For templates without tools (llama.cpp's generic format): the tools are described
    in a system message and the answer is one JSON object under the grammar."""

    name = "generic"
    native = False

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool
    ) -> tuple[Grammar, tuple[str, ...]]:
        call = call_schema(tools)
        if parallel:
            calls: dict = {
                "type": "object",
                "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                "required": ["tool_calls"],
                "additionalProperties": False,
            }
        else:
            calls = {
                "type": "object",
                "properties": {"tool_call": call},
                "required": ["tool_call"],
                "additionalProperties": False,
            }
        schema = calls
        if not forced:
            response = {
                "type": "object",
                "properties": {"response": {"type": "string"}},
                "required": ["response"],
                "additionalProperties": False,
            }
            schema = {"anyOf": [calls, response]}
        return Grammar.json_schema(schema, "tools"), ()

    def parser(self) -> Parser:
        return _GenericParser()

    @staticmethod
    def system_prompt(tools: list[dict], forced: bool, parallel: bool) -> str:
        shape = (
            '{"tool_calls": [{"name": "<tool name>", "arguments": {...}}, ...]}'
            if parallel
            else '{"tool_call": {"name": "<tool name>", "arguments": {...}}}'
        )
        lines = [
            "You can call these tools (JSON schemas of their parameters):",
            *(json.dumps(t["function"], ensure_ascii=False) for t in tools),
            f"To call a tool, answer with the JSON object {shape}.",
        ]
        if not forced:
            lines.append('To answer directly, answer with {"response": "<your answer>"}.')
        return "\n".join(lines)


class _GenericParser(Parser):
    """The whole answer is one JSON object: read at the end."""

    def __init__(self) -> None:
        self.buf = ""

    def push(self, text: str) -> list[Event]:
        self.buf += text
        return []

    def finish(self) -> list[Event]:
        text, self.buf = self.buf, ""
        try:
            obj = json.loads(text)
        except ValueError:
            return [("content", text)] if text else []
        if isinstance(obj, dict) and isinstance(obj.get("response"), str):
            return [("content", obj["response"])]
        items = obj.get("tool_calls") if isinstance(obj, dict) else None
        if items is None and isinstance(obj, dict) and "tool_call" in obj:
            items = [obj["tool_call"]]
        calls = [_parse_call(c) for c in items] if isinstance(items, list) else []
        if calls and all(c is not None for c in calls):
            return [("call", c) for c in calls]
        return [("content", text)] if text else []


FORMATS: tuple[ToolFormat, ...] = (HermesFormat(),)


def tool_format(template: str | None, renders_tools: bool) -> ToolFormat:
    """The format a chat template teaches: the first whose markers it writes, else the
    generic one (also for a template that does not render tools)."""
    for fmt in FORMATS if template and renders_tools else ():
        if fmt.marker in template:  # type: ignore[operator]
            return fmt
    return GenericFormat()
