"""POST /v1/embeddings (and /embeddings) in OpenAI's shape.

Request: `input` a string, a list of strings, a list of token ids or a list of such lists
(at most MAX_INPUTS inputs, none empty); `encoding_format` "float" (default) or "base64"
(the little-endian float32 bytes); `dimensions`, a Matryoshka cut: the first n values,
renormalized to unit length; `model` and `user` as OpenAI takes them; and, frink's (and
text-embeddings-inference's) extra, `truncate`: cut an input longer than the model takes
instead of refusing it. Every bad request is a 400 in OpenAI's error shape naming its
field. The model runs off the event loop, one request at a time (Model.embed batches the
request's inputs in one forward).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..embedding import normalized
from ..errors import FrinkError
from .openai import ApiError, bad

# OpenAI's own bound on the inputs of one request.
MAX_INPUTS = 2048
FORMATS = ("float", "base64")
_FIELDS = frozenset({"input", "model", "encoding_format", "dimensions", "user", "truncate"})

# One embedding forward at a time in this process (every route's, whatever API).
_LOCK = threading.Lock()

Handler = Callable[[Any, Request, Any], Awaitable[Response]]
BodyReader = Callable[[Any, Request, bool], Awaitable[dict]]


@dataclass(frozen=True)
class EmbeddingRequest:
    """A checked request: texts or token id lists (one kind), and how to answer."""

    texts: list[str] | None
    ids: list[list[int]] | None
    encoding_format: str
    dimensions: int | None
    truncate: bool


def routes(endpoint: Callable[[Handler], Any], read_body: BodyReader) -> list[Route]:
    """The routes, each handler wrapped by `endpoint` (the app's key check, errors and
    log) and reading its body with `read_body` (the app's size limit, JSON and model
    checks)."""

    async def handler(state: Any, request: Request, outcome: Any) -> Response:
        body = await read_body(state, request, True)
        req = parse(body, state.model.n_vocab)
        return await run_in_threadpool(answer, state, req)

    return [
        Route(f"{prefix}/embeddings", endpoint(handler), methods=["POST"]) for prefix in ("/v1", "")
    ]


def parse(body: dict, n_vocab: int) -> EmbeddingRequest:
    """The body's fields checked (400s naming the field) -> an EmbeddingRequest."""
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise bad(unknown[0], "is not a field of an embeddings request")
    if "input" not in body:
        raise bad("input", "is required")
    texts, ids = _inputs(body["input"], n_vocab)
    fmt = body.get("encoding_format", "float")
    if fmt not in FORMATS:
        raise bad("encoding_format", f"must be one of {', '.join(FORMATS)}")
    dims = body.get("dimensions")
    if dims is not None and (not _is_int(dims) or dims < 1):
        raise bad("dimensions", "must be a positive integer")
    if "user" in body and not isinstance(body["user"], str):
        raise bad("user", "must be a string")
    truncate = body.get("truncate", False)
    if not isinstance(truncate, bool):
        raise bad("truncate", "must be true or false")
    return EmbeddingRequest(texts, ids, fmt, dims, truncate)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _inputs(value: Any, n_vocab: int) -> tuple[list[str] | None, list[list[int]] | None]:
    """`input` as texts or as token id lists (exactly one of the two is not None)."""
    if isinstance(value, str):
        return [value], None
    if not isinstance(value, list) or not value:
        raise bad("input", "must be a string, a non-empty list of strings or of token ids")
    if len(value) > MAX_INPUTS:
        raise bad("input", f"holds {len(value)} inputs; at most {MAX_INPUTS} are taken")
    if all(isinstance(v, str) for v in value):
        return list(value), None
    if all(_is_int(v) for v in value):
        return None, [_token_ids(value, n_vocab)]
    if all(isinstance(v, list) for v in value):
        return None, [_token_ids(v, n_vocab) for v in value]
    raise bad("input", "must hold strings, or token ids, or lists of token ids (not a mix)")


def _token_ids(ids: list, n_vocab: int) -> list[int]:
    if not ids:
        raise bad("input", "holds an empty list of token ids")
    if not all(_is_int(i) and 0 <= i < n_vocab for i in ids):
        raise bad("input", f"token ids must be integers in [0, {n_vocab})")
    return list(ids)


def embed(
    state: Any,
    texts: list[str] | None,
    ids: list[list[int]] | None,
    truncate: bool,
    dimensions: int | None = None,
) -> tuple[np.ndarray, int]:
    """The served model's vectors of `texts` (or of token id lists `ids`), one row each,
    and the tokens they took. Runs the model (call it off the event loop). `dimensions`:
    the first n values renormalized; a 400 naming `input` or `dimensions` when the model
    cannot take an input or n exceeds its width."""
    model = state.model
    try:
        with _LOCK:
            seqs = [model.embed_tokens(t, truncate) for t in texts] if texts is not None else ids
            assert seqs is not None
            vectors = model.embed_ids(seqs, truncate)
    except FrinkError as e:
        raise ApiError(400, str(e), param="input", code="invalid_input") from None
    if dimensions is not None:
        if dimensions > vectors.shape[1]:
            raise bad("dimensions", f"must be at most the model's {vectors.shape[1]}")
        vectors = normalized(vectors[:, :dimensions])
    return vectors, sum(len(s) for s in seqs)


def answer(state: Any, req: EmbeddingRequest) -> Response:
    """Run the model over the request's inputs -> OpenAI's embeddings response."""
    vectors, n_tokens = embed(state, req.texts, req.ids, req.truncate, req.dimensions)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(v, req.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": state.model_id,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }
    )


def _encoded(v: np.ndarray, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return v.tolist()
