"""Anthropic's Messages API on `frink serve`: POST /v1/messages (whole, or streamed as
Anthropic's server-sent events) and POST /v1/messages/count_tokens, as the `anthropic`
client and Claude Code speak them.

A request is checked and converted by anthropic_request.py, then runs the chat path every
API shares (prepare.py: the template, the tool plan, the constraint; answer.start: the
engine's jobs). The answer is built from the engine's events as content blocks, in the
order they happen: a reasoning model's analysis (gpt-oss) as a `thinking` block, text as
`text` blocks, each call the model's tool-call parser reads as a `tool_use` block (id
"toolu_...", input an object). stop_reason: `tool_use` when the answer called a tool,
`max_tokens`, `stop_sequence` (with the string) or `end_turn`. usage.input_tokens counts
the whole prompt, as count_tokens does (frink's prompt cache is not Anthropic's
cache_control, so no cache fields are reported).

A stream is message_start, a ping, then per block content_block_start, its deltas
(text_delta, thinking_delta, input_json_delta) and content_block_stop; then
message_delta (stop_reason, usage) and message_stop; a ping every PING_SECONDS while
nothing else is sent; a failure mid-stream is an `error` event.

Errors on these routes are in Anthropic's shape, {"type": "error", "error": {"type",
"message"}}: 400 invalid_request_error, 401 authentication_error, 403 permission_error,
404 not_found_error, 413 request_too_large, 529 overloaded_error (a full queue, a server
going down; with Retry-After), 500 api_error. A request's model must be one this server
serves (404 otherwise), as on the OpenAI routes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import printable
from ..toolcalls import Parser, ToolCall
from . import answer, anthropic_request, prepare
from .answer import Outcome, Run, Stream
from .endpoints import check_generates, check_model, endpoint, error_headers, read_body
from .engine import Finish
from .openai import ApiError

if TYPE_CHECKING:
    from ..toolcalls.plan import ToolPlan
    from .app import ServerState

PING_SECONDS = 10.0
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
# The engine events an answer is made of; any other kind is a job's failure.


def routes(state: ServerState) -> list[Route]:
    """The Messages API's routes, their errors in Anthropic's shape."""
    return [
        Route("/v1/messages", endpoint(state, _messages, shape=error), methods=["POST"]),
        Route(
            "/v1/messages/count_tokens",
            endpoint(state, _count_tokens, shape=error),
            methods=["POST"],
        ),
    ]


def error_body(e: ApiError) -> tuple[int, dict]:
    """An error's status and body as Anthropic answers them (a 503 is its 529)."""
    status = 529 if e.status == 503 else e.status
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return status, {"type": "error", "error": {"type": kind, "message": e.message}}


def error(e: ApiError) -> JSONResponse:
    """An ApiError in Anthropic's shape."""
    status, body = error_body(e)
    return JSONResponse(body, status_code=status, headers=error_headers(e.status))


async def _conversation(
    state: ServerState, request: Request
) -> tuple[dict, list[dict], ToolPlan | None]:
    """The request's body, its conversation for the chat template, and its tool plan."""
    body = await read_body(state, request)
    check_model(state, body)
    check_generates(state)
    msgs = anthropic_request.messages(body)
    return body, msgs, anthropic_request.plan(body, state.model.tokenizer)


async def _count_tokens(state: ServerState, request: Request, o: Outcome) -> Response:
    _, msgs, plan = await _conversation(state, request)
    ids = await prepare.prompt_ids(state, msgs, plan)
    o.detail = f"input_tokens={len(ids)}"
    return JSONResponse({"input_tokens": len(ids)})


async def _messages(state: ServerState, request: Request, o: Outcome) -> Response:
    body, msgs, plan = await _conversation(state, request)
    gen = anthropic_request.generation(body)
    job = await prepare.chat_job(state, msgs, gen, plan, None)
    run = answer.start(
        state.engine,
        job.gen,
        True,
        o,
        job.ids,
        job.constraints,
        job.spell,
        calls=job.parsers is not None,
    )
    message = Message(state.model_id, len(job.ids), job.parsers[0] if job.parsers else None)
    if gen.stream:
        return Stream(_stream(run, message, o))
    return await answer.one_whole(run, request, o, message.events, message.body)


