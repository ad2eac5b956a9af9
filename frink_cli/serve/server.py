"""Running `frink serve`: the engine and app for a loaded model, on uvicorn.

The socket is bound here, before uvicorn starts, so a port in use is one clean error line
(and port 0 picks a free one, reported in the "listening" line). SIGINT and SIGTERM stop
the server gracefully: uvicorn finishes what it is sending, the engine ends every job
still running with an error event, and the command then exits 0 rather than re-raising
the signal.

SIGPIPE is ignored while serving: `frink` restores its default action for `frink run |
head`, and under it one write to a client that has gone (a reset connection) would kill
the process. Ignored, the write fails with EPIPE and only that connection closes.
Deadlines and the connection limit are connections.py's.
"""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import FrinkError
from .app import ServerState, create_app
from .connections import limits_for, protocol_class, quiet_accept_errors
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
    timeout: float = 60.0,
    max_connections: int = 256,
    cors_origins: frozenset[str] = frozenset(),
    parse_special: bool = False,
    kv_pool: int = 0,
    kv_slots: bool = False,
) -> None:
    import uvicorn

    spec = model.speculation[0] if model.speculation is not None else None
    engine = Engine(
        model.decoder,
        model.tokenizer,
        n_parallel=n_parallel,
        n_ctx=n_ctx,
        prefill_chunk=prefill_chunk,
        max_queue=max_queue,
        drafter=model.drafter if spec is not None else None,
        spec=spec,
        kv_pool=kv_pool,
        paged=not kv_slots,
    )

    model_id, names = model_names(model, alias)
    sock = bind(host, port)
    state = ServerState(
        model,
        engine,
        model_id,
        names,
        api_key=api_key,
        max_body=max_body,
        cors_origins=cors_origins,
        loopback=is_loopback(host),
        bound_host=host,
        parse_special=parse_special,
    )
    limits = limits_for(timeout, max_connections)

    config = uvicorn.Config(
        create_app(state, on_startup=lambda loop: quiet_accept_errors(loop, state.log_line)),
        http=protocol_class(limits, state.log_line),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=limits.keep_alive,  # type: ignore[arg-type]
        backlog=limits.accept_batch,
        lifespan="on",
    )
    port_bound = sock.getsockname()[1]
    announce(
        f"listening on http://{host}:{port_bound} (model {model_id}, {n_parallel} parallel "
        f"sequences of {n_ctx} tokens, backend {model.backend_name})"
    )
    announce(_kv_line(engine))
    with _sigpipe_ignored():
        _uvicorn_server(config, engine).run(sockets=[sock])


def _uvicorn_server(config: Any, engine: Engine) -> Any:
    """uvicorn's server for `config`, stopping `engine` on the signal that ends it."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            # Streams in flight end now (an error event, then [DONE]) rather than run on
            # while uvicorn waits for their connections to close.
            engine.stop()
            # uvicorn re-raises a captured signal once it has shut down; the shutdown
            # was the signal's whole purpose, so frink exits normally instead.
            self._captured_signals.clear()

    return _Server(config)


def _kv_line(engine: Engine) -> str:
    """The start-up line on how the engine holds its sequences' KV rows."""
    if engine.pages is not None:
        return engine.pages.describe()
    return f"KV cache per slot, not paged: {engine.paging_refusal}"


@contextlib.contextmanager
def _sigpipe_ignored() -> Iterator[None]:
    if not hasattr(signal, "SIGPIPE"):
        yield
        return
    before = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGPIPE, before)


def is_loopback(host: str) -> bool:
    """Whether `host` (a --host value) names only this machine: localhost or a loopback
    address."""
    import ipaddress

    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
