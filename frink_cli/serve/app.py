"""The HTTP face of `frink serve`: an OpenAI-compatible API over the engine, on Starlette.

Routes: POST /v1/chat/completions and /v1/completions (streamed as server-sent events or
whole), GET /v1/models and /health; the same without /v1, as llama-server accepts them;
and Anthropic's POST /v1/messages and /v1/messages/count_tokens (anthropic.py), Ollama's
/api/* (ollama.py) and /metrics (metrics.py); another API's routes answer in its own error
shape. Every other failure is an OpenAI-shaped JSON error with its status (400 bad field,
401 key with WWW-Authenticate, 403 host or origin, 404 model or route, 408 a request too
slow to arrive, 413 body, 503 queue full or shutting down, with Retry-After, 505 an HTTP
version other than 1.0 and 1.1), and nothing a request sends can stop the server: a
handler's own bug is a 500 for that request alone.

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
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import printable
from . import answer, anthropic, embeddings, lora, metrics, ollama, openai, prepare, tools
from .answer import Outcome, check_context
from .endpoints import check_generates, check_model, client, endpoint, openai_error, read_body
from .engine import Engine
from .openai import ApiError


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
            Route(f"{prefix}/chat/completions", endpoint(state, _chat), methods=["POST"]),
            Route(f"{prefix}/completions", endpoint(state, _complete), methods=["POST"]),
            Route(f"{prefix}/models", endpoint(state, _models), methods=["GET"]),
        ]
    routes.append(Route("/health", endpoint(state, _health, public=True), methods=["GET"]))
    routes += anthropic.routes(state)
    routes += ollama.routes(state, endpoint)
    routes += metrics.routes(state, endpoint)
    routes += lora.routes(state, endpoint)
    routes += embeddings.routes(
        lambda handler: endpoint(state, handler),
        lambda st, request, chat: _body(st, request, chat, generates=False),
    )

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        message = {404: "no such route", 405: "method not allowed"}.get(status, "HTTP error")
        path = printable(request.url.path)[:200]
        state.log_line(f"{client(request)} {request.method} {path} {status}")
        return openai_error(
            ApiError(status, f"{message}: {request.method} {path}", code=str(status))
        )

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
                f"{client(request)} {printable(scope['method'])[:20]} "
                f"{printable(scope['path'])[:200]} {refusal.status} {printable(refusal.message)}"
            )
            await openai_error(refusal)(scope, receive, send)
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
                    "access-control-allow-headers": "Authorization, Content-Type, X-Api-Key, "
                    "Anthropic-Version",
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


async def _body(state: ServerState, request: Request, chat: bool, generates: bool = True) -> dict:
    """The JSON object a request sent (endpoints.read_body), fields frink cannot honour
    refused by name, and the model it names checked (and, for a route that generates,
    that the model can)."""
    body = await read_body(state, request)
    openai.refuse_unsupported(body, chat)
    check_model(state, body)
    if generates:
        check_generates(state)
    return body


async def _health(state: ServerState, request: Request, o: Outcome) -> Response:
    e = state.engine
    return JSONResponse(
        {
            "status": "ok",
            "slots_processing": e.busy,
            "slots_idle": len(e.slots) - e.busy,
            "slots_total": len(e.slots),
            "requests_waiting": e.waiting,
        }
    )


async def _models(state: ServerState, request: Request, o: Outcome) -> Response:
    m = {"id": state.model_id, "object": "model", "created": 0, "owned_by": "frink"}
    return JSONResponse({"object": "list", "data": [m]})


async def _chat(state: ServerState, request: Request, o: Outcome) -> Response:
    body = await _body(state, request, chat=True)
    gen = openai.generation(body, vocab=state.model.n_vocab)
    gen = replace(gen, lora=lora.request_scales(body, len(state.model.lora)))
    job = await prepare.openai_chat_job(state, body, gen)
    return await answer.generate(
        state.engine,
        state.model_id,
        state.model.tokenizer,
        request,
        o,
        job.ids,
        job.gen,
        chat=True,
        constraints=job.constraints,
        parsers=job.parsers,
        spell=job.spell,
    )


async def _complete(state: ServerState, request: Request, o: Outcome) -> Response:
    body = await _body(state, request, chat=False)
    # (16: the API's documented default)
    gen = openai.generation(body, default_max_tokens=16, chat=False, vocab=state.model.n_vocab)
    gen = replace(gen, lora=lora.request_scales(body, len(state.model.lora)))
    prompt = openai.completion_prompt(body)
    tok = state.model.tokenizer
    n_ctx = state.engine.n_ctx
    if isinstance(prompt, str):
        ids = await prepare.tokenize_text(state, prompt)
    else:
        check_context(len(prompt), n_ctx)
        n_vocab = state.model.n_vocab
        if not all(0 <= t < n_vocab for t in prompt):
            raise openai.bad("prompt", f"token ids must be in [0, {n_vocab})")
        ids = prompt
    constraints = await prepare.constraints(state, tools.output_grammar(body), (), gen.n)
    return await answer.generate(
        state.engine, state.model_id, tok, request, o, ids, gen, False, constraints
    )
