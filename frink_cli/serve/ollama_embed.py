"""Ollama's embedding routes: POST /api/embed and the older POST /api/embeddings.

/api/embed takes `input`, a string or a list of strings (at most embeddings.MAX_INPUTS),
`truncate` (default true: an input longer than the model takes is cut; false refuses it),
`dimensions` (the first n values), and `options` / `keep_alive` (accepted, nothing to
change here). It answers {model, embeddings, total_duration, load_duration,
prompt_eval_count} with every vector L2-normalized, as Ollama's does; an empty input
answers no vectors. /api/embeddings takes `prompt`, one string, and answers {embedding},
the model's own vector (not renormalized), an empty prompt an empty one. Both run through
embeddings.embed, so a vector is the one /v1/embeddings gives. Bad fields are 400s naming
the field (ollama.py writes them in Ollama's error shape).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from ..embedding import normalized
from . import embeddings
from .ollama_fields import flag
from .openai import _show, bad

if TYPE_CHECKING:
    from .app import ServerState


async def embed(state: ServerState, body: dict) -> Response:
    """/api/embed's answer to a body whose model was checked."""
    t0 = time.perf_counter()
    value = body.get("input", [])
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise bad("input", f"must be a string or a list of strings (got {_show(value)})")
    if len(texts) > embeddings.MAX_INPUTS:
        raise bad("input", f"holds {len(texts)} inputs; at most {embeddings.MAX_INPUTS}")
    truncate = flag(body, "truncate", default=True)
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise bad("dimensions", "must be a positive integer")
    _check_options(body)
    head = {"model": state.model_id}
    if texts in ([], [""]):
        return JSONResponse({**head, "embeddings": []})
    if not all(texts):
        raise bad("input", "holds an empty string")
    vectors, n_tokens = await run_in_threadpool(
        embeddings.embed, state, texts, None, truncate, dims
    )
    return JSONResponse(
        {
            **head,
            "embeddings": normalized(vectors).tolist(),
            "total_duration": int((time.perf_counter() - t0) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": n_tokens,
        }
    )


async def embeddings_legacy(state: ServerState, body: dict) -> Response:
    """/api/embeddings' answer to a body whose model was checked."""
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise bad("prompt", f"must be a string (got {_show(prompt)})")
    _check_options(body)
    if not prompt:
        return JSONResponse({"embedding": []})
    vectors, _ = await run_in_threadpool(embeddings.embed, state, [prompt], None, True)
    return JSONResponse({"embedding": vectors[0].tolist()})


def _check_options(body: dict) -> None:
    options = body.get("options", {})
    if not isinstance(options, dict):
        raise bad("options", f"must be an object (got {_show(options)})")
