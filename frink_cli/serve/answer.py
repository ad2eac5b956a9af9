"""Answering a generation request of `frink serve`: its n jobs run on the engine, their
events gathered into one OpenAI answer, streamed as server-sent events or whole.

A choice's text goes through the model's tool-call parser when the request offered tools:
content streams as content, a call as OpenAI streams one, and finish_reason is
"tool_calls". A client that goes away cancels the jobs (the stream's generator closes,
or the whole answer's wait sees the disconnect), so their slots are free by the engine's
next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..constraint import Constraint
from ..errors import FrinkError, printable
from ..toolcalls import Parser, ToolCall
from . import openai
from .engine import Engine, Finish, Job, QueueFull
from .openai import ApiError


class Stream(StreamingResponse):
    """A streamed answer (server-sent events, or another API's `media_type`) whose
    generator is closed, and the request logged, the moment the stream ends: done, or its
    client gone (a send fails). Closing the generator cancels the job, so the slot is
    free by the engine's next step."""

    on_close: Callable[[], None] | None = None

    def __init__(self, events: AsyncIterator[str], media_type: str = "text/event-stream") -> None:
        super().__init__(events, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self._events = events

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self._events.aclose()  # type: ignore[attr-defined]
            if self.on_close is not None:
                self.on_close()


@dataclass
class Outcome:
    """What the request line in the log says beyond the status."""

    detail: str = ""


def check_context(n_tokens: int, n_ctx: int) -> None:
    if n_tokens >= n_ctx:
        raise ApiError(
            400,
            f"the prompt is {n_tokens} tokens, too long for this server's context of "
            f"{n_ctx} (frink serve -c/--ctx-size)",
            code="context_length_exceeded",
        )


async def generate(
    engine: Engine,
    model_id: str,
    tok: Any,
    request: Request,
    o: Outcome,
    ids: list[int],
    gen: openai.Generation,
    chat: bool,
    constraints: list[Constraint] | None = None,
    parsers: list[Parser] | None = None,
    spell: frozenset[int] = frozenset(),
) -> Response:
    """Run the request's n jobs and answer, streamed or whole. constraints: one per
    choice (the grammar a request asked for); parsers: one per choice when the request
    offered tools (its text goes through the model's tool-call parser), with `spell`
    the control tokens its text spells for the parser. `tok` spells
    tokens for log probabilities (None: a model without a tokenizer)."""
    run = start(engine, gen, chat, o, ids, constraints, spell, calls=parsers is not None)
    run.reply = openai.Reply(chat, model_id, _speller(tok))
    run.outs = [
        _Choice(gen.logprobs is not None, parser=parsers[i] if parsers else None)
        for i in range(gen.n)
    ]
    if gen.stream:
        return Stream(run.sse())
    return await run.whole(request)


def start(
    engine: Engine,
    gen: openai.Generation,
    chat: bool,
    o: Outcome,
    ids: list[int],
    constraints: list[Constraint] | None = None,
    spell: frozenset[int] = frozenset(),
    calls: bool = False,
) -> Run:
    """A request's n jobs queued on the engine once the prompt fits the context and the
    choices the slots (400s otherwise; a full queue is a 503); `calls`: their text goes
    through a tool-call parser (Run.submit). The caller reads their
    events (run.events, run.next_event) and must cancel the jobs if it stops early."""
    check_context(len(ids), engine.n_ctx)
    if gen.n > len(engine.slots):
        raise openai.bad("n", f"at most {len(engine.slots)} choices here (frink serve --parallel)")
    run = Run(engine, gen, chat, o)
    run.submit(ids, constraints, spell, calls=calls)
    return run


class Run:
    """One request's jobs, the events they send (in the order they happen) and what each
    choice has produced so far."""

    def __init__(self, engine: Engine, gen: openai.Generation, chat: bool, o: Outcome) -> None:
        self.engine, self.gen, self.chat, self.o = engine, gen, chat, o
        self.loop = asyncio.get_running_loop()
        # (choice index, kind, payload) from every choice's job, in the order they happen.
        self.events: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()
        self.jobs: list[Job] = []
        self.outs: list[_Choice] = []
        self.reply: openai.Reply

    def _emitter(self, index: int) -> Callable[[str, object], None]:
        def emit(kind: str, payload: object) -> None:
            # A closed loop (the server going down) has nobody left to tell.
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.events.put_nowait, (index, kind, payload))

        return emit

    def submit(
        self,
        ids: list[int],
        constraints: list[Constraint] | None,
        spell: frozenset[int],
        calls: bool = False,
    ) -> None:
        """Queue one job per choice (`calls`: its text goes through a tool-call parser); a
        full queue is a 503, a refused job a 400."""
        gen, engine = self.gen, self.engine
        self.jobs = [
            Job(
                prompt=ids,
                params=gen.choice_params(i),
                max_tokens=gen.max_tokens if gen.max_tokens is not None else engine.n_ctx,
                stop=gen.stop,
                emit=self._emitter(i),
                ignore_eos=gen.ignore_eos,
                cache_prompt=gen.cache_prompt,
                channels=self.chat,  # a harmony model's analysis goes to reasoning_content
                logprobs=gen.logprobs,
                constraint=constraints[i] if constraints else None,
                spell=spell,
                tool_calls=calls,
                lora=gen.lora,
            )
            for i in range(gen.n)
        ]
        try:
            for job in self.jobs:
                engine.submit(job)
        except QueueFull as e:
            _cancel(self.jobs)
            raise ApiError(503, f"server busy: {e}; retry later", kind="server_error") from None
        except FrinkError as e:
            _cancel(self.jobs)
            raise ApiError(400, str(e)) from None

    def describe(self) -> None:
        """The request's log detail, once every choice is done."""
        describe(self.o, [x.finish for x in self.outs if x.finish is not None])

    def cancel(self) -> None:
        _cancel(self.jobs)

    async def next_event(self, request: Request) -> tuple[int, str, Any] | None:
        """The next event of any choice: (choice index, kind, payload); None when the
        request's client has gone (checked every quarter second while waiting)."""
        while True:
            try:
                return await asyncio.wait_for(self.events.get(), 0.25)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return None

    def usage(self) -> dict:
        done = [c.finish for c in self.outs if c.finish is not None]
        return openai.usage(
            done[0].prompt_tokens, sum(f.completion_tokens for f in done), done[0].cached_tokens
        )

    def tokens(self, choice: dict, c: _Choice) -> dict:
        """`choice` with its token ids, when the request asked for them."""
        if self.gen.return_tokens and c.finish is not None:
            choice["tokens"] = list(c.finish.tokens)
        return choice

    async def sse(self) -> AsyncIterator[str]:
        """The answer as server-sent events; closing it cancels the jobs."""
        reply, outs = self.reply, self.outs
        try:
            if self.chat:  # the assistant's role comes first, as OpenAI's streams start
                for i in range(len(self.jobs)):
                    yield _sse(reply.chunk("", first=True, index=i))
            while True:
                i, kind, payload = await self.events.get()
                if kind not in ("logprob", "text", "reasoning", "done"):
                    self.o.detail = printable(str(payload))[:200]
                    yield _sse(failure(kind, payload).body())
                    yield "data: [DONE]\n\n"
                    return
                for chunk in self._chunks(i, kind, payload):
                    yield _sse(chunk)
                if kind == "done" and all(x.finish is not None for x in outs):
                    self.describe()
                    if self.gen.include_usage:
                        yield _sse(reply.usage_chunk(self.usage()))
                    yield "data: [DONE]\n\n"
                    return
        finally:
            _cancel(self.jobs)  # a client gone mid-stream; a no-op once the jobs are done

    def _chunks(self, i: int, kind: str, payload: Any) -> list[dict]:
        """The stream chunks one event of choice i makes."""
        reply, c = self.reply, self.outs[i]
        if kind == "logprob":
            c.logprobs.append(payload)  # type: ignore[union-attr]
            return []
        if kind == "text":
            if c.parser is None:
                return [reply.chunk(payload, logprobs=c.sent(), index=i)]
            return _tool_chunks(reply, c, i, c.parser.push(payload))
        if kind == "reasoning":
            return [reply.chunk(None, reasoning=payload, index=i)]
        c.finish = payload  # done
        chunks = _tool_chunks(reply, c, i, c.parser.finish()) if c.parser is not None else []
        last = reply.chunk(None, c.reason(), logprobs=c.sent(), index=i)
        self.tokens(last["choices"][0], c)
        return [*chunks, last]

    async def whole(self, request: Request) -> Response:
        """The answer as one JSON response, once every choice is done."""
        try:
            while True:
                event = await self.next_event(request)
                if event is None:
                    self.o.detail = "client disconnected"
                    return Response(status_code=499)
                i, kind, payload = event
                c = self.outs[i]
                if kind == "logprob":
                    c.logprobs.append(payload)  # type: ignore[union-attr]
                elif kind == "text":
                    p = c.parser
                    c.take(p.push(payload) if p is not None else [("content", payload)])
                elif kind == "reasoning":
                    c.reasoning.append(payload)
                elif kind == "done":
                    c.finish = payload
                    if c.parser is not None:
                        c.take(c.parser.finish())
                    if all(x.finish is not None for x in self.outs):
                        return self._whole_response()
                else:
                    raise failure(kind, payload)
        finally:
            _cancel(self.jobs)

    def _whole_response(self) -> JSONResponse:
        self.describe()
        choices = [
            self.tokens(
                self.reply.choice(
                    j,
                    "".join(x.pieces),
                    x.reason(),
                    "".join(x.reasoning),
                    x.logprobs,
                    tool_calls=[_call_body(k) for k in x.calls],
                ),
                x,
            )
            for j, x in enumerate(self.outs)
        ]
        return JSONResponse(self.reply.whole(choices, self.usage()))


def describe(o: Outcome, finishes: list[Finish]) -> None:
    """A request's log detail from its choices' finishes."""
    f = finishes[0]
    o.detail = (
        f"prompt={f.prompt_tokens} cached={f.cached_tokens} "
        f"completion={sum(x.completion_tokens for x in finishes)}"
        f" ttft={f.first_token_seconds:.3f}s finish={f.reason}"
        + (f" n={len(finishes)}" if len(finishes) > 1 else "")
    )


def failure(kind: str, payload: object) -> ApiError:
    """A job's failure event as an error: 503 when the server stopped it (a retry may
    reach a server that is up again), else a 500."""
    status = 503 if kind == "stopped" else 500
    return ApiError(status, str(payload), kind="server_error")


@dataclass
class _Choice:
    """What one choice of a request has produced so far."""

    asked_logprobs: bool
    pieces: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    # Answer tokens' log probabilities not yet sent (None: the request asked for none).
    logprobs: list | None = None
    finish: Finish | None = None
    parser: Parser | None = None  # the model's tool-call parser, when tools were offered
    calls: list[ToolCall] = field(default_factory=list)  # in order

    def __post_init__(self) -> None:
        if self.asked_logprobs:
            self.logprobs = []

    def take(self, events: list) -> None:
        """A tool-call parser's events: content text and completed calls."""
        for kind, value in events:
            if kind == "content":
                self.pieces.append(value)
            else:
                self.calls.append(value)

    def reason(self) -> str:
        """finish_reason: "tool_calls" when the answer made calls, else the engine's."""
        assert self.finish is not None
        return "tool_calls" if self.calls else self.finish.reason

    def sent(self) -> list | None:
        """The log probabilities gathered since the last chunk, now sent."""
        if self.logprobs is None:
            return None
        out, self.logprobs = self.logprobs, []
        return out


def _call_body(call: Any) -> dict:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _tool_chunks(reply: openai.Reply, c: _Choice, index: int, events: list) -> list[dict]:
    """Stream chunks for a tool-call parser's events: content as content; a call as
    OpenAI streams one (its index, id and name first, then its arguments)."""
    chunks = []
    for kind, value in events:
        if kind == "content":
            chunks.append(reply.chunk(value, logprobs=c.sent(), index=index))
            continue
        k = len(c.calls)
        c.calls.append(value)
        head = {**_call_body(value), "index": k}
        head["function"] = {"name": value.name, "arguments": ""}
        chunks.append(reply.chunk(None, logprobs=c.sent(), index=index, tool_calls=[head]))
        args = [{"index": k, "function": {"arguments": value.arguments}}]
        chunks.append(reply.chunk(None, index=index, tool_calls=args))
    return chunks


def _cancel(jobs: list[Job]) -> None:
    for job in jobs:
        job.cancel()  # a no-op once a job is done


def _speller(tok: Any) -> openai.Spell:
    """Token id -> (text, bytes) for log probabilities: the bytes the token adds to text
    (a piece of a UTF-8 character shows as U+FFFD in the text, whole in the bytes), or a
    control token's own name ("<|im_end|>"), which adds none."""
    if tok is None:
        return lambda token: ("", b"")

    def spell(token: int) -> tuple[str, bytes]:
        raw = tok.token_bytes(token)
        return (raw.decode("utf-8", errors="replace") if raw else tok.token_text(token)), raw

    return spell


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# The events a job's answer is made of; any other ends it (failure).
ANSWER_EVENTS = ("logprob", "text", "reasoning", "done")


async def one_whole(
    run: Run,
    request: Request,
    o: Outcome,
    feed: Callable[[str, Any], object],
    body: Callable[[], dict],
) -> Response:
    """A one-job run's answer as one JSON response, in another API's shape: each event fed
    to `feed` (kind, payload), then `body()` once done. A 499 when the client has gone; the
    job's failure raised as an ApiError; the job cancelled on the way out."""
    try:
        while True:
            event = await run.next_event(request)
            if event is None:
                o.detail = "client disconnected"
                return Response(status_code=499)
            _, kind, payload = event
            if kind not in ANSWER_EVENTS:
                raise failure(kind, payload)
            feed(kind, payload)
            if kind == "done":
                describe(o, [payload])
                return JSONResponse(body())
    finally:
        run.cancel()
