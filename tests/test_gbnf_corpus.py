"""llama.cpp's own GBNF grammars (grammars/*.gbnf in the llama-cpp-python sdist) through
frink's constraint stage, each output checked by llama.cpp's grammar engine.

What is checked, and against whom:
- every grammar of the corpus compiles through `compile_constraint` (none is refused: if
  llguidance ever cannot convert one, REFUSED pins the one-line refusal naming the
  construct, and the test asserts it instead of generating);
- a few sampled outputs per grammar on the real SmolLM2 (seeded, temperature 1.0, a short
  budget: an output the budget cuts is fine as long as every token was accepted) are fed
  token by token to llama.cpp's grammar sampler (`llama_sampler_init_grammar` over the
  vocabulary of the same GGUF, loaded vocab_only): each of frink's tokens must survive
  llama.cpp's mask, and at the end llama.cpp must allow end-of-generation wherever
  frink's constraint does (an output that finished: always). Not the converse: llguidance
  lexes greedily, so arithmetic.gbnf's `num ::= [0-9]+ ws` then "\n" never ends after
  "6 \n\n" (ws has taken both newlines), where llama.cpp's backtracking parser can;
- at every step of those outputs, every token frink's mask allows, llama.cpp's allows too,
  except two kinds llama.cpp's engine cannot judge: a token ending inside a multi-byte
  character (refused wherever a negated character class excludes any character the
  partial one could still become: list.gbnf's [^...\\u2028\\u2029] refuses " \\xe2", where
  llguidance looks at the bytes that could follow) and a token starting with a NUL byte
  (llama.cpp reads its text as a C string: always refused, though [^\\r\\n...] takes it).
llguidance is never its own judge here.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

from frink_cli.api import load
from frink_cli.constraint import Grammar, GrammarError, compile_constraint
from frink_cli.generate import GenerationStats

pytestmark = pytest.mark.real

llama_cpp = pytest.importorskip("llama_cpp")

# Every grammar llama-cpp-python 0.3.36's sdist ships (test_the_corpus_is_every_grammar
# holds this list to the directory), with a prompt that gives the model a reason to end.
PROMPTS = {
    "arithmetic": "Write one arithmetic expression, such as 2*(3+4).",
    "c": "Write a tiny C function.",
    "chess": "Write the first moves of a chess game in algebraic notation.",
    "english": "Say hello in one short sentence.",
    "japanese": "Say hello in Japanese.",
    "json": "Describe a cat as a small JSON object.",
    "json_arr": "Give a JSON array of three numbers.",
    "list": "List two fruits.",
}
# Grammars llguidance cannot convert: name -> the refusal's text (none in this corpus).
REFUSED: dict[str, str] = {}
SEEDS = (0, 1, 2)
MAX_TOKENS = 32

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)


@pytest.fixture(scope="module")
def grammars() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import llama_cpp_converter

    return llama_cpp_converter.ensure_converter() / "grammars"


@pytest.fixture(scope="module")
def model(smollm2_path):
    return load(smollm2_path)


@pytest.fixture(scope="module")
def vocab(smollm2_path):
    llm = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    yield llama_cpp.llama_model_get_vocab(llm.model)
    llm.close()


def test_the_corpus_is_every_grammar(grammars):
    assert sorted(p.stem for p in grammars.glob("*.gbnf")) == sorted(PROMPTS)


class LlamaGrammar:
    """llama.cpp's grammar sampler for one output: which tokens it leaves unmasked, and
    advancing it past a token (only ever one it allowed: llama.cpp aborts the process on
    accepting a token its grammar cannot take)."""

    def __init__(self, vocab, text: str) -> None:
        self._smpl = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        assert self._smpl, "llama.cpp could not parse the grammar"
        self.eos = llama_cpp.llama_vocab_eos(vocab)

    def allows(self, tokens) -> np.ndarray:
        """A bool per token of `tokens`: not masked to -inf by the grammar."""
        data = np.zeros(len(tokens), _TOKEN_DATA)
        data["id"] = tokens
        arr = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
            size=len(tokens),
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(arr))
        return np.isfinite(data["logit"])

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._smpl, token)

    def free(self) -> None:
        llama_cpp.llama_sampler_free(self._smpl)


def _unjudged(raw: bytes) -> bool:
    """Whether llama.cpp's grammar engine cannot judge a token of bytes `raw` (the module's
    docstring): it starts with NUL or ends inside a UTF-8 sequence."""
    if raw[:1] == b"\0":
        return True
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 == 0x80:
            continue
        need = 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4 if byte >> 3 == 30 else 1
        return need > back
    return False


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_outputs_are_accepted_by_llama_cpps_grammar(grammars, model, vocab, name):
    text = (grammars / f"{name}.gbnf").read_text()
    tok = model.tokenizer
    if name in REFUSED:
        with pytest.raises(GrammarError, match=REFUSED[name]):
            compile_constraint(tok, Grammar("gbnf", text))
        return
    unjudged = np.array([_unjudged(tok.token_bytes(i)) for i in range(tok.n_vocab)])
    eog = sorted(tok.eog_ids)
    prompt = model.prompt_ids(PROMPTS[name])
    for seed in SEEDS:
        c = compile_constraint(tok, Grammar("gbnf", text))[0]
        stats = GenerationStats()
        ids = model.generate_ids(
            prompt, max_tokens=MAX_TOKENS, temperature=1.0, seed=seed, stats=stats, constraint=c
        )
        out = list(ids)
        said = f"{name} seed {seed}: {tok.decode(out)!r}"
        ref = LlamaGrammar(vocab, text)
        # frink's mask along the same path, from a fresh constraint (c has moved on).
        replay = compile_constraint(tok, Grammar("gbnf", text))[0]
        try:
            for k, token in enumerate(out):
                allowed = replay.allowed()
                assert allowed is not None and allowed[token], said
                mask = np.flatnonzero(allowed & ~unjudged)
                refused = mask[~ref.allows(mask)]
                assert not refused.size, f"{said}: llama.cpp masks {refused[:5]} at token {k}"
                assert ref.allows([token])[0], f"{said}: llama.cpp masks token {k} ({token})"
                ref.accept(token)
                replay.accept(token)
            last = c.allowed()
            assert last is not None
            ends = bool(last[eog].any())
            assert ends or stats.stop_reason == "length", said
            if ends:
                assert ref.allows([ref.eos])[0], f"{said}: {stats.stop_reason}"
        finally:
            ref.free()


def test_llama_cpps_grammar_masks_what_it_should(grammars, model, vocab):
    """The acceptor is not vacuous: under json.gbnf llama.cpp allows "{" first, not "x"
    nor end-of-generation."""
    tok = model.tokenizer
    ids = [tok.encode(t, add_special=False, parse_special=False)[0] for t in ("{", "x")]
    ref = LlamaGrammar(vocab, (grammars / "json.gbnf").read_text())
    try:
        assert ref.allows([*ids, ref.eos]).tolist() == [True, False, False]
    finally:
        ref.free()
