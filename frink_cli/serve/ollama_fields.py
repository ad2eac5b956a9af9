"""Ollama's request fields, checked and translated into the OpenAI field names that
openai.generation and prepare.openai_chat_job read, so sampling, formats and tools mean the
same on every API.

- `options`: temperature, top_k, top_p, min_p, seed, num_predict (-1 and -2: until the
  context is full), stop, repeat_penalty, repeat_last_n, presence_penalty,
  frequency_penalty; unset ones take Ollama's defaults (DEFAULTS). The runtime options
  (num_ctx, num_gpu, num_thread, ...) are ignored, as Ollama ignores options a runner
  does not use: this server's context and threads are set when it starts. Samplers frink
  does not have (mirostat, typical_p, tfs_z) are refused unless neutral.
- `format`: "json" (any JSON object) or a JSON schema, through the constrained decoder.
- `tools`: OpenAI's function tools (Ollama's shape is the same); a call in the history
  ({"function": {"name", "arguments": {...}}}) gets an id, and a `tool` message answers
  the oldest call not yet answered (the one its `tool_name` names, when it names one).
- `images`, `suffix`, `template`: refused when given (frink has no image input,
  fill-in-the-middle or custom templates); `keep_alive` and `think` are accepted and
  ignored (the model stays loaded; a reasoning model's analysis always comes as
  `thinking`).

A bad field is an ApiError whose message names the field as Ollama's request spells it
(ollama_name).
"""

from __future__ import annotations

from typing import Any

from .openai import ApiError, _show, bad

# Ollama's defaults for the sampling options (api/types.go DefaultOptions).
DEFAULTS: dict[str, Any] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.9,
    "min_p": 0.0,
    "repeat_penalty": 1.1,
    "repeat_last_n": 64,
}
# Ollama option -> the OpenAI-side field it sets.
SAMPLING = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "seed": "seed",
    "num_predict": "max_tokens",
    "stop": "stop",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
# Samplers frink does not have -> the value that leaves them off.
NEUTRAL = {
    "mirostat": 0,
    "mirostat_tau": None,
    "mirostat_eta": None,
    "typical_p": 1.0,
    "tfs_z": 1.0,
}
# OpenAI-side field -> how Ollama's request names it, for error messages.
_NAMES = {
    **{v: f"options.{k}" for k, v in SAMPLING.items()},
    "response_format": "format",
    "json_schema": "format",
}
_ROLES = ("system", "user", "assistant", "tool")


def ollama_name(e: ApiError) -> ApiError:
    """`e` with its field named as Ollama's request names it."""
    param = e.param or ""
    for field, name in _NAMES.items():
        if param == field or param.startswith((field + ".", field + "[")):
            renamed = name + param[len(field) :] if name != "format" else name
            message = e.message
            if message.startswith(param):
                message = renamed + message[len(param) :]
            return ApiError(e.status, message, param=renamed)
    return e


def _refuse(body: dict, name: str, why: str, where: str = "") -> None:
    """A 400 when `body` gives `name` a value (one frink cannot honour)."""
    if body.get(name):
        raise bad(f"{where}.{name}" if where else name, why)


def _stream(body: dict) -> bool:
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise bad("stream", "must be true or false")
    return stream


def sampling(body: dict) -> dict:
    """The OpenAI-side sampling fields of `options` (Ollama's defaults where unset),
    with `stream`."""
    options = body.get("options", {})
    if not isinstance(options, dict):
        raise bad("options", "must be an object")
    out: dict[str, Any] = {**DEFAULTS, "stream": _stream(body)}
    for name, field in SAMPLING.items():
        value = options.get(name)
        if value is not None:
            out[field] = value
    if out.get("max_tokens") == -2:  # Ollama's "fill the context"
        out["max_tokens"] = -1
    for name, neutral in NEUTRAL.items():
        value = options.get(name)
        if neutral is not None and value is not None and value != neutral:
            raise bad(f"options.{name}", f"is not supported (only {neutral!r})")
    if body.get("logprobs"):
        raise bad("logprobs", "is not supported on this API (/v1/chat/completions has them)")
    ctx = options.get("num_ctx")
    if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, (int, float))):
        raise bad("options.num_ctx", f"must be an integer (got {_show(ctx)})")
    return out


def output_format(body: dict) -> dict:
    """`format` as OpenAI's response_format ({} when absent or empty)."""
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(fmt, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": fmt}}}
    raise bad("format", f'must be "json" or a JSON schema object (got {_show(fmt)})')


def chat_body(body: dict) -> dict:
    """An /api/chat request as an OpenAI chat request."""
    _refuse(body, "template", "is not supported (the model's own chat template is used)")
    tools = body.get("tools")
    out = {**sampling(body), **output_format(body), "messages": _messages(body.get("messages"))}
    if tools is not None:
        out["tools"] = tools
    return out


def generate_messages(body: dict) -> list[dict]:
    """A templated /api/generate request's conversation: its `system`, then its prompt."""
    _refuse(body, "images", "are not supported (no image input)")
    _refuse(body, "suffix", "is not supported (no fill-in-the-middle)")
    _refuse(body, "template", "is not supported (the model's own chat template is used)")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise bad("system", "must be a string")
    msgs = [{"role": "system", "content": system}] if system else []
    return [*msgs, {"role": "user", "content": prompt(body)}]


def prompt(body: dict) -> str:
    p = body.get("prompt", "")
    if not isinstance(p, str):
        raise bad("prompt", f"must be a string (got {_show(p)})")
    return p


def context_ids(body: dict, n_vocab: int) -> list[int]:
    """/api/generate's `context`: an earlier answer's token ids, which the prompt follows."""
    ctx = body.get("context", [])
    if not isinstance(ctx, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in ctx
    ):
        raise bad("context", f"must be a list of token ids in [0, {n_vocab})")
    return list(ctx)


def flag(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name, default)
    if not isinstance(v, bool):
        raise bad(name, "must be true or false")
    return v


def _messages(msgs: Any) -> list[dict]:
    """Ollama's messages in OpenAI's shape: calls given ids, tool results matched to them."""
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "must be a non-empty list of messages")
    out = []
    pending: list[tuple[str, str]] = []  # (call id, function name), not yet answered
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "must be an object with a role and content")
        if m.get("role") not in _ROLES:
            raise bad(f"{where}.role", f"must be one of {', '.join(_ROLES)}")
        _refuse(m, "images", "are not supported (no image input)", where)
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise bad(f"{where}.content", "must be a string")
        msg: dict[str, Any] = {"role": m["role"], "content": content or ""}
        if m["role"] == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _calls(m["tool_calls"], where, i, pending)
        elif m["role"] == "tool":
            msg["tool_call_id"] = _answered(m, where, pending)
        out.append(msg)
    return out


def _calls(calls: Any, where: str, i: int, pending: list[tuple[str, str]]) -> list[dict]:
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls", "must be a list")
    kept = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise bad(f"{where}.tool_calls[{j}]", "must be a function call with a name")
        call_id = f"call_{i}_{j}"
        pending.append((call_id, f["name"]))
        kept.append({"id": call_id, "type": "function", "function": f})
    return kept


def _answered(m: dict, where: str, pending: list[tuple[str, str]]) -> str:
    name = m.get("tool_name", m.get("name"))
    if name is not None and not isinstance(name, str):
        raise bad(f"{where}.tool_name", "must be a string")
    for k, (call_id, called) in enumerate(pending):
        if name is None or called == name:
            del pending[k]
            return call_id
    wanted = f" to {_show(name)}" if name is not None else ""
    raise bad(where, f"a tool message must answer an assistant tool call{wanted} before it")
