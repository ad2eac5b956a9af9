"""Llama 3.x tool calls: one JSON object, after `<|python_tag|>` when the model uses it."""

from __future__ import annotations

from typing import Any

from ..constraint import Grammar, lark_json
from .core import MarkedParser, Parser, ToolFormat, call_schema


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
        return MarkedParser(self.marker, None, self.bare, "parameters")
