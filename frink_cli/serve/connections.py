"""The connections of `frink serve`: deadlines and a limit that uvicorn does not keep.

Why this exists: uvicorn's HTTP/1.1 protocol (h11) waits for a request head or body as
long as a client likes, and accepts connections until the process runs out of file
descriptors. A handful of idle or trickling clients then holds the server: `/health` stops
answering, asyncio prints "Too many open files" tracebacks, the next write fails. This
protocol (a subclass of uvicorn's own) adds what servers such as nginx keep:

- a head deadline: a request's head must arrive within `header_timeout` of the connection
  opening or of the previous answer's end, however slowly it trickles in (408, closed);
- a body deadline: while a request body is being sent, no gap between its bytes may be
  longer than `timeout` (408, closed), the read timeout llama-server's --timeout sets;
- a write deadline: an answer the client stops reading (the socket's buffer full) for
  `timeout` seconds ends its connection, so its job leaves its slot;
- a connection limit, `max_connections`, below the process's file-descriptor limit: a new
  connection past it closes the connection that has waited longest for its client (idle,
  or trickling a head or body). Only when every connection is busy on the server's side
  (answers being computed) is the newcomer refused, with a 503.

Connections whose requests are being answered are never timed out here: a long generation
is not a stall, and a client that goes away is noticed by the app (its slot is freed).
"""

from __future__ import annotations

import asyncio
import json
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# File descriptors kept back from connections: stdio, the listening socket, the event
# loop's own, the model file and the log, with room to spare.
FD_RESERVE = 32
# A request head should take a client milliseconds; seconds allow for a slow network.
HEADER_TIMEOUT_S = 10.0
# How long a kept-alive connection may sit idle between requests (uvicorn's and
# llama-server's default).
KEEP_ALIVE_S = 5.0


@dataclass(frozen=True)
class Limits:
    """Deadlines (seconds) and the connection limit of one server."""

    timeout: float  # body gaps and write stalls (--timeout)
    max_connections: int  # open connections at most (--max-connections, capped by fds)
    header_timeout: float = HEADER_TIMEOUT_S
    keep_alive: float = KEEP_ALIVE_S
    accept_batch: int = 128  # connections accepted per event-loop turn (the listen backlog)


