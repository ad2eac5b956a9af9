"""The HTTP family of the fuzzing suite: hostile clients against a real `frink serve`.

Why: a server meets clients that speak other protocols, send malformed framing, vanish
at any moment, open connections by the hundred and send text that is not Unicode. None
may kill it, make it answer 500, or stall it: `/health` must answer within a second
after every case and while a flood is open. This module starts `frink serve` on a tiny
model (scripts/fuzz_inputs.py's GGUF) on a free loopback port, runs seeded cases over raw
sockets, and counts how each ended; the server's log must hold no traceback at the end.

    python scripts/fuzz_inputs.py --http-cases N     (make fuzz: 2,000)

Cases, chosen per index from the seed: malformed framing (request lines, versions,
headers, lengths, chunking), connections dropped at every stage (mid-head, mid-body,
mid-answer; closed or reset), floods of idle and trickling connections, JSON with lone
surrogates, nulls, wrong types and unsupported fields (on the OpenAI, Anthropic and Ollama
routes), hostile content blocks and fields on /v1/messages (each a 400 in Anthropic's
shape), hostile inputs on /v1/embeddings and /api/embed,
huge fields and bodies, bad input on the constrained and tool routes (each a 400 naming
its field), and plain valid requests (which must get a 200). Loopback only; bounded in
count and time (every socket has a timeout, every case a fixed size).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Outcomes that break the promise.
BAD = ("death", "500", "stall", "traceback", "wrong answer")
HEALTH_S = 1.0  # /health must answer within this
SOCKET_S = 10.0  # any one read or write by a case
# The server's settings: short deadlines so trickling cases end quickly; a small
# connection limit so floods pass it.
SERVER_ARGS = ("--timeout", "2", "--max-connections", "48", "-np", "2", "--queue", "4")


class ServeProcess:
    """`frink serve MODEL` on a free loopback port, its stderr in a temporary file."""

    def __init__(self, model: Path, *args: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.log_file = tempfile.NamedTemporaryFile(prefix="frink-fuzz-http-", suffix=".log")  # noqa: SIM115
        env = {**os.environ, "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "frink_cli.cli", "serve", str(model)]
            + ["--port", str(self.port), "--backend", "numpy", *args],
            stdout=subprocess.DEVNULL,
            stderr=self.log_file,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while health(self.port, 2.0) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"frink serve did not start:\n{self.log()}")
            time.sleep(0.2)

    def log(self) -> str:
        return Path(self.log_file.name).read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        self.stop()
        self.log_file.close()


def health(port: int, timeout: float = HEALTH_S) -> float | None:
    """Seconds /health took to answer 200, or None (no answer within `timeout`)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            raw = _read(s)
    except OSError:
        return None
    took = time.monotonic() - t0
    return took if raw.startswith(b"HTTP/1.1 200") and took <= timeout else None


def _read(s: socket.socket, limit: int = 1 << 20) -> bytes:
    raw = b""
    while len(raw) < limit:
        try:
            part = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not part:
            break
        raw += part
    return raw


