"""The HTTP face of `frink serve`: an OpenAI-compatible API over the engine, on Starlette.

Routes: POST /v1/chat/completions and /v1/completions (streamed as server-sent events or
whole), GET /v1/models and /health; the same without /v1, as llama-server accepts them.
Every failure is an OpenAI-shaped JSON error with its status (400 bad field, 401 key
with WWW-Authenticate, 403 host or origin, 404 model or route, 408 a request too slow to
arrive, 413 body, 503 queue full or shutting down, with Retry-After, 505 an HTTP version
other than 1.0 and 1.1), and nothing a request sends can stop the server: a handler's own
bug is a 500 for that request alone.

Before any route (_Gate): a server bound to a loopback address answers only requests
whose Host names this machine (a web page cannot reach it through DNS rebinding), and a
browser's cross-origin request only from an origin listed in --cors-origins (a page the
user visits cannot drive it). No route redirects, so no header is reflected into one.

A prompt's size is checked before any work on it, and parsing, templating and tokenizing
run off the event loop (a long prompt, or a template the sandbox stops after its deadline,
must not stall other streams or /health). A client that goes away cancels its job: its
slot is free by the engine's next step; its request is logged as one quiet line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..chat import chat_ids, check_fits
from ..constraint import Constraint, Grammar, GrammarError, compile_constraint
from ..errors import FrinkError, printable
from . import answer, embeddings, openai, tools
from .answer import Outcome, Stream, check_context
from .connections import DROPPED
from .engine import Engine
from .openai import ApiError

log = logging.getLogger("frink.serve")


@dataclass
class ServerState:
    model: Any  # api.Model
    engine: Engine
    model_id: str
    names: frozenset[str]  # the model names a request may ask for
    api_key: str | None = None
    max_body: int = 8 << 20
    # Browser origins allowed to call (--cors-origins; "*": any). Others get a 403.
    cors_origins: frozenset[str] = frozenset()
    # Bound to a loopback address: only Host headers naming this machine are answered.
    loopback: bool = True
    bound_host: str = "127.0.0.1"
    # Control tokens written in message content and prompts act as control tokens
    # (--parse-special); otherwise they are text, as any other characters.
    parse_special: bool = False
    log_line: Callable[[str], None] = field(
        default=lambda line: print(line, file=sys.stderr, flush=True)
    )


def create_app(
    state: ServerState, on_startup: Callable[[asyncio.AbstractEventLoop], None] | None = None
) -> ASGIApp:
    """The server's ASGI app; on_startup is called with the event loop once it runs."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if on_startup is not None:
            on_startup(asyncio.get_running_loop())
        worker = threading.Thread(target=state.engine.run, name="frink-engine", daemon=True)
        worker.start()
        try:
            yield
        finally:
            state.engine.stop()
            await run_in_threadpool(worker.join, 10.0)

    routes = []
    for prefix in ("/v1", ""):
        routes += [
            Route(f"{prefix}/chat/completions", _endpoint(state, _chat), methods=["POST"]),
            Route(f"{prefix}/completions", _endpoint(state, _complete), methods=["POST"]),
            Route(f"{prefix}/models", _endpoint(state, _models), methods=["GET"]),
        ]
    routes += embeddings.routes(
        lambda handler: _endpoint(state, handler),
        lambda st, request, chat: _body(st, request, chat, generates=False),
    )
    routes.append(Route("/health", _endpoint(state, _health, public=True), methods=["GET"]))

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        message = {404: "no such route", 405: "method not allowed"}.get(status, "HTTP error")
        path = printable(request.url.path)[:200]
        state.log_line(f"{_client(request)} {request.method} {path} {status}")
        return _error(ApiError(status, f"{message}: {request.method} {path}", code=str(status)))

    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )
    # "/v1/models/" would otherwise redirect to a URL built from the Host header.
    app.router.redirect_slashes = False
    return _Gate(app, state)


# Host names that are this machine whatever the bound address (the port is not compared).
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_HTTP_VERSIONS = ("1.0", "1.1")


