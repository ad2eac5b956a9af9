"""What every API of `frink serve` does with a request before the engine runs it,
whatever the transport's shapes (OpenAI's, Ollama's, ...):

- read_json: the body, read at most --max-body bytes, as the JSON object it must be;
- tokenize, tokenize_text and constraints: tokenizing (a text prompt refused by its
  length first) and compiling a grammar, off the event loop;
- chat_work: a chat request in OpenAI's field names (messages, tools, tool_choice,
  response_format, ...) turned into the prompt ids, the tool plan's constraint and
  parsers, and the control tokens the answer must spell. Another API translates its
  request into these names and calls it, so tools and formats mean one thing everywhere.

Every bad field is an openai.ApiError (its status and a message naming the field); an
API with its own error shape reshapes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ..chat import chat_ids, check_fits
from ..constraint import Constraint, Grammar, GrammarError, compile_constraint
from ..errors import FrinkError
from ..toolcalls import Parser
from . import openai, tools
from .openai import ApiError, Generation

if TYPE_CHECKING:
    from .app import ServerState

# Bodies larger than this are parsed off the event loop.
_PARSE_INLINE_BYTES = 64 << 10


async def read_json(state: ServerState, request: Request) -> dict:
    """The JSON object a request sent, read at most state.max_body bytes (413 past it),
    checked as openai.parse_body checks it."""
    too_big = ApiError(
        413, f"request body exceeds {state.max_body} bytes", code="request_too_large"
    )
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > state.max_body:
        raise too_big
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > state.max_body:
            raise too_big
    if len(data) > _PARSE_INLINE_BYTES:
        return await run_in_threadpool(openai.parse_body, bytes(data))
    return openai.parse_body(bytes(data))


async def tokenize(state: ServerState, make: Callable[[], list[int]]) -> list[int]:
    """`make()` run off the event loop; a tokenizer's refusal is a 400."""
    if state.model.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: send token ids to /v1/completions")
    try:
        return await run_in_threadpool(make)
    except FrinkError as e:  # a prompt too long to tokenize, a template that failed
        raise ApiError(400, str(e), code="invalid_prompt") from None


async def tokenize_text(state: ServerState, text: str) -> list[int]:
    """A prompt's ids as the text is (no template); refused by its length before any
    tokenizing when it cannot fit the context."""
    tok = state.model.tokenizer
    if tok is not None:
        try:
            check_fits(tok, len(text), state.engine.n_ctx)
        except FrinkError as e:
            raise ApiError(400, str(e), code="context_length_exceeded") from None
    parse = state.parse_special
    return await tokenize(state, lambda: tok.encode(text, parse_special=parse))


async def constraints(
    state: ServerState, grammar: Grammar | None, triggers: tuple[str, ...], n: int
) -> list[Constraint] | None:
    """n constraints for `grammar` (one per choice), compiled off the event loop."""
    if grammar is None:
        return None
    tok = state.model.tokenizer
    if tok is None:
        raise openai.bad(grammar.field, "needs a model with a tokenizer")
    try:
        return await run_in_threadpool(compile_constraint, tok, grammar, triggers, n)
    except GrammarError as e:
        raise openai.bad(e.field, e.detail) from None


@dataclass(frozen=True)
class ChatWork:
    """A chat request made ready for the engine."""

    ids: list[int]  # the rendered, tokenized conversation
    gen: Generation  # the request's, with tool_choice none's ban on call markers
    constraints: list[Constraint] | None  # one per choice
    parsers: list[Parser] | None  # one per choice when the answer may call tools
    spell: frozenset[int]  # control tokens the answer's text spells for the parsers


async def chat_work(state: ServerState, body: dict, gen: Generation) -> ChatWork:
    """`body`, a chat request in OpenAI's field names, as the engine takes it: the
    conversation (with its tool calls and results) rendered by the chat template with
    the tools offered, and the constraint of `response_format` or of the tool plan."""
    msgs = openai.messages(body)
    tok = state.model.tokenizer
    plan = tools.tool_plan(body, tok)
    grammar = tools.output_grammar(body)
    triggers: tuple[str, ...] = ()
    if plan is not None and not plan.calls:
        gen = dataclasses.replace(gen, params=plan.without_calls(gen.params, tok))
    elif plan is not None:
        if grammar is not None:
            raise openai.bad(grammar.field.split(".")[0], "cannot be combined with tools")
        grammar, triggers = plan.grammar(tok)
    msgs = tools.conversation(body, msgs)
    if plan is not None:
        msgs = plan.messages(msgs)
    offered = plan.template_tools() if plan is not None else None
    n_ctx = state.engine.n_ctx
    # chat_ids refuses text that cannot fit n_ctx before rendering or tokenizing it.
    ids = await tokenize(
        state,
        lambda: chat_ids(
            tok, msgs, notes=[], n_ctx=n_ctx, parse_special=state.parse_special, tools=offered
        ),
    )
    calls = plan is not None and plan.calls
    return ChatWork(
        ids,
        gen,
        await constraints(state, grammar, triggers, gen.n),
        [plan.parser() for _ in range(gen.n)] if plan is not None and calls else None,
        plan.spelled(tok) if plan is not None else frozenset(),
    )