def _status(raw: bytes) -> int:
    """The status of the first response in `raw` (0: none)."""
    if not raw.startswith(b"HTTP/"):
        return 0
    try:
        return int(raw.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def _reset(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


# ---------------------------------------------------------------------------------------
# requests


def request(
    method: str = "POST",
    path: str = "/v1/chat/completions",
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    version: str = "HTTP/1.1",
) -> bytes:
    h = {"Host": "127.0.0.1", "Connection": "close"}
    if body:
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
    return head.encode("latin-1", "replace") + b"\r\n" + body


def chat_body(rng: random.Random, stream: bool | None = None, **extra: object) -> dict:
    return {
        "messages": [{"role": "user", "content": rng.choice(["hello", "hi", "hello hi"])}],
        "max_tokens": rng.randint(1, 8),
        "temperature": rng.choice([0, 0.8]),
        "stream": rng.random() < 0.5 if stream is None else stream,
        **extra,
    }


def ollama_body(rng: random.Random, path: str, stream: bool | None = None) -> dict:
    """An Ollama /api/chat or /api/generate request for the fuzz model ("tiny")."""
    body: dict = {
        "model": "tiny",
        "options": {"num_predict": rng.randint(1, 8), "temperature": rng.choice([0, 0.8])},
        "stream": rng.random() < 0.5 if stream is None else stream,
    }
    if path == "/api/chat":
        body["messages"] = chat_body(rng)["messages"]
    else:
        body["prompt"] = rng.choice(["hello", "hi", ""])
    return body


OLLAMA = ("/api/chat", "/api/generate")


def anthropic_body(rng: random.Random, stream: bool | None = None) -> dict:
    """An Anthropic /v1/messages request for the fuzz model."""
    return {
        "model": "tiny",
        "max_tokens": rng.randint(1, 8),
        "messages": chat_body(rng)["messages"],
        "temperature": rng.choice([0, 0.8]),
        "stream": rng.random() < 0.5 if stream is None else stream,
    }


# ---------------------------------------------------------------------------------------
# the cases: each sends its bytes and returns the statuses it saw


Case = Callable[[int], list[int]]


def _send(port: int, data: bytes, read: bool = True, close: str = "fin") -> list[int]:
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_S) as s:
        with contextlib.suppress(OSError):  # the server closed first (a refusal): fine
            s.sendall(data)
        raw = _read(s) if read else b""
        if close == "rst":
            _reset(s)
    return [_status(raw)] if raw else []


_METHODS = ["GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD", "PRI", "BREW", "G ET", ""]
_TARGETS = [
    "/health",
    "/v1/models",
    "/v1/chat/completions",
    "/completions",
    "/v1/embeddings",
    "*",
    "/../../etc/passwd",
    "/%00%ff",
    "/v1/models/",
    "http://evil.example/v1/models",
    "/" + "a" * 9000,
]
_VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/3.0", "HTTP/0.9", "HTTP/1.1x", "", "HTTP/11"]
_HEADERS = [
    ("Host", "evil.example"),
    ("Host", "localhost:1"),
    ("Host", ""),
    ("Content-Length", "-1"),
    ("Content-Length", "abc"),
    ("Content-Length", "99999999999999999999999"),
    ("Content-Length", "5, 6"),
    ("Transfer-Encoding", "chunked"),
    ("Transfer-Encoding", "gzip, chunked"),
    ("Transfer-Encoding", "identity"),
    ("Expect", "100-continue"),
    ("Origin", "https://evil.example"),
    ("Origin", "null"),
    ("Authorization", "Bearer " + "k" * 5000),
    ("Connection", "keep-alive, Upgrade"),
    ("Upgrade", "websocket"),
    ("Upgrade", "h2c"),
    ("X-Long", "v" * 20000),
    ("Bad Name", "x"),
    ("X-Nul", "a\0b"),
    ("X-Fold", "a\r\n b"),
    ("Content-Type", "text/plain"),
]


def framing_case(rng: random.Random) -> tuple[str, Case]:
    method, target, version = rng.choice(_METHODS), rng.choice(_TARGETS), rng.choice(_VERSIONS)
    headers = dict(rng.sample(_HEADERS, rng.randint(0, 4)))
    body = rng.choice([b"", b"{}", json.dumps(chat_body(rng, stream=False)).encode(), b"\xff" * 7])
    if "Content-Length" not in headers and body:
        headers["Content-Length"] = str(len(body))
    if headers.get("Transfer-Encoding", "").endswith("chunked"):
        body = rng.choice(
            [b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\n", b"ffffffffff\r\nab", b"0\r\n\r\n"]
        )
    line = f"{method} {target} {version}".strip()
    head = line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if rng.random() < 0.3:
        head += "Host: 127.0.0.1\r\n"
    data = head.encode("latin-1") + b"\r\n" + body
    if rng.random() < 0.1:
        data = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + data
    if rng.random() < 0.05:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    close = rng.choice(["fin", "rst"])
    return f"framing {line[:60]!r}", lambda port: _send(port, data, close=close)


def drop_case(rng: random.Random) -> tuple[str, Case]:
    """A valid request cut at a random byte, or its answer abandoned after a few bytes."""
    path = rng.choice(["/v1/chat/completions", "/v1/completions"])
    body = chat_body(rng) if "chat" in path else {"prompt": "hello", "max_tokens": 8}
    body["max_tokens"] = rng.randint(1, 60)
    body["ignore_eos"] = rng.random() < 0.5
    data = request("POST", path, json.dumps(body).encode())
    close = rng.choice(["fin", "rst"])
    if rng.random() < 0.5:
        cut = rng.randint(0, len(data) - 1)

        def cut_request(port: int) -> list[int]:
            with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_S) as s:
                s.sendall(data[:cut])
                if close == "rst":
                    _reset(s)
            return []

        return f"drop mid-request at byte {cut} ({close})", cut_request
    after = rng.randint(0, 400)

    def abandon(port: int) -> list[int]:
        with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_S) as s:
            s.sendall(data)
            raw = b""
            while len(raw) < after:
                part = s.recv(after - len(raw) or 1)
                if not part:
                    break
                raw += part
            if close == "rst":
                _reset(s)
        return [_status(raw)] if raw.startswith(b"HTTP/") and b" " in raw[:12] else []

    return f"drop after {after} answer bytes ({close})", abandon


