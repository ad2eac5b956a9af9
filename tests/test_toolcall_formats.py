"""The tool-call formats (frink_cli/toolcalls/) on the real chat templates.

What is checked, and against whom:
- detection: each template in llama.cpp's corpus (models/templates in the llama-cpp-python
  sdist) and the templates frink ships or reads from the real models' GGUFs picks the
  format its family writes (the generic one when a template shows no tools);
- parsing: an assistant turn with calls, rendered by the family's own template (the
  documented form, written by the template's authors, not by us), parses back into the
  same calls, fed whole and split at every character;
- grammars: 20 random walks through each format's forced-call grammar on a real vocabulary
  parse into calls whose arguments validate (`jsonschema`) against the function's schema.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from grammar_walks import random_walks
from tool_defs import add_tool, weather_tool

from frink_cli.archs import open_checkpoint
from frink_cli.chat import _renders_tools, render_chat
from frink_cli.tokenizer import load_tokenizer
from frink_cli.toolcalls import (
    Gemma4Format,
    GenericFormat,
    GraniteFormat,
    HarmonyFormat,
    HermesFormat,
    Llama3Format,
    MistralFormat,
    QwenXmlFormat,
    ToolFormat,
    tool_format,
)
from frink_cli.toolcalls.plan import ToolPlan

jsonschema = pytest.importorskip("jsonschema")

WEATHER = weather_tool(days={"type": "integer", "minimum": 1, "maximum": 7})
ADD = add_tool(1000)
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

# llama.cpp's template corpus: the format each family's template teaches.
CORPUS = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3_xml",
    "Qwen3.5-4B.jinja": "qwen3_xml",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral",
    "google-gemma-2-2b-it.jinja": "generic",
    "openai-gpt-oss-120b.jinja": "harmony",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "ibm-granite-granite-4.0.jinja": "hermes",
    "google-gemma-4-31B-it.jinja": "gemma4",
    "google-gemma-4-31B-it-interleaved.jinja": "gemma4",
}


@pytest.fixture(scope="module")
def templates() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import llama_cpp_converter

    return llama_cpp_converter.ensure_converter() / "models" / "templates"


def _format(template: str) -> ToolFormat:
    return tool_format(template, _renders_tools(template))


@pytest.mark.parametrize(("name", "expected"), sorted(CORPUS.items()))
def test_format_is_detected_from_the_template(templates, name, expected):
    assert _format((templates / name).read_text()).name == expected


def test_format_of_frinks_own_and_the_real_models_templates(smollm2_path, gemma3_path, qwen05_path):
    """Qwen2.5-Coder's GGUF template teaches Hermes; SmolLM2's, Gemma 3's and the
    fallbacks in configs/chat_templates show no tools: the generic format."""
    expected = {qwen05_path: "hermes", smollm2_path: "generic", gemma3_path: "generic"}
    for path, name in expected.items():
        tok = load_tokenizer(open_checkpoint(path))
        assert _format(tok.chat_template).name == name, path.name
    shipped = Path(__file__).resolve().parents[1] / "configs" / "chat_templates"
    for path in sorted(shipped.glob("*.jinja")):
        assert _format(path.read_text()).name == "generic", path.name


CALLS = [
    ("get_weather", {"city": "Paris", "unit": "celsius"}),
    ("add", {"a": 1, "b": -2}),
]


def _events(parser, pieces):
    content, calls = "", []
    for piece in [*pieces, None]:
        for kind, value in parser.push(piece) if piece is not None else parser.finish():
            if kind == "content":
                content += value
            else:
                calls.append((value.name, json.loads(value.arguments)))
    return content, calls


# Where the assistant's turn ends in each family's rendering (end-of-turn markers).
_TURN_ENDS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "</s>",
    "<|call|>",
    "<|end|>",
    "<|end_of_text|>",
)


def _rendered_turn(template: str, calls: list[tuple[str, dict]], content: str) -> str:
    """The assistant turn the template writes for `calls` (the documented output)."""
    user = [{"role": "user", "content": "What's the weather in Paris, and 1 + -2?"}]
    tool_calls = [
        {
            "id": f"abc12345{i}",  # 9 characters: Mistral's templates insist
            "type": "function",
            "function": {"name": name, "arguments": args},
        }
        for i, (name, args) in enumerate(calls)
    ]
    turn = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    kw = dict(bos_token="<s>", eos_token="</s>", tools=TOOLS)
    before = render_chat(template, user, add_generation_prompt=True, **kw)
    whole = render_chat(template, [*user, turn], add_generation_prompt=False, **kw)
    assert whole.startswith(before)
    text = whole[len(before) :]
    for end in _TURN_ENDS:
        at = text.rfind(end)
        if at >= 0:
            text = text[:at]
    return text.strip()


@pytest.mark.parametrize(
    "name",
    [
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "Qwen3-Coder.jinja",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "openai-gpt-oss-120b.jinja",
    ],
)
def test_template_written_calls_parse_back_streamed_and_whole(templates, name):
    template = (templates / name).read_text()
    fmt = _format(template)
    # Llama 3.x writes one call per turn; gpt-oss's template one call per message.
    calls = CALLS[:1] if fmt.name in ("llama3", "harmony") else CALLS
    text = _rendered_turn(template, calls, "")
    whole = _events(fmt.parser(TOOLS), [text])
    assert whole == ("", calls), text
    assert _events(fmt.parser(TOOLS), list(text)) == whole


# gpt-oss as OpenAI's harmony guide shows it: reasoning, then a call in the commentary
# channel (the answer after the prompt's `<|start|>assistant`).
HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city":"Paris","unit":"celsius"}<|call|>'
)


@pytest.mark.parametrize(
    ("fmt", "text", "content", "calls"),
    [
        (
            Llama3Format(),
            '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": -2}}',
            "",
            [("add", {"a": 1, "b": -2})],
        ),
        (Llama3Format(), "Paris is sunny {today}.", "Paris is sunny {today}.", []),
        (
            MistralFormat(),
            'Checking.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": -2}, '
            '"id": "abcdefghi"}]',
            "Checking.",
            [("add", {"a": 1, "b": -2})],
        ),
        (
            MistralFormat(named=True),
            '[TOOL_CALLS]add[ARGS]{"a": 1, "b": -2}[TOOL_CALLS]get_weather[ARGS]'
            '{"city": "Paris", "unit": "celsius"}',
            "",
            [("add", {"a": 1, "b": -2}), ("get_weather", {"city": "Paris", "unit": "celsius"})],
        ),
        (
            QwenXmlFormat(),
            "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n12 < 13 Main St\n"
            "</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>",
            "Sure.",
            [("get_weather", {"city": "12 < 13 Main St", "unit": "celsius", "days": 3})],
        ),
        # gpt-oss (a call after its reasoning, as OpenAI's harmony guide shows; a final
        # answer); Gemma 4 (as its template writes calls, nested values, a JSON-quoted
        # string, a call that is not one).
        (
            HarmonyFormat(),
            HARMONY_CALL,
            "",
            [("get_weather", {"city": "Paris", "unit": "celsius"})],
        ),
        (
            HarmonyFormat(),
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
            "<|message|>It is 1 + -2 = -1.<|return|>",
            "It is 1 + -2 = -1.",
            [],
        ),
        (HarmonyFormat(), "<|channel|>final<|message|>Sunny, {today}.", "Sunny, {today}.", []),
        # (serve's channel split passes the final channel's text plain, a call spelled;
        # a marker's text inside a string of the arguments is part of the string)
        (
            HarmonyFormat(),
            "Let me check.<|start|>assistant<|channel|>commentary to=functions.get_weather "
            '<|constrain|>json<|message|>{"city": "a<|end|>b", "unit": "celsius"}<|call|>',
            "Let me check.",
            [("get_weather", {"city": "a<|end|>b", "unit": "celsius"})],
        ),
        (HarmonyFormat(), "to do: <|channel|> is a marker", "to do: <|channel|> is a marker", []),
        (
            Gemma4Format(),
            'Checking.<|tool_call>call:get_weather{city:<|"|>Paris, "FR"<|"|>,'
            'unit:<|"|>celsius<|"|>}<tool_call|><|tool_call>call:add{a:1,b:-2}<tool_call|>',
            "Checking.",
            [
                ("get_weather", {"city": 'Paris, "FR"', "unit": "celsius"}),
                ("add", {"a": 1, "b": -2}),
            ],
        ),
        (
            Gemma4Format(),
            '<|tool_call>call:plan{days:[{<|"|>day<|"|>:1,ok:true}],note:"x",skip:null}'
            "<tool_call|>",
            "",
            [("plan", {"days": [{"day": 1, "ok": True}], "note": "x", "skip": None})],
        ),
        (
            Gemma4Format(),
            "<|tool_call>call:add{a:1,<tool_call|>",
            "<|tool_call>call:add{a:1,<tool_call|>",
            [],
        ),
    ],
)
def test_documented_outputs_parse_streamed_and_whole(fmt, text, content, calls):
    whole = _events(fmt.parser(TOOLS), [text])
    assert whole == (content, calls)
    assert _events(fmt.parser(TOOLS), list(text)) == whole


def test_granite_calls_as_its_template_asks_parse_streamed_and_whole(templates):
    """Granite 3's template does not render past calls; its system prompt asks for
    `<|tool_call|>` and a JSON list: that answer, rendered as the assistant's turn."""
    template = (templates / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text()
    fmt = _format(template)
    answer = "<|tool_call|>" + json.dumps([{"name": n, "arguments": a} for n, a in CALLS])
    assert "<|tool_call|> followed by a JSON list" in template
    text = _rendered_turn(template, [], answer)
    assert text == answer
    whole = _events(fmt.parser(TOOLS), [text])
    assert whole == ("", CALLS)
    assert _events(fmt.parser(TOOLS), list(text)) == whole


def test_gemma4_template_written_calls_parse_back_streamed_and_whole(templates):
    """Gemma 4's generation prompt holds an empty thought channel its rendering of a past
    turn does not, and a turn with calls runs on into the tool responses: the calls are
    the text after the model's turn opens, up to the first response."""
    template = (templates / "google-gemma-4-31B-it.jinja").read_text()
    fmt = _format(template)
    user = [{"role": "user", "content": "What's the weather in Paris, and 1 + -2?"}]
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(CALLS)
    ]
    turn = {"role": "assistant", "content": "", "tool_calls": calls}
    whole = render_chat(template, [*user, turn], bos_token="<bos>", eos_token="", tools=TOOLS)
    text = whole[whole.rindex("<|turn>model\n") + len("<|turn>model\n") :]
    text = text.split("<|tool_response>")[0]
    assert text.startswith("<|tool_call>call:get_weather{"), text
    parsed = _events(fmt.parser(TOOLS), [text])
    assert parsed == ("", CALLS), text
    assert _events(fmt.parser(TOOLS), list(text)) == parsed


