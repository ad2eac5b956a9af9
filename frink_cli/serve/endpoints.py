"""The HTTP plumbing every route of `frink serve` shares, whatever API it speaks: the
endpoint wrapper (key check, error shaping, the request's log line), the API key check,
and reading a request's JSON body within the size limit.

An API answers errors in its own shape: an endpoint takes a `shape` (ApiError -> the
response); the OpenAI shape is the default, and the same status headers go with every
shape (Retry-After on a 503, WWW-Authenticate on a 401, Connection: close on a 408/505).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ..errors import printable
from . import openai
from .answer import Outcome, Stream
from .connections import DROPPED
from .openai import ApiError

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("frink.serve")

# An ApiError -> the response an API answers it with.
Shape = Callable[[ApiError], Response]

# Bodies larger than this are parsed off the event loop.
_PARSE_INLINE_BYTES = 64 << 10


def client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "-"


def error_headers(status: int) -> dict[str, str] | None:
    """The headers an error of this status carries, whatever its body's shape."""
    headers = {}
    if status == 503:
        headers["Retry-After"] = "1"
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="frink"'
    if status in (408, 505):
        headers["Connection"] = "close"
    return headers or None


def openai_error(e: ApiError) -> JSONResponse:
    """An error in OpenAI's shape."""
    return JSONResponse(e.body(), status_code=e.status, headers=error_headers(e.status))


def endpoint(
    state: ServerState, handler: Callable, public: bool = False, shape: Shape = openai_error
) -> Callable:
    """handler(state, request, outcome) as a route: the key checked (unless `public`),
    an ApiError answered in `shape`, a handler's own bug a 500 for this request alone,
    and one log line per request (a stream's once it ends)."""

    async def call(request: Request) -> Response:
        t0 = time.perf_counter()
        outcome = Outcome()
        try:
            if not public:
                check_key(state, request)
            response = await handler(state, request, outcome)
        except ApiError as e:
            response = shape(e)
            outcome.detail = printable(e.message)[:200]
        except ClientDisconnect:  # gone mid-upload, or dropped by connections.py
            dropped = request.scope.get("state", {}).get(DROPPED)
            response = Response(status_code=408 if dropped else 499)
            outcome.detail = dropped or "client disconnected"
        except Exception as e:  # noqa: BLE001 - a handler bug answers 500, the server lives
            log.exception("request failed")
            response = shape(
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
    line = f"{client(request)} {request.method} {path} {status} {time.perf_counter() - t0:.2f}s"
    state.log_line(line + (f" {o.detail}" if o.detail else ""))


def check_key(state: ServerState, request: Request) -> None:
    """A 401 unless the request carries the server's key (--api-key), as
    `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY` (Anthropic's)."""
    if state.api_key is None:
        return
    expected = state.api_key.encode()
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), expected):
        return
    header = request.headers.get("x-api-key")
    if header is not None and hmac.compare_digest(header.strip().encode(), expected):
        return
    raise ApiError(
        401,
        "a valid API key is required (Authorization: Bearer KEY)",
        kind="authentication_error",
        code="invalid_api_key",
    )


async def read_body(state: ServerState, request: Request) -> dict:
    """The JSON object a request sent, read at most max_body bytes (413 past it), checked
    as openai.parse_body checks it (valid Unicode, nulls dropped)."""
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
        return await run_in_threadpool(openai.parse_body, bytes(data))
    return openai.parse_body(bytes(data))


def check_model(state: ServerState, body: dict) -> None:
    """A 404 unless the body's `model` (when given) is one this server serves."""
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or model not in state.names):
        raise ApiError(
            404,
            f"model {printable(str(model))[:100]!r} is not served here (this server has "
            f"{state.model_id!r})",
            code="model_not_found",
            param="model",
        )


def check_generates(state: ServerState) -> None:
    """A 400 when the served model only embeds (an encoder): it cannot answer a route that
    generates."""
    if state.model.config.ext.embeds_only():
        raise ApiError(400, "this model only embeds: use /v1/embeddings", param="model")
