"""gpt-oss's harmony tool calls through `frink serve` and the official `openai` client.

The model is the tiny gpt-oss fixture (tests/test_gpt_oss.py) given a byte-level
vocabulary that holds harmony's markers as control tokens and llama.cpp's corpus copy of
gpt-oss's own chat template (models/templates/openai-gpt-oss-120b.jinja), so the format is
detected from the real template, the tools are rendered by it, and the answer goes
through serve's channel split and the harmony parser. Its weights are random: a call is
what `required` or a named tool_choice makes it write (the grammar writes the harmony
header, then the arguments under the schema).

What must hold: the call parses, names an offered tool, its arguments validate against the
tool's schema (`jsonschema`), finish_reason is "tool_calls"; streamed deltas assemble to
exactly the whole answer's calls; the call and the tool's result go back through the
template as gpt-oss writes them (`<|start|>functions.NAME to=assistant<|channel|>
commentary<|message|>...<|end|>`), one call per assistant message.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fixture_copies import write_out
from model_checks import _path
from serve_process import Server
from tool_defs import SCHEMAS, TOOLS

from frink_cli.chat import render_chat

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
gguf = pytest.importorskip("gguf")

MARKERS = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
    "<|endoftext|>",
]
CONTROL, NORMAL = 3, 1  # llama.cpp's token types


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map (byte-level BPE's alphabet)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


@pytest.fixture(scope="module")
def gpt_oss_template() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import llama_cpp_converter

    path = llama_cpp_converter.ensure_converter() / "models" / "templates"
    return (path / "openai-gpt-oss-120b.jinja").read_text()


@pytest.fixture(scope="module")
def harmony_gguf(tiny_model, tmp_path_factory, gpt_oss_template) -> Path:
    """The tiny gpt-oss GGUF with a 512-token byte-level vocabulary: the 256 bytes, a
    merge, harmony's markers, reserved control tokens to the model's row count."""
    src = gguf.GGUFReader(_path(tiny_model, "gpt_oss", "gguf"))
    n_vocab = int(src.tensors[[t.name for t in src.tensors].index("token_embd.weight")].shape[1])
    chars = _byte_chars()
    space_t = chars[ord(" ")] + "t"
    tokens = [*chars, space_t, *MARKERS]
    types = [NORMAL] * (len(chars) + 1) + [CONTROL] * len(MARKERS)
    tokens += [f"<|reserved_{i}|>" for i in range(n_vocab - len(tokens))]
    types += [CONTROL] * (n_vocab - len(types))
    dst = tmp_path_factory.mktemp("harmony") / "gpt-oss-harmony.gguf"
    w = gguf.GGUFWriter(dst, "gpt-oss")
    for key, field in src.fields.items():
        if key.startswith(("GGUF.", "tokenizer.", "general.architecture")):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{chars[ord(' ')]} t"])
    w.add_eos_token_id(tokens.index("<|return|>"))
    w.add_chat_template(gpt_oss_template)
    for t in src.tensors:
        w.add_tensor(t.name, np.array(t.data))
    write_out(w)
    return dst


@pytest.fixture(scope="module")
def server(harmony_gguf) -> Iterator[Server]:
    s = Server(harmony_gguf, "-c", "4096", "--parallel", "1")
    try:
        yield s
    finally:
        s.stop()


def _client(server: Server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=600)


QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]


def _check(calls: list[tuple[str, str]]) -> None:
    assert len(calls) == 1, calls
    name, arguments = calls[0]
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "add"}}], ids=str
)
def test_forced_call_whole_and_streamed(server, choice):
    client = _client(server)
    kw = dict(
        model="gpt-oss-harmony", messages=QUESTION, tools=TOOLS, tool_choice=choice, max_tokens=300
    )
    whole = client.chat.completions.create(temperature=0, **kw).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    _check(calls)
    if isinstance(choice, dict):
        assert calls[0][0] == "add"
    assert not whole.message.content

    streamed: dict[int, list[str]] = {}
    finish, content = None, ""
    for chunk in client.chat.completions.create(temperature=0, stream=True, **kw):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            part = streamed.setdefault(c.index, ["", ""])
            part[0] += c.function.name or ""
            part[1] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [tuple(v) for _, v in sorted(streamed.items())] == calls
    assert not content


def test_the_call_and_its_result_go_back_as_gpt_oss_writes_them(server, gpt_oss_template):
    """Two calls in one assistant message become two gpt-oss messages, each followed by
    its result (the template names a result after the last call before it)."""
    from frink_cli.toolcalls import HarmonyFormat
    from frink_cli.toolcalls.plan import ToolPlan

    calls = [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {}}},
    ]
    msgs = [
        *QUESTION,
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "3"},
        {"role": "tool", "tool_call_id": "c2", "name": "get_weather", "content": "sunny"},
    ]
    plan = ToolPlan(TOOLS, False, True, HarmonyFormat())
    text = render_chat(
        gpt_oss_template,
        plan.messages(msgs),
        add_generation_prompt=True,
        bos_token="",
        eos_token="",
    )
    assert (
        '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1}'
        '<|call|><|start|>functions.add to=assistant<|channel|>commentary<|message|>"3"<|end|>'
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}"
        "<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
        '"sunny"<|end|><|start|>assistant'
    ) in text, text

    # Through the server: the history is accepted and rendered, the answer is content.
    wire = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.dumps(c["function"]["arguments"]),
                    },
                }
                for c in calls
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
    ]
    reply = _client(server).chat.completions.create(
        model="gpt-oss-harmony",
        messages=wire,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert not reply.choices[0].message.tool_calls


def test_python_api_reads_the_call_too(harmony_gguf):
    """Model.chat spells the harmony markers for the same parser."""
    import frink_cli

    m = frink_cli.load(harmony_gguf)
    reply = m.chat(
        QUESTION, tools=TOOLS, tool_choice="required", max_tokens=300, n_ctx=4096, temperature=0
    )
    _check([(c.name, c.arguments) for c in reply.tool_calls])
    assert not reply.text