def test_granite_content_before_a_call_and_a_partial_marker():
    fmt = GraniteFormat()
    text = 'Let me check.<|tool_call|>[{"name": "add", "arguments": {"a": 1, "b": -2}}]'
    assert _events(fmt.parser(TOOLS), [text]) == ("Let me check.", [("add", {"a": 1, "b": -2})])
    assert _events(fmt.parser(TOOLS), list(text)) == _events(fmt.parser(TOOLS), [text])
    plain = "No tool needed: <|tool_ is not a call."
    assert _events(fmt.parser(TOOLS), list(plain)) == (plain, [])


@pytest.fixture(scope="module")
def qwen_tok(qwen05_path):
    return load_tokenizer(open_checkpoint(qwen05_path))


@pytest.mark.parametrize(
    "fmt",
    [
        HermesFormat(),
        QwenXmlFormat(),
        Llama3Format(),
        MistralFormat(),
        MistralFormat(True),
        GraniteFormat(),
        HarmonyFormat(),
        Gemma4Format(),
    ],
    ids=[
        "hermes",
        "qwen3_xml",
        "llama3",
        "mistral",
        "mistral-args",
        "granite",
        "harmony",
        "gemma4",
    ],
)
def test_forced_call_grammar_writes_valid_calls(qwen_tok, fmt):
    """Every walk through the forced grammar is one or more calls the format's own parser
    reads back, each naming an offered tool with arguments valid against its schema."""
    parallel = not isinstance(fmt, Llama3Format)
    grammar, triggers = fmt.grammar(TOOLS, True, parallel, qwen_tok)
    assert triggers == ()
    _, auto_triggers = fmt.grammar(TOOLS, False, parallel, qwen_tok)
    assert auto_triggers
    for text in random_walks(qwen_tok, grammar, 20, cap=2000):
        content, calls = _events(fmt.parser(TOOLS), [text])
        assert calls and not content.strip(), text
        for name, args in calls:
            jsonschema.validate(args, SCHEMAS[name])


