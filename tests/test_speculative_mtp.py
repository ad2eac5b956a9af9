"""Multi-token-prediction heads as the drafter (`--spec mtp`, frink_cli/mtp.py): the head
computes what llama.cpp's MTP graph computes, greedy output is llama.cpp's greedy run token
for token, and a file without MTP heads is refused by name.

The fixture is the tiny qwen35 with one MTP block added to its HF dir and converted by
llama.cpp's converter (scripts/make_tiny_mtp.py); its trunk is the qwen35 fixture's, so
that fixture's llama.cpp greedy run is this file's too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from frink_subprocess import child_env, frink
from isa_variants import child_json
from script_loader import load_script

import frink_cli
from frink_cli.generate import GenerationStats
from frink_cli.mtp import MtpDrafter, MtpHead
from frink_cli.speculative import SpecParams


@pytest.fixture(scope="module")
def mtp_gguf(tiny_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qwen35_mtp")
    return load_script("make_tiny_mtp").with_mtp("qwen35", tiny_model("qwen35").hf_dir, out)


# llama.cpp's MTP head, in a process of its own: the state input it should read is a stub
# in this llama-cpp-python (make_tiny_mtp.llama_cpp_mtp), so its graph reads the input
# buffer as allocated, which is zeroed memory only in a fresh process (a process that ran
# other llama.cpp contexts first hands back used memory, and its logits came out NaN).
_MTP_CHILD = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from script_loader import load_script
from pathlib import Path
hidden, logits = load_script("make_tiny_mtp").llama_cpp_mtp(Path(sys.argv[2]), np.load(sys.argv[3]))
np.savez(sys.argv[4], hidden=hidden, logits=logits)
print("{}")
"""


def test_the_head_computes_what_llama_cpp_does(tiny_model, mtp_gguf: Path, tmp_path) -> None:
    tokens = tiny_model("qwen35").ref["tokens"][:24]
    np.save(tmp_path / "tokens.npy", tokens)
    args = [str(Path(__file__).parent), str(mtp_gguf), str(tmp_path / "tokens.npy")]
    child_json(_MTP_CHILD, [*args, str(tmp_path / "out.npz")], child_env(), 600)
    ref = np.load(tmp_path / "out.npz")
    hidden, logits = ref["hidden"], ref["logits"]
    assert np.isfinite(logits).all(), "llama.cpp's MTP head read a state that was not zero"
    model = frink_cli.load(mtp_gguf)
    dec = model.decoder
    h = dec.host.final_norm(dec.hidden(np.asarray(tokens), dec.new_cache(64)))
    np.testing.assert_allclose(h, hidden, atol=2e-3)  # what the head is handed
    # llama.cpp's head reads a zero state here (make_tiny_mtp.llama_cpp_mtp says why).
    head = MtpHead(model.checkpoint, dec)
    cache, zero = head.new_cache(64, 4), np.zeros((1, model.config.n_embd), np.float32)
    mine = np.stack(
        [head.forward(zero, [int(t)], np.asarray([k]), cache)[1] for k, t in enumerate(tokens[1:])]
    )
    np.testing.assert_allclose(mine, logits, atol=2e-3)


def test_the_drafter_keeps_its_rows_in_step_with_the_history(tiny_model, mtp_gguf) -> None:
    """Histories growing by 1 to 6 tokens a round (kept drafts), each drafted from the
    rows the drafter kept, as a fresh drafter drafts from the whole history at once."""
    tokens = [int(t) for t in tiny_model("qwen35").ref["tokens"][:32]]
    model = frink_cli.load(mtp_gguf)
    dec = model.decoder
    hidden = dec.host.final_norm(dec.hidden(np.asarray(tokens), dec.new_cache(64)))
    head, params = MtpHead(model.checkpoint, dec), SpecParams(draft_max=3, p_min=0.0)
    kept = MtpDrafter(head, 64, params)
    kept.observe(0, hidden)
    for end in (9, 10, 14, 20, 21, 27):
        fresh = MtpDrafter(head, 64, params)
        fresh.observe(0, hidden)
        assert kept.draft(tokens[:end], 3) == fresh.draft(tokens[:end], 3), end


def _greedy(model: frink_cli.Model, prompt: list[int], n: int) -> tuple[list[int], GenerationStats]:
    stats = GenerationStats()
    out = list(model.generate_ids(prompt, max_tokens=n, temperature=0.0, stats=stats))
    return out, stats