class _Gate:
    """The checks every request passes before any route: HTTP version, Host, Origin; and
    CORS headers on the answers to allowed origins."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        refusal = self._refusal(scope, headers, origin)
        if refusal is not None:
            request = Request(scope)
            self.state.log_line(
                f"{_client(request)} {printable(scope['method'])[:20]} "
                f"{printable(scope['path'])[:200]} {refusal.status} {printable(refusal.message)}"
            )
            await _error(refusal)(scope, receive, send)
            return
        if origin is None:
            await self.app(scope, receive, send)
            return
        cors = [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"vary", b"Origin"),
        ]
        if scope["method"] == "OPTIONS":  # a browser's preflight for an allowed origin
            await Response(
                status_code=204,
                headers={
                    "access-control-allow-origin": origin,
                    "access-control-allow-methods": "GET, POST, OPTIONS",
                    "access-control-allow-headers": "Authorization, Content-Type",
                    "access-control-max-age": "600",
                    "vary": "Origin",
                },
            )(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _refusal(
        self, scope: Scope, headers: dict[str, str], origin: str | None
    ) -> ApiError | None:
        version = scope.get("http_version", "1.1")
        if version not in _HTTP_VERSIONS:
            return ApiError(
                505,
                f"HTTP/{printable(version)[:10]} is not supported (HTTP/1.1 is)",
                code="http_version_not_supported",
            )
        if self.state.loopback and not self._host_allowed(headers.get("host")):
            return ApiError(
                403,
                f"Host {printable(headers.get('host', ''))[:100]!r} is not this machine: a "
                "server bound to a loopback address answers only its own names "
                "(frink serve --host to listen elsewhere)",
                kind="permission_error",
                code="host_not_allowed",
            )
        allowed = self.state.cors_origins
        if origin is not None and "*" not in allowed and origin not in allowed:
            return ApiError(
                403,
                f"Origin {printable(origin)[:100]!r} is not allowed (frink serve "
                "--cors-origins lists the web origins that may call this server)",
                kind="permission_error",
                code="origin_not_allowed",
            )
        return None

    def _host_allowed(self, host: str | None) -> bool:
        if host is None:  # HTTP/1.0 may leave it out; no browser does
            return True
        if host.startswith("["):
            name = host[1 : host.find("]")] if "]" in host else ""
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        name = name.lower().rstrip(".")
        if name in _LOOPBACK_NAMES or name == self.state.bound_host.strip("[]").lower():
            return True
        if name.endswith(".localhost"):
            return True
        parts = name.split(".")
        return len(parts) == 4 and parts[0] == "127" and all(p.isdigit() for p in parts)


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "-"


def _error(e: ApiError) -> JSONResponse:
    headers = {}
    if e.status == 503:
        headers["Retry-After"] = "1"
    if e.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="frink"'
    if e.status in (408, 505):
        headers["Connection"] = "close"
    return JSONResponse(e.body(), status_code=e.status, headers=headers or None)


def _endpoint(state: ServerState, handler: Callable, public: bool = False) -> Callable:
    async def call(request: Request) -> Response:
        t0 = time.perf_counter()
        outcome = Outcome()
        try:
            if not public:
                _check_key(state, request)
            response = await handler(state, request, outcome)
        except ApiError as e:
            response = _error(e)
            outcome.detail = printable(e.message)[:200]
        except ClientDisconnect:  # gone mid-upload, or dropped by connections.py
            dropped = request.scope.get("state", {}).get(DROPPED)
            response = Response(status_code=408 if dropped else 499)
            outcome.detail = dropped or "client disconnected"
        except Exception as e:  # noqa: BLE001 - a handler bug answers 500, the server lives
            log.exception("request failed")
            response = _error(
                ApiError(500, f"internal error: {type(e).__name__}", kind="server_error")
            )
            outcome.detail = printable(f"{type(e).__name__}: {e}")[:200]
        if isinstance(response, Stream):
            response.on_close = lambda: _log(state, request, 200, t0, outcome)
        else:
            _log(state, request, response.status_code, t0, outcome)
        return response

    return call


def _log(state: ServerState, request: Request, status: int, t0: float, o: Outcome) -> None:
    path = printable(request.url.path)[:200]
    line = f"{_client(request)} {request.method} {path} {status} {time.perf_counter() - t0:.2f}s"
    state.log_line(line + (f" {o.detail}" if o.detail else ""))


def _check_key(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        key.strip().encode(), state.api_key.encode()
    ):
        raise ApiError(
            401,
            "a valid API key is required (Authorization: Bearer KEY)",
            kind="authentication_error",
            code="invalid_api_key",
        )


# Bodies larger than this are parsed off the event loop.
_PARSE_INLINE_BYTES = 64 << 10


async def _body(state: ServerState, request: Request, chat: bool, generates: bool = True) -> dict:
    """The JSON object a request sent, read at most max_body bytes, checked as
    openai.parse_body checks it, fields frink cannot honour refused by name, and the
    model it names checked (and, for a route that generates, that the model can)."""
    too_big = ApiError(
        413, f"request body exceeds {state.max_body} bytes", code="request_too_large"
    )
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > state.max_body:
        raise too_big
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > state.max_body:
            raise too_big
    if len(data) > _PARSE_INLINE_BYTES:
        body = await run_in_threadpool(openai.parse_body, bytes(data))
    else:
        body = openai.parse_body(bytes(data))
    openai.refuse_unsupported(body, chat)
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or model not in state.names):
        raise ApiError(
            404,
            f"model {printable(str(model))[:100]!r} is not served here (this server has "
            f"{state.model_id!r})",
            code="model_not_found",
            param="model",
        )
    if generates and state.model.config.ext.embeds_only():
        raise ApiError(400, "this model only embeds: use /v1/embeddings", param="model")
    return body


async def _health(state: ServerState, request: Request, o: Outcome) -> Response:
    e = state.engine
    return JSONResponse(
        {
            "status": "ok",
            "slots_processing": e.busy,
            "slots_idle": len(e.slots) - e.busy,
            "requests_waiting": e.waiting,
        }
    )


async def _models(state: ServerState, request: Request, o: Outcome) -> Response:
    m = {"id": state.model_id, "object": "model", "created": 0, "owned_by": "frink"}
    return JSONResponse({"object": "list", "data": [m]})


async def _chat(state: ServerState, request: Request, o: Outcome) -> Response:
    body = await _body(state, request, chat=True)
    gen = openai.generation(body, vocab=state.model.n_vocab)
    msgs = openai.messages(body)
    tok = state.model.tokenizer
    plan = tools.tool_plan(body, tok)
    grammar = tools.output_grammar(body)
    triggers: tuple[str, ...] = ()
    if plan is not None and not plan.calls:
        gen = dataclasses.replace(gen, params=plan.without_calls(gen.params, tok))
    elif plan is not None:
        if grammar is not None:
            raise openai.bad(grammar.field.split(".")[0], "cannot be combined with tools")
        grammar, triggers = plan.grammar(tok)
    msgs = tools.conversation(body, msgs)
    if plan is not None:
        msgs = plan.messages(msgs)
    offered = plan.template_tools() if plan is not None else None
    n_ctx = state.engine.n_ctx
    # chat_ids refuses text that cannot fit n_ctx before rendering or tokenizing it.
    ids = await _tokenize(
        state,
        lambda: chat_ids(
            tok, msgs, notes=[], n_ctx=n_ctx, parse_special=state.parse_special, tools=offered
        ),
    )
    constraints = await _constraints(state, grammar, triggers, gen.n)
    return await answer.generate(
        state.engine,
        state.model_id,
        tok,
        request,
        o,
        ids,
        gen,
        chat=True,
        constraints=constraints,
        parsers=None if plan is None or not plan.calls else [plan.parser() for _ in range(gen.n)],
        spell=plan.spelled(tok) if plan is not None else frozenset(),
    )


async def _constraints(
    state: ServerState, grammar: Grammar | None, triggers: tuple[str, ...], n: int
) -> list[Constraint] | None:
    """n constraints for `grammar` (one per choice), compiled off the event loop."""
    if grammar is None:
        return None
    tok = state.model.tokenizer
    if tok is None:
        raise openai.bad(grammar.field, "needs a model with a tokenizer")
    try:
        return await run_in_threadpool(compile_constraint, tok, grammar, triggers, n)
    except GrammarError as e:
        raise openai.bad(e.field, e.detail) from None


async def _complete(state: ServerState, request: Request, o: Outcome) -> Response:
    body = await _body(state, request, chat=False)
    # (16: the API's documented default)
    gen = openai.generation(body, default_max_tokens=16, chat=False, vocab=state.model.n_vocab)
    prompt = openai.completion_prompt(body)
    tok = state.model.tokenizer
    n_ctx = state.engine.n_ctx
    if isinstance(prompt, str):
        if tok is not None:
            try:
                check_fits(tok, len(prompt), n_ctx)  # before any tokenizing
            except FrinkError as e:
                raise ApiError(400, str(e), code="context_length_exceeded") from None
        parse = state.parse_special
        ids = await _tokenize(state, lambda: tok.encode(prompt, parse_special=parse))
    else:
        check_context(len(prompt), n_ctx)
        n_vocab = state.model.n_vocab
        if not all(0 <= t < n_vocab for t in prompt):
            raise openai.bad("prompt", f"token ids must be in [0, {n_vocab})")
        ids = prompt
    constraints = await _constraints(state, tools.output_grammar(body), (), gen.n)
    return await answer.generate(
        state.engine, state.model_id, tok, request, o, ids, gen, False, constraints
    )


async def _tokenize(state: ServerState, make: Callable[[], list[int]]) -> list[int]:
    if state.model.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: send token ids to /v1/completions")
    try:
        return await run_in_threadpool(make)
    except FrinkError as e:  # a prompt too long to tokenize, a template that failed
        raise ApiError(400, str(e), code="invalid_prompt") from None