def test_generic_format_is_for_templates_without_tools():
    assert isinstance(tool_format("{{ messages }}", False), GenericFormat)
    assert isinstance(tool_format(None, True), GenericFormat)


def test_plan_spells_the_markers_that_are_control_tokens():
    """A marker the vocabulary holds as a control token (no bytes) is spelled for the
    parser; one that is text already, or absent, is not; with no calls parsed, none."""

    class Vocab:
        ids = {"[TOOL_CALLS]": 5, "[ARGS]": 6, "<tool_call>": 7}

        def token_id(self, text):
            return self.ids.get(text)

        def token_bytes(self, i):
            return b"<tool_call>" if i == 7 else b""

    mistral = ToolPlan(TOOLS, True, True, MistralFormat(named=True))
    assert mistral.spelled(Vocab()) == frozenset({5, 6})
    assert ToolPlan(TOOLS, True, True, HermesFormat()).spelled(Vocab()) == frozenset()
    assert (
        ToolPlan(TOOLS, False, False, mistral.format, calls=False).spelled(Vocab()) == frozenset()
    )


PLAN = {
    "type": "function",
    "function": {
        "name": "plan",
        "parameters": {
            "type": "object",
            "properties": {
                "days": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1, "maximum": 7},
                    "minItems": 2,
                    "maxItems": 3,
                },
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 1},
            },
            "required": ["days", "tags"],
            "additionalProperties": False,
        },
    },
}


