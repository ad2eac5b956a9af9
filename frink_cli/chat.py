"""Chat templates -> prompt text -> prompt ids.

Why this module exists: instruction-tuned models only behave when the prompt is laid out
the way they were trained, and that layout ships as a Jinja template inside the model
file (or, where a file has none, a fallback format its vocabulary has markers for). This
module turns a conversation into the ids the model sees: the template rendered
(chat_template.py: transformers' rendering in a bounded sandbox), then tokenized with
control tokens parsed only where the template wrote them.
"""

from __future__ import annotations

import json
import logging
import secrets
from functools import lru_cache
from typing import TYPE_CHECKING

from .chat_template import render_chat
from .errors import FrinkError
from .resources import config_file

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

__all__ = [
    "chat_ids",
    "check_fits",
    "fallback_template",
    "prompt_ids",
    "render_chat",
    "renders_tools",
]

log = logging.getLogger("frink")

_TEMPLATES_DIR = config_file("chat_templates")


@lru_cache(maxsize=1)
def _fallbacks() -> list[dict]:
    table = json.loads((_TEMPLATES_DIR / "fallbacks.json").read_text())["fallbacks"]
    return [{**f, "template": (_TEMPLATES_DIR / f["file"]).read_text()} for f in table]


def fallback_template(tok: Tokenizer) -> tuple[str, str] | None:
    """(name, template) of the first fallback whose markers the vocabulary has, or None."""
    for f in _fallbacks():
        if all(tok.token_id(m) is not None for m in f["markers"]):
            return f["name"], f["template"]
    return None


def prompt_ids(
    tok: Tokenizer,
    prompt: str,
    *,
    system: str | None = None,
    raw: bool = False,
    notes: list[str] | None = None,
    n_ctx: int | None = None,
) -> list[int]:
    """The ids a prompt becomes: raw text, or one user turn (after an optional system
    message) through the chat template (chat_ids)."""
    if raw:
        check_fits(tok, len(prompt), n_ctx)
        return tok.encode(prompt)
    messages: list[dict] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    return chat_ids(tok, messages, notes=notes, n_ctx=n_ctx)


def check_fits(tok: Tokenizer, n_chars: int, n_ctx: int | None) -> int | None:
    """Refuse text that cannot fit n_ctx tokens before tokenizing it (a token spells at
    most `tok.max_token_chars` characters); the character limit, or None."""
    limit = None if n_ctx is None else n_ctx * max(tok.max_token_chars, 1)
    if limit is not None and n_chars > limit:
        raise FrinkError(
            f"prompt is {n_chars} characters, more than a context of {n_ctx} tokens can "
            f"hold with this vocabulary (at most {limit}; raise -c/--ctx-size)"
        )
    return limit


def chat_ids(
    tok: Tokenizer,
    messages: list[dict],
    *,
    notes: list[str] | None = None,
    n_ctx: int | None = None,
    parse_special: bool = False,
    tools: list[dict] | None = None,
) -> list[int]:
    """The ids a conversation becomes through the model's chat template, ready for the
    assistant's next turn (messages: {"role", "content": str}, plus an assistant's
    "tool_calls" and a tool message's "tool_call_id" and "name"; `tools` go to the
    template, see renders_tools).

    Content is text: a control token's spelling inside a message ("<|im_end|>") is
    tokenized as the characters it is, so a message cannot forge a turn; only the markers
    the template itself writes are control tokens (transformers' split_special_tokens
    applied to the messages alone). parse_special=True reads control tokens anywhere, as
    llama.cpp does. BOS is added per the model's policy unless the rendered text already
    starts with it (as llama.cpp's chat path does).

    With no chat template llama.cpp falls back to ChatML. frink uses a fallback format
    (configs/chat_templates/fallbacks.json: ChatML, Gemma's turns) only when the vocabulary
    has its marker tokens; otherwise they would be tokenized as plain text the model never
    saw in training, so the messages' contents go in raw, one after another, and a note says
    so (appended to `notes` when given, else logged on the "frink" logger).

    With n_ctx, text that cannot fit n_ctx tokens is refused before it is tokenized, and
    the template's output is capped at that many characters.
    """
    limit = check_fits(tok, sum(len(str(m.get("content") or "")) for m in messages), n_ctx)
    template = tok.chat_template
    if not template:
        found = fallback_template(tok)
        if found:
            note = f"model has no chat template; using the {found[0]} format its vocabulary has"
            template = found[1]
        else:
            note = "model has no chat template; the prompt is used as raw text"
            template = None
        if notes is not None:
            notes.append(note)
        else:
            log.warning(note)
        if template is None:
            joined = "".join(str(m.get("content") or "") for m in messages)
            return tok.encode(joined, parse_special=parse_special)
    controls = () if parse_special else _controls_in_content(tok, messages)
    if not controls:
        text = _render(tok, template, messages, limit, tools)
        # Tokenizer.encode leaves BOS out when the text starts with the BOS token itself.
        return tok.encode(text, add_special=True, parse_special=True)
    return _content_as_text(tok, template, messages, limit, tools)


