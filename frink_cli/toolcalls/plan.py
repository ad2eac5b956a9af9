"""What a request's tools mean for one model, whatever the transport (the HTTP API or
the Python one): the tools the chat template sees, the constraint that makes a call
valid and its lazy triggers, a parser per answer, and the conversation as the template
receives it.

The caller checks the fields first (serve/tools.py answers a bad one with a 400, the
Python API with a FrinkError); tool_plan takes checked values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..chat import renders_tools
from ..constraint import Grammar
from ..sampling import SamplingParams
from .core import Parser, ToolFormat
from .detect import tool_format
from .generic import GenericFormat

# The tool_choice values that name no tool.
CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools mean for this model."""

    tools: list[dict]  # the tools offered (only the named one when tool_choice names it)
    forced: bool  # required or named: a call from the first token
    parallel: bool
    format: ToolFormat
    # False for tool_choice "none": the template still shows the tools (as llama.cpp
    # renders them), but no call is parsed and the format's opening marker is banned.
    calls: bool = True

    def template_tools(self) -> list[dict] | None:
        """The tools the chat template receives (None: the generic system prompt)."""
        return self.tools if self.format.native else None

    def grammar(self, tok: Any = None) -> tuple[Grammar, tuple[str, ...]]:
        return self.format.grammar(self.tools, self.forced, self.parallel, tok)

    def parser(self) -> Parser:
        """A parser for one answer's text."""
        return self.format.parser(self.tools)

    def spelled(self, tok: Any) -> frozenset[int]:
        """The ids of the format's markers that are control tokens (they spell no text),
        which the answer's text must spell for the parser; none when no call is parsed."""
        if tok is None or not self.calls:
            return frozenset()
        ids = (tok.token_id(m) for m in self.format.markers)
        return frozenset(i for i in ids if i is not None and not tok.token_bytes(i))

    def without_calls(self, params: SamplingParams, tok: Any) -> SamplingParams:
        """`params` with the format's opening markers banned (a bias of -100, OpenAI's
        ban) where the vocabulary spells one as a single token; for tool_choice none."""
        ids = [tok.token_id(m) for m in self.format.openers] if tok is not None else []
        banned = tuple((i, -100.0) for i in ids if i is not None)
        return replace(params, logit_bias=params.logit_bias + banned)

    def messages(self, msgs: list[dict]) -> list[dict]:
        """The conversation as the template receives it: native formats as their family
        takes it (ToolFormat.conversation); the generic one with the tools in a system
        message and past calls as JSON text."""
        if self.format.native:
            return self.format.conversation(msgs)
        out = []
        for m in msgs:
            if m["role"] == "assistant" and m.get("tool_calls"):
                calls = [
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                    for c in m["tool_calls"]
                ]
                out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls})})
            elif m["role"] == "tool":
                reply = {"tool_response": {"name": m.get("name", ""), "content": m["content"]}}
                out.append({"role": "user", "content": json.dumps(reply, ensure_ascii=False)})
            else:
                out.append(m)
        prompt = GenericFormat.system_prompt(self.tools, self.forced, self.parallel)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
        return out


def tool_plan(
    tools: list[dict], choice: str, parallel: bool, tok: Any, name: str | None = None
) -> ToolPlan | None:
    """The plan for checked `tools` (OpenAI function tools, names unique) and `choice`
    ("auto", "none" or "required"; `name`, one of the tools' names, forces that tool
    whatever `choice` says). None: no tools, or "none" on a template without tools."""
    if not tools:
        return None
    fmt = tool_format(tok.chat_template if tok is not None else None, renders_tools(tok))
    if name is not None:
        named = [t for t in tools if t["function"]["name"] == name]
        return ToolPlan(named, True, parallel, fmt)
    if choice == "none":
        return ToolPlan(tools, False, False, fmt, calls=False) if fmt.native else None
    return ToolPlan(tools, choice == "required", parallel, fmt)
