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
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from .constraint import Grammar, lark_json


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI's API carries it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])


# An event of a parser: ("content", str) or ("call", ToolCall).
Event = tuple[str, Any]

_WS = r"/[ \t\r\n]{0,4}/"


def _literal(marker: str, tok: Any) -> str:
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
    args = obj.get(arguments_key, obj.get("arguments", {}))
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
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        body = "body: " + lark_json(call_schema(tools))
        tagged = f'"{self.start}" {_WS} body {_WS} "{self.end}"'
        if not forced:
            lark = f"start: {tagged} | body\n{body}"
            return Grammar("lark", lark, "tools"), (self.start, self.bare)
        repeat = "+" if parallel else ""
        lark = f"start: call{repeat}\ncall: {tagged} {_WS}\n{body}"
        return Grammar("lark", lark, "tools"), ()

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return _MarkedParser(self.start, self.end, self.bare)


# A bare call opens as `{"name"`, JSON's whitespace allowed inside (as llama.cpp reads
# Llama's and Qwen's bare calls); a buffer's tail that may still become one is held back.
_BARE = re.compile(r'\{\s*"name"')
_BARE_PARTIAL = re.compile(r'\{\s*(?:"(?:n(?:a(?:m(?:e)?)?)?)?)?$')


class _MarkedParser(Parser):
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
        self.content = _Content()

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
                keep = _partial_tail(self.buf, self.start)
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
            call = _parse_call(json.loads(body), self.arguments_key)
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


class GenericFormat(ToolFormat):
    """For templates without tools (llama.cpp's generic format): the tools are described
    in a system message and the answer is one JSON object under the grammar."""

    name = "generic"
    native = False

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
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

    def parser(self, tools: list[dict] | None = None) -> Parser:
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


class Llama3Format(ToolFormat):
    """Llama 3.1 / 3.2 / 3.3 (JSON tool calling): the answer is one object
    `{"name": ..., "parameters": {...}}`, after `<|python_tag|>` when the model uses it
    (3.1's templates name it; 3.2's teach the object alone). One call per answer."""

    name = "llama3"
    marker = "<|python_tag|>"
    bare = '{"name"'

    def matches(self, template: str) -> bool:
        return self.marker in template or (
            "<|start_header_id|>" in template and '"parameters"' in template
        )

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        lark = "start: " + lark_json(call_schema(tools, "parameters"))
        return Grammar("lark", lark, "tools"), () if forced else (self.bare,)

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return _MarkedParser(self.marker, None, self.bare, "parameters")


def _mistral_id() -> str:
    # Mistral's templates refuse a call id that is not 9 letters or digits.
    return uuid.uuid4().hex[:9]


class MistralFormat(ToolFormat):
    """Mistral: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments", "id"}` (Nemo,
    v3 tokenizers), or per call `[TOOL_CALLS]name[ARGS]{...}` (Small 3.2, Devstral,
    Ministral; a `[CALL_ID]id` may sit before `[ARGS]`). The template's spelling picks
    which one the grammar writes; the parser reads both. Call ids are 9 characters, as
    the templates require of the ids sent back."""

    name = "mistral"
    marker = "[TOOL_CALLS]"

    def __init__(self, named: bool = False) -> None:
        self.named = named  # the [ARGS] form

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        start = _literal(self.marker, tok)
        if self.named:
            args = _literal("[ARGS]", tok)
            options = " | ".join(
                f"{json.dumps(t['function']['name'])} {args} "
                + lark_json(t["function"].get("parameters") or {"type": "object"})
                for t in tools
            )
            repeat = "+" if parallel else ""
            lark = f"start: call{repeat}\ncall: {start} ({options})"
        else:
            calls: dict = {"type": "array", "items": call_schema(tools), "minItems": 1}
            if not parallel:
                calls["maxItems"] = 1
            lark = f"start: {start} {lark_json(calls)}"
        return Grammar("lark", lark, "tools"), () if forced else (self.marker,)

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return _MistralParser()


