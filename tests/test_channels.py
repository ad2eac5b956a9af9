"""gpt-oss's harmony output split by channel (frink_cli/channels.py).

The token streams are OpenAI's harmony format as its documentation spells a reply: an
analysis message, then `<|start|>assistant` and the final message ended by `<|return|>`;
a commentary message addressed to a tool (` to=functions.x <|constrain|>json`); a reply
with no header. The vocabulary is a stand-in with harmony's marker tokens, each other token
one word, so the split alone is under test (the tokenizer is tested against llama.cpp
elsewhere).
"""

from __future__ import annotations

from frink_cli.channels import FINAL, ChannelSplit, is_harmony
from frink_cli.toolcalls import HarmonyFormat

MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"]


class _Stream:
    def __init__(self, tok: _Vocab) -> None:
        self.tok = tok

    def push(self, token_id: int) -> str:
        return self.tok.words[token_id]

    def flush(self) -> str:
        return ""


class _Vocab:
    def __init__(self, words: list[str]) -> None:
        self.words = MARKERS + words

    def token_id(self, text: str) -> int | None:
        return self.words.index(text) if text in self.words else None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.words[i] for i in ids)

    def token_bytes(self, i: int) -> bytes:
        return b"" if self.words[i] in MARKERS else self.words[i].encode()

    def token_text(self, i: int) -> str:
        return self.words[i]

    def stream(self) -> _Stream:
        return _Stream(self)

    def ids(self, text: list[str]) -> list[int]:
        return [self.words.index(t) for t in text]


def _split(tok: _Vocab, tokens: list[str], calls: bool = False) -> dict[str, str]:
    split = ChannelSplit(tok, calls=calls)  # type: ignore[arg-type]
    out: dict[str, str] = {}
    for t in tok.ids(tokens):
        for channel, text in split.push(t):
            out[channel] = out.get(channel, "") + text
    for channel, text in split.flush():
        out[channel] = out.get(channel, "") + text
    return out


WORDS = [
    "analysis",
    "final",
    "commentary",
    " to=functions.get",
    "<|constrain|>",
    "json",
    "User",
    " asks",
    " 2+2",
    ".",
    "4",
    " is",
    " the",
    " answer",
    "{}",
    "assistant",
]


def test_reasoning_then_answer() -> None:
    tok = _Vocab(WORDS)
    assert is_harmony(tok)  # type: ignore[arg-type]
    got = _split(
        tok,
        [
            "<|channel|>",
            "analysis",
            "<|message|>",
            "User",
            " asks",
            " 2+2",
            ".",
            "<|end|>",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "final",
            "<|message|>",
            "4",
            " is",
            " the",
            " answer",
            ".",
            "<|return|>",
        ],
    )
    assert got == {"analysis": "User asks 2+2.", FINAL: "4 is the answer."}


