"""The constraint mask stage (frink_cli/constraint.py) on real vocabularies.

What is checked, and against whom:
- llguidance's tokenizer built from frink's vocabulary spells every token as llama.cpp's
  own vocabulary does (llguidance's llama.cpp bridge over llama-cpp-python, same file),
  and keeps the same tokens out of free text;
- outputs under a JSON schema (random walks through the mask and the model's samples)
  validate with `jsonschema`; under a regex they match Python's `re`;
- bad schemas and grammars are refused with one line naming the problem.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from grammar_walks import random_walks

from frink_cli.api import load
from frink_cli.archs import open_checkpoint
from frink_cli.constraint import (
    GRAMMAR_MAX_BYTES,
    Grammar,
    GrammarError,
    compile_constraint,
    ll_tokenizer,
)
from frink_cli.errors import FrinkError
from frink_cli.generate import GenerationStats
from frink_cli.sampling import Sampler, SamplingParams
from frink_cli.tokenizer import load_tokenizer

pytestmark = pytest.mark.real

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "height": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 2.5},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "integer", "minimum": 0, "maximum": 99999},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "height", "role", "tags", "address"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request, smollm2_path, gemma3_path):
    return load(smollm2_path if request.param == "smollm2" else gemma3_path)


def test_vocabulary_is_llama_cpps(smollm2_path, gemma3_path):
    """Every token's bytes as llguidance reads them from llama.cpp's own vocabulary of the
    same file; every control token special (out of free text) there too. (llguidance's
    llama.cpp bridge also marks user-defined tokens spelled <...> special, e.g. Gemma's
    "<table>"; frink keeps them as the text they decode to.)"""
    llama_cpp = pytest.importorskip("llama_cpp")
    from llguidance.llamacpp import lltokenizer_from_vocab

    for path in (smollm2_path, gemma3_path):
        tok = load_tokenizer(open_checkpoint(path))
        ours = ll_tokenizer(tok)
        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        theirs = lltokenizer_from_vocab(llama_cpp.llama_model_get_vocab(llm.model))
        assert ours.vocab_size == theirs.vocab_size == tok.n_vocab
        differ = [
            i
            for i in range(tok.n_vocab)
            if (ours.is_special_token(i) and not theirs.is_special_token(i))
            or (not ours.is_special_token(i) and ours.decode_bytes([i]) != theirs.decode_bytes([i]))
        ]
        assert not differ, f"{path.name}: {len(differ)} tokens differ, first {differ[:5]}"
        assert set(ours.eos_tokens) == set(tok.eog_ids)


def _samples(model, prompt: str, n: int, temperature=1.0, **constraint) -> list[tuple[str, str]]:
    """n sampled answers (seeds 0..n-1, at most 400 tokens each) with why each stopped."""
    outs = []
    for seed in range(n):
        stats = GenerationStats()
        text = "".join(
            model.generate(
                prompt,
                max_tokens=400,
                temperature=temperature,
                seed=seed,
                stats=stats,
                **constraint,
            )
        )
        outs.append((text, stats.stop_reason))
    return outs


def _generate(model, prompt: str, n: int, temperature=1.0, **constraint) -> list[str]:
    """n sampled answers, each ended by the grammar or the model (never cut by length)."""
    outs = _samples(model, prompt, n, temperature, **constraint)
    for text, stop in outs:
        assert stop in ("grammar", "eog"), (stop, text)
    return [text for text, _ in outs]


def test_json_schema_outputs_validate(model):
    """20 random walks through the mask (grammar_walks.random_walks) and the model's own
    samples at temperature 1.0 all parse and validate against the schema: nested objects,
    arrays, enums, bounds and all.

    A JSON number has no bound on its digits, so a sample at temperature 1.0 may write
    "1.1111..." until the length limit; which seed does so moves with any change to the
    roundings. So of 4 samples, every one that ended must validate and at least 2 must
    end; a sample cut by length is still checked to be a prefix the mask allowed (its
    text so far is an object that has begun)."""
    jsonschema = pytest.importorskip("jsonschema")
    grammar = Grammar.json_schema(PERSON)
    for text in random_walks(model.tokenizer, grammar, 20):
        jsonschema.validate(json.loads(text), PERSON)
    samples = _samples(model, "Describe a person as JSON.", 4, json_schema=PERSON)
    ended = [text for text, stop in samples if stop in ("grammar", "eog")]
    assert len(ended) >= 2, samples
    for text in ended:
        jsonschema.validate(json.loads(text), PERSON)
    for text, stop in samples:
        assert stop in ("grammar", "eog", "length"), (stop, text)
        assert text.lstrip().startswith("{"), text


def test_json_object_and_regex(model):
    prompt = 'Reply with a JSON object with the keys "city" and "country" for Paris.'
    for text in _generate(model, prompt, 1, temperature=0.0, json_schema=True):
        assert isinstance(json.loads(text), dict)
    pattern = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"
    texts = random_walks(model.tokenizer, Grammar("regex", pattern), 20)
    texts += _generate(model, "Today's date:", 1, regex=pattern)
    for text in texts:
        assert re.fullmatch(pattern, text), text


def test_greedy_under_a_mask_is_the_best_allowed_token(model):
    """The mask comes before every stage: greedy picks the best allowed logit, and a
    sampled token is always an allowed one."""
    c = compile_constraint(model.tokenizer, Grammar("regex", "[0-9]+"))[0]
    allowed = c.allowed()
    assert allowed is not None and 0 < allowed.sum() < model.n_vocab
    logits = np.random.default_rng(0).standard_normal(model.n_vocab).astype(np.float32)
    greedy = Sampler(SamplingParams(temperature=0.0), model.n_vocab).sample(logits, [], allowed)
    assert greedy == int(np.flatnonzero(allowed)[np.argmax(logits[allowed])])
    s = Sampler(
        SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=1), model.n_vocab
    )
    assert all(allowed[s.sample(logits, [], allowed)] for _ in range(50))
    for token in model.tokenizer.eog_ids:  # a number must come first
        assert not allowed[token]


@pytest.mark.parametrize(
    ("grammar", "named"),
    [
        (Grammar("json_schema", '{"type": "nonsense"}', "json_schema"), "nonsense"),
        (Grammar("json_schema", '{"type": "object", "dependentSchemas": {}}'), "dependentSchemas"),
        (Grammar("json_schema", "{not json", "json_schema"), "json_schema"),
        (Grammar("json_schema", '{"$ref": "#/$defs/missing"}'), "missing"),
        (Grammar("gbnf", 'root ::= "a" undefined_rule'), "undefined_rule"),
        (Grammar("gbnf", "root ::= x\nx ::= x"), "grammar"),  # derives no string
        (Grammar("lark", "start: foo"), "foo"),
        (Grammar("regex", "a(b", "regex"), "unclosed group"),
        (Grammar("gbnf", "x" * (GRAMMAR_MAX_BYTES + 1)), "larger than"),
    ],
)
def test_bad_grammars_are_refused_naming_the_problem(smollm2_path, grammar, named):
    tok = load_tokenizer(open_checkpoint(smollm2_path))
    with pytest.raises(GrammarError) as e:
        compile_constraint(tok, grammar)
    message = str(e.value)
    assert named in message and "\n" not in message and message.startswith(grammar.field)


def test_deeply_nested_schema_is_refused():
    deep: dict = {}
    cur = deep
    for _ in range(10_000):
        cur["type"] = "object"
        cur["properties"] = {"a": {}}
        cur = cur["properties"]["a"]
    with pytest.raises(GrammarError, match="nested too deeply|recursion"):
        Grammar.json_schema(deep).llguidance()
    text = '{"items": ' * 10_000 + "{}" + "}" * 10_000
    with pytest.raises(GrammarError, match="nested too deeply|recursion"):
        Grammar("json_schema", text).llguidance()


def test_one_constraint_at_a_time(smollm2_path):
    m = load(smollm2_path)
    with pytest.raises(FrinkError, match="one of"):
        m.constraint(json_schema={}, regex="a")
