"""A chat request made ready for the engine, whatever API it came through (OpenAI's chat
completions, Anthropic's messages, Ollama's chat): the conversation with its tools rendered
by the chat template into prompt ids, and the constraints and tool-call parsers its choices
run with. openai_chat_job takes a body in OpenAI's field names (an API may translate its
request into them, as Ollama's does); tokenize_text a prompt used as it is (no template).

The caller checks its own fields first and hands over the conversation in the chat
template's shape (role, text content; an assistant's tool_calls with arguments as
objects; a tool message's tool_call_id and name) and the ToolPlan (toolcalls/plan.py).
Templating, tokenizing and compiling a grammar run off the event loop; a prompt that
cannot fit the context is refused before it is rendered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from ..chat import chat_ids, check_fits
from ..constraint import Constraint, Grammar, GrammarError, compile_constraint
from ..errors import FrinkError
from ..toolcalls import Parser
from ..toolcalls.plan import ToolPlan
from . import openai, tools
from .openai import ApiError

if TYPE_CHECKING:
    from .app import ServerState


@dataclass(frozen=True)
class ChatJob:
    """What answer.generate takes for one chat request."""

    ids: list[int]
    gen: openai.Generation
    constraints: list[Constraint] | None
    parsers: list[Parser] | None  # one per choice when the answer may call tools
    spell: frozenset[int]  # control-token markers the answer's text spells for a parser


async def prompt_ids(state: ServerState, msgs: list[dict], plan: ToolPlan | None) -> list[int]:
    """The prompt the chat template makes of `msgs` with the plan's tools."""
    if plan is not None:
        msgs = plan.messages(msgs)
    offered = plan.template_tools() if plan is not None else None
    tok, n_ctx, special = state.model.tokenizer, state.engine.n_ctx, state.parse_special
    # chat_ids refuses text that cannot fit n_ctx before rendering or tokenizing it.
    return await tokenize(
        state,
        lambda: chat_ids(tok, msgs, notes=[], n_ctx=n_ctx, parse_special=special, tools=offered),
    )


async def chat_job(
    state: ServerState,
    msgs: list[dict],
    gen: openai.Generation,
    plan: ToolPlan | None,
    grammar: Grammar | None,
) -> ChatJob:
    """The prompt ids, sampler and constraints of a chat request: tool_choice none bans
    the format's call markers; a plan that calls brings its grammar (lazy for auto) and a
    parser per choice. `grammar` (a response format) cannot be combined with calls."""
    tok = state.model.tokenizer
    triggers: tuple[str, ...] = ()
    if plan is not None and not plan.calls:
        gen = dataclasses.replace(gen, params=plan.without_calls(gen.params, tok))
    elif plan is not None:
        if grammar is not None:
            raise openai.bad(grammar.field.split(".")[0], "cannot be combined with tools")
        try:
            grammar, triggers = plan.grammar(tok)
        except GrammarError as e:  # a schema feature the format's syntax cannot enforce
            raise openai.bad(e.field, e.detail) from None
    ids = await prompt_ids(state, msgs, plan)
    calls = plan is not None and plan.calls
    return ChatJob(
        ids,
        gen,
        await constraints(state, grammar, triggers, gen.n),
        [plan.parser() for _ in range(gen.n)] if plan is not None and calls else None,
        plan.spelled(tok) if plan is not None else frozenset(),
    )


async def openai_chat_job(state: ServerState, body: dict, gen: openai.Generation) -> ChatJob:
    """chat_job for a body in OpenAI's field names: messages (with their tool calls and
    results), tools, tool_choice and response_format."""
    plan = tools.tool_plan(body, state.model.tokenizer)
    msgs = tools.conversation(body, openai.messages(body))
    return await chat_job(state, msgs, gen, plan, tools.output_grammar(body))


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


async def tokenize(state: ServerState, make: Callable[[], list[int]]) -> list[int]:
    """make() off the event loop: a prompt's ids; its failure a 400."""
    if state.model.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: send token ids to /v1/completions")
    try:
        return await run_in_threadpool(make)
    except FrinkError as e:  # a prompt too long to tokenize, a template that failed
        raise ApiError(400, str(e), code="invalid_prompt") from None
