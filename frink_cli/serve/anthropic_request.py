"""An Anthropic Messages API request, checked and turned into what frink's chat path
takes (serve/prepare.py): the conversation in the chat template's shape, the tool plan,
and the engine's Generation.

Every field frink reads is checked for type and range, and a bad one is an ApiError
(400) naming it: `messages[1].content[0].type`. Content blocks frink reads: `text`,
`tool_use` (an assistant's call), `tool_result` (a user's answer to one, its content a
string or text blocks); an assistant's `thinking` and `redacted_thinking` blocks are
accepted and left out of the prompt (chat templates drop past reasoning). Other block
types (`image`, `document`, ...) are refused by name: this server reads text.
`cache_control` is accepted and ignored (frink caches every prompt's prefix itself),
as are `metadata` and fields frink does not read.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import FrinkError
from ..sampling import SamplingParams
from ..toolcalls.plan import ToolPlan, tool_plan
from .openai import MAX_STOPS, ApiError, Generation, _number, _show, bad
from .tools import MAX_TOOLS

_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
# Blocks an assistant may send back that frink leaves out of the prompt.
_DROPPED = ("thinking", "redacted_thinking")


def generation(body: dict) -> Generation:
    """max_tokens (required), stop_sequences, temperature (0-1, default 1), top_p, top_k
    (off unless given: Anthropic's sampler is temperature alone), stream."""
    n = body.get("max_tokens")
    if n is None:
        raise bad("max_tokens", "is required")
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1 << 30:
        raise bad("max_tokens", f"must be an integer of at least 1 (got {_show(n)})")
    stops = body.get("stop_sequences", [])
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop_sequences", "must be a list of strings")
    if len(stops) > MAX_STOPS or any(len(s) > 1000 for s in stops):
        raise bad("stop_sequences", f"at most {MAX_STOPS} strings of 1000 characters")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", "must be true or false")
    top_k = body.get("top_k", 0)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise bad("top_k", f"must be a non-negative integer (got {_show(top_k)})")
    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        raise bad("metadata", "must be an object")
    try:
        params = SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 1.0),
            top_k=top_k,
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
            min_p=0.0,
        )
    except FrinkError as e:  # the sampler's own checks, should a range above miss one
        raise ApiError(400, str(e)) from None
    return Generation(params, n, tuple(stops), stream, False, False, False)


def system_text(body: dict) -> str:
    """`system`: a string or a list of text blocks, joined."""
    system = body.get("system", "")
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise bad("system", "must be a string or a list of text blocks")
    return "".join(_text_block(b, f"system[{j}]") for j, b in enumerate(system))


def _text_block(b: Any, where: str) -> str:
    if not isinstance(b, dict):
        raise bad(where, "must be a content block object")
    kind = b.get("type")
    if kind != "text":
        raise _unsupported(kind, f"{where}.type")
    if not isinstance(b.get("text"), str):
        raise bad(f"{where}.text", "must be a string")
    return str(b["text"])


def _unsupported(kind: Any, where: str) -> ApiError:
    if kind in ("image", "document", "search_result", "container_upload"):
        return bad(where, f"{kind} blocks are not supported (this server reads text only)")
    return bad(where, f"unknown or unsupported content block type {_show(kind)}")


