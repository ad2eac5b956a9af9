"""The OpenAI API's request fields and response shapes, as the `openai` client and
llama-server speak them.

Requests are untrusted: every field frink reads is checked for type and range here, and
a bad one is an ApiError (an OpenAI-shaped error body with its HTTP status) naming the
field. A body's text must be valid Unicode (a lone surrogate such as "\ud800" is refused
by its field's name), and a null field is the same as an absent one, as OpenAI takes it.
Fields frink does not read are ignored, as llama-server ignores them; fields it cannot
honour (UNSUPPORTED: functions, audio, ...; non-text content; more choices than the
server's slots) are refused by name rather than silently dropped.

`logit_bias` is OpenAI's: token id -> a bias in [-100, 100] added to that token's logit
before the sampler's other stages (sampling.SamplingParams.logit_bias).

Log probabilities (chat's `logprobs` + `top_logprobs`, completions' `logprobs: k`) are
the model's own: log softmax of the raw logits at each answer token, before temperature
and penalties, as vLLM returns them by default. Every sampled token has one, a harmony
model's reasoning tokens included (as vLLM's); an end-of-generation token has none.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..errors import FrinkError
from ..sampling import SamplingParams, TokenLogprob

MAX_STOPS = 16
# The most alternatives a request may ask for per token (OpenAI's chat limit).
MAX_TOP_LOGPROBS = 20
# The most choices (`n`) a request may ask for (OpenAI's limit; a server also holds them
# to its --parallel slots, which decode them side by side).
MAX_CHOICES = 128
# The most tokens a request may bias (logit_bias entries).
MAX_LOGIT_BIAS = 1024
LOGIT_BIAS_RANGE = 100.0


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status,
            message,
            kind,
            param,
            code,
        )

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param)


def parse_body(data: bytes) -> dict:
    """A request body as the JSON object it must be: its text valid Unicode (a lone
    surrogate, escaped or as raw bytes, is refused naming its field), null fields dropped
    (null means absent)."""
    try:
        body = json.loads(data)
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not UTF-8 text") from None
    except RecursionError:
        field = _deepest_field(data)
        if field is None:
            raise ApiError(400, "the body is nested too deeply") from None
        raise bad(field, "is nested too deeply") from None
    except ValueError:
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    where = _invalid_text(body)
    if where is not None:
        raise bad(where, "is not valid Unicode text (it holds a lone surrogate such as \\ud800)")
    return {k: v for k, v in body.items() if v is not None}


# A JSON text's strings and brackets: enough to follow its nesting without parsing it.
_JSON_NESTING = re.compile(rb'"(?:[^"\\]|\\.)*"|[][{}]')


def _deepest_field(data: bytes) -> str | None:
    """The top-level field under which the JSON object `data` nests deepest (None: no
    field nests), found without the recursion that json.loads ran out of."""
    depth = deepest = 0
    key = field = None
    for m in _JSON_NESTING.finditer(data):
        t = m.group()
        if t[:1] == b'"':
            # At depth 1 the last string before a bracket is that value's key.
            key = t if depth == 1 else key
        elif t in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest, field = depth, key
        else:
            depth -= 1
    if field is None:
        return None
    return field[1:-1].decode("utf-8", "replace")[:64]


def _invalid_text(root: dict) -> str | None:
    """The path of the first string (key or value) in `root` that is not valid Unicode
    (a lone surrogate), or None. Iterative: the body may nest as deep as JSON allows."""
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if not _valid(v):
                return path or "body"
        elif isinstance(v, dict):
            for k, x in v.items():
                where = f"{path}.{k}" if path else str(k)
                if not _valid(k):
                    return f"{path}.<key>" if path else "<key>"
                stack.append((where, x))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))
    return None


def _valid(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_none_or(*neutral: object) -> Callable[[Any], bool]:
    """A field's check: refused unless falsy or one of these values."""
    return lambda v: bool(v) and v not in neutral


# Request fields frink cannot honour yet, refused by name: a client sending them expects
# an answer that they shape, and a silent plain answer would be wrong. Lifting one is
# deleting its line here once the feature works (tools and response_format: the agents
# issue). Each: field -> (what it asks for, whether a value asks for it).
UNSUPPORTED: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "functions": ("the deprecated function calls are not supported: use tools", _not_none_or()),
    "function_call": (
        "the deprecated function calls are not supported: use tool_choice",
        _not_none_or("none"),
    ),
    "audio": ("audio output is not supported", _not_none_or()),
    "modalities": ("only text output is supported", lambda v: bool(v) and v != ["text"]),
    "prediction": ("predicted outputs are not supported", _not_none_or()),
    "web_search_options": ("web search is not supported", _not_none_or()),
}
# The text completions API's own.
UNSUPPORTED_COMPLETION: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "tools": ("is a chat completions field (/v1/chat/completions)", _not_none_or()),
    "tool_choice": ("is a chat completions field (/v1/chat/completions)", _not_none_or("none")),
    "echo": ("is not supported", _not_none_or()),
    "suffix": ("is not supported", _not_none_or()),
    "best_of": ("only 1 is supported", lambda v: v != 1),
}


