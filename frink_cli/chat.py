"""Chat templates -> prompt text -> prompt ids.

Why this module exists: instruction-tuned models only behave when the prompt is laid out
the way they were trained, and that layout ships as a Jinja template inside the model
file. Templates come from whoever published the file, so they are untrusted code: they
are rendered in Jinja's immutable sandbox, with the same helpers and options transformers'
apply_chat_template provides (trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`,
`strftime_now`, a non-HTML-escaping `tojson`, a `{% generation %}` block), and any reach for
Python internals (underscore attributes, mutating the inputs) stops the render with a
FrinkError instead of quietly rendering as an empty string.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import FrinkError
from .resources import config_file

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

log = logging.getLogger("frink")

_TEMPLATES_DIR = config_file("chat_templates")


@lru_cache(maxsize=1)
def _fallbacks() -> list[dict]:
    table = json.loads((_TEMPLATES_DIR / "fallbacks.json").read_text())["fallbacks"]
    return [{**f, "template": (_TEMPLATES_DIR / f["file"]).read_text()} for f in table]


def fallback_template(tok: "Tokenizer") -> tuple[str, str] | None:
    """(name, template) of the first fallback whose markers the vocabulary has, or None."""
    for f in _fallbacks():
        if all(tok.token_id(m) is not None for m in f["markers"]):
            return f["name"], f["template"]
    return None


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Env(ImmutableSandboxedEnvironment):
        # The stock sandbox answers an unsafe attribute with an Undefined that renders as ""
        # and only fails when used further; a template probing for internals is refused now.
        def unsafe_undefined(self, obj: Any, attribute: Any) -> Any:
            raise SecurityError(
                f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    class _Generation(jinja2.ext.Extension):
        # transformers' `{% generation %}...{% endgeneration %}` marks assistant text for
        # training masks; for inference it is just its body.
        tags: ClassVar[set[str]] = {"generation"}

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
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"namespace attribute {name!r} is not allowed")

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        # Jinja's own tojson HTML-escapes; templates expect plain JSON, as transformers gives
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = _Env(trim_blocks=True, lstrip_blocks=True,
               extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = lambda *a, **k: dict(*a, **k)
    return env.from_string(template)


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg if len(msg) <= 300 else msg[:297] + "..."


def render_chat(template: str, messages: list[dict], *, bos_token: str | None,
                eos_token: str | None, add_generation_prompt: bool = True) -> str:
    """The prompt text `template` makes of `messages`, rendered the way transformers does."""
    from jinja2.exceptions import SecurityError, TemplateSyntaxError

    try:
        compiled = _compile(template)
    except TemplateSyntaxError as e:
        raise FrinkError(
            f"chat template does not parse (line {e.lineno}): {_one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - the template is untrusted input
        raise FrinkError(f"chat template does not parse: {_one_line(e)}") from None
    try:
        return compiled.render(
            messages=[dict(m) for m in messages],
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
        )
    except SecurityError as e:
        raise FrinkError(f"chat template refused by the sandbox: {_one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - raise_exception() and any template bug
        raise FrinkError(f"chat template failed: {_one_line(e)}") from None


def prompt_ids(tok: Tokenizer, prompt: str, *, system: str | None = None, raw: bool = False,
               notes: list[str] | None = None) -> list[int]:
    """The ids a prompt becomes: raw text, or one user turn through the chat template.

    Chat prompts are tokenized with special tokens parsed (the template writes them as
    text) and BOS added per the model's policy unless the rendered text already starts
    with it (as llama.cpp's chat path does).

    With no chat template llama.cpp falls back to ChatML. frink uses a fallback format
    (configs/chat_templates/fallbacks.json: ChatML, Gemma's turns) only when the vocabulary
    has its marker tokens; otherwise they would be tokenized as plain text the model never
    saw in training, so the prompt goes in raw and a note says so (appended to `notes`
    when given, else logged on the "frink" logger).
    """
    if raw:
        return tok.encode(prompt)
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
            return tok.encode(prompt)
    messages: list[dict] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    text = render_chat(template, messages, bos_token=tok.bos_text, eos_token=tok.eos_text,
                       add_generation_prompt=True)
    # Tokenizer.encode leaves BOS out when the text starts with the BOS token itself.
    return tok.encode(text, add_special=True, parse_special=True)
