"""LoRA adapters over HTTP, as llama-server has them: GET /lora-adapters lists the model's
adapters ([{"id", "path", "scale"}]); POST /lora-adapters ([{"id", "scale"}]) sets their
global scales, an adapter left out at 0; a generation request's `lora` field (the same
list) scales them for that request alone (left out: 0; absent or empty: the global
scales). The engine fixes a job's scales when it is admitted (serve/engine.py), so a
POST changes the requests admitted after it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .answer import Outcome
from .openai import ApiError, bad

if TYPE_CHECKING:  # only for hints: app.py imports this module
    from .app import ServerState

# A list of (id, scale) pairs: far below any real body limit.
_MAX_BODY = 1 << 16


def parse_scales(value: Any, n_adapters: int, field: str = "lora") -> dict[int, float]:
    """[{"id": i, "scale": s}, ...] as {i: s}: ids of the model's adapters, finite scales
    (a 400 naming `field` otherwise)."""
    if not isinstance(value, list):
        raise bad(field, "must be an array of objects with id and scale")
    out: dict[int, float] = {}
    for entry in value:
        if not isinstance(entry, dict):
            raise bad(field, "must be an array of objects with id and scale")
        i, s = entry.get("id"), entry.get("scale", 0.0)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_adapters:
            raise bad(field, f"id must be an adapter id in [0, {n_adapters}) (got {i!r})"[:200])
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            raise bad(field, f"scale must be a finite number (got {s!r})"[:200])
        out[i] = float(s)
    return out


def request_scales(body: dict, n_adapters: int) -> dict[int, float] | None:
    """A generation request's `lora`: its scales, or None (the global ones) where it is
    absent or empty."""
    value = body.get("lora")
    if value is None or value == []:
        return None
    return parse_scales(value, n_adapters)


def routes(state: ServerState, endpoint: Callable[..., Callable]) -> list[Route]:
    """GET and POST /lora-adapters; `endpoint` wraps each handler as app.py wraps every
    route (API key, log, errors)."""

    async def listed(state: ServerState, request: Request, o: Outcome) -> Response:
        adapters = state.model.lora
        return JSONResponse(
            [{"id": i, "path": ad.path, "scale": ad.scale} for i, ad in enumerate(adapters)]
        )

    async def set_scales(state: ServerState, request: Request, o: Outcome) -> Response:
        raw = await request.body()
        if len(raw) > _MAX_BODY:
            raise ApiError(413, f"request body over {_MAX_BODY} bytes")
        try:
            data = json.loads(raw)
        except ValueError:
            raise ApiError(400, "the request body is not JSON") from None
        if not isinstance(data, list):
            raise ApiError(400, "Request body must be an array")
        adapters = state.model.lora
        scales = parse_scales(data, len(adapters), "body")
        for i, ad in enumerate(adapters):
            ad.scale = scales.get(i, 0.0)
        return JSONResponse({"success": True})

    return [
        Route("/lora-adapters", endpoint(state, listed), methods=["GET"]),
        Route("/lora-adapters", endpoint(state, set_scales), methods=["POST"]),
    ]
