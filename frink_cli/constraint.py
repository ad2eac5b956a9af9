"""The constraint mask stage: which tokens a grammar allows next, through llguidance.

Why it exists: an agent or an extraction job needs output that parses (JSON matching a
schema, a tool call, a grammar's language). Filtering text after the fact cannot make a
model produce that; masking its choices token by token can. Every input form (a JSON
schema, `json_object`, Lark, llama.cpp's GBNF, a regex) becomes one llguidance grammar
and goes through the one path below, and the sampler sees the mask as a set of allowed
token ids before any of its stages, so every sampler setting works on the allowed tokens.

llguidance's tokenizer is built from frink's own (never from a hub): each token's bytes,
the end-of-generation ids as its EOS set, and control tokens (those that add no bytes to
text) marked special, so free text can never produce `<|im_end|>` and friends.

Grammars are untrusted input: their text is capped (GRAMMAR_MAX_BYTES; a 100k-branch
alternation takes llguidance tens of seconds), llguidance's own fuel limits bound the
lexer and parser, nesting past its recursion limit is refused, and every failure is a
GrammarError of one line naming the problem, never a hang or a traceback.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import FrinkError

if TYPE_CHECKING:
    import llguidance
    from llguidance._lib import JsonCompileOptions

    from .tokenizer import Tokenizer

# The most bytes of grammar, regex or serialized schema one request may send.
GRAMMAR_MAX_BYTES = 256 << 10
# Kinds of constraint; "json_object" is any JSON object (OpenAI's response_format).
KINDS = ("json_schema", "json_object", "lark", "gbnf", "regex")


class GrammarError(FrinkError):
    """A schema or grammar that cannot be compiled or enforced; `field` names what the
    user sent it as (the CLI flag or the API field) for the message."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


@dataclass(frozen=True)
class Grammar:
    """A constraint as the user gave it: its kind, its text (a JSON schema as JSON text)
    and the name it came under (`--json-schema`, `response_format`, ...) for errors."""

    kind: str
    text: str
    field: str = "grammar"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r}")

    @staticmethod
    def json_schema(schema: Any, field: str = "json_schema") -> Grammar:
        """A JSON schema given as an object or as JSON text."""
        if isinstance(schema, str):
            text = schema
        else:
            try:
                text = json.dumps(schema)
            except (TypeError, ValueError, RecursionError) as e:
                raise GrammarError(field, f"is not a JSON schema ({_one_line(e)})") from None
        return Grammar("json_schema", text, field)

    def llguidance(self) -> str:
        """The llguidance grammar (its JSON form) for this constraint, checked to compile
        (without a tokenizer); GrammarError when it does not."""
        import llguidance as llg

        if len(self.text.encode("utf-8", "surrogatepass")) > GRAMMAR_MAX_BYTES:
            raise GrammarError(self.field, f"is larger than {GRAMMAR_MAX_BYTES} bytes")
        try:
            if self.kind == "json_schema":
                schema = json.loads(self.text)
                if not isinstance(schema, (dict, bool)):
                    raise GrammarError(self.field, "a JSON schema must be an object")
                grammar = llg.LLMatcher.grammar_from_json_schema(self.text, _JSON_OPTIONS)
            elif self.kind == "json_object":
                grammar = llg.LLMatcher.grammar_from_json_schema('{"type": "object"}')
            elif self.kind == "lark":
                grammar = llg.LLMatcher.grammar_from_lark(self.text)
            elif self.kind == "gbnf":
                # llguidance converts GBNF to Lark (and takes Lark as it is).
                grammar = llg.grammar_from("gbnf", self.text)
            else:
                grammar = llg.LLMatcher.grammar_from_regex(self.text)
        except GrammarError:
            raise
        except RecursionError:
            raise GrammarError(self.field, "is nested too deeply") from None
        except Exception as e:  # noqa: BLE001 - the converters' errors on untrusted text
            raise GrammarError(self.field, _one_line(e)) from None
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(
            grammar, None, limits=_limits()
        )
        if failed:
            raise GrammarError(self.field, _one_line(messages[0] if messages else "invalid"))
        return grammar


