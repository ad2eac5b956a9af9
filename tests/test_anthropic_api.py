"""Anthropic's Messages API on `frink serve`, driven by the official `anthropic` client.

On the real Qwen2.5-Coder-0.5B-Instruct (its template takes tools): a message and the
same message streamed give the same text at temperature 0; a tool round trip (tool_use,
then tool_result, then an answer that uses the result); count_tokens equals the answer's
usage.input_tokens; stop_reason for a stop sequence and for max_tokens. On a tiny model
(no generation needed): bad input answered in Anthropic's error shape and status through
the client's own exceptions, the key read from x-api-key or a Bearer token, and the
OpenAI routes' errors left in OpenAI's shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from serve_process import Server
from tool_defs import TOOLS

anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")

KEY = "sekret-key"
# tool_defs' tools in Anthropic's shape (the same prompt as the OpenAI tool tests').
WEATHER, ADD = (
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
)
# The client has no sampling arguments: they travel as extra body fields.
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def _start(path, *args: str) -> Iterator[tuple[Server, str]]:
    s = Server(path, "--api-key", KEY, "--backend", "numpy", *args)
    try:
        status, models = s.get("/v1/models", {"Authorization": f"Bearer {KEY}"})
        assert status == 200
        yield s, models["data"][0]["id"]
        assert s.stop() == 0
        assert "Traceback" not in s.log(), s.log()
    finally:
        s.close()


@pytest.fixture(scope="module")
def qwen(qwen05_path) -> Iterator[tuple[Server, str]]:
    yield from _start(qwen05_path, "-c", "2048", "-np", "2")


@pytest.fixture(scope="module")
def tiny(tiny_model: Callable) -> Iterator[tuple[Server, str]]:
    yield from _start(tiny_model("llama").gguf, "-c", "256")


def _client(server: Server, **kw):
    return anthropic.Anthropic(base_url=server.url, max_retries=0, **{"api_key": KEY, **kw})


@pytest.mark.real
def test_streamed_text_is_the_whole_text(qwen):
    server, model = qwen
    client = _client(server)
    ask = {"model": model, "max_tokens": 40, "extra_body": GREEDY, "system": "Be brief."}
    ask["messages"] = [{"role": "user", "content": "Name three colours."}]
    whole = client.messages.create(**ask)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text.strip()
    with client.messages.stream(**ask) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and whole.stop_reason in (
        "end_turn",
        "max_tokens",
    )
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.real
def test_count_tokens_equals_usage(qwen):
    server, model = qwen
    client = _client(server)
    ask = {"model": model, "system": "You check the weather.", "messages": QUESTION}
    counted = client.messages.count_tokens(**ask, tools=[WEATHER])
    answer = client.messages.create(**ask, tools=[WEATHER], max_tokens=4, extra_body=GREEDY)
    assert counted.input_tokens == answer.usage.input_tokens > 20
    plain = client.messages.count_tokens(**ask)
    assert plain.input_tokens < counted.input_tokens  # the tools are in the prompt


@pytest.mark.real
def test_tool_round_trip(qwen):
    server, model = qwen
    client = _client(server)
    ask = {"model": model, "max_tokens": 96, "extra_body": GREEDY, "tools": [WEATHER, ADD]}
    first = client.messages.create(**ask, messages=QUESTION, tool_choice={"type": "any"})
    assert first.stop_reason == "tool_use"
    calls = [b for b in first.content if b.type == "tool_use"]
    assert calls and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
    jsonschema.validate(calls[0].input, WEATHER["input_schema"])
    reply = "It is 17 degrees Celsius, cloudy."
    result = {"type": "tool_result", "tool_use_id": calls[0].id, "content": reply}
    history = [
        *QUESTION,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    # tool_choice none keeps the tools in the prompt but no call can come, so the small
    # model answers from the tool's result (with auto it calls the tool again).
    second = client.messages.create(**ask, messages=history, tool_choice={"type": "none"})
    text = "".join(b.text for b in second.content if b.type == "text")
    assert second.stop_reason == "end_turn", text
    assert "17" in text, text


@pytest.mark.real
def test_streamed_tool_call(qwen):
    server, model = qwen
    with _client(server).messages.stream(
        model=model,
        max_tokens=96,
        extra_body=GREEDY,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == ("message_start", None) and kinds[-1] == ("message_stop", None)
    assert ("content_block_delta", "input_json_delta") in kinds
    assert final.stop_reason == "tool_use"
    (call,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(call.input, WEATHER["input_schema"])


@pytest.mark.real
def test_stop_reasons(qwen):
    server, model = qwen
    client = _client(server)
    ask = {"model": model, "extra_body": GREEDY}
    ask["messages"] = [{"role": "user", "content": "Count from one to ten in words."}]
    short = client.messages.create(**ask, max_tokens=3)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    whole = client.messages.create(**ask, max_tokens=60)
    text = whole.content[0].text
    cut = next(w for w in ("three", "Three", "3") if w in text)
    stopped = client.messages.create(**ask, max_tokens=60, stop_sequences=[cut])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == cut
    assert stopped.content[0].text == text[: text.index(cut)]


def _post(server: Server, body: dict, **kw):
    return _client(server, **kw).post("/v1/messages", body=body, cast_to=object)


BASE = {"model": None, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"max_tokens": None}, "max_tokens: is required"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": "x"}, "top_k"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"stream": "yes"}, "stream"),
        ({"metadata": "x"}, "metadata"),
        ({"system": 7}, "system"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {"type": "image", "source": {"type": "base64", "data": "AA=="}},
                        ],
                    }
                ]
            },
            "image blocks are not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "hologram"}]}]},
            "unknown or unsupported content block type 'hologram'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
            "messages[0].content[0].text",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}],
                    }
                ]
            },
            "no assistant tool_use",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "add"}}, "no tool named"),
        ({"tool_choice": {"type": "any"}}, "needs tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [{"name": "x"}]}, "tools[0].input_schema"),
        ({"tools": [{**WEATHER, "type": "web_search_20250305"}]}, "tools[0].type"),
        ({"tools": [WEATHER, WEATHER]}, "defined twice"),
    ],
)
def test_bad_input_is_an_invalid_request_error(tiny, change, words):
    server, model = tiny
    body = {k: v for k, v in {**BASE, "model": model, **change}.items() if v is not None}
    with pytest.raises(anthropic.BadRequestError) as e:
        _post(server, body)
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert words in e.value.body["error"]["message"]


def test_errors_name_their_kind(tiny):
    server, model = tiny
    body = {**BASE, "model": model}
    with pytest.raises(anthropic.AuthenticationError) as auth:
        _post(server, body, api_key="wrong")
    assert auth.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        _post(server, {**body, "model": "claude-nonesuch"})
    assert missing.value.body["error"]["type"] == "not_found_error"
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        status, raw = server.request("POST", route, b"{not json", {"x-api-key": KEY})
        assert status == 400 and raw["type"] == "error", raw
    # The key as a Bearer token (auth_token) is accepted too; the body is still checked.
    with pytest.raises(anthropic.BadRequestError):
        _client(server, api_key=None, auth_token=KEY).post(
            "/v1/messages", body={**body, "max_tokens": 0}, cast_to=object
        )


def test_openai_routes_keep_their_error_shape(tiny):
    server, _ = tiny
    body = json.dumps({"messages": "hi"}).encode()
    headers = {"x-api-key": KEY, "Content-Type": "application/json"}
    status, raw = server.request("POST", "/v1/chat/completions", body, headers)
    assert status == 400 and "type" not in raw and raw["error"]["param"] == "messages", raw
