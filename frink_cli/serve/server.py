"""Running `frink serve`: the engine and app for a loaded model, on uvicorn.

The socket is bound here, before uvicorn starts, so a port in use is one clean error line
(and port 0 picks a free one, reported in the "listening" line). SIGINT and SIGTERM stop
the server gracefully: uvicorn finishes what it is sending, the engine ends every job
still running with an error event, and the command then exits 0 rather than re-raising
the signal.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from ..errors import FrinkError
from .app import ServerState, create_app
from .engine import Engine


def model_names(model: Any, alias: str | None) -> tuple[str, frozenset[str]]:
    """The id /v1/models reports, and every name a request may use for it."""
    path = Path(str(model.checkpoint.path))
    model_id = alias or path.stem or path.name
    return model_id, frozenset({model_id, path.name, path.stem, str(path)})


def bind(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        raise FrinkError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    except (OverflowError, TypeError) as e:
        raise FrinkError(f"cannot listen on {host}:{port}: {e}") from None
    return sock


def serve(
    model: Any,
    *,
    host: str,
    port: int,
    n_parallel: int,
    n_ctx: int,
    api_key: str | None,
    alias: str | None,
    prefill_chunk: int,
    max_queue: int,
    max_body: int,
    announce: Any,
) -> None:
    import uvicorn

    engine = Engine(
        model.decoder,
        model.tokenizer,
        n_parallel=n_parallel,
        n_ctx=n_ctx,
        prefill_chunk=prefill_chunk,
        max_queue=max_queue,
    )
    model_id, names = model_names(model, alias)
    state = ServerState(model, engine, model_id, names, api_key=api_key, max_body=max_body)
    sock = bind(host, port)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            # Streams in flight end now (an error event, then [DONE]) rather than run on
            # while uvicorn waits for their connections to close.
            engine.stop()
            # uvicorn re-raises a captured signal once it has shut down; the shutdown
            # was the signal's whole purpose, so frink exits normally instead.
            self._captured_signals.clear()

    config = uvicorn.Config(
        create_app(state),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        lifespan="on",
    )
    where = sock.getsockname()
    announce(
        f"listening on http://{host}:{where[1]} (model {model_id}, {n_parallel} parallel "
        f"sequences of {n_ctx} tokens, backend {model.backend_name})"
    )
    _Server(config).run(sockets=[sock])
