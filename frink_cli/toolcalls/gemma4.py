"""Gemma 4 tool calls, as its chat template writes them:
`<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`, keys bare and in sorted order, a
string value between `<|"|>` quotes (no escapes), other values as JSON writes them.

The grammar writes that syntax under each function's parameters schema: strings (their
enum, or their length bounds), objects (their properties in sorted order, the required
ones always, commas only between) and arrays (their item count bounds) in Gemma's
syntax; numbers, booleans and null are JSON's, so llguidance's JSON schema enforces them
(bounds included). A keyword of a string, object or array schema that the syntax does
not enforce (`pattern`, `uniqueItems`, `anyOf` beside properties, ...) is refused by
name (a GrammarError), never ignored."""

from __future__ import annotations

import json
import re
from typing import Any

from ..constraint import Grammar, GrammarError, lark_json
from .core import Event, MarkedParser, Parser, ToolCall, ToolFormat, literal

QUOTE = '<|"|>'
_WORD = re.compile(r"[A-Za-z_][\w.-]*")
# Keywords that constrain nothing; then, per kind written in Gemma's syntax, the ones its
# grammar enforces (additionalProperties: only the listed properties are ever written).
_NOTES = {"description", "title", "default", "examples", "$comment", "deprecated", "$schema"}
_NOTES |= {"$id", "$defs", "definitions"}  # (a $ref into them is JSON's, refused there)
_ENFORCED = {
    "string": {"type", "enum", "minLength", "maxLength"},
    "object": {"type", "properties", "required", "additionalProperties"},
    "array": {"type", "items", "minItems", "maxItems"},
}


class Gemma4Format(ToolFormat):
    name = "gemma4"
    start, end = "<|tool_call>", "<tool_call|>"
    marker = start
    markers = (start, end, QUOTE)

    def matches(self, template: str) -> bool:
        return "<|tool_call>call:" in template

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        rules = _Rules(literal(QUOTE, tok))
        options = []
        for t in tools:
            f = t["function"]
            rules.where = f"function {f['name']}: parameters"
            args = rules.value(f.get("parameters") or {"type": "object"}, top=True)
            options.append(f"{json.dumps('call:' + f['name'])} {args}")
        call = f"call: {literal(self.start, tok)} ({' | '.join(options)}) {literal(self.end, tok)}"
        head = "start: call+" if forced and parallel else "start: call"
        lark = "\n".join([head, call, *rules.lines])
        return Grammar("lark", lark, "tools"), () if forced else (self.start,)

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return _Gemma4Parser()


