"""Mistral tool calls: `[TOOL_CALLS]` then a JSON list, or `[TOOL_CALLS]name[ARGS]{...}`."""

from __future__ import annotations

import json
import uuid
from typing import Any

from ..constraint import Grammar, lark_json
from .core import (
    Content,
    Event,
    Parser,
    ToolCall,
    ToolFormat,
    call_list_schema,
    literal,
    parse_call,
    partial_tail,
)


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
    markers = (marker, "[ARGS]", "[CALL_ID]")

    def __init__(self, named: bool = False) -> None:
        self.named = named  # the [ARGS] form

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        start = literal(self.marker, tok)
        if self.named:
            args = literal("[ARGS]", tok)
            options = " | ".join(
                f"{json.dumps(t['function']['name'])} {args} "
                + lark_json(t["function"].get("parameters") or {"type": "object"})
                for t in tools
            )
            repeat = "+" if parallel else ""
            lark = f"start: call{repeat}\ncall: {start} ({options})"
        else:
            lark = f"start: {start} {lark_json(call_list_schema(tools, parallel))}"
        return Grammar("lark", lark, "tools"), () if forced else (self.marker,)

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return _MistralParser()


class _MistralParser(Parser):
    """Content until the first [TOOL_CALLS]; then calls (either form) to the end."""

    def __init__(self) -> None:
        self.buf = ""
        self.calls_started = False
        self.content = Content()

    def push(self, text: str) -> list[Event]:
        self.buf += text
        if self.calls_started:
            return self._calls(final=False)
        at = self.buf.find(MistralFormat.marker)
        if at < 0:
            keep = partial_tail(self.buf, MistralFormat.marker)
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
                calls = [parse_call(i) for i in items] if isinstance(items, list) else [None]
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