async def _stream(run: Run, message: Message, o: Outcome) -> AsyncIterator[str]:
    """The answer as Anthropic's server-sent events; closing it cancels the job."""
    try:
        yield _sse("message_start", {"type": "message_start", "message": message.head()})
        yield _sse("ping", {"type": "ping"})
        while True:
            try:
                _, kind, payload = await asyncio.wait_for(run.events.get(), PING_SECONDS)
            except asyncio.TimeoutError:
                yield _sse("ping", {"type": "ping"})
                continue
            if kind not in answer.ANSWER_EVENTS:
                o.detail = printable(str(payload))[:200]
                yield _sse("error", error_body(answer.failure(kind, payload))[1])
                return
            for name, data in message.events(kind, payload):
                yield _sse(name, data)
            if kind == "done":
                answer.describe(o, [payload])
                reason, sequence = message.stop_reason()
                delta = {"stop_reason": reason, "stop_sequence": sequence}
                usage = {"output_tokens": payload.completion_tokens}
                yield _sse(
                    "message_delta", {"type": "message_delta", "delta": delta, "usage": usage}
                )
                yield _sse("message_stop", {"type": "message_stop"})
                return
    finally:
        run.cancel()


def _sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


# A stream event: (its name, its data).
Event = tuple[str, dict]


class Message:
    """One answer as Anthropic's content blocks, built from the engine's events in the
    order they happen; each event also gives the stream events that say the same."""

    def __init__(self, model: str, input_tokens: int, parser: Parser | None) -> None:
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model, self.input_tokens, self.parser = model, input_tokens, parser
        self.blocks: list[dict] = []
        self.open = False  # whether the last block has not been closed yet
        self.finish: Finish | None = None

    def events(self, kind: str, payload: Any) -> list[Event]:
        """One engine event: the blocks grow, and the stream events that say so."""
        if kind == "reasoning":
            return self._add("thinking", payload)
        if kind == "text":
            return self._parts(self.parser.push(payload) if self.parser else [("content", payload)])
        if kind == "done":
            self.finish = payload
            return [*(self._parts(self.parser.finish()) if self.parser else []), *self._close()]
        return []  # a log probability: the Messages API has none

    def _parts(self, parts: list) -> list[Event]:
        """A tool-call parser's events: text, and completed calls."""
        out: list[Event] = []
        for kind, value in parts:
            out += self._add("text", value) if kind == "content" else self._call(value)
        return out

    def _add(self, kind: str, text: str) -> list[Event]:
        """Text or thinking, appended to the last block if it is an open one of its kind."""
        if not text:
            return []
        out: list[Event] = []
        if not (self.open and self.blocks[-1]["type"] == kind):
            out += self._close()
            extra = {"signature": ""} if kind == "thinking" else {}
            out += self._start({"type": kind, kind: "", **extra})
        self.blocks[-1][kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        out.append(("content_block_delta", self._indexed("content_block_delta", delta=delta)))
        return out

    def _call(self, call: ToolCall) -> list[Event]:
        """A completed call as a tool_use block: started, its input as one JSON delta."""
        block = {"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": call.name}
        out = [*self._close(), *self._start({**block, "input": {}})]
        self.blocks[-1]["input"] = anthropic_request.tool_input(call.arguments)
        delta = {"type": "input_json_delta", "partial_json": call.arguments}
        out.append(("content_block_delta", self._indexed("content_block_delta", delta=delta)))
        return [*out, *self._close()]

    def _start(self, block: dict) -> list[Event]:
        self.blocks.append(block)
        self.open = True
        data = self._indexed("content_block_start", content_block=dict(block))
        return [("content_block_start", data)]

    def _close(self) -> list[Event]:
        if not self.open:
            return []
        self.open = False
        return [("content_block_stop", self._indexed("content_block_stop"))]

    def _indexed(self, kind: str, **fields: Any) -> dict:
        return {"type": kind, "index": len(self.blocks) - 1, **fields}

    def stop_reason(self) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) once the answer is done."""
        assert self.finish is not None
        if any(b["type"] == "tool_use" for b in self.blocks):
            return "tool_use", None
        if self.finish.reason == "length":
            return "max_tokens", None
        if self.finish.stop_sequence is not None:
            return "stop_sequence", self.finish.stop_sequence
        return "end_turn", None

    def head(self) -> dict:
        """The message as message_start opens a stream: no content yet."""
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }

    def body(self) -> dict:
        """The whole message, once the answer is done."""
        assert self.finish is not None
        reason, sequence = self.stop_reason()
        usage = {"input_tokens": self.input_tokens, "output_tokens": self.finish.completion_tokens}
        return {
            **self.head(),
            "content": self.blocks,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage,
        }
