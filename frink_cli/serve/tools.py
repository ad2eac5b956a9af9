"""The OpenAI API's structured-output and tool fields: checked, and turned into what the
engine and the chat template take.

- `response_format` (json_schema with `strict`, json_object, text) and llama-server's
  `grammar` and `json_schema` fields become one constraint.Grammar;
- `tools`, `tool_choice`, `parallel_tool_calls` are checked and become a ToolPlan
  (frink_cli/toolcalls/plan.py): the tools the chat template sees, the constraint and
  its lazy triggers, and a parser per choice;
- an assistant message's `tool_calls` and a `tool` message's `tool_call_id` are kept for
  the template, each tool message matched to a call before it.

Every bad field is an ApiError (400) naming it, before any work is queued.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..constraint import Grammar
from ..toolcalls.plan import CHOICES, ToolPlan
from ..toolcalls.plan import tool_plan as plan_tools
from .openai import _show, bad

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MAX_TOOLS = 128


def output_grammar(body: dict) -> Grammar | None:
    """The constraint a request puts on its text: response_format, or llama-server's
    `grammar` (GBNF or Lark) or `json_schema`; at most one of them."""
    found: list[Grammar] = []
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
            raise bad("response_format", "must be an object with a type")
        kind = rf["type"]
        if kind == "json_object":
            found.append(Grammar("json_object", "", "response_format"))
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict):
                raise bad("response_format.json_schema", "must be an object")
            strict = spec.get("strict")
            if strict is not None and not isinstance(strict, bool):
                raise bad("response_format.json_schema.strict", "must be true or false")
            schema = spec.get("schema", {})
            if not isinstance(schema, (dict, bool)):
                raise bad("response_format.json_schema.schema", "must be a JSON schema object")
            # strict or not, the schema is enforced: llguidance refuses what it cannot.
            found.append(Grammar.json_schema(schema, "response_format.json_schema.schema"))
        elif kind != "text":
            raise bad(
                "response_format.type",
                f"must be text, json_object or json_schema (got {_show(kind)})",
            )
    grammar = body.get("grammar")
    if grammar is not None:
        if not isinstance(grammar, str):
            raise bad("grammar", "must be a string (llama.cpp GBNF or Lark)")
        found.append(Grammar("gbnf", grammar, "grammar"))
    schema = body.get("json_schema")
    if schema is not None:
        if not isinstance(schema, (dict, bool)):
            raise bad("json_schema", "must be a JSON schema object")
        found.append(Grammar.json_schema(schema, "json_schema"))
    if len(found) > 1:
        raise bad(found[1].field.split(".")[0], f"cannot be combined with {found[0].field}")
    return found[0] if found else None


def tool_plan(body: dict, tok: Any) -> ToolPlan | None:
    """The request's tools (None: none offered, or tool_choice "none" on a template
    without tools)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", "must be true or false")
    if tools is None:
        if choice not in (None, "none"):
            raise bad("tool_choice", "needs tools")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad("tools", f"must be a list of at most {MAX_TOOLS} tools")
    names: set[str] = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise bad(f"{where}.type", "only function tools are supported")
        f = t.get("function")
        if not isinstance(f, dict):
            raise bad(f"{where}.function", "must be an object")
        name = f.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad(f"{where}.function.name", "must be 1-64 letters, digits, _ . : or -")
        if name in names:
            raise bad(f"{where}.function.name", f"{name!r} is defined twice")
        names.add(name)
        params = f.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"{where}.function.parameters", "must be a JSON schema object")
        desc = f.get("description")
        if desc is not None and not isinstance(desc, str):
            raise bad(f"{where}.function.description", "must be a string")
    if choice is None:
        choice = "auto" if tools else "none"
    if not tools:
        return None
    if isinstance(choice, dict):
        f = choice.get("function")
        name = f.get("name") if isinstance(f, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise bad("tool_choice", 'must be auto, none, required or {"type": "function", ...}')
        if name not in names:
            raise bad("tool_choice", f"no tool named {_show(name)} in tools")
        return plan_tools(tools, "required", parallel, tok, name=name)
    if choice not in CHOICES:
        raise bad(
            "tool_choice", f"must be auto, none, required or a function (got {_show(choice)})"
        )
    return plan_tools(tools, choice, parallel, tok)


def conversation(body: dict, msgs: list[dict]) -> list[dict]:
    """`msgs` (openai.messages: role and text content) with the tool fields the chat
    template reads: an assistant's tool_calls (arguments as objects, as transformers
    passes them) and a tool message's tool_call_id and the called function's name. A
    tool message must answer a call made before it."""
    out = []
    pending: dict[str, str] = {}  # call id -> function name, not yet answered
    for i, (raw, m) in enumerate(zip(body["messages"], msgs)):
        m = dict(m)
        where = f"messages[{i}]"
        if m["role"] == "assistant" and raw.get("tool_calls") is not None:
            calls = raw["tool_calls"]
            if not isinstance(calls, list):
                raise bad(f"{where}.tool_calls", "must be a list")
            kept = []
            for j, c in enumerate(calls):
                at = f"{where}.tool_calls[{j}]"
                f = c.get("function") if isinstance(c, dict) else None
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    raise bad(at, "must be a function call with a name")
                args = f.get("arguments", "{}")
                if isinstance(args, str):
                    try:
                        args = json.loads(args or "{}")
                    except ValueError:
                        raise bad(f"{at}.function.arguments", "is not JSON") from None
                if not isinstance(args, dict):
                    raise bad(f"{at}.function.arguments", "must be a JSON object")
                call_id = c.get("id")
                if call_id is not None and not isinstance(call_id, str):
                    raise bad(f"{at}.id", "must be a string")
                call_id = call_id or f"call_{i}_{j}"
                pending[call_id] = f["name"]
                kept.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": f["name"], "arguments": args},
                    }
                )
            m["tool_calls"] = kept
        elif m["role"] == "tool":
            call_id = raw.get("tool_call_id")
            if not isinstance(call_id, str):
                raise bad(f"{where}.tool_call_id", "is required in a tool message")
            if call_id not in pending:
                raise bad(
                    f"{where}.tool_call_id",
                    f"no assistant tool call with id {_show(call_id)} before it",
                )
            m["tool_call_id"] = call_id
            m["name"] = pending.pop(call_id)
        out.append(m)
    return out