class _Rules:
    """Lark rules for values in Gemma's syntax, named as they are made."""

    def __init__(self, quote: str) -> None:
        self.quote = quote
        self.lines: list[str] = []
        self.where = "parameters"  # the schema's path, for a refusal

    def _check(self, schema: dict, kind: str) -> None:
        """Refuse a keyword of `schema` (written as `kind`) the grammar would not enforce."""
        unknown = sorted(set(schema) - _ENFORCED[kind] - _NOTES)
        if unknown:
            raise GrammarError(
                "tools",
                f"{self.where} uses {unknown[0]!r}, which Gemma 4's call syntax cannot enforce",
            )

    def _rule(self, body: str) -> str:
        name = f"g{len(self.lines)}"
        self.lines.append(f"{name}: {body}")
        return name

    def value(self, schema: Any, top: bool = False) -> str:
        """The Lark expression of one value of `schema`."""
        if not isinstance(schema, dict):
            return lark_json(schema)
        kind = schema.get("type")
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
            self._check(schema, "string")
            return (
                "(" + " | ".join(f"{self.quote} {json.dumps(e)} {self.quote}" for e in enum) + ")"
            )
        if kind == "string":
            self._check(schema, "string")
            lo, hi = _bounds(schema, "minLength", "maxLength", self.where)
            count = f"{{{lo},{hi}}}" if hi is not None else f"{{{lo},}}"
            return f"{self.quote} /[^<]{count}/ {self.quote}"
        if kind == "object" and (top or "properties" in schema):
            self._check(schema, "object")
            return self._object(schema)
        if kind == "array" and isinstance(schema.get("items"), dict):
            self._check(schema, "array")
            return self._array(schema)
        return lark_json(schema)

    def _array(self, schema: dict) -> str:
        """`[v,...]`: between minItems and maxItems values of `items`."""
        lo, hi = _bounds(schema, "minItems", "maxItems", self.where)
        where, self.where = self.where, self.where + ".items"
        item = self.value(schema["items"])
        self.where = where
        if hi == 0:
            return '"[" "]"'
        least, most = max(lo - 1, 0), (hi - 1 if hi is not None else None)  # after the first
        if most == 0:
            values = item
        else:
            more = "*" if least == 0 and most is None else f"{{{least},{most or ''}}}"
            values = f'{item} ("," {item}){more}'
        return self._rule(f'"[" {values} "]"' if lo else f'"[" ({values})? "]"')

    def _object(self, schema: dict) -> str:
        """`{k:v,...}`: the properties in sorted order, each optional one maybe left out,
        commas only between those written."""
        props = sorted((schema.get("properties") or {}).items())
        required = set(schema.get("required") or ())
        unlisted = sorted(required - {key for key, _ in props})
        if unlisted:  # only listed properties are ever written
            raise GrammarError("tools", f"{self.where}: required {unlisted[0]!r} has no schema")
        first, rest = "", ""  # the rules for "the pairs from i on", before and after a pair
        where = self.where
        for key, sub in reversed(props):
            self.where = f"{where}.{key}"
            pair = self._rule(f"{json.dumps(key + ':')} {self.value(sub)}")
            self.where = where
            after = f"{pair} {rest}".strip()
            if key in required:
                new_rest = self._rule(f'"," {after}')
                new_first = self._rule(after)
            else:
                new_rest = self._rule(f'("," {pair})? {rest}'.strip())
                new_first = self._rule(f"({after} | {first})" if first else f"({after})?")
            first, rest = new_first, new_rest
        return f'"{{" {first} "}}"' if first else '"{" "}"'


def _bounds(schema: dict, low: str, high: str, where: str) -> tuple[int, int | None]:
    """A count's bounds (minLength/maxLength, minItems/maxItems): non-negative integers,
    the low one at most the high one; refused by name otherwise."""
    got: list[int | None] = []
    for key, n in ((low, schema.get(low, 0)), (high, schema.get(high))):
        if isinstance(n, float) and n.is_integer():
            n = int(n)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise GrammarError("tools", f"{where}: {key} must be a non-negative integer")
        got.append(n)
    lo, hi = got[0] or 0, got[1]
    if hi is not None and lo > hi:
        raise GrammarError("tools", f"{where}: {low} is more than {high}")
    return lo, hi


class _Gemma4Parser(MarkedParser):
    def __init__(self) -> None:
        super().__init__(Gemma4Format.start, Gemma4Format.end)

    def _call(self, body: str, before: str, after: str) -> list[Event]:
        call = _read_call(body)
        if call is None:  # not a call after all: the text as the model wrote it
            return self.content.send(before + body + after)
        return [("call", call)]


def _read_call(body: str) -> ToolCall | None:
    """`call:NAME{...}` as a call (None when it is not one)."""
    if not body.startswith("call:") or "{" not in body:
        return None
    name, brace, args = body[len("call:") :].partition("{")
    try:
        parsed = json.loads(_as_json(brace + args))
    except ValueError:
        return None
    if not name.strip() or not isinstance(parsed, dict):
        return None
    return ToolCall(name.strip(), json.dumps(parsed, ensure_ascii=False))


def _as_json(text: str) -> str:
    """Gemma's argument syntax as JSON text: `<|"|>` strings and bare keys quoted."""
    out, i = [], 0
    while i < len(text):
        if text.startswith(QUOTE, i):
            j = text.find(QUOTE, i + len(QUOTE))
            if j < 0:
                raise ValueError("an unclosed string")
            out.append(json.dumps(text[i + len(QUOTE) : j]))
            i = j + len(QUOTE)
        elif text[i] == '"':
            s, i = json.JSONDecoder().raw_decode(text, i)
            out.append(json.dumps(s))
        elif m := _WORD.match(text, i):
            word = m.group()
            key = text[m.end() :].lstrip().startswith(":")
            out.append(json.dumps(word) if key else word)  # else true, false, null
            i = m.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