def test_greedy_output_is_plain_greedy(tiny_model, mtp_gguf: Path) -> None:
    ref = tiny_model("qwen35").ref
    model = frink_cli.load(mtp_gguf)
    prompt, want = [int(t) for t in ref["greedy_prompt"]], ref["greedy_llamacpp"].tolist()
    prompts = [(prompt, want)]
    for n in (5, 33):  # two more prompts, against frink's plain greedy run of each
        other = [int(t) for t in ref["tokens"][:n]]
        prompts.append((other, _greedy(model, other, 12)[0]))
    model.speculate(SpecParams(draft_max=3, p_min=0.0, mtp=True))
    for prompt, want in prompts:
        out, stats = _greedy(model, prompt, len(want))
        assert out == want
        assert stats.drafted_tokens > 0


def test_an_hf_dir_drafts_as_its_gguf_conversion(tiny_model, mtp_gguf: Path) -> None:
    """The HF dir's mtp.* weights (Qwen3.5's naming, sharded beside the trunk) load into the
    same MTP head as the converter's NextN blocks: the same drafts from the same history,
    the head's logits within 2e-3 of the GGUF's."""
    tokens = [int(t) for t in tiny_model("qwen35").ref["tokens"][:24]]
    params = SpecParams(draft_max=4, p_min=0.0)
    drafts, logits = [], []
    for path in (mtp_gguf.parent / "hf", mtp_gguf):
        model = frink_cli.load(path)
        dec = model.decoder
        head = MtpHead(model.checkpoint, dec)
        hidden = dec.host.final_norm(dec.hidden(np.asarray(tokens), dec.new_cache(64)))
        drafter = MtpDrafter(head, 64, params)
        drafter.observe(0, hidden)
        drafts.append([drafter.draft(tokens[:end], 4) for end in (5, 12, 24)])
        cache = head.new_cache(64, 4)
        logits.append(head.forward(hidden[:12], tokens[1:13], np.arange(12), cache)[1])
    assert drafts[0] == drafts[1]
    np.testing.assert_allclose(logits[0], logits[1], atol=2e-3)


@pytest.mark.parametrize("spelling", [("--spec", "mtp"), ("--spec-type", "draft-mtp")])
@pytest.mark.parametrize("kind", ["gguf", "hf_dir"])
def test_a_file_without_mtp_heads_is_refused(tiny_model, spelling, kind: str) -> None:
    path = getattr(tiny_model("qwen35"), kind)
    r = frink("run", path, "-p", "hi", "-n", "2", *spelling)
    assert r.returncode != 0 and len(r.lines()) == 1, r.describe()
    assert f"--spec mtp: {path} has no MTP heads (nextn_predict_layers = 0)" in r.stderr


def _served(path: Path, prompts: list[list[int]], n: int, *args: str) -> tuple[list, float, float]:
    """`frink serve PATH ARGS` answering the prompts (token ids) concurrently through the
    official openai client, greedy: (each answer's ids, the drafted and accepted counters
    of /metrics)."""
    import concurrent.futures
    import urllib.request

    import openai
    from serve_process import Server, clean_stop
    from test_speculative import _counter

    with clean_stop(Server(path, "--alias", "m", "-np", "4", "-c", "256", *args)) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)

        def ids(prompt: list[int]) -> list[int]:
            r = client.completions.create(
                model="m",
                prompt=prompt,
                max_tokens=n,
                temperature=0,
                extra_body={"return_tokens": True, "ignore_eos": True},
            )
            return list(r.choices[0].model_extra["tokens"])

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            out = list(pool.map(ids, prompts))
        metrics = urllib.request.urlopen(s.url + "/metrics", timeout=30).read().decode()
    drafted = _counter(metrics, "frink_spec_draft_tokens_total")
    return out, drafted, _counter(metrics, "frink_spec_accepted_tokens_total")


@pytest.fixture(scope="module")
def served_plain(tiny_model, mtp_gguf: Path) -> tuple[list[list[int]], list[list[int]]]:
    """4 prompts of the tiny qwen35, each a block of ids said twice (prompt lookup finds
    the repeat), and the plain server's greedy answers to them."""
    tokens = [int(t) for t in tiny_model("qwen35").ref["tokens"]]
    prompts = [tokens[a:b] * 2 for a, b in ((0, 9), (3, 7), (10, 29), (7, 40))]
    answers, drafted, _ = _served(mtp_gguf, prompts, 32)
    assert drafted == 0
    return prompts, answers


