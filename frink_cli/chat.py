"""Chat templates -> prompt text -> prompt ids.

Why this module exists: instruction-tuned models only behave when the prompt is laid out
the way they were trained, and that layout ships as a Jinja template inside the model
file. Templates come from whoever published the file, so they are untrusted code: they
are rendered in Jinja's immutable sandbox, with the same helpers and options transformers'
apply_chat_template provides (trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`,
`strftime_now`, a non-HTML-escaping `tojson`, a `{% generation %}` block), and any reach for
Python internals (underscore attributes, mutating the inputs) stops the render with a
FrinkError instead of quietly rendering as an empty string.

Rendering is also bounded, because a template can loop or grow without end: every value
it builds (string repetition, concatenation, formatting, filter and method results) and
its output are capped at what the context can hold (`max_chars`), and a render that runs
past TEMPLATE_SECONDS is stopped (_deadline: an exception raised in the rendering thread,
since a template loop may produce no output for a streaming check to see).
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from .errors import FrinkError
from .resources import config_file

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

log = logging.getLogger("frink")

_TEMPLATES_DIR = config_file("chat_templates")

# Real templates render in milliseconds; seconds mean a loop meant to hang.
TEMPLATE_SECONDS = 5.0
# The cap on any value a template builds when the caller gives no context to size it by.
DEFAULT_MAX_CHARS = 1 << 22
# The cap of the render in progress (a template is compiled once and rendered with many).
_cap: contextvars.ContextVar[int] = contextvars.ContextVar(
    "chat_template_cap", default=DEFAULT_MAX_CHARS
)
# A %-format width or precision: "%999999999s" would build a huge string in one step.
# (a mapping key, "%(name)9s", is skipped: its letters would end the spec early)
_FORMAT_NUMBER = re.compile(r"%(?:\([^)]*\))?([^a-zA-Z%(]*)")
_DIGITS = re.compile(r"\d+")


class _TooBig(Exception):
    pass


class _TemplateTimeout(BaseException):
    """Raised into the rendering thread at the deadline; a BaseException so that no
    `except Exception` inside Jinja or a filter can swallow it."""


def _check_size(value: Any) -> Any:
    """`value` itself, unless it is a string or container longer than the render's cap."""
    if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > _cap.get():
        raise _TooBig
    return value


def _check_ints(args: tuple, kwargs: dict) -> None:
    # A width, count or indent beyond the cap (center(10**9), indent(10**9)) can only
    # build a value beyond it; refuse before the allocation, not after.
    cap = _cap.get()
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > cap:
            raise _TooBig


def _check_format(fmt: str, star: bool) -> None:
    # A width or precision in a format string ("%999999999s", "{:>999999999}") builds a
    # string that large in one C call: refuse any number in the format beyond the cap.
    cap = _cap.get()
    for spec in _FORMAT_NUMBER.findall(fmt) if star else [fmt]:
        if (star and "*" in spec) or any(
            len(n) > 18 or int(n) > cap for n in _DIGITS.findall(spec)
        ):
            raise _TooBig


