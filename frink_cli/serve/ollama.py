"""Ollama's API, the part clients use: POST /api/chat and /api/generate (NDJSON streamed
by default, whole with `stream: false`), GET /api/tags, POST /api/show, GET /api/version,
GET /api/ps, and the embedding routes /api/embed and /api/embeddings (ollama_embed.py).

Requests are translated into the OpenAI field names (ollama_fields.py) and run through
the same checks, chat template, tool plan and constrained decoder as /v1/chat/completions
(prepare.openai_chat_job); only the answer's shape is Ollama's: `message` (chat) or `response`
(generate) pieces, then a last object with done: true, done_reason, the token counts and
durations in nanoseconds (and generate's `context`, the prompt's and answer's ids). A
tool call is sent whole, its arguments an object; a reasoning model's analysis comes as
`thinking`. A templated /api/generate is a one-turn chat (its `system`, then its
prompt); `raw: true` sends the prompt as it is. An empty prompt only answers that the
model is loaded (done_reason "load"), as Ollama's does.

Every failure on these routes is Ollama's error, {"error": message}, with its status
(400 a bad field, named as Ollama names it; 401 key; 404 model; 413; 503 busy); one in
a stream that has begun is its last line.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import printable
from ..toolcalls import Parser
from . import answer, ollama_embed, ollama_fields, ollama_models, openai, prepare, tools
from .answer import Outcome, Run, Stream
from .endpoints import check_generates, read_body
from .engine import Finish
from .ollama_models import ModelFacts
from .openai import ApiError

if TYPE_CHECKING:
    from .app import ServerState

_NDJSON = "application/x-ndjson"


def error(e: ApiError) -> JSONResponse:
    """Ollama's error body for `e`, its field named as Ollama's request names it."""
    e = ollama_fields.ollama_name(e)
    headers = {}
    if e.status == 503:
        headers["Retry-After"] = "1"
    if e.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="frink"'
    return JSONResponse({"error": e.message}, status_code=e.status, headers=headers or None)


def routes(state: ServerState, endpoint: Callable[..., Callable]) -> list[Route]:
    """The Ollama routes; `endpoint` wraps each handler as app.py wraps every route (API
    key, log line, errors), here with Ollama's error shape."""
    facts: list[ModelFacts] = []  # read on first use

    async def model(state: ServerState) -> ModelFacts:
        if not facts:
            facts.append(
                await run_in_threadpool(ollama_models.model_facts, state.model, state.model_id)
            )
        return facts[0]

    async def list_tags(state: ServerState, request: Request, o: Outcome) -> Response:
        return JSONResponse(ollama_models.tags(await model(state)))

    async def show(state: ServerState, request: Request, o: Outcome) -> Response:
        body = await read_body(state, request)
        _check_model(state, body.get("model", body.get("name")))
        return JSONResponse(ollama_models.show(await model(state)))

    async def ps(state: ServerState, request: Request, o: Outcome) -> Response:
        return JSONResponse(ollama_models.running(await model(state), state.engine.n_ctx))

    async def version(state: ServerState, request: Request, o: Outcome) -> Response:
        return JSONResponse({"version": __version__})

    def embedding(answer: Callable) -> Callable:
        async def handler(state: ServerState, request: Request, o: Outcome) -> Response:
            body = await read_body(state, request)
            _check_model(state, body.get("model"))
            return await answer(state, body)

        return handler

    def route(path: str, handler: Callable, method: str) -> Route:
        return Route(path, endpoint(state, handler, shape=error), methods=[method])

    return [
        route("/api/chat", _chat, "POST"),
        route("/api/generate", _generate, "POST"),
        route("/api/tags", list_tags, "GET"),
        route("/api/show", show, "POST"),
        route("/api/version", version, "GET"),
        route("/api/ps", ps, "GET"),
        route("/api/embed", embedding(ollama_embed.embed), "POST"),
        route("/api/embeddings", embedding(ollama_embed.embeddings_legacy), "POST"),
    ]


def _check_model(state: ServerState, name: Any) -> None:
    """`name` must be this server's model (an Ollama tag ":latest" is the same name)."""
    if not isinstance(name, str) or not name:
        raise ApiError(400, "model is required", param="model")
    if name not in state.names and name.removesuffix(":latest") not in state.names:
        raise ApiError(
            404,
            f"model {printable(name)[:100]!r} not found (this server has {state.model_id!r})",
            param="model",
        )


async def _request(state: ServerState, request: Request) -> dict:
    body = await read_body(state, request)
    _check_model(state, body.get("model"))
    check_generates(state)
    return body


async def _chat(state: ServerState, request: Request, o: Outcome) -> Response:
    t0 = time.perf_counter()
    body = ollama_fields.chat_body(await _request(state, request))
    gen = openai.generation(body, vocab=state.model.n_vocab)
    work = await prepare.openai_chat_job(state, body, gen)
    calls = work.parsers is not None
    run = answer.start(
        state.engine, work.gen, True, o, work.ids, work.constraints, work.spell, calls=calls
    )
    reply = _Reply(state.model_id, True, work.parsers[0] if work.parsers else None, t0)
    return await _respond(run, reply, request, o, gen.stream)


