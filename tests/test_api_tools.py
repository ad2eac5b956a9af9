"""Model.chat with tools, in the Python API, on the real Qwen2.5-Coder-0.5B-Instruct (its
template takes tools and teaches Hermes' `<tool_call>`).

What must hold: with tool_choice "required" and with a named tool, every sampled answer
at temperature 1.0 is a call of an offered tool whose parsed arguments validate against
that tool's parameters schema (`jsonschema`); the named choice calls that tool; a call's
.args is its JSON arguments parsed; bad tools and tool_choice values are FrinkErrors
before anything is generated.
"""

from __future__ import annotations

import json

import pytest
from tool_defs import SCHEMAS, TOOLS, WEATHER

from frink_cli.api import load
from frink_cli.errors import FrinkError

jsonschema = pytest.importorskip("jsonschema")

QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def qwen(qwen05_path):
    return load(qwen05_path, backend="numpy")


def _check(reply, names: set[str]) -> None:
    assert reply.tool_calls, reply
    for call in reply.tool_calls:
        assert call.name in names and call.id
        assert call.args == json.loads(call.arguments)
        jsonschema.validate(call.args, SCHEMAS[call.name])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_gives_a_valid_call(qwen, seed):
    reply = qwen.chat(
        QUESTION, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed, max_tokens=96
    )
    _check(reply, {"get_weather", "add"})


@pytest.mark.parametrize(
    "choice", ["add", {"type": "function", "function": {"name": "add"}}], ids=["name", "object"]
)
def test_named_tool_is_the_one_called(qwen, choice):
    reply = qwen.chat(
        QUESTION, tools=TOOLS, tool_choice=choice, temperature=1.0, seed=4, max_tokens=96
    )
    _check(reply, {"add"})


def test_none_answers_in_text(qwen):
    reply = qwen.chat(QUESTION, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=24)
    assert reply.tool_calls == [] and reply.text.strip()
    assert "<tool_call>" not in reply.text


@pytest.mark.parametrize(
    ("tools", "choice", "words"),
    [
        (TOOLS, "multiply", "tool_choice"),
        (TOOLS, {"type": "function", "function": {}}, "tool_choice"),
        (None, "required", "needs tools"),
        ([{"type": "retrieval"}], None, "tools[0]"),
        ([WEATHER, WEATHER], None, "twice"),
    ],
)
def test_bad_tools_are_refused(qwen, tools, choice, words):
    with pytest.raises(FrinkError, match=words.replace("[", r"\[")):
        qwen.chat(QUESTION, tools=tools, tool_choice=choice, max_tokens=4)