def _bounded(f: Callable) -> Callable:
    """A filter or global whose arguments and result are checked against the cap."""

    @functools.wraps(f)  # keeps jinja_pass_arg (pass_context, pass_environment)
    def call(*args: Any, **kwargs: Any) -> Any:
        _check_ints(args, kwargs)
        return _check_size(f(*args, **kwargs))

    return call


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


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    import jinja2
    import jinja2.compiler
    import jinja2.ext
    import jinja2.nodes
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _CodeGen(jinja2.compiler.CodeGenerator):
        # `a ~ b` compiles to a join the sandbox never sees; route it through a size check.
        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class _Env(ImmutableSandboxedEnvironment):
        code_generator_class = _CodeGen
        # Operators that can build a value far larger than their operands.
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        # The stock sandbox answers an unsafe attribute with an Undefined that renders as ""
        # and only fails when used further; a template probing for internals is refused now.
        def unsafe_undefined(self, obj: Any, attribute: Any) -> Any:
            raise SecurityError(
                f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
            )

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            cap = _cap.get()
            sized = (str, bytes, list, tuple)
            if operator == "*" and isinstance(right, sized) and isinstance(left, int):
                left, right = right, left
            if operator == "*" and isinstance(left, sized) and isinstance(right, int):
                if len(left) * max(right, 0) > cap:
                    raise _TooBig
            elif operator == "+" and isinstance(left, sized) and isinstance(right, sized):
                if len(left) + len(right) > cap:
                    raise _TooBig
            elif (
                operator == "**"
                and isinstance(right, int)
                and abs(right) > 1024
                and (isinstance(left, int) and abs(left) > 1)
            ):
                raise _TooBig  # an integer of millions of digits, computed in C
            elif operator == "%" and isinstance(left, str):
                _check_format(left, star=True)
            return _check_size(super().call_binop(context, operator, left, right))

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            _check_ints(args, kwargs)
            return _check_size(super().call(context, obj, *args, **kwargs))

        def wrap_str_format(self, value: Any) -> Any:
            # Where the sandbox hands out str.format (at attribute access, not at the call).
            receiver = getattr(value, "__self__", None)
            if isinstance(receiver, str) and getattr(value, "__name__", "") in (
                "format",
                "format_map",
            ):
                _check_format(receiver, star=False)
            return super().wrap_str_format(value)

        def concat(self, parts: Iterable[Any]) -> str:
            pieces = [p if isinstance(p, str) else str(p) for p in parts]
            if sum(map(len, pieces)) > _cap.get():
                raise _TooBig
            return "".join(pieces)

    class _Generation(jinja2.ext.Extension):
        # transformers' `{% generation %}...{% endgeneration %}` marks assistant text for
        # training masks; for inference it is just its body.
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            node = jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body)
            return node.set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class _Namespace(jinja2.utils.Namespace):
        # namespace() objects are writable; keep templates from planting dunder attributes
        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: any kwarg name
            self, rest = args[0], args[1:]
            for name in dict(*rest, **kwargs):
                _Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, *rest, **kwargs)

        def __setitem__(self, name: str, value: Any) -> None:
            _Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, _check_size(value))

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"namespace attribute {name!r} is not allowed")

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        # Jinja's own tojson HTML-escapes; templates expect plain JSON, as transformers gives
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = _Env(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.filters = {k: _bounded(f) for k, f in env.filters.items()}
    bounded_format = env.filters["format"]

    def format_filter(value: Any, *args: Any, **kwargs: Any) -> Any:
        # `"%999999999s"|format(x)`: the filter's own % builds the string in one C call.
        if isinstance(value, str):
            _check_format(value, star=True)
        return bounded_format(value, *args, **kwargs)

    env.filters["format"] = format_filter
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = lambda *a, **k: dict(*a, **k)
    return env.from_string(template)


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg if len(msg) <= 300 else msg[:297] + "..."


def render_chat(
    template: str,
    messages: list[dict],
    *,
    bos_token: str | None,
    eos_token: str | None,
    add_generation_prompt: bool = True,
    max_chars: int | None = None,
    tools: list[dict] | None = None,
) -> str:
    """The prompt text `template` makes of `messages`, rendered the way transformers does.

    tools: OpenAI function tools, passed to the template as apply_chat_template(tools=...)
    passes them. max_chars caps the output and every value the template builds
    (DEFAULT_MAX_CHARS when None); the render stops after TEMPLATE_SECONDS.
    """
    from jinja2.exceptions import SecurityError, TemplateSyntaxError

    try:
        compiled = _compile(template)
    except TemplateSyntaxError as e:
        raise FrinkError(
            f"chat template does not parse (line {e.lineno}): {_one_line(e)}"
        ) from None
    except Exception as e:  # noqa: BLE001 - the template is untrusted input
        raise FrinkError(f"chat template does not parse: {_one_line(e)}") from None
    cap = DEFAULT_MAX_CHARS if max_chars is None else max_chars
    token = _cap.set(cap)
    try:
        with _deadline(TEMPLATE_SECONDS):
            return _collect(
                compiled.generate(
                    messages=[dict(m) for m in messages],
                    tools=tools or None,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=bos_token or "",
                    eos_token=eos_token or "",
                ),
                cap,
            )
    except _TemplateTimeout:
        raise FrinkError(
            f"chat template took longer than {TEMPLATE_SECONDS:g} s to render (stopped)"
        ) from None
    except (_TooBig, MemoryError, OverflowError):
        raise FrinkError(
            f"chat template output (or a value it builds) exceeds {cap} characters"
            + (", more than the context can hold" if max_chars is not None else "")
        ) from None
    except SecurityError as e:
        raise FrinkError(f"chat template refused by the sandbox: {_one_line(e)}") from None
    except RecursionError:
        raise FrinkError("chat template recursed too deeply") from None
    except Exception as e:  # noqa: BLE001 - raise_exception() and any template bug
        raise FrinkError(f"chat template failed: {_one_line(e)}") from None
    finally:
        _cap.reset(token)


def _collect(chunks: Iterator[str], cap: int) -> str:
    out: list[str] = []
    n = 0
    for chunk in chunks:
        n += len(chunk)
        if n > cap:
            raise _TooBig
        out.append(chunk)
    return "".join(out)


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise _TemplateTimeout in this thread if the block runs longer than `seconds`.

    CPython delivers an asynchronous exception at the thread's next bytecode, so a render
    stuck in template loops stops within milliseconds of the deadline. Where the C API is
    not there (other interpreters) the block runs unbounded in time.
    """
    try:
        import ctypes

        set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    except (ImportError, AttributeError):
        yield
        return
    tid = ctypes.c_ulong(threading.get_ident())
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    def fire() -> None:
        with lock:
            if not state["done"]:
                state["fired"] = True
                set_async_exc(tid, ctypes.py_object(_TemplateTimeout))

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            state["done"] = True
        timer.cancel()
        if state["fired"]:
            set_async_exc(tid, None)  # not yet delivered: withdraw it


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
        text = render_chat(
            template,
            messages,
            bos_token=tok.bos_text,
            eos_token=tok.eos_text,
            add_generation_prompt=True,
            max_chars=limit,
            tools=tools,
        )
        # Tokenizer.encode leaves BOS out when the text starts with the BOS token itself.
        return tok.encode(text, add_special=True, parse_special=True)
    return _content_as_text(tok, template, messages, limit, tools)


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
    text = render_chat(
        template,
        marked,
        bos_token=tok.bos_text,
        eos_token=tok.eos_text,
        add_generation_prompt=True,
        max_chars=None if limit is None else limit + 64 * len(messages),
        tools=tools,
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