# Whitespace as JSON allows it, but bounded: a model that keeps emitting newlines inside
# an object would otherwise never have to end it.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,8}"}


def lark_json(schema: Any) -> str:
    """A Lark rule body `%json {...}` for `schema`, with the JSON options every schema
    here gets (bounded whitespace): inside Lark, llguidance reads them from the schema's
    "x-guidance" key."""
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": _JSON_OPTIONS}
    return "%json " + json.dumps(schema)


def _limits() -> llguidance.LLParserLimits:
    import llguidance as llg

    # llguidance's defaults bound each step's lexer fuel and Earley items; errors say
    # what they are about without echoing the grammar back.
    return llg.LLParserLimits(verbose_errors=False)


def _one_line(e: object) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# --- llguidance's view of frink's vocabulary ----------------------------------------------

_TOKENIZERS: weakref.WeakKeyDictionary[Tokenizer, llguidance.LLTokenizer] = (
    weakref.WeakKeyDictionary()
)
_TOKENIZERS_LOCK = threading.Lock()


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads: token bytes, EOS/BOS, special ids, and a
    byte-string tokenizer (frink's own, special tokens read as text)."""

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else min(tok.eog_ids, default=0)
        self.bos_token_id = tok.bos_id
        tokens: list[bytes] = []
        special: list[int] = []
        for i in range(tok.n_vocab):
            raw = tok.token_bytes(i)
            if raw:
                tokens.append(raw)
                continue
            # A token that adds no bytes to text: a control token (or an unused slot). The
            # 0xff prefix is llguidance's mark of a special token; free text never holds
            # that byte, so such tokens are allowed only where a grammar names them.
            name = tok.token_text(i) or f"<[{i}]>"
            tokens.append(b"\xff" + name.encode("utf-8", "surrogateescape"))
            special.append(i)
        self.tokens = tokens
        self.special_token_ids = special
        self._by_bytes: dict[bytes, int] = {}

    def __call__(self, text: bytes) -> list[int]:
        """Tokens spelling exactly `text` (llguidance forces them): frink's own tokenization
        where it does, else the longest token at each byte (an SPM vocabulary's space
        prefix would otherwise put a space the grammar does not allow in front)."""
        ids = self._tok.encode(
            text.decode("utf-8", errors="replace"), add_special=False, parse_special=False
        )
        if b"".join(self.tokens[i] for i in ids) == text:
            return ids
        if not self._by_bytes:
            special = set(self.special_token_ids)
            for i, raw in enumerate(self.tokens):
                if i not in special:
                    self._by_bytes.setdefault(raw, i)
        longest = max(map(len, self._by_bytes))
        out, at = [], 0
        while at < len(text):
            for n in range(min(longest, len(text) - at), 0, -1):
                found = self._by_bytes.get(text[at : at + n])
                if found is not None:
                    out.append(found)
                    break
            at += n  # a byte no token spells is skipped: the matcher then reports it
        return out


def ll_tokenizer(tok: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for `tok`, built once per Tokenizer (a second or two for a
    262k vocabulary) and shared by every constraint on it."""
    import llguidance as llg

    with _TOKENIZERS_LOCK:
        found = _TOKENIZERS.get(tok)
        if found is None:
            eos = sorted(tok.eog_ids) or [_Vocabulary(tok).eos_token_id]
            found = llg.LLTokenizer(
                llg.TokenizerWrapper(_Vocabulary(tok)), n_vocab=tok.n_vocab, eos_token=eos
            )
            _TOKENIZERS[tok] = found
        return found


# --- one sequence's constraint ----------------------------------------------------------


class Constraint:
    """One sequence's grammar state: the tokens allowed next, advanced token by token.

    Contract: call allowed() before each sample, then accept(token) with the token that
    was sampled from those allowed (an end-of-generation token included). `finished` is
    true once the grammar can only end: generation stops there without asking the model.

    With `triggers` (llama.cpp's lazy grammar), generation is free until the text holds
    one of them; the grammar then applies from that trigger on (the trigger's own text
    is fed to it first, so the grammar spells the trigger too), and when the grammar is
    done the constraint waits for a trigger again (several tool calls in one answer).
    """

    def __init__(
        self,
        tok: Tokenizer,
        grammar: str | llguidance.LLMatcher,
        field: str = "grammar",
        triggers: Sequence[str] = (),
    ) -> None:
        import llguidance as llg
        from llguidance.numpy import fill_next_token_bitmask

        self._tok = tok
        n = tok.n_vocab
        self._n_vocab = n
        self._bits = np.zeros((1, (n + 31) // 32), dtype=np.int32)
        if isinstance(grammar, str):
            grammar = llg.LLMatcher(ll_tokenizer(tok), grammar, limits=_limits(), log_level=0)
            # A grammar that compiles yet derives no string (root ::= x, x ::= x) fails on
            # its first mask: computed here, so it is refused before generation starts.
            if not grammar.is_error():
                fill_next_token_bitmask(grammar, self._bits)
        self._matcher = grammar
        if self._matcher.is_error():
            raise GrammarError(field, _one_line(self._matcher.get_error()))
        self.field = field
        self.triggers = tuple(t.encode() for t in triggers)
        self._active = not self.triggers
        self._seen = b""  # text since the last grammar ended, while waiting for a trigger

    def copy(self) -> Constraint:
        """An independent constraint in this one's state (another sequence's)."""
        triggers = [t.decode() for t in self.triggers]
        out = Constraint(self._tok, self._matcher.deep_copy(), self.field, triggers)
        out._active, out._seen = self._active, self._seen
        return out

    @property
    def active(self) -> bool:
        """Whether the grammar constrains the next token (a lazy one: after its trigger)."""
        return self._active

    @property
    def finished(self) -> bool:
        """The grammar can only end: nothing but end-of-generation may follow."""
        return not self.triggers and self._matcher.is_stopped()

    def allowed(self) -> np.ndarray | None:
        """A bool row over the vocabulary of the tokens allowed next (None: any token)."""
        if not self._active:
            return None
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self._matcher, self._bits)
        if self._matcher.is_error():
            raise GrammarError(self.field, _one_line(self._matcher.get_error()))
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._n_vocab]
        return bits.view(bool)

    def accept(self, token: int) -> None:
        """Advance past `token` (which allowed() allowed)."""
        if not self._active:
            self._wait_for_trigger(token)
        elif not self._matcher.consume_token(int(token)):
            raise GrammarError(self.field, _one_line(self._matcher.get_error() or "rejected"))
        if self.triggers and self._active and self._matcher.is_stopped():
            self._matcher.reset()
            self._active, self._seen = False, b""

    def _wait_for_trigger(self, token: int) -> None:
        tok = self._tok
        self._seen += tok.token_bytes(int(token)) or tok.token_text(int(token)).encode()
        found = [at for at in (self._seen.find(t) for t in self.triggers) if at >= 0]
        if not found:
            self._seen = self._seen[-max(map(len, self.triggers)) :]
            return
        text = self._seen[min(found) :].decode("utf-8", "replace")
        self._active, self._seen = True, b""
        # The trigger and anything after it, fed to the grammar (any tokenization of the
        # same bytes is the same to it).
        ids = tok.encode(text, add_special=False, parse_special=True)
        if self._matcher.try_consume_tokens(ids) != len(ids):
            raise GrammarError(self.field, "the text after the trigger does not match")


def compile_constraint(
    tok: Tokenizer, grammar: Grammar, triggers: Sequence[str] = (), copies: int = 1
) -> list[Constraint]:
    """`copies` independent constraints for `grammar` on `tok`'s vocabulary (one per
    sequence), lazy when `triggers` are given; GrammarError when it does not compile or
    llguidance cannot enforce it."""
    first = Constraint(tok, grammar.llguidance(), grammar.field, triggers)
    return [first] + [first.copy() for _ in range(copies - 1)]


def allowed_ids(allowed: np.ndarray) -> Sequence[int]:
    """The ids a mask row allows (for tests and diagnostics)."""
    return np.flatnonzero(allowed).tolist()