class _MistralParser(Parser):
    """Content until the first [TOOL_CALLS]; then calls (either form) to the end."""

    def __init__(self) -> None:
        self.buf = ""
        self.calls_started = False
        self.content = _Content()

    def push(self, text: str) -> list[Event]:
        self.buf += text
        if self.calls_started:
            return self._calls(final=False)
        at = self.buf.find(MistralFormat.marker)
        if at < 0:
            keep = _partial_tail(self.buf, MistralFormat.marker)
            out = self.content.send(self.buf[: len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep :]
            return out
        out = self.content.send(self.buf[:at]) if self.buf[:at].strip() else []
        self.content.held = ""
        self.calls_started, self.buf = True, self.buf[at:]
        return out + self._calls(final=False)

    def _calls(self, final: bool) -> list[Event]:
        out: list[Event] = []
        marker = MistralFormat.marker
        while self.buf.startswith(marker):
            rest = self.buf[len(marker) :].lstrip()
            if rest.startswith("["):  # [TOOL_CALLS][{...}, ...]
                try:
                    items, used = json.JSONDecoder().raw_decode(rest)
                except ValueError:
                    break
                calls = [_parse_call(i) for i in items] if isinstance(items, list) else [None]
                if not calls or None in calls:
                    break
                for item, call in zip(items, calls):
                    assert call is not None
                    cid = item.get("id")
                    ok = isinstance(cid, str) and len(cid) == 9 and cid.isalnum()
                    out.append(
                        ("call", ToolCall(call.name, call.arguments, cid if ok else _mistral_id()))
                    )
            else:  # [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}
                at = rest.find("[ARGS]")
                if at < 0:
                    break
                name, cid = rest[:at], None
                if "[CALL_ID]" in name:
                    name, cid = name.split("[CALL_ID]", 1)
                try:
                    args, used = json.JSONDecoder().raw_decode(rest, at + len("[ARGS]"))
                except ValueError:
                    break
                if not isinstance(args, dict) or not name.strip():
                    break
                ok = cid is not None and len(cid) == 9 and cid.isalnum()
                arguments = json.dumps(args, ensure_ascii=False)
                out.append(
                    ("call", ToolCall(name.strip(), arguments, cid if ok else _mistral_id()))
                )
            self.buf = rest[used:].lstrip()
        if final and self.buf:
            out += self.content.send(self.buf) + self.content.flush()
            self.buf = ""
        return out

    def finish(self) -> list[Event]:
        if not self.calls_started:
            text, self.buf = self.buf, ""
            return (self.content.send(text) if text else []) + self.content.flush()
        return self._calls(final=True)


def _param_schemas(tools: list[dict] | None) -> dict[str, dict]:
    out = {}
    for t in tools or ():
        params = t["function"].get("parameters") or {}
        out[t["function"]["name"]] = params.get("properties") or {}
    return out


def _is_text(schema: Any) -> bool:
    """Whether an XML parameter of this schema is written as raw text (not JSON)."""
    if not isinstance(schema, dict):
        return False
    if schema.get("type") == "string":
        return True
    enum = schema.get("enum")
    return isinstance(enum, list) and bool(enum) and all(isinstance(e, str) for e in enum)


class QwenXmlFormat(ToolFormat):
    """Qwen3-Coder and Qwen 3.5: `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE
    \n</parameter>\n...</function>\n</tool_call>`; a value is raw text for a string
    parameter and JSON otherwise (read back by the parameter's schema)."""

    name = "qwen3_xml"
    marker = "<parameter="

    def matches(self, template: str) -> bool:
        return "<function=" in template and "<parameter=" in template

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        rules, options = [], []
        for i, t in enumerate(tools):
            f = t["function"]
            params = f.get("parameters") or {}
            required = set(params.get("required") or ())
            parts = []
            for j, (key, schema) in enumerate((params.get("properties") or {}).items()):
                head = json.dumps(f"<parameter={key}>\n")
                tail = json.dumps("\n</parameter>\n")
                if _is_text(schema) and "enum" in schema:
                    value = "(" + " | ".join(json.dumps(e) for e in schema["enum"]) + ")"
                    rules.append(f"p{i}_{j}: {head} {value} {tail}")
                elif _is_text(schema):
                    # One lexeme from the key to the closing tag, so where the value ends
                    # is never a lexer's guess; no "<" inside a value.
                    lo = int(schema.get("minLength", 0))
                    hi = schema.get("maxLength")
                    count = f"{{{lo},{int(hi)}}}" if hi is not None else f"{{{lo},}}"
                    regex = "<parameter=" + _regex_escape(key) + r">\n[^<]" + count
                    regex += r"\n<\/parameter>\n"
                    rules.append(f"p{i}_{j}: P{i}_{j}\nP{i}_{j}: /{regex}/")
                else:
                    rules.append(f"p{i}_{j}: {head} {lark_json(schema)} {tail}")
                parts.append(f"p{i}_{j}" + ("" if key in required else "?"))
            opening = json.dumps(f"<function={f['name']}>\n")
            rules.append(f'f{i}: {opening} {" ".join(parts)} "</function>"')
            options.append(f"f{i}")
        start, end = json.dumps("<tool_call>\n"), json.dumps("\n</tool_call>")
        call = f"call: {start} ({' | '.join(options)}) {end} {_WS}"
        if forced:
            head = "start: call+" if parallel else "start: call"
            triggers: tuple[str, ...] = ()
        else:
            head, triggers = "start: call", ("<tool_call>",)
        lark = "\n".join([head, call, *rules])
        return Grammar("lark", lark, "tools"), triggers

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return _QwenXmlParser(_param_schemas(tools))


def _regex_escape(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in text)


class _QwenXmlParser(_MarkedParser):
    def __init__(self, schemas: dict[str, dict]) -> None:
        super().__init__("<tool_call>", "</tool_call>")
        self.schemas = schemas

    def _call(self, body: str, before: str, after: str) -> list[Event]:
        call = self._xml_call(body)
        if call is None:
            return self.content.send(before + body + after)
        return [("call", call)]

    def _xml_call(self, body: str) -> ToolCall | None:
        body = body.strip()
        if not body.startswith("<function=") or not body.endswith("</function>"):
            return None
        head, _, rest = body[len("<function=") : -len("</function>")].partition(">")
        name = head.strip()
        if not name:
            return None
        schemas = self.schemas.get(name, {})
        args: dict[str, Any] = {}
        while True:
            rest = rest.lstrip("\n")
            if not rest.strip():
                break
            if not rest.startswith("<parameter="):
                return None
            key, _, rest = rest[len("<parameter=") :].partition(">")
            value, found, rest = rest.partition("</parameter>")
            if not found:
                return None
            value = value.removeprefix("\n").removesuffix("\n")
            if _is_text(schemas.get(key)):
                args[key] = value
            else:
                try:
                    args[key] = json.loads(value)
                except ValueError:
                    args[key] = value
        return ToolCall(name, json.dumps(args, ensure_ascii=False))


# In the order they are tried: Qwen's XML templates also write Hermes' <tool_call>.
FORMATS: tuple[ToolFormat, ...] = (
    QwenXmlFormat(),
    HermesFormat(),
    MistralFormat(),
    Llama3Format(),
)


def tool_format(template: str | None, renders_tools: bool) -> ToolFormat:
    """The format a chat template teaches: the first whose markers it writes, else the
    generic one (also for a template that does not render tools)."""
    if not template or not renders_tools:
        return GenericFormat()
    for fmt in FORMATS:
        if fmt.matches(template):
            if isinstance(fmt, MistralFormat) and "[ARGS]" in template:
                return MistralFormat(named=True)
            return fmt
    return GenericFormat()
