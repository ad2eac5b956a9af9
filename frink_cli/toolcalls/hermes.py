"""Hermes, Qwen 2.5 / 3 tool calls: `<tool_call>{json}</tool_call>`."""

from __future__ import annotations

from typing import Any

from ..constraint import Grammar, lark_json
from .core import WS, MarkedParser, Parser, ToolFormat, call_schema


class HermesFormat(ToolFormat):
    """Hermes, Qwen 2.5 / 3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.

    Small Qwen 2.5 models often write the JSON object without the tags; as llama.cpp,
    an answer that opens with `{"name"` is taken as a call too (and triggers the grammar).
    """

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"
    bare = '{"name"'
    marker = start
    markers = (start, end)

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        body = "body: " + lark_json(call_schema(tools))
        tagged = f'"{self.start}" {WS} body {WS} "{self.end}"'
        if not forced:
            lark = f"start: {tagged} | body\n{body}"
            return Grammar("lark", lark, "tools"), (self.start, self.bare)
        repeat = "+" if parallel else ""
        lark = f"start: call{repeat}\ncall: {tagged} {WS}\n{body}"
        return Grammar("lark", lark, "tools"), ()

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return MarkedParser(self.start, self.end, self.bare)
