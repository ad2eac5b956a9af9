"""Tool calls and structured output in `frink serve`, through the official `openai` client
on real models, and the tool-call parsers on their family's documented output.

What must hold: on Qwen2.5-Coder-0.5B (a template with tools) a question gets a call
whose arguments validate against the function's schema (`jsonschema`), streamed deltas
assemble to exactly the whole answer's calls, `required` and a named tool_choice give a
valid call in each of the model's 2 choices at temperature 1.0 (random walks through
the grammars: tests/test_toolcall_formats.py); the call and the tool's reply are
rendered back through the model's template and the final answer (tool_choice none)
states the tool's result;
response_format json_schema and json_object outputs parse and validate; bad tool and
schema fields are 400s naming the field. The parsers are fed the documented format split
at every character, and give the same content and calls as when fed whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from serve_process import Server
from tool_defs import SCHEMAS, TOOLS

from frink_cli.toolcalls import GenericFormat, HermesFormat

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")


def _events(parser, pieces):
    content, calls = "", []
    for piece in pieces:
        for kind, value in parser.push(piece):
            if kind == "content":
                content += value
            else:
                calls.append((value.name, json.loads(value.arguments)))
    for kind, value in parser.finish():
        if kind == "content":
            content += value
        else:
            calls.append((value.name, json.loads(value.arguments)))
    return content, calls


HERMES_TEXT = (
    "Let me look that up.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (
            HERMES_TEXT,
            "Let me look that up.",
            [("get_weather", {"city": "Paris", "unit": "celsius"}), ("add", {"a": 1, "b": 2})],
        ),
        ('{"name": "add", "arguments": {"a": 1, "b": 2}}', "", [("add", {"a": 1, "b": 2})]),
        ("No tools needed: 1 < 2.", "No tools needed: 1 < 2.", []),
        ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ],
)
def test_hermes_parser_streamed_equals_whole(text, content, calls):
    whole = _events(HermesFormat().parser(), [text])
    assert whole == (content, calls)
    # Split at every character: a marker arriving in pieces never leaks into content.
    assert _events(HermesFormat().parser(), list(text)) == whole


def test_generic_parser():
    text = '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}'
    assert _events(GenericFormat().parser(), list(text)) == ("", [("add", {"a": 1, "b": 2})])
    assert _events(GenericFormat().parser(), ['{"response": "hi"}']) == ("hi", [])


@pytest.fixture(scope="module")
def qwen(qwen05_path) -> Iterator[Server]:
    s = Server(qwen05_path, "-np", "4", "-c", "2048", "--backend", "numpy")
    try:
        yield s
        assert s.stop() == 0
        assert "Traceback" not in s.log(), s.log()
    finally:
        s.close()


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _model(client) -> str:
    return client.models.list().data[0].id


def _check_call(call) -> None:
    assert call.type == "function" and call.id
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def test_auto_call_streamed_equals_whole_and_the_answer_goes_back(qwen):
    client = _client(qwen)
    model = _model(client)
    kw = dict(model=model, messages=QUESTION, tools=TOOLS, temperature=0, seed=1)
    whole = client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    for call in choice.message.tool_calls:
        _check_call(call)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta
        assert not delta.content or not delta.content.strip()
        for tc in delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            c["id"] = c["id"] or tc.id
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls
    ]
    # The call and the tool's reply, rendered through Qwen's template for the next turn;
    # tool_choice "none" keeps the tools in the prompt but no call can come, so the
    # model answers from the tool's reply (the temperature it returned, in words).
    call = choice.message.tool_calls[0]
    follow = QUESTION + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "It is 17 degrees Celsius, cloudy."},
    ]
    again = client.chat.completions.create(
        model=model, messages=follow, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=40
    )
    answer = again.choices[0]
    assert answer.message.tool_calls is None
    assert "17" in answer.message.content, answer.message.content


def test_tool_choice_none_keeps_the_tools_in_the_prompt(qwen):
    """tool_choice none renders the tools as auto does (llama.cpp's behaviour): the prompt
    is as long as auto's, longer than without tools; and the answer is content only."""
    client = _client(qwen)
    model = _model(client)
    usage = {}
    for choice in ("auto", "none", None):
        extra = {"tools": TOOLS, "tool_choice": choice} if choice else {}
        r = client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=1, temperature=0, **extra
        )
        usage[choice] = r.usage.prompt_tokens
        if choice == "none":
            assert r.choices[0].message.tool_calls is None
    assert usage["auto"] == usage["none"] > usage[None] + 100


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_calls_are_valid_every_time(qwen, choice):
    """A forced call is valid in each of the model's 2 choices at temperature 1.0 (20
    random walks through each format's forced grammar: tests/test_toolcall_formats.py)."""
    client = _client(qwen)
    tool_choice = (
        "required" if choice == "required" else {"type": "function", "function": {"name": "add"}}
    )
    r = client.chat.completions.create(  # (the prompt the tests before it left cached)
        model=_model(client),
        messages=QUESTION,
        tools=TOOLS,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        temperature=1.0,
        seed=1,
        n=2,
        max_tokens=100,
    )
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c
        assert len(c.message.tool_calls) == 1
        for call in c.message.tool_calls:
            _check_call(call)
            if choice == "named":
                assert call.function.name == "add"


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "scores": {
            "type": "array",
            "items": {"type": "number", "minimum": 0, "maximum": 10},
            "maxItems": 3,
        },
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "scores", "address"],
    "additionalProperties": False,
}


def test_response_format_json_schema_and_json_object(qwen):
    """4 choices at temperature 1.0 under a json_schema response_format parse and
    validate; a json_object answer parses. (Many more samples, on every vocabulary, go
    through the mask in tests/test_constraint.py.)"""
    client = _client(qwen)
    model = _model(client)
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format=fmt,
        temperature=1.0,
        seed=3,
        n=4,
        max_tokens=300,
    )
    assert len(r.choices) == 4
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), PERSON)
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "The capital of France, as a JSON object."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=100,
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools[0].function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "nonsense"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"grammar": 'root ::= "a" missing'}, "grammar"),
        ({"json_schema": {"type": "object", "dependentSchemas": {}}}, "json_schema"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "nonsense"}},
                    }
                ]
            },
            "tools",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "tool_call_id": "call_x", "content": "42"},
                ]
            },
            "messages[1].tool_call_id",
        ),
    ],
)
def test_bad_tool_and_schema_fields_are_400s(qwen, extra, param):
    import urllib.error
    import urllib.request

    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        qwen.url + "/v1/chat/completions", data, {"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400
    error = json.loads(e.value.read())["error"]
    assert "\n" not in error["message"]
    assert error["param"] == param and error["message"].startswith(param), error