def _accepts(tok, grammar, text: str) -> bool:
    """Whether the constraint lets `text` be written whole and then end."""
    from frink_cli.constraint import compile_constraint

    c = compile_constraint(tok, grammar)[0]
    for t in tok.encode(text, add_special=False, parse_special=False):
        allowed = c.allowed()
        if allowed is not None and not allowed[t]:
            return False
        c.accept(t)
    return c.finished


def test_gemma4_grammar_keeps_min_and_max_items(qwen_tok):
    """Gemma 4's own array syntax holds minItems and maxItems: too few or too many values
    cannot be written, and every random walk validates against the schema."""
    fmt = Gemma4Format()
    grammar, _ = fmt.grammar([PLAN], True, False, qwen_tok)
    q = '<|"|>'

    def call(days: str, tags: str) -> str:
        return f"<|tool_call>call:plan{{days:[{days}],tags:[{tags}]}}<tool_call|>"

    assert _accepts(qwen_tok, grammar, call("1,2", ""))
    assert _accepts(qwen_tok, grammar, call("1,2,3", f"{q}a{q}"))
    assert not _accepts(qwen_tok, grammar, call("1", ""))
    assert not _accepts(qwen_tok, grammar, call("1,2,3,4", ""))
    assert not _accepts(qwen_tok, grammar, call("1,2", f"{q}a{q},{q}b{q}"))
    schema = PLAN["function"]["parameters"]
    for text in random_walks(qwen_tok, grammar, 20, cap=2000):
        content, calls = _events(fmt.parser([PLAN]), [text])
        assert calls and not content.strip(), text
        for _, args in calls:
            jsonschema.validate(args, schema)


@pytest.mark.parametrize(
    ("prop", "named"),
    [
        ({"type": "string", "pattern": "^a"}, "'pattern'"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'"),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 2}, "minItems"),
        ({"type": "array", "items": {"type": "integer"}, "minItems": -1}, "minItems"),
    ],
)
def test_gemma4_refuses_what_its_syntax_cannot_enforce(prop, named):
    from frink_cli.constraint import GrammarError

    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"x": prop}, "required": ["x"]},
        },
    }
    with pytest.raises(GrammarError, match=named) as e:
        Gemma4Format().grammar([tool], True, False)
    assert "function f: parameters.x" in str(e.value)
    params = {"type": "object", "properties": {}, "required": ["y"]}
    tool["function"]["parameters"] = params
    with pytest.raises(GrammarError, match="required 'y' has no schema"):
        Gemma4Format().grammar([tool], True, False)


def test_harmony_auto_grammar_wakes_at_a_call_not_at_its_words(qwen_tok):
    """With tool_choice auto, the grammar applies from a message addressed to a function
    (`<|channel|>commentary to=functions.` or `<|start|>assistant to=functions.`), not at
    the recipient's words inside the reasoning; once awake, the arguments follow the
    schema."""
    from frink_cli.constraint import compile_constraint

    grammar, triggers = HarmonyFormat().grammar(TOOLS, False, True, qwen_tok)
    prose = "<|channel|>analysis<|message|>Use to=functions.add.<|end|><|start|>assistant"
    for call, valid in (
        ('<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a":1,"b":2}', 1),
        ('<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a":"x"', 0),
        ('<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a":1', 1),
    ):
        c = compile_constraint(qwen_tok, grammar, triggers)[0]
        for t in qwen_tok.encode(prose, add_special=False, parse_special=False):
            assert c.allowed() is None
            c.accept(t)
        ok, woke = True, False
        for t in qwen_tok.encode(call, add_special=False, parse_special=False):
            allowed = c.allowed()
            woke = woke or allowed is not None
            if allowed is not None and not allowed[t]:
                ok = False
                break
            c.accept(t)
        assert woke and ok == bool(valid), call
