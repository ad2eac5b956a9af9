"""A chat template rendered as transformers renders it, in a bounded sandbox.

Templates come from whoever published the model file, so they are untrusted code: they
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
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import FrinkError

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


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
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


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    """`template` compiled in a sandboxed environment of its own, every filter and global
    bounded by the render's cap; jinja2's TemplateSyntaxError if it does not parse."""
    env = _Env(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.filters = {k: _bounded(f) for k, f in env.filters.items()}
    bounded_format = env.filters["format"]

    def format_filter(value: Any, *args: Any, **kwargs: Any) -> Any:
        # `"%999999999s"|format(x)`: the filter's own % builds the string in one C call.
        if isinstance(value, str):
            _check_format(value, star=True)
        return bounded_format(value, *args, **kwargs)

    env.filters["format"] = format_filter
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
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
