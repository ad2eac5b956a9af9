"""`frink serve`'s own flags (where it listens, who may call it, how requests are bounded),
one flag group (cli_groups) that the command takes as `server: ServerOptions`, checked
once here and handed to serve.server.serve as keyword arguments."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer

from .cli_checks import check_ranges, read_api_key
from .cli_groups import flag_group


@dataclass(frozen=True)
class ServerOptions:
    """The flags as serve.server.serve's keyword arguments of the same names."""

    host: str
    port: int
    api_key: str | None
    alias: str | None
    prefill_chunk: int
    max_queue: int
    max_body: int
    timeout: float
    max_connections: int
    cors_origins: frozenset[str]
    parse_special: bool
    kv_pool: int
    kv_slots: bool

    def kwargs(self) -> dict[str, Any]:
        return asdict(self)


def server_options(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8080, "--port", help="port to listen on (0: any free port)"),
    api_key: str | None = typer.Option(
        None, "--api-key", help="require Authorization: Bearer KEY", envvar="FRINK_API_KEY"
    ),
    api_key_file: Path | None = typer.Option(
        None,
        "--api-key-file",
        help="read the API key from this file's first line (it stays out of `ps`)",
    ),
    alias: str | None = typer.Option(None, "--alias", help="the model name clients see"),
    prefill_chunk: int = typer.Option(
        128, "--prefill-chunk", help="prompt rows fed per step beside the running streams"
    ),
    queue: int = typer.Option(64, "--queue", help="requests waiting at most (then 503)"),
    max_body: int = typer.Option(
        8 << 20, "--max-body", help="largest request body in bytes (then 413)"
    ),
    timeout: float = typer.Option(
        60.0,
        "-to",
        "--timeout",
        help="seconds a client may leave a request body unsent or an answer unread "
        "(then its connection closes); a request head gets min(10, this)",
    ),
    max_connections: int = typer.Option(
        256,
        "--max-connections",
        help="open connections at most (kept below the file-descriptor limit); past it the "
        "longest-idle one is closed",
    ),
    cors_origins: str = typer.Option(
        "",
        "--cors-origins",
        help="comma-separated web origins (https://app.example) whose pages may call this "
        "server ('*': any); other browser requests get a 403",
    ),
    parse_special: bool = typer.Option(
        False,
        "--parse-special",
        help="read control tokens written in message content and prompts as control tokens "
        "(llama-server's behaviour: a client's text can then forge chat turns)",
    ),
    kv_pool: int = typer.Option(
        0,
        "--kv-pool",
        help="tokens the paged KV cache holds for all sequences together (0: --parallel x "
        "--ctx-size); requests are admitted by its free pages",
    ),
    kv_slots: bool = typer.Option(
        False, "--kv-slots", help="a whole-context KV cache per slot instead of the paged pool"
    ),
) -> ServerOptions:
    """The flags as ServerOptions; FrinkError (one line, naming the flag) for a value out of
    range, an empty or unreadable API key."""
    check_ranges(
        ("--port", port, 0, 65535),
        ("--prefill-chunk", prefill_chunk, 1, None),
        ("--queue", queue, 0, None),
        ("--max-body", max_body, 1, None),
        ("--timeout", timeout, 0.1, 86400),
        ("--max-connections", max_connections, 1, None),
        ("--kv-pool", kv_pool, 0, None),
    )
    origins = frozenset(o.strip().rstrip("/") for o in cors_origins.split(",") if o.strip())
    key = read_api_key(api_key, api_key_file)
    return ServerOptions(
        host, port, key, alias, prefill_chunk, queue, max_body, timeout, max_connections,
        origins, parse_special, kv_pool, kv_slots,
    )  # fmt: skip


server_flags = flag_group("server", server_options)
