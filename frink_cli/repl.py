"""`frink chat`: an interactive conversation in the terminal.

It keeps the history and sends all of it through the chat template each turn, as a chat
client of `frink serve` would, to the same engine: the slot's cache still holds the
conversation so far, so a turn feeds only its new message (the prompt cache). Answers
stream as they are made. Ctrl-C stops the answer being written (what was written stays
in the history) and the conversation goes on; end of input (Ctrl-D) or /exit ends it.

What the model writes is shown through errors.terminal_text: a control sequence in its
output (ESC, bidi overrides) shows as its escape and never drives the terminal; the
history keeps the text as written. An answer cut by the full context says so.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from .chat import chat_ids
from .errors import FrinkError, printable, terminal_text
from .sampling import SamplingParams
from .serve.engine import Engine, Finish, Job

HELP = "commands: /reset (forget the conversation), /system TEXT (set the system message), /exit"


def chat_loop(
    model: Any,
    *,
    n_ctx: int,
    params: SamplingParams,
    max_tokens: int,
    system: str | None,
    out: TextIO,
    note: Callable[[str], None],
    read: Callable[[str], str] = input,
) -> None:
    if model.tokenizer is None:
        raise FrinkError("this model has no tokenizer: there is nothing to chat with")
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401 - line editing and history for input()
    engine = Engine(model.decoder, model.tokenizer, n_parallel=1, n_ctx=n_ctx)
    worker = threading.Thread(target=engine.run, name="frink-engine", daemon=True)
    worker.start()
    messages: list[dict] = []
    note(f"chatting with {model.checkpoint.path.name}; {HELP}")
    try:
        while True:
            try:
                line = read("> ")
            except EOFError:
                out.write("\n")
                return
            except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
                out.write("\n")
                continue
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                command, _, arg = text.partition(" ")
                if command == "/exit":
                    return
                if command == "/reset":
                    messages.clear()
                    note("conversation cleared")
                elif command == "/system":
                    system = arg.strip() or None
                    messages.clear()
                    note(
                        "system message set; conversation cleared"
                        if system
                        else "system message removed; conversation cleared"
                    )
                else:
                    note(f"unknown command {printable(command)}; {HELP}")
                continue
            messages.append({"role": "user", "content": line})
            turn = ([{"role": "system", "content": system}] if system else []) + messages
            try:
                ids = chat_ids(model.tokenizer, turn, notes=[], n_ctx=n_ctx)
                if len(ids) >= n_ctx:
                    raise FrinkError(
                        f"the conversation is {len(ids)} tokens, more than the context of "
                        f"{n_ctx} holds: /reset, or raise -c/--ctx-size"
                    )
            except FrinkError as e:
                messages.pop()
                note(f"error: {e}")
                continue
            except KeyboardInterrupt:  # before the answer began: the turn is dropped
                messages.pop()
                out.write("\n")
                note("[answer stopped]")
                continue
            answer = _answer(engine, ids, params, max_tokens, out, note)
            messages.append({"role": "assistant", "content": answer})
    finally:
        engine.stop()
        worker.join(5.0)


def _answer(
    engine: Engine,
    ids: list[int],
    params: SamplingParams,
    max_tokens: int,
    out: TextIO,
    note: Callable[[str], None],
) -> str:
    """Stream one answer to `out`; its text (as far as it got when interrupted)."""
    events: queue.Queue[tuple[str, object]] = queue.Queue()
    # channels: a harmony model (gpt-oss) answers in its final channel; its analysis is
    # not shown (nor kept in the conversation, as its template drops it).
    job = Job(
        ids,
        params,
        max_tokens,
        (),
        lambda kind, payload: events.put((kind, payload)),
        channels=True,
    )
    pieces: list[str] = []
    t0 = time.perf_counter()
    try:
        engine.submit(job)
        while True:
            try:
                kind, payload = events.get(timeout=0.1)
            except queue.Empty:
                continue
            if kind == "text":
                assert isinstance(payload, str)
                pieces.append(payload)
                out.write(terminal_text(payload))
                out.flush()
            elif kind == "reasoning":
                continue
            elif kind == "done":
                assert isinstance(payload, Finish)
                out.write("\n")
                seconds = time.perf_counter() - t0 - payload.first_token_seconds
                rate = (payload.completion_tokens - 1) / seconds if seconds > 0 else 0.0
                note(
                    f"[{payload.completion_tokens} tokens, {rate:.1f} tok/s, prompt "
                    f"{payload.prompt_tokens} ({payload.cached_tokens} cached), first token "
                    f"{payload.first_token_seconds:.2f}s]"
                )
                if payload.reason == "length" and payload.completion_tokens < max_tokens:
                    note(
                        f"[the context of {engine.n_ctx} tokens is full: the answer was cut; "
                        "/reset to start over, or raise -c/--ctx-size]"
                    )
                break
            else:
                out.write("\n")
                note(f"error: {payload}")
                break
    except KeyboardInterrupt:
        job.cancel()
        out.write("\n")
        note("[answer stopped]")
    return "".join(pieces)
