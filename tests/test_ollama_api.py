"""Ollama's API on `frink serve` (/api/chat, /api/generate, /api/tags, /api/show,
/api/version, /api/ps), driven by the official `ollama` client and by raw HTTP.

What must hold: on the real Qwen2.5-Coder-0.5B a chat streamed and whole give the same
text at temperature 0, with the token counts of the usage the OpenAI route reports for
the same request; generate answers (templated, raw, and continued from its `context`);
`format` "json" gives JSON and a schema gives JSON that validates (`jsonschema`); a tool
call comes back with object arguments that validate, and its result goes back through
the template; list, show, version and ps describe the served model. On a tiny model:
every route but /health wants the API key; every bad field on the new routes is a 4xx
in Ollama's error shape {"error": ...} naming the field, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from script_loader import load_script
from serve_process import Server, clean_stop, fuzz_base_model
from tool_defs import SCHEMAS, WEATHER

ollama = pytest.importorskip("ollama")
jsonschema = pytest.importorskip("jsonschema")
F = load_script("fuzz_inputs")

KEY = "ollama-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


def _client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, headers=AUTH)


# --- the tiny model: keys, shapes, errors ----------------------------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fuzz_base_model(tmp_path_factory.mktemp("ollama"))


@pytest.fixture(scope="module")
def tiny(tiny_path: Path) -> Iterator[Server]:
    with clean_stop(Server(tiny_path, "--api-key", KEY, "-np", "2", "--backend", "numpy")) as s:
        yield s


ROUTES = [
    ("GET", "/v1/models"),
    ("GET", "/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/completions"),
    ("GET", "/metrics"),
    ("POST", "/api/chat"),
    ("POST", "/api/generate"),
    ("GET", "/api/tags"),
    ("POST", "/api/show"),
    ("GET", "/api/version"),
    ("GET", "/api/ps"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
]


def test_every_route_but_health_wants_the_key(tiny):
    for method, path in ROUTES:
        body = b"{}" if method == "POST" else None
        status, _ = tiny.request(method, path, body)
        assert status == 401, (method, path, status)
    status, body = tiny.request("POST", "/api/chat", b"{}")
    assert body["error"].startswith("a valid API key is required")
    status, health = tiny.get("/health")
    assert status == 200
    assert health["slots_total"] == 2
    assert health["slots_processing"] + health["slots_idle"] == 2


def test_models_version_and_ps(tiny, tiny_path):
    client = _client(tiny)
    listed = client.list().models
    assert [m.model for m in listed] == ["tiny"]
    assert listed[0].size == tiny_path.stat().st_size
    assert listed[0].details.family == "llama" and listed[0].details.format == "gguf"
    shown = client.show("tiny:latest")
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == F.N_CTX
    assert "completion" in shown.capabilities and "messages" in shown.template
    assert client.ps().models[0].model == "tiny"
    assert client.ps().models[0].context_length == F.N_CTX
    status, version = tiny.get("/api/version", AUTH)
    assert status == 200 and version["version"]


def test_tiny_chat_streamed_equals_whole(tiny):
    client = _client(tiny)
    kw = dict(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        options={**GREEDY, "num_predict": 8},
    )
    client.chat(**kw)  # the prompt's cache, as the two below find it
    whole = client.chat(**kw)
    pieces = list(client.chat(**kw, stream=True))
    assert pieces[-1].done and not any(p.done for p in pieces[:-1])
    assert "".join(p.message.content for p in pieces) == whole.message.content
    assert whole.done_reason == pieces[-1].done_reason == "length"
    assert whole.eval_count == pieces[-1].eval_count == 8
    assert whole.prompt_eval_count == pieces[-1].prompt_eval_count > 0


def test_tiny_generate_context_and_load(tiny):
    client = _client(tiny)
    first = client.generate(model="tiny", prompt="ab", options={**GREEDY, "num_predict": 4})
    assert first.done and first.eval_count == 4 and first.context
    assert len(first.context) == first.prompt_eval_count + 4
    raw = client.generate(model="tiny", prompt="ab", raw=True, options={**GREEDY, "num_predict": 3})
    assert raw.eval_count == 3 and raw.prompt_eval_count < first.prompt_eval_count
    more = client.generate(
        model="tiny",
        prompt="c",
        raw=True,
        context=first.context,
        options={**GREEDY, "num_predict": 2},
    )
    assert more.prompt_eval_count > len(first.context)
    loaded = client.generate(model="tiny")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


MSGS = [{"role": "user", "content": "hi"}]
BAD_CHAT = [
    ({"model": "tiny", "messages": []}, 400, "messages"),
    ({"model": "tiny", "messages": "hi"}, 400, "messages"),
    ({"model": "tiny", "messages": [5]}, 400, "messages[0]"),
    ({"model": "tiny", "messages": [{"role": "bot", "content": "x"}]}, 400, "messages[0].role"),
    ({"model": "tiny", "messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content"),
    (
        {"model": "tiny", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
        400,
        "images",
    ),
    ({"model": "tiny", "messages": [{"role": "tool", "content": "17"}]}, 400, "tool call"),
    ({"model": "tiny", "messages": MSGS, "options": "hot"}, 400, "options"),
    (
        {"model": "tiny", "messages": MSGS, "options": {"temperature": "hot"}},
        400,
        "options.temperature",
    ),
    ({"model": "tiny", "messages": MSGS, "options": {"top_k": 1.5}}, 400, "options.top_k"),
    (
        {"model": "tiny", "messages": MSGS, "options": {"num_predict": 0}},
        400,
        "options.num_predict",
    ),
    ({"model": "tiny", "messages": MSGS, "options": {"stop": [1]}}, 400, "options.stop"),
    ({"model": "tiny", "messages": MSGS, "options": {"mirostat": 2}}, 400, "options.mirostat"),
    ({"model": "tiny", "messages": MSGS, "options": {"num_ctx": "big"}}, 400, "options.num_ctx"),
    ({"model": "tiny", "messages": MSGS, "format": 5}, 400, "format"),
    ({"model": "tiny", "messages": MSGS, "format": {"type": 5}}, 400, "format"),
    ({"model": "tiny", "messages": MSGS, "stream": "yes"}, 400, "stream"),
    ({"model": "tiny", "messages": MSGS, "tools": {"a": 1}}, 400, "tools"),
    ({"model": "tiny", "messages": MSGS, "tools": [{"type": "web"}]}, 400, "tools[0].type"),
    ({"model": "tiny", "messages": MSGS, "logprobs": True}, 400, "logprobs"),
    ({"messages": MSGS}, 400, "model is required"),
    ({"model": 3, "messages": MSGS}, 400, "model is required"),
    ({"model": "gpt-9", "messages": MSGS}, 404, "not found"),
]
BAD_GENERATE = [
    ({"model": "tiny", "prompt": ["a"]}, 400, "prompt"),
    ({"model": "tiny", "prompt": "a", "images": ["aGk="]}, 400, "images"),
    ({"model": "tiny", "prompt": "a", "suffix": "b"}, 400, "suffix"),
    ({"model": "tiny", "prompt": "a", "template": "{{ .Prompt }}"}, 400, "template"),
    ({"model": "tiny", "prompt": "a", "system": 1}, 400, "system"),
    ({"model": "tiny", "prompt": "a", "context": [-1]}, 400, "context"),
    ({"model": "tiny", "prompt": "a", "context": "1 2"}, 400, "context"),
    ({"model": "tiny", "prompt": "a", "raw": "yes"}, 400, "raw"),
    ({"model": "tiny", "prompt": "a", "options": {"seed": "x"}}, 400, "options.seed"),
    ({"model": "tiny", "prompt": "a " * 200}, 400, "context"),  # longer than the context
    ({"model": "tiny", "prompt": "a " * 200, "raw": True}, 400, "context"),
]


@pytest.mark.parametrize(("body", "status", "named"), BAD_CHAT)
def test_bad_chat_is_ollamas_error(tiny, body, status, named):
    code, answer = tiny.request("POST", "/api/chat", json.dumps(body).encode(), AUTH)
    assert code == status, answer
    assert set(answer) - {"_headers"} == {"error"} and named in answer["error"], answer


@pytest.mark.parametrize(("body", "status", "named"), BAD_GENERATE)
def test_bad_generate_is_ollamas_error(tiny, body, status, named):
    code, answer = tiny.request("POST", "/api/generate", json.dumps(body).encode(), AUTH)
    assert code == status, answer
    assert set(answer) - {"_headers"} == {"error"} and named in answer["error"], answer


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/show"])
@pytest.mark.parametrize("data", [b"", b"not json", b"[1, 2]", b'{"model": "tiny"'])
def test_malformed_bodies_are_ollamas_error(tiny, path, data):
    code, answer = tiny.request("POST", path, data, AUTH)
    assert code == 400 and isinstance(answer["error"], str), answer


def test_show_unknown_model_is_404(tiny):
    with pytest.raises(ollama.ResponseError) as e:
        _client(tiny).show("llama3")
    assert e.value.status_code == 404 and "not found" in e.value.error


# --- the real model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(qwen05_path) -> Iterator[Server]:
    with clean_stop(
        Server(qwen05_path, "--api-key", KEY, "-np", "2", "-c", "2048", "--backend", "numpy")
    ) as s:
        yield s


def _name(server: Server) -> str:
    return _client(server).list().models[0].model


QUESTION = [{"role": "user", "content": "Name three primary colours, briefly."}]


def test_chat_streamed_equals_whole_with_openai_usage(qwen):
    client = _client(qwen)
    kw = dict(model=_name(qwen), messages=QUESTION, options={**GREEDY, "num_predict": 24})
    client.chat(**kw)  # the prompt's cache, as the two below find it
    whole = client.chat(**kw)
    pieces = list(client.chat(**kw, stream=True))
    text = "".join(p.message.content for p in pieces)
    assert text == whole.message.content and text.strip()
    assert whole.message.role == "assistant"
    assert whole.eval_count == pieces[-1].eval_count
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 24}
    status, openai_answer = qwen.request(
        "POST", "/v1/chat/completions", json.dumps(body).encode(), AUTH
    )
    assert status == 200
    usage = openai_answer["usage"]
    assert whole.prompt_eval_count == usage["prompt_tokens"]
    assert whole.eval_count == usage["completion_tokens"]
    assert openai_answer["choices"][0]["message"]["content"] == text


def test_generate(qwen):
    client = _client(qwen)
    r = client.generate(
        model=_name(qwen), prompt="What is 2 + 2? Answer with a number.", options=GREEDY
    )
    assert r.done and r.done_reason == "stop" and "4" in r.response
    assert r.eval_duration > 0 and r.total_duration >= r.eval_duration


def test_format_json_and_schema(qwen):
    client = _client(qwen)
    msgs = [{"role": "user", "content": "Describe a cat as JSON with its name and age."}]
    kw = dict(model=_name(qwen), messages=msgs, options={**GREEDY, "num_predict": 80})
    assert isinstance(json.loads(client.chat(**kw, format="json").message.content), dict)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    answer = json.loads(client.chat(**kw, format=schema).message.content)
    jsonschema.validate(answer, schema)
    g = client.generate(model=_name(qwen), prompt=msgs[0]["content"], format=schema, options=GREEDY)
    jsonschema.validate(json.loads(g.response), schema)


def test_tool_call_round_trip(qwen):
    client = _client(qwen)
    question = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    r = client.chat(model=_name(qwen), messages=question, tools=[WEATHER], options=GREEDY)
    calls = r.message.tool_calls
    assert calls and [c.function.name for c in calls] == ["get_weather"]
    jsonschema.validate(dict(calls[0].function.arguments), SCHEMAS["get_weather"])
    streamed = client.chat(
        model=_name(qwen), messages=question, tools=[WEATHER], options=GREEDY, stream=True
    )
    assert [c.function.name for p in streamed for c in p.message.tool_calls or []] == [
        "get_weather"
    ]
    follow = [
        *question,
        r.message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "content": "It is 17 degrees Celsius, cloudy.",
            "tool_name": "get_weather",
        },
    ]
    again = client.chat(model=_name(qwen), messages=follow, options={**GREEDY, "num_predict": 40})
    assert not again.message.tool_calls and "17" in again.message.content


def test_list_show_ps_on_the_real_model(qwen):
    client = _client(qwen)
    (model,) = client.list().models
    assert model.details.family == "qwen2" and model.details.quantization_level
    assert model.size > 100 << 20 and model.details.parameter_size.endswith("M")
    shown = client.show(model.model)
    assert shown.modelinfo["qwen2.block_count"] == 24
    assert "tools" in shown.capabilities and "tool_call" in shown.template
    assert client.ps().models[0].context_length == 2048