def _render(
    tok: Tokenizer,
    template: str,
    messages: list[dict],
    max_chars: int | None,
    tools: list[dict] | None,
) -> str:
    """`messages` through `template` with the model's BOS and EOS texts, ready for the
    assistant's next turn (render_chat's bounds and errors)."""
    return render_chat(
        template,
        messages,
        bos_token=tok.bos_text,
        eos_token=tok.eos_text,
        add_generation_prompt=True,
        max_chars=max_chars,
        tools=tools,
    )


def _controls_in_content(tok: Tokenizer, messages: list[dict]) -> tuple[str, ...]:
    """Whether any message's content spells one of the vocabulary's control tokens: the
    vocabulary's control spellings if so, else ()."""
    contents = [m["content"] for m in messages if isinstance(m.get("content"), str)]
    texts = tok.control_texts
    if any(t in c for c in contents for t in texts):
        return texts
    return ()


def _content_as_text(
    tok: Tokenizer,
    template: str,
    messages: list[dict],
    limit: int | None,
    tools: list[dict] | None = None,
) -> list[int]:
    """The ids of the rendered conversation with control tokens parsed only outside the
    messages' content. Each content is rendered between two markers no message can hold
    (a random nonce), so where the template put it is known; the text between the control
    tokens the template wrote is then tokenized as plain text, as the plain path does.

    A template that rewrites content (splits or slices it) loses the markers' pairing:
    such a conversation is refused, since frink could not tell its text from the
    template's markers."""
    nonce = secrets.token_hex(8)
    opening, closing = f"\ue000{nonce}\ue001", f"\ue002{nonce}\ue003"
    marked = [
        {**m, "content": f"{opening}{m['content']}{closing}"}
        if isinstance(m.get("content"), str)
        else m
        for m in messages
    ]
    text = _render(
        tok, template, marked, None if limit is None else limit + 64 * len(messages), tools
    )
    # (piece, is content) in order
    segments: list[tuple[str, bool]] = []
    at = 0
    while True:
        start = text.find(opening, at)
        end = text.find(closing, at)
        if start < 0 and end < 0:
            segments.append((text[at:], False))
            break
        if start < 0 or end < start or text.find(opening, start + 1, end) >= 0:
            raise FrinkError(
                "a message holds the text of a control token and the chat template rewrites "
                "message content, so that text cannot be kept apart from the template's own "
                "markers; remove it from the message (or let control tokens in content act as "
                "such: frink serve --parse-special)"
            )
        segments.append((text[at:start], False))
        segments.append((text[start + len(opening) : end], True))
        at = end + len(closing)
    controls = tok.control_texts
    pieces: list[str | int] = []  # plain text runs and the template's control token ids
    run: list[str] = []
    for segment, is_content in segments:
        if is_content:
            run.append(segment)
            continue
        for part in _split_controls(tok, segment, controls):
            if isinstance(part, int):
                pieces.append("".join(run))
                run = []
                pieces.append(part)
            else:
                run.append(part)
    pieces.append("".join(run))
    ids: list[int] = []
    for p in pieces:
        if isinstance(p, int):
            ids.append(p)
        elif p:
            ids.extend(tok.encode(p, add_special=False, parse_special=False))
    # BOS as Tokenizer.encode adds it: per the model's policy, unless already first.
    if tok.add_bos and tok.bos_id is not None and not (ids and ids[0] == tok.bos_id):
        ids.insert(0, tok.bos_id)
    if tok.add_eos and tok.eos_id is not None and not (ids and ids[-1] == tok.eos_id):
        ids.append(tok.eos_id)
    return ids


def _split_controls(tok: Tokenizer, text: str, controls: tuple[str, ...]) -> list[str | int]:
    """`text` cut at the control tokens it spells (the longest at each place, as the
    tokenizer's own partition takes them): plain pieces and control token ids."""
    found = [c for c in controls if c in text]
    out: list[str | int] = []
    at = 0
    while found:
        best: tuple[int, int, str] | None = None  # (position, -length, spelling)
        for c in found:
            i = text.find(c, at)
            if i >= 0 and (best is None or (i, -len(c)) < best[:2]):
                best = (i, -len(c), c)
        if best is None:
            break
        i, _, c = best
        token = tok.token_id(c)
        if token is None:  # (every control spelling is a vocabulary entry)
            break
        if i > at:
            out.append(text[at:i])
        out.append(token)
        at = i + len(c)
    if at < len(text):
        out.append(text[at:])
    return out


_PROBE_TOOL = "frink_probe_tool_4f1c"


@lru_cache(maxsize=8)
def _renders_tools(template: str) -> bool:
    probe = {
        "type": "function",
        "function": {"name": _PROBE_TOOL, "description": "", "parameters": {"type": "object"}},
    }
    try:
        text = render_chat(
            template,
            [{"role": "user", "content": "hi"}],
            bos_token="",
            eos_token="",
            tools=[probe],
        )
    except FrinkError:
        return False
    return _PROBE_TOOL in text


def renders_tools(tok: Tokenizer) -> bool:
    """Whether the model's own chat template shows the model the tools it is given (as
    llama.cpp finds out: render it with a tool and look for the tool's name)."""
    return bool(tok.chat_template) and _renders_tools(tok.chat_template)
