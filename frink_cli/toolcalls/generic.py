"""The generic tool-call format for templates without tools (llama.cpp's fallback): the
tools described in a system message and the whole answer one JSON object,
`{"tool_call": {...}}` or `{"response": "..."}`, always under the grammar."""

from __future__ import annotations

import json
from typing import Any

from ..constraint import Grammar
from .core import Event, Parser, ToolFormat, call_schema, parse_call


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
        calls = [parse_call(c) for c in items] if isinstance(items, list) else []
        if calls and all(c is not None for c in calls):
            return [("call", c) for c in calls]
        return [("content", text)] if text else []
