"""gpt-oss harmony tool calls: a commentary-channel message addressed to the function,
`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`
(the model's spelling) or `to=functions.NAME<|channel|>commentary json<|message|>...`
(the template's, for past calls), each after `<|start|>assistant`.

The parser reads the answer's harmony text with its markers spelled out: the `final`
channel's text (and text outside any message) is content; analysis and commentary
preambles are not content (the channel splitter, channels.py, gives analysis to
reasoning); a message whose header says `to=functions.NAME` is a call of NAME."""

from __future__ import annotations

import json
import re
from typing import Any

from ..constraint import Grammar, lark_json
from .core import Content, Event, Parser, ToolCall, ToolFormat, literal, partial_tail

_HEADER_END = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


class HarmonyFormat(ToolFormat):
    name = "harmony"
    marker = "to=functions."

    def matches(self, template: str) -> bool:
        return "<|channel|>" in template and "functions." in template

    @property
    def openers(self) -> tuple[str, ...]:
        return ()  # the recipient is words of a header, never one token

    def grammar(
        self, tools: list[dict], forced: bool, parallel: bool, tok: Any = None
    ) -> tuple[Grammar, tuple[str, ...]]:
        channel, constrain = literal("<|channel|>", tok), literal("<|constrain|>", tok)
        message = literal(_HEADER_END, tok)
        options = " | ".join(
            json.dumps(t["function"]["name"])
            + f" header {message} "
            + lark_json(t["function"].get("parameters") or {"type": "object"})
            for t in tools
        )
        call = f'"{self.marker}" ({options})'
        spelled = f'{channel} "commentary" (" " {constrain}? "json")?'
        rules = [f'header: " "? ({constrain} "json" | {spelled})?']
        if forced:  # the model's own spelling, from the first token
            head = f'start: {channel} "commentary " call'
            return Grammar("lark", "\n".join([head, "call: " + call, *rules]), "tools"), ()
        lark = "\n".join([f"start: {call}", *rules])
        return Grammar("lark", lark, "tools"), (self.marker,)

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return _HarmonyParser()


class _HarmonyParser(Parser):
    def __init__(self) -> None:
        self.buf = ""
        self.state = "header"  # | "final" | "call" | "skip"
        self.name = ""
        self.content = Content()

    def push(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        while True:
            if self.state == "header":
                at = self.buf.find(_HEADER_END)
                if at < 0:
                    return out
                self._open(self.buf[:at])
                self.buf = self.buf[at + len(_HEADER_END) :]
                continue
            found = [(self.buf.find(e), e) for e in _ENDS]
            found = [f for f in found if f[0] >= 0]
            if not found:
                if self.state == "final":
                    keep = max(partial_tail(self.buf, e) for e in _ENDS)
                    out += self.content.send(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep :]
                return out
            at, end = min(found)
            out += self._close(self.buf[:at])
            self.buf = self.buf[at + (0 if end == "<|start|>" else len(end)) :]
            self.state = "header"

    def _open(self, header: str) -> None:
        """The message whose header (the text before <|message|>) this is."""
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        if recipient is not None:
            self.state, self.name = "call", recipient.group(1)
        elif channel is None or channel.group(1) == "final":
            self.state = "final"
        else:
            self.state = "skip"

    def _close(self, body: str) -> list[Event]:
        """A message's body, at its end."""
        if self.state == "final":
            return self.content.send(body)
        if self.state != "call":
            return []
        try:
            args = json.loads(body)
        except ValueError:
            args = None
        if not isinstance(args, dict):  # not a call after all: the text as written
            return self.content.send(body)
        return [("call", ToolCall(self.name, json.dumps(args, ensure_ascii=False)))]

    def finish(self) -> list[Event]:
        text, self.buf = self.buf, ""
        if self.state == "header":  # text outside any message counts as final
            out = self.content.send(text) if text.strip() and "<|" not in text else []
        else:
            out = self._close(text)
        self.state = "header"
        return out + self.content.flush()
