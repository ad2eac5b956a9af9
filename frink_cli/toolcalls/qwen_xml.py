"""Qwen3-Coder / Qwen 3.5 XML tool calls: `<function=NAME><parameter=KEY>VALUE...`."""

from __future__ import annotations

import json
from typing import Any

from ..constraint import Grammar, lark_json
from .core import WS, Event, MarkedParser, Parser, ToolCall, ToolFormat


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
    markers = ("<tool_call>", "</tool_call>")

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
        call = f"call: {start} ({' | '.join(options)}) {end} {WS}"
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


class _QwenXmlParser(MarkedParser):
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