def refuse_unsupported(body: dict, chat: bool) -> None:
    """A 400 naming the first field of UNSUPPORTED (chat) or UNSUPPORTED_COMPLETION that
    the body asks for."""
    table = UNSUPPORTED if chat else {**UNSUPPORTED, **UNSUPPORTED_COMPLETION}
    for name, (why, asks) in table.items():
        if name in body:
            try:
                asked = asks(body[name])
            except TypeError:  # an unhashable value compared with a neutral one
                asked = True
            if asked:
                raise bad(name, why)


@dataclass(frozen=True)
class Generation:
    """What a request asks the engine for, checked."""

    params: SamplingParams
    max_tokens: int | None  # None: until the context is full
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    return_tokens: bool  # frink's (and llama-server's) extra: the answer's token ids too
    ignore_eos: bool  # llama-server's extra: generate past end-of-generation tokens
    cache_prompt: bool = True  # llama-server's extra: False computes the prompt afresh
    # None: no log probabilities; k: each answer token's, with its k most likely tokens.
    logprobs: int | None = None
    n: int = 1  # choices: independent answers to the one prompt
    # llama-server's `lora`: the adapters' scales for this request (None: the global ones).
    lora: dict[int, float] | None = None

    def choice_params(self, index: int) -> SamplingParams:
        """Choice `index`'s sampler: a seeded request's choices draw from seeds seed,
        seed + 1, ..., so each differs and each is reproducible."""
        if self.params.seed is None or index == 0:
            return self.params
        return replace(self.params, seed=(self.params.seed + index) % (1 << 63))


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(name, f"must be a number (got {_show(v)})")
    if not lo <= v <= hi:
        raise bad(name, f"must be between {lo:g} and {hi:g} (got {v:g})")
    return float(v)