def flood_case(rng: random.Random) -> tuple[str, Case]:
    """Many connections at once, idle or trickling a head, /health checked while open."""
    n = rng.randint(10, 120)
    trickle = rng.random()

    def flood(port: int) -> list[int]:
        socks = []
        statuses: list[int] = []
        try:
            for _ in range(n):
                try:
                    c = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_S)
                except OSError:
                    break
                if rng.random() < trickle:
                    with contextlib.suppress(OSError):
                        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                socks.append(c)
            if health(port) is None:
                statuses.append(-1)  # a stall, counted by the runner
        finally:
            for c in socks:
                if rng.random() < 0.5:
                    _reset(c)
                else:
                    c.close()
        return statuses

    return f"flood of {n} ({trickle:.0%} trickling)", flood


def _surrogate(rng: random.Random) -> bytes:
    return rng.choice([b"\\ud800", b"\\udfff", b"\\ud83d", b"\xed\xa0\x80", b"\xed\xbf\xbf"])


def _random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([-1, 0, 1, 2, 7, 10**6, -(10**12), 2**63, 2**70])
    if kind == 3:
        return rng.choice([0.0, -0.5, 0.5, 1.0, 2.5, 1e300, -1e-300])
    if kind in (4, 5):
        return "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(12)))
    if kind in (6, 7):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["role", "content", "type", "x"]): _random_value(rng, depth + 1)}


_FIELDS = [
    "messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
    "stop", "n", "stream", "stream_options", "presence_penalty", "frequency_penalty",
    "logprobs", "top_logprobs", "model", "logit_bias", "tools", "response_format",
    "functions", "echo", "suffix", "best_of", "ignore_eos", "return_tokens", "cache_prompt",
    "options", "format", "raw", "context", "images", "system", "template", "keep_alive",
    "think",
]  # fmt: skip


