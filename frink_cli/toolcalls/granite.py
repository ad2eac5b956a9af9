"""Granite 3.x tool calls: `<|tool_call|>` then a JSON list of `{"name", "arguments"}`
(the form Granite 3's templates ask for: "respond only with <|tool_call|> followed by a
JSON list of tools used"). Granite 4 writes Hermes' `<tool_call>` (hermes.py)."""

from __future__ import annotations

import json
from typing import Any

from ..constraint import Grammar, lark_json
from .core import (
    Event,
    MarkedParser,
    Parser,
    ToolFormat,
    call_list_schema,
    literal,
    parse_call,
)


class GraniteFormat(ToolFormat):
    name = "granite"
    marker = "<|tool_call|>"

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        calls = lark_json(call_list_schema(tools, parallel))
        lark = f"start: {literal(self.marker, tok)} {calls}"
        return Grammar("lark", lark, "tools"), () if forced else (self.marker,)

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return _GraniteParser()


class _GraniteParser(MarkedParser):
    """Content until `<|tool_call|>`, then one JSON list of calls (an object alone is
    taken as a list of one)."""

    def __init__(self) -> None:
        super().__init__(GraniteFormat.marker, None)

    def _call(self, body: str, before: str, after: str) -> list[Event]:
        try:
            items = json.loads(body)
        except ValueError:
            items = None
        if isinstance(items, dict):
            items = [items]
        calls = [parse_call(i) for i in items] if isinstance(items, list) and items else [None]
        if None in calls:  # not calls after all: the text as the model wrote it
            return self.content.send(before + body + after)
        return [("call", c) for c in calls if c is not None]