def _integer(body: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(name, f"must be an integer (got {_show(v)})")
    if not lo <= v <= hi:
        raise bad(name, f"must be between {lo} and {hi} (got {v})")
    return v


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives per answer token a request asks for (None: no logprobs).
    Chat: `logprobs: true` and `top_logprobs: 0..20` (which needs logprobs); completions:
    `logprobs: 0..20` (OpenAI's own limit is 5; llama-server's is larger)."""
    if chat:
        on = body.get("logprobs")
        if on is not None and not isinstance(on, bool):
            raise bad("logprobs", "must be true or false")
        top = _integer(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
        if top is not None and not on:
            raise bad("top_logprobs", "needs logprobs: true")
        return (top or 0) if on else None
    return _integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)


def logit_bias(body: dict, vocab: int | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: {"token id": bias in [-100, 100]}, ids below `vocab`."""
    v = body.get("logit_bias")
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise bad("logit_bias", "must be an object mapping token ids to biases")
    if len(v) > MAX_LOGIT_BIAS:
        raise bad("logit_bias", f"at most {MAX_LOGIT_BIAS} tokens")
    out = []
    for key, bias in v.items():
        ok = isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12
        token = int(key) if ok else -1
        if token < 0 or (vocab is not None and token >= vocab):
            limit = f" in [0, {vocab})" if vocab is not None else ""
            raise bad("logit_bias", f"keys must be token ids{limit} (got {_show(key)})")
        if (
            isinstance(bias, bool)
            or not isinstance(bias, (int, float))
            or not math.isfinite(bias)
            or abs(bias) > LOGIT_BIAS_RANGE
        ):
            raise bad(
                "logit_bias",
                f"token {token}: the bias must be a number in [-100, 100] (got {_show(bias)})",
            )
        out.append((token, float(bias)))
    return tuple(out)


def generation(
    body: dict,
    default_max_tokens: int | None = None,
    chat: bool = True,
    vocab: int | None = None,
) -> Generation:
    """The sampling and stopping fields shared by chat and text completions (`vocab`:
    the model's vocabulary size, which logit_bias's ids must be below)."""
    n = _integer(body, "n", 1, 1, MAX_CHOICES) or 1
    top = logprobs(body, chat)
    max_tokens = _integer(body, "max_completion_tokens", None, 1, 1 << 30)
    if max_tokens is None:
        # -1: until the context is full (llama-server's n_predict spelling).
        max_tokens = _integer(body, "max_tokens", default_max_tokens, -1, 1 << 30)
        if max_tokens == 0:
            raise bad("max_tokens", "must be at least 1")
        if max_tokens == -1:
            max_tokens = None
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOPS:
            raise bad("stop", f"at most {MAX_STOPS} stop strings")
        stops = tuple(stop)
    else:
        raise bad("stop", "must be a string or a list of strings")
    if any(len(s) > 1000 for s in stops):
        raise bad("stop", "a stop string is longer than 1000 characters")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", "must be true or false")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("stream_options", "must be an object")
    include_usage = bool(opts and opts.get("include_usage"))
    seed = _integer(body, "seed", None, -(1 << 63), (1 << 63) - 1)
    try:
        params = SamplingParams(
            temperature=_number(body, "temperature", 0.8, 0.0, 2.0),
            top_k=_integer(body, "top_k", 40, 0, 1 << 30) or 0,
            top_p=_number(body, "top_p", 0.95, 0.0, 1.0),
            min_p=_number(body, "min_p", 0.05, 0.0, 1.0),
            repeat_penalty=_number(body, "repeat_penalty", 1.0, 1e-6, 100.0),
            repeat_last_n=_integer(body, "repeat_last_n", 64, -1, 1 << 30) or 0,
            frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            seed=None if seed is None or seed < 0 else seed,
            logit_bias=logit_bias(body, vocab),
        )
    except FrinkError as e:  # the sampler's own checks, should a range above miss one
        raise ApiError(400, str(e)) from None
    flags = []
    for name, default in (("return_tokens", False), ("ignore_eos", False), ("cache_prompt", True)):
        value = body.get(name, default)
        if not isinstance(value, bool):
            raise bad(name, "must be true or false")
        flags.append(value)
    return_tokens, ignore_eos, cache_prompt = flags
    return Generation(
        params,
        max_tokens,
        stops,
        stream,
        include_usage,
        return_tokens,
        ignore_eos,
        cache_prompt,
        logprobs=top,
        n=n,
    )


_ROLES = ("system", "developer", "user", "assistant", "tool")


def messages(body: dict) -> list[dict]:
    """The conversation, each message {"role", "content": str} for the chat template."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "must be a non-empty list of messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "must be an object with a role and content")
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"{where}.role", f"must be one of {', '.join(_ROLES)} (got {_show(role)})")
        out.append({"role": role, "content": _content(m.get("content"), f"{where}.content")})
    return out


def _content(c: Any, where: str) -> str:
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for j, p in enumerate(c):
            if (
                not isinstance(p, dict)
                or p.get("type") != "text"
                or not isinstance(p.get("text"), str)
            ):
                raise bad(f"{where}[{j}]", "only text parts are supported")
            parts.append(p["text"])
        return "".join(parts)
    raise bad(where, "must be a string or a list of text parts")


def completion_prompt(body: dict) -> str | list[int]:
    """A text completion's prompt: a string, or token ids (one prompt; a list of one)."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise bad("prompt", "is empty")
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return list(p)
    if isinstance(p, list) and len(p) > 1:
        raise bad("prompt", "only one prompt per request is supported")
    raise bad("prompt", "must be a string or a list of token ids")


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


# A token id -> its text and bytes as the API shows them.
Spell = Callable[[int], tuple[str, bytes]]


def _no_spelling(token: int) -> tuple[str, bytes]:
    return "", b""


class Reply:
    """One response's id, timestamp and model name, and its bodies and stream chunks, for
    any number of choices (`n`). `spell` names tokens in log probabilities (the model's
    tokenizer)."""

    def __init__(self, chat: bool, model: str, spell: Spell = _no_spelling) -> None:
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.spell = spell
        self._offsets: dict[int, int] = {}  # per choice, text_offset of its next token

    def logprobs(self, entries: list[TokenLogprob] | None, index: int = 0) -> dict | None:
        """Choice `index`'s `logprobs` for these answer tokens: chat's {"content": [...]}
        or the completions API's parallel lists (None when the request asked for none)."""
        if entries is None:
            return None
        if self.chat:
            return {"content": [self._chat_entry(e) for e in entries], "refusal": None}
        tokens, offsets = [], []
        offset = self._offsets.get(index, 0)
        for e in entries:
            text = self.spell(e.token)[0]
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
        self._offsets[index] = offset
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{self.spell(t)[0]: lp for t, lp in e.top} for e in entries],
            "text_offset": offsets,
        }

    def _chat_entry(self, e: TokenLogprob) -> dict:
        def one(token: int, logprob: float) -> dict:
            text, raw = self.spell(token)
            return {"token": text, "logprob": logprob, "bytes": list(raw)}

        return {**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def choice(
        self,
        index: int,
        text: str,
        finish: str,
        reasoning: str = "",
        logprobs: list[TokenLogprob] | None = None,
        tool_calls: list[dict] | None = None,
    ) -> dict:
        """One whole choice. reasoning: a harmony model's analysis channel, as llama-server
        and vLLM return it (message.reasoning_content), when there was one. tool_calls:
        the calls the answer made (serve/tools.py), content None when it made only those."""
        lp = self.logprobs(logprobs, index)
        if self.chat:
            message: dict = {"role": "assistant", "content": text}
            if reasoning:
                message["reasoning_content"] = reasoning
            if tool_calls:
                message["tool_calls"] = tool_calls
                message["content"] = text or None
            return {"index": index, "message": message, "logprobs": lp, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}

    def whole(self, choices: list[dict], use: dict) -> dict:
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": choices, "usage": use}

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        first: bool = False,
        reasoning: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
        index: int = 0,
        tool_calls: list[dict] | None = None,
    ) -> dict:
        """A stream chunk of choice `index`; logprobs: those of its answer tokens since its
        last chunk (None: not asked); tool_calls: tool-call deltas (index, id, name, then
        argument fragments)."""
        lp = self.logprobs(logprobs, index)
        if self.chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            if tool_calls is not None:
                delta["tool_calls"] = tool_calls
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            choice: dict = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, use: dict) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": use}