@pytest.mark.parametrize("spec", ["mtp", "ngram", "draft"])
def test_serve_speculates_on_the_hybrid_as_plain(mtp_gguf: Path, served_plain, spec) -> None:
    """`frink serve --spec mtp|ngram` and `-md` (the model drafting for itself) on the tiny
    qwen35 (gated delta net layers beside attention) with its MTP head: 4 concurrent greedy
    requests through the openai client answer as the plain server does, token for token.
    Drafts were made: the MTP head's rejected (the fixture's head is random: each rejection
    restores the recurrent state and feeds the kept ids again), the repeated prompts' and
    the model's own kept (tests/test_speculative.py's engine test mixes the two)."""
    prompts, plain = served_plain
    how = ("-md", str(mtp_gguf)) if spec == "draft" else ("--spec", spec)
    args = (*how, "--draft-max", "3", "--draft-p-min", "0")
    got, drafted, accepted = _served(mtp_gguf, prompts, 32, *args)
    assert got == plain
    assert drafted > 0
    if spec == "mtp":
        assert accepted < drafted
    else:
        assert 0 < accepted


class HiddenChecking:
    """A drafter that reads hidden states as an MTP head does and, at every draft, checks
    what the engine handed it: the target's rows before the newest token, after the final
    norm, as a fresh run of the history computes them. It drafts as the model drafting for
    itself with every third token wrong (kept and rejected drafts)."""

    reads_hidden = True

    def __init__(self, model: frink_cli.Model, n_ctx: int, params: SpecParams) -> None:
        from test_speculative import Corrupting

        from frink_cli.speculative import ModelDrafter

        self.dec, self.n_ctx = model.decoder, n_ctx
        self.inner = Corrupting(ModelDrafter(model.decoder, n_ctx, params), model.n_vocab)
        self.hidden = np.zeros((n_ctx, model.config.n_embd), np.float32)
        self.checked, self.worst = 0, 0.0

    def prepare(self, prompt) -> None:
        pass

    def observe(self, start: int, hidden: np.ndarray) -> None:
        self.hidden[start : start + len(hidden)] = hidden

    def draft(self, history, n: int) -> list[int]:
        end = len(history) - 1
        fresh = self.dec.hidden(np.asarray(history[:end]), self.dec.new_cache(self.n_ctx))
        # (checked in the test: an assertion here would end the engine's thread)
        diff = np.abs(self.hidden[:end] - self.dec.host.final_norm(fresh)).max()
        self.worst = max(self.worst, float(diff))
        self.checked += 1
        return self.inner.draft(history, n)


def test_the_engine_hands_an_mtp_drafter_its_hidden_states(tiny_model) -> None:
    """The engine with `--spec mtp`: 2 slots, 4 greedy jobs sharing a prefix (a slot's
    next job resumes from its saved state), the drafter kept per slot: at every draft it
    holds the target's hidden states for the whole history, drafts are kept and rejected,
    and the answers are the plain engine's."""
    from test_engine import _engine, _others, _run, _stop

    model = frink_cli.load(tiny_model("qwen35").gguf)
    head = [int(t) for t in tiny_model("qwen35").ref["tokens"][:12]]
    prompts = [head + p.tolist() for p in _others(model.n_vocab, [3, 9, 1, 14])]
    params = SpecParams(draft_max=4, p_min=0.0, mtp=True)
    made: list[HiddenChecking] = []

    def drafter(n_ctx: int) -> HiddenChecking:
        made.append(HiddenChecking(model, n_ctx, params))
        return made[-1]

    kw = {"n_parallel": 2, "n_ctx": 96, "prefill_chunk": 8}
    plain, t = _engine(model, **kw)
    try:
        want = [tokens for tokens, _ in _run(plain, prompts, 20)]
    finally:
        _stop(plain, t)
    spec, t = _engine(model, drafter=drafter, spec=params, **kw)
    try:
        got = [tokens for tokens, _ in _run(spec, prompts, 20)]
    finally:
        _stop(spec, t)
    assert got == want
    assert len(made) == 2 and all(d.checked for d in made)
    assert max(d.worst for d in made) < 1e-4  # (a wrong row is off by ~1)
    assert 0 < spec.accepted < spec.drafted, (spec.accepted, spec.drafted)