def json_case(rng: random.Random) -> tuple[str, Case]:
    """A well-framed request whose JSON is hostile: surrogates, nulls, wrong types,
    unsupported fields, depth."""
    path = rng.choice(["/v1/chat/completions", "/v1/completions", "/v1/messages", *OLLAMA])
    if path in OLLAMA:
        body = ollama_body(rng, path, stream=False)
    elif path == "/v1/messages":
        body = anthropic_body(rng, stream=False)
    elif path == "/v1/chat/completions":
        body = chat_body(rng, stream=False)
    else:
        body = {"prompt": "hi", "max_tokens": 3}
    for f in rng.sample(_FIELDS, rng.randint(0, 4)):
        body[f] = _random_value(rng)
    raw = json.dumps(body).encode()
    r = rng.random()
    if r < 0.35:  # a lone surrogate in a string value
        text = b'"content": "' if b'"content": "' in raw else b'"prompt": "'
        if text in raw:
            raw = raw.replace(text, text + _surrogate(rng), 1)
        else:
            raw = raw[:-1] + b', "x": "' + _surrogate(rng) + b'"}'
    elif r < 0.45:
        depth = rng.choice([10, 1000, 50000])
        raw = raw[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    elif r < 0.55:
        raw = raw[:-1] + b', "n": 1' + b"0" * rng.choice([30, 5000]) + b"}"
    what = raw[:80].decode("utf-8", "replace")
    return f"json {path} {what!r}", lambda port: _send(port, request("POST", path, raw))


def huge_case(rng: random.Random) -> tuple[str, Case]:
    """Huge fields: a prompt of megabytes (refused by its length, or by --max-body), a
    head past h11's limit, many messages, long stop strings."""
    r = rng.random()
    if r < 0.4:
        size = rng.choice([100_000, 1_000_000, 7_600_000, 9_000_000])
        body = json.dumps({"prompt": "word " * (size // 5)}).encode()
        data = request("POST", "/v1/completions", body)
    elif r < 0.6:
        data = request("GET", "/health", headers={"X-Huge": "h" * rng.choice([20_000, 1_000_000])})
    elif r < 0.8:
        msgs = [{"role": "user", "content": "hi"}] * rng.choice([1000, 20000])
        data = request("POST", "/v1/chat/completions", json.dumps({"messages": msgs}).encode())
    else:
        body = chat_body(rng, stop=["s" * 100_000], stream=False)
        data = request("POST", "/v1/chat/completions", json.dumps(body).encode())

    def huge(port: int) -> list[int]:
        stalls: list[int] = []
        with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_S) as s:
            with contextlib.suppress(OSError):
                s.sendall(data)
            if health(port) is None:
                stalls.append(-1)
            raw = _read(s)
        return [*stalls, _status(raw)] if raw else stalls

    return f"huge {len(data)} bytes", huge


def _nested_schema(depth: int) -> str:
    """A placeholder for a schema nested `depth` deep, spelled into the body's JSON by
    _body_bytes (json.dumps cannot write one)."""
    return f"<schema nested {depth} deep>"


def _body_bytes(body: dict) -> bytes:
    raw = json.dumps(body).encode()
    for depth in (10_000, 600):
        deep = b'{"type": "object", "properties": {"a": ' * depth + b"{}" + b"}}" * depth
        raw = raw.replace(json.dumps(_nested_schema(depth)).encode(), deep)
    return raw


def _bad_schema(rng: random.Random) -> object:
    """A JSON schema llguidance cannot compile, or one past the size or depth bounds."""
    r = rng.random()
    if r < 0.2:  # nested 10,000 deep: past the JSON reader's depth, or llguidance's
        return _nested_schema(rng.choice([10_000, 600]))
    if r < 0.35:  # larger than constraint.GRAMMAR_MAX_BYTES
        n = rng.choice([12_000, 40_000])
        return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}
    return rng.choice(
        [
            {"type": "nonsense"},
            {"type": 5},
            {"type": "object", "properties": []},
            {"$ref": "#/$defs/missing"},
            {"type": "string", "pattern": "a(b"},
            {"type": "object", "dependentSchemas": {}},
            {"type": "integer", "minimum": "x"},
            {"enum": []},
            7,
            "schema",
        ]
    )


_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
_NOT_FUNCTIONS = [
    {},
    "f",
    [],
    {"type": "retrieval"},
    {"type": "function"},
    {"type": "function", "function": "f"},
    {"type": "function", "function": {"name": "no spaces allowed"}},
    {"type": "function", "function": {"name": "f", "parameters": "object"}},
]
_BAD_GRAMMARS = ['root ::= "a" undefined_rule', "root ::= (", "", "root ::= [", "x" * 300_000,
                 'root ::= "unterminated', "start: foo", "\x00\x01"]  # fmt: skip


def _constrained_request(rng: random.Random) -> tuple[str, dict, str]:
    """(path, body, the field its 400 must name) for one hostile constrained or tool
    request."""
    chat = rng.random() < 0.7
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict = chat_body(rng) if chat else {"prompt": "hi", "max_tokens": 3}
    kind = rng.randrange(6 if chat else 2)
    if kind == 0:
        schema = _bad_schema(rng)
        if rng.random() < 0.5:
            body["json_schema"] = schema
            return path, body, "json_schema"
        body["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        return path, body, "response_format"
    if kind == 1:
        body["grammar"] = rng.choice(_BAD_GRAMMARS)
        return path, body, "grammar"
    if kind == 2:
        body["tools"] = [_TOOL]
        body["tool_choice"] = rng.choice(
            [{"type": "function", "function": {"name": "g"}}, "sometimes", {"type": "function"}]
        )
        return path, body, "tool_choice"
    if kind == 3:
        body["messages"].append({"role": "tool", "tool_call_id": "call_1", "content": "42"})
        if rng.random() < 0.5:  # a call, but with another id
            call = {"id": "call_2", "type": "function", "function": {"name": "f"}}
            body["messages"].insert(1, {"role": "assistant", "tool_calls": [call]})
        return path, body, "messages"
    if kind == 4:
        body["tools"] = rng.choice([[_TOOL, rng.choice(_NOT_FUNCTIONS)], {"f": _TOOL}, "f"])
        return path, body, "tools"
    body["tools"] = [_TOOL]
    body["response_format"] = {"type": "json_object"}
    return path, body, "response_format"


def constrained_case(rng: random.Random) -> tuple[str, Case]:
    """Bad input on the constrained and tool routes: invalid, huge and 10,000-deep
    schemas, grammars that do not compile, an unknown tool in tool_choice, a tool message
    answering no call, tools that are not functions. Each must be a 400 in the API's
    error shape whose message and param name the field."""
    path, body, field = _constrained_request(rng)
    data = request("POST", path, _body_bytes(body))

    def named(error: Any) -> bool:
        error = error["error"]
        return str(error["param"]).startswith(field) and field in error["message"]

    return f"constrained {path} {field}", lambda port: _refused(port, data, named)


def valid_case(rng: random.Random) -> tuple[str, Case]:
    paths = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", *OLLAMA]
    path = rng.choice([*paths, "/v1/messages", "/api/tags", "/api/version", "/api/ps", "/metrics"])
    if path in OLLAMA:
        data = request("POST", path, json.dumps(ollama_body(rng, path)).encode())
    elif path == "/v1/messages":
        data = request("POST", path, json.dumps(anthropic_body(rng)).encode())
    elif path == "/v1/chat/completions":
        data = request("POST", path, json.dumps(chat_body(rng)).encode())
    elif path == "/v1/completions":
        body = {"prompt": "hello", "max_tokens": rng.randint(1, 8), "stream": rng.random() < 0.5}
        data = request("POST", path, json.dumps(body).encode())
    else:
        data = request("GET", path)

    def valid(port: int) -> list[int]:
        statuses = _send(port, data)
        # A correct request must be answered (a full queue's 503 is an answer too).
        return [s if s in (200, 503) else -2 for s in statuses] or [-2]

    return f"valid {path}", valid


_BAD_BLOCKS: list[Any] = [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
    {"type": "nonsense"},
    {"type": "text"},
    {"type": "text", "text": 5},
    {"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"},
    {"type": "tool_use", "id": "t", "name": "f", "input": "not an object"},
    {"type": "thinking"},
    "a string, not a block",
    7,
    None,
]
_BAD_MESSAGE_FIELDS: list[tuple[str, list[Any]]] = [
    ("max_tokens", [0, -1, "8", 10**12, None, 2.5]),
    ("system", [5, [{"type": "image"}], [{"type": "text"}], {"a": 1}]),
    ("tool_choice", [{"type": "tool"}, {"type": "nope"}, "auto", {"type": "tool", "name": "x"}]),
    ("messages", [[], [{"role": "system", "content": "x"}], [{"role": "user"}], "hi"]),
    ("tools", [[{"name": "no spaces"}], [{}], {"f": 1}, [{"name": "f", "input_schema": 3}]]),
    ("stop_sequences", ["x", [1], [None]]),
    ("temperature", [-1, 3, "hot"]),
    ("top_k", [-5, "k", 1.5]),
    ("metadata", ["m", [1]]),
]


def anthropic_case(rng: random.Random) -> tuple[str, Case]:
    """/v1/messages with one hostile part (an unknown, malformed or image content block, a
    bad max_tokens, system, tool_choice, messages, tools, or sampling field): each must be
    a 400 in Anthropic's error shape, {"type": "error", "error": {"type", "message"}}."""
    body = anthropic_body(rng, stream=rng.random() < 0.3)
    if rng.random() < 0.4:
        body["messages"] = [{"role": "user", "content": [rng.choice(_BAD_BLOCKS)]}]
        what = "content block"
    else:
        what, values = rng.choice(_BAD_MESSAGE_FIELDS)
        body[what] = rng.choice(values)
    data = request("POST", "/v1/messages", json.dumps(body).encode())

    def shaped(answer: Any) -> bool:
        error = answer["error"]
        return (
            answer["type"] == "error"
            and error["type"] == "invalid_request_error"
            and (isinstance(error["message"], str))
        )

    return f"anthropic {what} {json.dumps(body)[:60]!r}", lambda port: _refused(port, data, shaped)


def _refused(port: int, data: bytes, good: Callable[[Any], bool]) -> list[int]:
    """[400] when `data` is refused with a 400 whose JSON body `good` accepts, else [-2]."""
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_S) as s:
        s.sendall(data)
        raw = _read(s)
    try:
        ok = good(json.loads(raw.partition(b"\r\n\r\n")[2]))
    except (ValueError, KeyError, TypeError):
        ok = False
    status = _status(raw)
    return [status if status == 400 and ok else -2]


def embed_case(rng: random.Random) -> tuple[str, Case]:
    """/v1/embeddings or Ollama's /api/embed with a hostile or valid `input` and options:
    each must be answered 200 or refused 400, never a 500."""
    inputs: list[Any] = [
        "hello",
        ["a", "b"],
        [1, 2, 3],
        [[1, 2], [3]],
        [],
        [[]],
        ["x"] * 10_000,
        [10**12],
        [True, False],
        [[1, "x"]],
        {"text": "a"},
        "word " * rng.choice([10, 5000, 100_000]),
        _random_value(rng),
    ]
    body: dict[str, Any] = {"input": rng.choice(inputs)}
    for name, values in (
        ("encoding_format", ["float", "base64", "int8", 3]),
        ("dimensions", [1, 8, 0, -1, 10**9, "8", 2.5]),
        ("truncate", [True, False, "yes"]),
    ):
        if rng.random() < 0.3:
            body[name] = rng.choice(values)
    path = rng.choice(["/v1/embeddings", "/api/embed"])
    if path == "/api/embed":
        body["model"] = "tiny"
        body.pop("encoding_format", None)
    raw = json.dumps(body).encode()
    what = raw[:80].decode("utf-8", "replace")

    def embed(port: int) -> list[int]:
        statuses = _send(port, request("POST", path, raw))
        return [s if s in (200, 400, 413, 503) else -2 for s in statuses] or [-2]

    return f"embeddings {path} {what!r}", embed


FAMILIES: list[tuple[float, Callable[[random.Random], tuple[str, Case]]]] = [
    (0.30, framing_case),
    (0.25, drop_case),
    (0.20, json_case),
    (0.05, constrained_case),
    (0.08, valid_case),
    (0.07, huge_case),
    (0.05, flood_case),
    (0.05, embed_case),
    (0.05, anthropic_case),
]


def http_cases(n: int, seed: int) -> list[tuple[str, Case]]:
    """n cases, reproducible from (seed, index); the first few are fixed: one of each
    family and the HTTP/2 preface."""
    rng = random.Random(seed)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    out: list[tuple[str, Case]] = [
        ("HTTP/2 preface, closed", lambda port: _send(port, preface, read=False)),
        ("HTTP/2 preface, reset", lambda port: _send(port, preface, read=False, close="rst")),
    ]
    out += [make(rng) for _, make in FAMILIES]
    weights = [w for w, _ in FAMILIES]
    while len(out) < n:
        make = rng.choices([m for _, m in FAMILIES], weights)[0]
        out.append(make(rng))
    return out[:n]


def run_http_cases(
    model: Path, n: int, seed: int, progress: bool = False
) -> tuple[Counter, list[tuple[str, str, str]]]:
    """Counts per outcome ("ok" or one of BAD), and the (case, outcome, detail) of every
    bad one. The server is started on `model` and stopped (SIGTERM) at the end."""
    counts: Counter = Counter()
    bad: list[tuple[str, str, str]] = []
    server = ServeProcess(model, *SERVER_ARGS)
    try:
        for k, (name, case) in enumerate(http_cases(n, seed)):
            try:
                statuses = case(server.port)
            except OSError as e:  # the case's own socket (a refusal, a reset): not a finding
                statuses, detail = [], f"{type(e).__name__}: {e}"
            else:
                detail = ""
            outcome = "ok"
            if not server.alive():
                outcome, detail = "death", f"exit {server.proc.returncode}"
            elif any(s == 500 or (s >= 500 and s not in (503, 505)) for s in statuses):
                outcome, detail = "500", str(statuses)
            elif -2 in statuses:
                outcome, detail = "wrong answer", str(statuses)
            elif -1 in statuses or health(server.port) is None:
                outcome = "stall"
            counts[outcome] += 1
            if outcome != "ok":
                bad.append((f"#{k} {name}", outcome, detail))
            if outcome == "death":
                break
            if progress and k % 500 == 0:
                print(f"http {k} cases: {dict(counts)}", file=sys.stderr, flush=True)
        code = server.stop()
        log = server.log()
        if "Traceback" in log or code != 0:
            counts["traceback"] += 1
            bad.append(
                (
                    "the server's log at the end",
                    "traceback",
                    f"exit {code}\n{_around_traceback(log)}",
                )
            )
    finally:
        server.close()
    return counts, bad


def _around_traceback(log: str) -> str:
    """The log around its first traceback (or its end)."""
    at = log.find("Traceback")
    return log[max(at - 300, 0) : at + 6000] if at >= 0 else log[-3000:]
