"""gpt-oss harmony tool calls: a commentary-channel message addressed to the function,
`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`
(the model's spelling) or `to=functions.NAME<|channel|>commentary json<|message|>...`
(the template's, for past calls), each after `<|start|>assistant`.

The parser reads the answer's harmony text with its markers spelled out (Model.chat
spells them, `markers`), or what serve's channel split (channels.ChannelSplit with
`calls`) passes on: the final channel's text plain, a call's message spelled whole. The
`final` channel's text (and text outside any message) is content; analysis and commentary
preambles are not content (the split gives them to reasoning); a message whose header
says `to=functions.NAME` (after `<|start|>` or `<|channel|>`, or as the answer's first
text, right after the prompt's `<|start|>assistant`) is a call of NAME."""

from __future__ import annotations

import json
import re
from typing import Any

from ..constraint import Grammar, lark_json
from .core import Content, Event, Parser, ToolCall, ToolFormat, literal, partial_tail

_HEADER_END = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_OPENS = ("<|start|>", "<|channel|>")
_AUTO_OPENS = ("<|channel|>commentary ", "<|start|>assistant ")
_LEAD = "to="  # the answer's first text may be the recipient of its first message
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

    @property
    def markers(self) -> tuple[str, ...]:
        return (*_OPENS, _HEADER_END, "<|constrain|>", "<|end|>", "<|call|>", "<|return|>")

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
        own = f'" "? ({constrain} "json")?'
        if forced:  # the model's own spelling, from the first token
            head = f'start: {channel} "commentary " call'
            lark = "\n".join([head, "call: " + call, f"header: {own}"])
            return Grammar("lark", lark, "tools"), ()
        # auto: from where a message opens addressed to a function (its channel, or its
        # role with the recipient first), never at the words in another message's text
        spelled = f'{channel} "commentary" (" " {constrain}? "json")?'
        head = f'start: ({channel} "commentary " | {literal("<|start|>", tok)} "assistant ") call'
        lark = "\n".join([head, "call: " + call, f'header: {own} | " "? {spelled}'])
        return Grammar("lark", lark, "tools"), tuple(o + self.marker for o in _AUTO_OPENS)

    def parser(self, tools: list[dict] | None = None) -> Parser:
        return _HarmonyParser()

    def conversation(self, msgs: list[dict]) -> list[dict]:
        """gpt-oss's template writes one call per assistant message and names a tool
        result after the last call before it (`<|start|>functions.NAME to=assistant
        ...`): an assistant message with several calls becomes one message per call, each
        followed by its result (matched by tool_call_id), as gpt-oss makes calls."""
        out: list[dict] = []
        answered: set[int] = set()  # indexes of tool messages already placed
        for i, m in enumerate(msgs):
            calls = m.get("tool_calls") or []
            if i in answered:
                continue
            if m["role"] != "assistant" or len(calls) < 2:
                out.append(m)
                continue
            results = {
                r.get("tool_call_id"): j
                for j, r in enumerate(msgs[i + 1 :], i + 1)
                if r["role"] == "tool"
            }
            for k, call in enumerate(calls):
                out.append(
                    {**m, "content": m.get("content") if k == 0 else "", "tool_calls": [call]}
                )
                j = results.get(call.get("id"))
                if j is not None and j not in answered:
                    out.append(msgs[j])
                    answered.add(j)
        return out


class _HarmonyParser(Parser):
    """States: "lead" (the answer's first text: a recipient, or content), "out" (text
    outside any message: content), "header" (from `<|start|>` or `<|channel|>` to
    `<|message|>`), then the message's body: "final", "call" or "skip", and "after" a
    call's JSON object, up to its end marker."""

    def __init__(self) -> None:
        self.buf = ""
        self.state = "lead"
        self.name = ""
        self.content = Content()

    def push(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        while True:
            if self.state == "lead":
                lead = self.buf.lstrip()
                if _LEAD.startswith(lead):
                    return out  # may still become a recipient
                self.state = "header" if lead.startswith(_LEAD) else "out"
                continue
            if self.state == "out":
                found = [(self.buf.find(o), o) for o in _OPENS if o in self.buf]
                if not found:
                    keep = max(partial_tail(self.buf, o) for o in _OPENS)
                    out += self.content.send(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                at = min(found)[0]
                out += self.content.send(self.buf[:at])
                self.buf, self.state = self.buf[at:], "header"
                continue
            if self.state == "header":
                at = self.buf.find(_HEADER_END)
                if at < 0:
                    return out
                self._open(self.buf[:at])
                self.buf = self.buf[at + len(_HEADER_END) :]
                continue
            if self.state == "call" and self.buf.lstrip()[:1] == "{":
                if not self._call_json(out):
                    return out
                continue
            found = [(self.buf.find(e), e) for e in _ENDS if e in self.buf]
            if self.state == "after" and not found:  # what follows a call's JSON: dropped
                keep = max(partial_tail(self.buf, e) for e in _ENDS)
                self.buf = self.buf[len(self.buf) - keep :]
                return out
            if not found:
                if self.state == "final":
                    keep = max(partial_tail(self.buf, e) for e in _ENDS)
                    out += self.content.send(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep :]
                return out
            at, end = min(found)
            out += self._close(self.buf[:at])
            self.buf = self.buf[at + (0 if end == "<|start|>" else len(end)) :]
            self.state = "out"

    def _call_json(self, out: list[Event]) -> bool:
        """A call's arguments, once their JSON object is whole (a marker's text inside one
        of its strings is part of it): the call out, True; False while incomplete."""
        body = self.buf.lstrip()
        try:
            args, end = json.JSONDecoder().raw_decode(body)
        except ValueError:
            return False
        if not isinstance(args, dict):
            return False  # not a call: its text, at its end marker
        out.append(("call", ToolCall(self.name, json.dumps(args, ensure_ascii=False))))
        self.buf, self.state = body[end:], "after"
        return True

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
        if self.state in ("lead", "out", "header"):
            # text outside any message counts as final; an unfinished header is text too
            out = self.content.send(text)
        else:
            out = self._close(text)
        self.state = "lead"
        return out + self.content.flush()