def messages(body: dict) -> list[dict]:
    """The conversation for the chat template: the system prompt first; an assistant's
    tool_use blocks as its tool_calls (arguments as objects); a user's tool_result blocks
    as tool messages, each answering a call made before it, then the user's text."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "must be a non-empty list of messages")
    system = system_text(body)
    out = [{"role": "system", "content": system}] if system else []
    pending: dict[str, str] = {}  # tool_use id -> tool name, not yet answered
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "must be an object with a role and content")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"{where}.role", f"must be user or assistant (got {_show(role)})")
        content = m.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise bad(f"{where}.content", "must be a string or a list of content blocks")
        if role == "assistant":
            out.append(_assistant(content, f"{where}.content", pending))
        else:
            out += _user(content, f"{where}.content", pending)
    return out


def _assistant(blocks: list, where: str, pending: dict[str, str]) -> dict:
    text, calls = [], []
    for j, b in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind in _DROPPED:
            continue
        if kind != "tool_use":
            text.append(_text_block(b, at))
            continue
        call_id, name, args = b.get("id"), b.get("name"), b.get("input")
        if not isinstance(call_id, str) or not call_id:
            raise bad(f"{at}.id", "must be a non-empty string")
        if not isinstance(name, str):
            raise bad(f"{at}.name", "must be a string")
        if not isinstance(args, dict):
            raise bad(f"{at}.input", "must be an object")
        pending[call_id] = name
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        )
    m: dict = {"role": "assistant", "content": "".join(text)}
    if calls:
        m["tool_calls"] = calls
    return m


def _user(blocks: list, where: str, pending: dict[str, str]) -> list[dict]:
    out, text = [], []
    for j, b in enumerate(blocks):
        at = f"{where}[{j}]"
        if not isinstance(b, dict) or b.get("type") != "tool_result":
            text.append(_text_block(b, at))
            continue
        call_id = b.get("tool_use_id")
        if not isinstance(call_id, str):
            raise bad(f"{at}.tool_use_id", "must be a string")
        if call_id not in pending:
            raise bad(
                f"{at}.tool_use_id", f"no assistant tool_use with id {_show(call_id)} before it"
            )
        is_error = b.get("is_error", False)
        if not isinstance(is_error, bool):
            raise bad(f"{at}.is_error", "must be true or false")
        content = b.get("content", "")
        if isinstance(content, list):
            content = "".join(_text_block(c, f"{at}.content[{k}]") for k, c in enumerate(content))
        elif not isinstance(content, str):
            raise bad(f"{at}.content", "must be a string or a list of text blocks")
        if is_error:
            content = f"Error: {content}"
        out.append(
            {
                "role": "tool",
                "content": content,
                "tool_call_id": call_id,
                "name": pending.pop(call_id),
            }
        )
    if text:
        out.append({"role": "user", "content": "".join(text)})
    return out


def plan(body: dict, tok: Any) -> ToolPlan | None:
    """`tools` (name, description, input_schema) and `tool_choice` (auto, any, tool with
    its name, none; disable_parallel_tool_use) as the model's ToolPlan."""
    tools, choice = body.get("tools"), body.get("tool_choice", {"type": "auto"})
    if not isinstance(choice, dict) or choice.get("type") not in (*_CHOICES, "tool"):
        raise bad("tool_choice", 'must be {"type": "auto" | "any" | "tool" | "none"}')
    parallel = not choice.get("disable_parallel_tool_use", False)
    if not isinstance(choice.get("disable_parallel_tool_use", False), bool):
        raise bad("tool_choice.disable_parallel_tool_use", "must be true or false")
    if tools is None:
        if choice["type"] in ("any", "tool"):
            raise bad("tool_choice", "needs tools")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad("tools", f"must be a list of at most {MAX_TOOLS} tools")
    functions = [_function(t, f"tools[{i}]") for i, t in enumerate(tools)]
    names = [f["function"]["name"] for f in functions]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise bad(f"tools[{i}].name", f"{name!r} is defined twice")
    if choice["type"] == "tool":
        name = choice.get("name")
        if name not in names:
            raise bad("tool_choice.name", f"no tool named {_show(name)} in tools")
        return tool_plan(functions, "required", parallel, tok, name=name)
    if not functions:
        return None
    return tool_plan(functions, _CHOICES[choice["type"]], parallel, tok)


def _function(t: Any, where: str) -> dict:
    """An Anthropic custom tool as an OpenAI function tool (what the tool plan takes)."""
    if not isinstance(t, dict):
        raise bad(where, "must be a tool object")
    if t.get("type", "custom") != "custom":
        raise bad(f"{where}.type", f"only custom tools are supported (got {_show(t['type'])})")
    name, schema, desc = t.get("name"), t.get("input_schema"), t.get("description")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad(f"{where}.name", "must be 1-128 letters, digits, _ or -")
    if not isinstance(schema, dict):
        raise bad(f"{where}.input_schema", "must be a JSON schema object")
    if desc is not None and not isinstance(desc, str):
        raise bad(f"{where}.description", "must be a string")
    f = {"name": name, **({"description": desc} if desc else {}), "parameters": schema}
    return {"type": "function", "function": f}


def tool_input(arguments: str) -> dict:
    """A call's arguments (JSON text of an object) as tool_use's input."""
    value = json.loads(arguments)
    return value if isinstance(value, dict) else {}