CALL = [
    "<|channel|>",
    "commentary",
    " to=functions.get",
    "<|constrain|>",
    "json",
    "<|message|>",
    "{}",
    "<|call|>",
]
REASONING = ["<|channel|>", "analysis", "<|message|>", "User", " asks", "<|end|>"]
REASONING_THEN_ANSWER = [
    *REASONING,
    *["<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "4", "."],
]
CALL_AFTER_REASONING = [*REASONING, "<|start|>", "assistant", *CALL]


def test_tool_call_header() -> None:
    assert _split(_Vocab(WORDS), CALL) == {"commentary": "{}"}


def _parsed(text: str) -> tuple[str, list[tuple[str, dict]]]:
    """The harmony parser's content and calls for `text`, fed one character at a time."""
    parser = HarmonyFormat().parser()
    events = [e for ch in text for e in parser.push(ch)] + parser.finish()
    content = "".join(v for k, v in events if k == "content")
    return content, [(v.name, v.args) for k, v in events if k == "call"]


def test_with_tools_a_call_goes_to_the_parser_spelled() -> None:
    """With tools offered, a message addressed to a function is passed on whole, markers
    spelled, and the harmony parser reads the call from it; the reasoning stays."""
    got = _split(_Vocab(WORDS), CALL_AFTER_REASONING, calls=True)
    head = "<|start|>assistant<|channel|>commentary to=functions.get<|constrain|>json"
    assert got == {"analysis": "User asks", FINAL: head + "<|message|>{}<|call|>"}
    assert _parsed(got[FINAL]) == ("", [("get", {})])


def test_with_tools_the_recipient_may_come_first() -> None:
    """`to=functions.NAME<|channel|>commentary ...` right after the prompt's
    `<|start|>assistant` (the template's spelling of a past call) is a call too; an answer
    that only starts like a recipient is content."""
    tokens = [" to=functions.get", "<|channel|>", "commentary", "json", "<|message|>", "{}"]
    got = _split(_Vocab(WORDS), tokens, calls=True)
    assert got == {FINAL: "<|start|> to=functions.get<|channel|>commentaryjson<|message|>{}"}
    assert _parsed(got[FINAL]) == ("", [("get", {})])
    plain = ["4", " is", " the", " answer"]
    assert _split(_Vocab(WORDS), plain, calls=True) == {FINAL: "4 is the answer"}


def test_no_header_is_the_answer() -> None:
    assert _split(_Vocab(WORDS), ["4", " is", " the", " answer"]) == {FINAL: "4 is the answer"}


def test_other_vocabularies_are_not_harmony() -> None:
    class Plain(_Vocab):
        def token_id(self, text: str) -> int | None:
            return None if text.startswith("<|") else super().token_id(text)

    assert not is_harmony(Plain(WORDS))  # type: ignore[arg-type]


# --- the engine (frink serve, frink chat): the split on a running model -----------------------


class _Scripted:
    """A sampler that answers a script of token ids, whatever the logits say."""

    script: list[int] = []

    def __init__(self, params: object, n_vocab: int) -> None:
        self.left = list(self.script)

    def sample(self, logits: object, history: object, allowed: object = None) -> int:
        return self.left.pop(0)


def _engine_events(tiny_model, monkeypatch, tok: _Vocab, script: list[str], **job) -> dict:
    """What the engine sends for a scripted answer: the "text" and the "reasoning" of a
    Job with `job`'s fields (the tiny qwen3 model computes, the script samples)."""
    import queue
    import threading

    from model_checks import _path

    import frink_cli
    from frink_cli.sampling import SamplingParams
    from frink_cli.serve import engine as engine_mod

    _Scripted.script = tok.ids(script)
    monkeypatch.setattr(engine_mod, "Sampler", _Scripted)
    m = frink_cli.load(_path(tiny_model, "qwen3", "gguf"))
    e = engine_mod.Engine(m.decoder, tok, n_ctx=64)  # type: ignore[arg-type]
    t = threading.Thread(target=e.run, daemon=True)
    t.start()
    events: queue.Queue = queue.Queue()
    emit = lambda kind, payload: events.put((kind, payload))  # noqa: E731
    e.submit(engine_mod.Job([1, 2, 3], SamplingParams(), 32, (), emit, **job))
    got: dict[str, str] = {"text": "", "reasoning": ""}
    while True:
        kind, payload = events.get(timeout=60)
        if kind == "done":
            break
        got[kind] += payload
    e.stop()
    t.join(30)
    return got


def test_engine_sends_the_final_channel_as_text_and_the_rest_as_reasoning(
    tiny_model, monkeypatch
) -> None:
    tok = _Vocab(WORDS)
    tok.eog_ids = frozenset(tok.ids(["<|return|>"]))  # as the harmony vocabulary has it
    script = [*REASONING_THEN_ANSWER, "<|return|>"]
    whole = "<|channel|>analysis<|message|>User asks<|end|><|start|>assistant<|channel|>final"
    for channels, want in ((True, ("4.", "User asks")), (False, (whole + "<|message|>4.", ""))):
        got = _engine_events(tiny_model, monkeypatch, tok, script, channels=channels)
        # Without channels (a completion) every token's text goes out, the stand-in
        # vocabulary's markers included.
        assert (got["text"], got["reasoning"]) == want


def test_engine_passes_a_call_on_as_text_when_tools_were_offered(tiny_model, monkeypatch) -> None:
    """Job.tool_calls: the call's message comes as "text" (spelled for the parser), the
    reasoning before it as "reasoning"."""
    tok = _Vocab(WORDS)
    tok.eog_ids = frozenset(tok.ids(["<|return|>", "<|call|>"]))
    got = _engine_events(
        tiny_model, monkeypatch, tok, CALL_AFTER_REASONING, channels=True, tool_calls=True
    )
    assert got["reasoning"] == "User asks"
    assert _parsed(got["text"]) == ("", [("get", {})])


def test_reasoning_goes_where_llama_server_puts_it() -> None:
    """message.reasoning_content (whole) and delta.reasoning_content (stream), as llama-server
    and vLLM return gpt-oss's analysis; absent when there was none."""
    from frink_cli.serve.openai import Reply

    r = Reply(True, "m")
    use = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    msg = r.whole([r.choice(0, "4.", "stop", "User asks")], use)["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "4.", "reasoning_content": "User asks"}
    assert "reasoning_content" not in r.choice(0, "4.", "stop")["message"]
    assert r.chunk(None, reasoning="User")["choices"][0]["delta"] == {"reasoning_content": "User"}


def test_frink_run_splits_a_harmony_answer_unless_raw() -> None:
    """What `frink run` prints from: (channel, text) pairs, final on stdout."""
    from frink_cli.channels import generated_channels as _generated

    tok = _Vocab(WORDS)
    script = tok.ids(REASONING_THEN_ANSWER)

    class Model:
        tokenizer = tok

        def generate_ids(self, ids, **kw):
            return iter(script)

        def generate(self, ids, **kw):
            return iter(tok.words[i] for i in script)

    got = list(_generated(Model(), [1], False, 16, None, None, {}))
    assert "".join(t for c, t in got if c == FINAL) == "4."
    assert "".join(t for c, t in got if c == "analysis") == "User asks"
    raw = list(_generated(Model(), [1], True, 16, None, None, {}))
    assert {c for c, _ in raw} == {FINAL}