async def _generate(state: ServerState, request: Request, o: Outcome) -> Response:
    t0 = time.perf_counter()
    raw = await _request(state, request)
    prompt = ollama_fields.prompt(raw)
    msgs = ollama_fields.generate_messages(raw)
    body = {**ollama_fields.sampling(raw), **ollama_fields.output_format(raw)}
    context = ollama_fields.context_ids(raw, state.model.n_vocab)
    gen = openai.generation(body, vocab=state.model.n_vocab)
    if not prompt and not context:
        reply = _Reply(state.model_id, False, None, t0)
        return JSONResponse({**reply.head(), "response": "", "done": True, "done_reason": "load"})
    spell: frozenset[int] = frozenset()
    if ollama_fields.flag(raw, "raw"):
        ids = await prepare.tokenize_text(state, prompt)
        constraints = await prepare.constraints(state, tools.output_grammar(body), (), 1)
    else:
        work = await prepare.openai_chat_job(state, {**body, "messages": msgs}, gen)
        ids, gen, constraints, spell = work.ids, work.gen, work.constraints, work.spell
    ids = context + ids
    run = answer.start(state.engine, gen, True, o, ids, constraints, spell)
    reply = _Reply(state.model_id, False, None, t0, ids)
    return await _respond(run, reply, request, o, gen.stream)


class _Reply:
    """One Ollama answer built from its job's events: chat's `message` or generate's
    `response`, pieces streamed as they come or gathered into one."""

    def __init__(
        self,
        model_id: str,
        chat: bool,
        parser: Parser | None,
        t0: float,
        prompt: list[int] | None = None,
    ) -> None:
        self.model_id, self.chat, self.parser, self.t0 = model_id, chat, parser, t0
        self.prompt = prompt or []
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[dict] = []
        self.finish: Finish | None = None

    def head(self) -> dict:
        return {"model": self.model_id, "created_at": ollama_models.now()}

    def feed(self, kind: str, payload: Any) -> list[dict]:
        """Take one engine event; the pieces it adds, each {field: value} of content,
        thinking or tool_calls."""
        if kind == "reasoning":
            self.thinking.append(payload)
            return [{"thinking": payload}]
        if kind == "text":
            events = (
                self.parser.push(payload) if self.parser is not None else [("content", payload)]
            )
        elif kind == "done":
            self.finish = payload
            events = self.parser.finish() if self.parser is not None else []
        else:  # log probabilities: none asked
            return []
        pieces = []
        for what, value in events:
            if what == "content":
                self.content.append(value)
                pieces.append({"content": value})
            else:
                call = {"function": {"name": value.name, "arguments": _arguments(value.arguments)}}
                self.calls.append(call)
                pieces.append({"tool_calls": [call]})
        return pieces

    def piece(self, piece: dict) -> dict:
        """A streamed line for one piece."""
        if self.chat:
            return {
                **self.head(),
                "message": {"role": "assistant", "content": "", **piece},
                "done": False,
            }
        text = {"response": piece.get("content", "")}
        if "thinking" in piece:
            text["thinking"] = piece["thinking"]
        return {**self.head(), **text, "done": False}

    def last(self, whole: bool) -> dict:
        """The last object: the whole answer (or, streamed, an empty last piece), done,
        its reason, token counts and durations."""
        f = self.finish
        assert f is not None
        text = "".join(self.content) if whole else ""
        out = self.head()
        if self.chat:
            message: dict = {"role": "assistant", "content": text}
            if whole and self.thinking:
                message["thinking"] = "".join(self.thinking)
            if whole and self.calls:
                message["tool_calls"] = self.calls
            out["message"] = message
        else:
            out["response"] = text
            if whole and self.thinking:
                out["thinking"] = "".join(self.thinking)
        out.update(
            done=True,
            done_reason=f.reason,
            total_duration=_ns(time.perf_counter() - self.t0),
            load_duration=0,
            prompt_eval_count=f.prompt_tokens,
            prompt_eval_duration=_ns(f.first_token_seconds),
            eval_count=f.completion_tokens,
            eval_duration=_ns(f.decode_seconds),
        )
        if not self.chat:
            out["context"] = [*self.prompt, *f.tokens]
        return out


async def _respond(run: Run, reply: _Reply, request: Request, o: Outcome, stream: bool) -> Response:
    if stream:
        return Stream(_lines(run, reply, o), media_type=_NDJSON)
    return await answer.one_whole(run, request, o, reply.feed, lambda: reply.last(whole=True))


async def _lines(run: Run, reply: _Reply, o: Outcome) -> AsyncIterator[str]:
    """The answer as NDJSON lines; closing it cancels the job."""
    try:
        while True:
            _, kind, payload = await run.events.get()
            if kind not in answer.ANSWER_EVENTS:
                o.detail = printable(str(payload))[:200]
                yield _line({"error": answer.failure(kind, payload).message})
                return
            for piece in reply.feed(kind, payload):
                yield _line(reply.piece(piece))
            if kind == "done":
                answer.describe(o, [payload])
                yield _line(reply.last(whole=False))
                return
    finally:
        run.cancel()


def _arguments(text: str) -> Any:
    """A call's arguments as the object Ollama sends (the parser made them JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"