def fd_budget() -> int:
    """File descriptors this process may open beyond FD_RESERVE (its soft limit's worth)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(int(soft) - FD_RESERVE, 8)


def limits_for(timeout: float, max_connections: int) -> Limits:
    """The server's limits for --timeout and --max-connections, the limit capped so that a
    burst of accepted connections cannot exhaust the file descriptors: asyncio accepts up
    to `accept_batch` connections in one turn before any of them can evict another, and
    may take two such turns before the evicted ones are closed."""
    budget = fd_budget()
    batch = max(4, min(128, budget // 8))
    cap = max(budget - 3 * batch, 4)
    return Limits(
        timeout=timeout,
        max_connections=min(max_connections, cap),
        header_timeout=min(HEADER_TIMEOUT_S, timeout),
        keep_alive=min(KEEP_ALIVE_S, timeout),
        accept_batch=batch,
    )


def _raw_response(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP response written outside h11's state machine (the connection closes
    after it): an OpenAI-shaped error body."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


# The key a connection that was timed out sets in its request's scope["state"], for the
# app's log line.
DROPPED = "frink.dropped"


class _Pool:
    """One server's open connections, its limits, and its refusals' log (at most one line
    a second, through log_line)."""

    def __init__(self, limits: Limits, log_line: Callable[[str], None]) -> None:
        self.limits = limits
        self.log_line = log_line
        self.open: set[Connection] = set()
        self.last_refusal_log = float("-inf")
        self.refused = 0

    def note_refusal(self, now: float) -> None:
        """Count one refused connection; log the count if a second has passed since the
        last line."""
        self.refused += 1
        if now - self.last_refusal_log >= 1.0:
            self.last_refusal_log = now
            self.log_line(
                f"refused {self.refused} connection(s): {self.limits.max_connections} open, all "
                "busy (frink serve --max-connections)"
            )
            self.refused = 0


class Connection(H11Protocol):
    """uvicorn's h11 protocol with the head, body and write deadlines and the connection
    limit of its `pool` (a server's; protocol_class binds one)."""

    pool: _Pool
    _timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None
    _waiting_since = 0.0  # since when the server has been waiting for a request head
    _last_data = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self._last_data = self.loop.time()
        self.pool.open.add(self)
        if len(self.pool.open) > self.pool.limits.max_connections:
            victim = min(
                (c for c in self.pool.open if c is not self and c._waiting_on_client()),
                key=lambda c: c._waited_since(),
                default=None,
            )
            if victim is None:
                self._refuse()
                return
            victim._drop("the server needed its connection for a newer client")
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.open.discard(self)
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_data = self.loop.time()
        super().data_received(data)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = self.loop.time()
        self._arm()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.pool.limits.timeout, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def send_400_response(self, msg: str) -> None:
        # h11 refused bytes after a request head was read (a bad chunk, say) while
        # that request's app runs: its answer must not follow this 400 (h11 would
        # raise in the app's send, a traceback), so the app sees its client gone.
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:  # too late for a 400 on this connection
                self.transport.close()
                return
        try:
            super().send_400_response(msg)
        except h11.LocalProtocolError:
            self.transport.close()

    # --- the connection's state ---------------------------------------------------

    def _waiting_on_client(self) -> bool:
        """Whether the server waits for this client's bytes: a request head (idle or
        partial) or a request body not yet complete."""
        return not self.transport.is_closing() and self.conn.their_state in (
            h11.IDLE,
            h11.SEND_BODY,
        )

    def _waited_since(self) -> float:
        return self._waiting_since if self.conn.their_state is h11.IDLE else self._last_data

    def _deadline(self) -> float | None:
        if not self._waiting_on_client():
            return None
        if self.conn.their_state is h11.IDLE:
            return self._waiting_since + self.pool.limits.header_timeout
        return self._last_data + self.pool.limits.timeout

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self._deadline()
        if deadline is not None:
            self._timer = self.loop.call_at(deadline, self._expire)

    def _cancel_timers(self) -> None:
        for t in (self._timer, self._write_timer):
            if t is not None:
                t.cancel()
        self._timer = self._write_timer = None

    def _expire(self) -> None:
        self._timer = None
        deadline = self._deadline()
        if deadline is None:
            return
        if self.loop.time() < deadline:  # moved on since it was armed
            self._arm()
            return
        what = "request head" if self.conn.their_state is h11.IDLE else "request body"
        seconds = (
            self.pool.limits.header_timeout if what == "request head" else self.pool.limits.timeout
        )
        self._drop(f"no {what} within {seconds:g} s (frink serve --timeout)")

    def _drop(self, why: str) -> None:
        """Close a connection waiting on its client: a partial request gets a 408
        first; a request whose body was still coming sees its client gone, with `why`
        for its log line."""
        cycle = self.cycle
        partial = self.conn.their_state is h11.SEND_BODY or bool(self.conn.trailing_data[0])
        if cycle is not None and not cycle.response_complete:
            cycle.scope["state"][DROPPED] = why
        if partial and (cycle is None or not cycle.response_started):
            self.transport.write(_raw_response(408, "Request Timeout", why))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    def _write_stalled(self) -> None:
        self._write_timer = None
        if self.flow.write_paused and not self.transport.is_closing():
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.scope["state"][DROPPED] = (
                    f"the client read nothing for {self.pool.limits.timeout:g} s "
                    "(frink serve --timeout)"
                )
            self.transport.abort()

    def _refuse(self) -> None:
        self.pool.open.discard(self)
        self.pool.note_refusal(self.loop.time())
        self.transport.write(
            _raw_response(
                503,
                "Service Unavailable",
                f"server busy: {self.pool.limits.max_connections} connections open; retry later",
                "retry-after: 1\r\n",
            )
        )
        self.transport.close()


def protocol_class(limits: Limits, log_line: Callable[[str], None]) -> type[H11Protocol]:
    """A uvicorn HTTP protocol class keeping `limits` over the connections it makes;
    refusals are logged through log_line (at most one line a second)."""

    class _Conn(Connection):
        pool = _Pool(limits, log_line)

    return _Conn


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, log_line: Callable[[str], None]) -> None:
    """Make asyncio's "socket.accept() out of system resource" (it pauses accepting for a
    second, then resumes) one line in the log instead of a traceback; other loop errors
    keep asyncio's default report."""
    last = [float("-inf")]

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message", "").startswith("socket.accept()") and isinstance(exc, OSError):
            now = loop.time()
            if now - last[0] >= 1.0:
                last[0] = now
                log_line(f"cannot accept connections for a moment: {exc.strerror or exc}")
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
