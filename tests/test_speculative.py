"""Speculative decoding (frink_cli/speculative.py): greedy output is llama.cpp's greedy run,
token for token, whatever is drafted; sampling keeps the sampler's distribution; a draft
model with another vocabulary and bad flags are refused by name.

The tiny fixtures' references hold llama.cpp's own greedy continuation of a prompt, so a
speculative run is checked against llama.cpp directly, on every kind of cache a layer can
have: full attention, sliding windows (taken back through `rewind`), recurrent states
(restored from a snapshot) and both side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from frink_subprocess import frink
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from script_loader import load_script
from test_cli import one_json_object

import frink_cli
from frink_cli.draft_budget import PROBE_AFTER, DraftBudget, verify_cost
from frink_cli.draft_gate import ConfidenceGate
from frink_cli.draft_vocab import DraftVocab
from frink_cli.generate import GenerationStats
from frink_cli.model.linear import Linear
from frink_cli.prompt_lookup import NgramDrafter
from frink_cli.quant.blocks import QuantMatrix, QuantRows
from frink_cli.sampling import Sampler, SamplingParams
from frink_cli.speculative import (
    BlindDrafter,
    ModelDrafter,
    SpecParams,
    speculative_tokens,
    tiled_room,
    verify,
)

# Full attention (granite), sliding windows of 6 with sinks and MoE (gpt_oss), sliding and
# global layers (gemma4), gated delta net (qwen35), mamba, short convolutions (lfm2),
# attention beside mamba2 in one layer (falcon_h1), per-head Mamba between attention
# layers (plamo2, written straight to GGUF: GGUF_DIRECT), lightning attention (minimax).
FIXTURES = [
    "granite",
    "gpt_oss",
    "gemma4",
    "qwen35",
    "mamba",
    "lfm2",
    "falcon_h1",
    "plamo2",
    "minimax",
]
# Fixtures no transformers class makes: their maker script (model.gguf and ref.npz).
GGUF_DIRECT = {"plamo2": "make_tiny_plamo2"}
# Drafting from the model itself: every draft is the target's own greedy pick only where
# a k-row step gives a row what a one-row step gives it (batch invariance).
INVARIANT = ["granite", "gpt_oss", "gemma4", "lfm2", "mamba"]


class ScriptedDrafter(BlindDrafter):
    """Drafts llama.cpp's greedy continuation with every third token wrong, so each round
    keeps some drafts, rejects one and takes the target's caches back."""

    def __init__(self, prompt: Sequence[int], want: Sequence[int], n_vocab: int) -> None:
        self.prompt, self.want, self.n_vocab = len(prompt), list(want), n_vocab

    def prepare(self, prompt: Sequence[int]) -> None:
        assert len(prompt) == self.prompt

    def draft(self, history: Sequence[int], n: int) -> list[int]:
        at = len(history) - self.prompt
        out = self.want[at : at + n]
        return [(t + 1) % self.n_vocab if (at + j) % 3 == 2 else t for j, t in enumerate(out)]


@pytest.fixture(scope="module")
def gguf_direct(tmp_path_factory) -> Callable[[str], tuple[Path, dict[str, np.ndarray]]]:
    """gguf_direct(name) -> (its GGUF, llama.cpp's reference), made once per module."""
    made: dict[str, tuple[Path, dict[str, np.ndarray]]] = {}

    def get(name: str) -> tuple[Path, dict[str, np.ndarray]]:
        if name not in made:
            load_script("make_tiny_models")  # the makers import it as a sibling
            out = tmp_path_factory.mktemp(name)
            made[name] = (out / "model.gguf", load_script(GGUF_DIRECT[name]).make(out))
        return made[name]

    return get


def _reference(
    tiny_model, name: str, gguf_direct: Callable | None = None
) -> tuple[frink_cli.Model, list[int], list[int]]:
    if name in GGUF_DIRECT:
        assert gguf_direct is not None
        path, ref = gguf_direct(name)
    else:
        fx = tiny_model(name)
        path, ref = fx.gguf, fx.ref
    model = frink_cli.load(path)
    return model, [int(t) for t in ref["greedy_prompt"]], ref["greedy_llamacpp"].tolist()


def _run(model, prompt, want, drafter, params, **sampling) -> tuple[list[int], GenerationStats]:
    stats = GenerationStats()
    sampler = Sampler(SamplingParams(temperature=0.0, **sampling), model.n_vocab)
    out = list(
        speculative_tokens(
            model.decoder,
            prompt,
            sampler,
            drafter,
            params,
            max_tokens=len(want),
            n_ctx=len(prompt) + len(want) + 8,
            stats=stats,
        )
    )
    return out, stats


@pytest.mark.parametrize("name", FIXTURES)
def test_rejected_drafts_leave_llama_cpp_greedy_run(tiny_model, gguf_direct, name: str) -> None:
    model, prompt, want = _reference(tiny_model, name, gguf_direct)
    params = SpecParams(draft_max=5)
    out, stats = _run(model, prompt, want, ScriptedDrafter(prompt, want, model.n_vocab), params)
    assert out == want
    assert 0 < stats.accepted_tokens < stats.drafted_tokens, (stats.accepted_tokens, stats)


def _self_drafted(
    tiny_model, name: str, p_min: float
) -> tuple[ModelDrafter, list[int], list[int], GenerationStats]:
    """The fixture drafting for itself (4 tokens a round): (drafter, output, llama.cpp's
    greedy run, stats)."""
    model, prompt, want = _reference(tiny_model, name)
    params = SpecParams(draft_max=4, p_min=p_min)
    drafter = ModelDrafter(model.decoder, len(prompt) + len(want) + 8, params)
    out, stats = _run(model, prompt, want, drafter, params)
    return drafter, out, want, stats


@pytest.mark.parametrize("name", INVARIANT)
def test_the_model_drafting_for_itself_is_always_right(tiny_model, name: str) -> None:
    _, out, want, stats = _self_drafted(tiny_model, name, 0.0)
    assert out == want
    assert stats.drafted_tokens > 0 and stats.accepted_tokens == stats.drafted_tokens


@pytest.mark.parametrize("name", ["granite", "lfm2"])
def test_the_gate_trusts_a_drafter_whose_doubtful_picks_the_target_makes(
    tiny_model, name: str
) -> None:
    """Drafting for itself, the model's doubtful picks (under a p_min above its top
    probabilities) are all the target's: every verdict agrees, so the judged positions are
    the picks' own, and the bar halves."""
    drafter, out, want, _ = _self_drafted(tiny_model, name, 0.999)
    assert out == want
    assert len(drafter.gate.verdicts) >= 2 and all(drafter.gate.verdicts)
    assert drafter.gate.bar == pytest.approx(0.999 / 2)


def _picked(p: float) -> np.ndarray:
    """Logits whose best token has probability p (p > 0.1): the rest spread over ten."""
    return np.log(np.asarray([p] + [(1.0 - p) / 10] * 10))


def test_the_gate_judges_doubtful_picks_by_the_tokens_that_followed() -> None:
    gate = ConfidenceGate(0.75)
    gate.begin(2)
    assert gate.admit(7, _picked(0.9)) and not gate.admit(8, _picked(0.6))
    gate.judge([0, 0, 7, 8, 1])  # the target kept 7, then made 8 itself
    gate.begin(5)
    assert not gate.admit(4, _picked(0.6))
    gate.judge([0, 0, 7, 8, 1, 3, 1])  # the target made 3, not 4
    gate.begin(7)
    assert gate.admit(5, _picked(0.9)) and not gate.admit(6, _picked(0.7))
    gate.judge([0, 0, 7, 8, 1, 3, 1, 9, 6])  # 5 rejected: 6 followed another token
    assert list(gate.verdicts) == [True, False]
    assert gate.bar == 0.75


def test_the_gate_halves_the_bar_while_doubtful_picks_agree() -> None:
    gate = ConfidenceGate(0.75)
    history = [0]
    for _ in range(2):  # two stops at doubtful picks the target then made
        gate.begin(len(history))
        assert not gate.admit(3, _picked(0.6))
        history.append(3)
        gate.judge(history)
    assert gate.bar == 0.375
    gate.begin(len(history))
    assert gate.admit(3, _picked(0.6)) and not gate.admit(3, _picked(0.35))
    gate.judge(history + [3, 2])  # the target kept the first, made 2 for the second
    assert list(gate.verdicts) == [True, True, True, False]
    assert gate.bar == 0.75  # (3 + 1) / (4 + 2) < 0.75


class RecordingDrafter(ModelDrafter):
    """A ModelDrafter that keeps what it was shown and what it drafted, round by round."""

    rounds: list[tuple[list[int], list[int]]]

    def draft(self, history: Sequence[int], n: int) -> list[int]:
        out = super().draft(history, n)
        self.rounds.append((list(history), out))
        return out


@pytest.mark.parametrize("name", ["granite", "gpt_oss", "qwen35"])
def test_a_draft_vocabulary_drafts_only_its_tokens_and_keeps_llama_cpp_greedy_run(
    tiny_model, name: str
) -> None:
    """Drafting for itself over the first 64 of 512 ids and the generation's own tokens:
    every draft is one of those, the output is still llama.cpp's greedy run, and drafts
    are made (the restricted head ran: the drafter holds a vocabulary)."""
    model, prompt, want = _reference(tiny_model, name)
    params = SpecParams(draft_max=4, p_min=0.0, draft_vocab=64)
    drafter = RecordingDrafter(model.decoder, len(prompt) + len(want) + 8, params)
    drafter.rounds = []
    assert drafter.vocab is not None
    out, stats = _run(model, prompt, want, drafter, params)
    assert out == want
    assert stats.drafted_tokens > 0
    for history, drafted in drafter.rounds:
        shown = set(history)
        assert all(t < 64 or t in shown for t in drafted), (history, drafted)
    seen = drafter.rounds[-1][0]  # every token the drafter was shown
    assert sorted(drafter.vocab.extra) == sorted({t for t in seen if t >= 64})


@pytest.mark.parametrize("quantized", [False, True])
def test_a_draft_vocabulary_scores_its_ids_as_the_whole_head_does(
    tiny_model, quantized: bool
) -> None:
    """The cut head's logits are the whole head's at the held ids, bit for bit: f32, and a
    head in the file's blocks (the tiny model's quantized to Q8_0 here)."""
    model = frink_cli.load(tiny_model("granite").gguf)
    dec = model.decoder
    if quantized:
        head = dec.host.w.output
        w = np.asarray(head.w, dtype=np.float32)
        data = quantize(w, GGMLQuantizationType.Q8_0)
        qm = QuantMatrix(data, GGMLQuantizationType.Q8_0, w.shape[0], w.shape[1])
        dec.host.w.output = Linear(QuantRows((qm,)), head.b)
    vocab = DraftVocab.for_decoder(dec, 100)
    assert vocab is not None
    vocab.see([300, 5, 101, 300, 511])
    hidden = np.random.default_rng(0).standard_normal((3, model.config.n_embd)).astype(np.float32)
    ids, got = vocab.logits(hidden)
    assert ids.tolist() == [*range(100), 300, 101, 511]
    np.testing.assert_array_equal(got, dec.logits(hidden)[:, ids])
    assert DraftVocab.for_decoder(dec, 0) is None
    assert DraftVocab.for_decoder(dec, model.n_vocab) is None


def test_drafts_are_asked_for_whole_tiles_of_verify_rows() -> None:
    """The verify step's rows (drafts + 1) come in fours where room allows: 16 drafts
    would pay a weight pass for a 17th row."""
    assert [tiled_room(n) for n in (1, 2, 3, 4, 6, 7, 8, 15, 16, 20)] == [
        1,
        2,
        3,
        3,
        3,
        7,
        7,
        15,
        15,
        19,
    ]


@pytest.mark.parametrize("name", ["granite", "qwen35"])
def test_ngram_drafting_gives_llama_cpp_greedy_run(tiny_model, name: str) -> None:
    model, prompt, want = _reference(tiny_model, name)
    params = SpecParams(draft_max=8, ngram_min=1, ngram_max=3)
    out, stats = _run(model, prompt, want, NgramDrafter(params), params)
    assert out == want
    assert stats.drafted_tokens > 0


class RecordedDrafter(ModelDrafter):
    """A ModelDrafter keeping each round's draft."""

    rounds: list[list[int]]

    def draft(self, history: Sequence[int], n: int) -> list[int]:
        self.rounds.append(super().draft(history, n))
        return self.rounds[-1]


def _counted_drafter(
    path: Path, n_ctx: int, params: SpecParams, lookup: BlindDrafter | None
) -> tuple[RecordedDrafter, list[int]]:
    """A draft model loaded from path (its own decoder) recording its rounds' drafts, and
    the rows of each of its steps as it makes them."""
    dec = frink_cli.load(path).decoder
    steps: list[int] = []
    step, prefill = dec.step, dec.prefill
    dec.step = lambda ids, cache, **kw: steps.append(len(ids)) or step(ids, cache, **kw)
    dec.prefill = lambda ids, cache: steps.append(len(ids)) or prefill(ids, cache)
    drafter = RecordedDrafter(dec, n_ctx, params, lookup)
    drafter.rounds = []
    return drafter, steps


@pytest.mark.parametrize("name", ["granite", "gpt_oss", "gemma4", "lfm2"])
def test_staged_drafts_are_the_draft_models_own_picks(tiny_model, name: str) -> None:
    """--spec ngram -md: the draft model's steps verify lookup's proposals (here llama.cpp's
    continuation with every third token wrong). Drafting for itself, the model drafts the
    same tokens round for round as without lookup, in fewer steps of its own (its caches
    taken back past each wrong proposal: full attention, sliding windows; a recurrent
    draft takes no proposals), and the output is llama.cpp's greedy run."""
    fx = tiny_model(name)
    model, prompt, want = _reference(tiny_model, name)
    params = SpecParams(draft_max=6, p_min=0.0)

    class Lookup(BlindDrafter):
        def prepare(self, prompt: Sequence[int]) -> None:
            pass

        def draft(self, history: Sequence[int], n: int) -> list[int]:
            at = len(history) - len(prompt)
            out = want[at : at + n]
            return [(t + 1) % model.n_vocab if (at + j) % 3 == 2 else t for j, t in enumerate(out)]

    runs = []
    for lookup in (None, Lookup()):
        drafter, steps = _counted_drafter(fx.gguf, len(prompt) + len(want) + 8, params, lookup)
        out, stats = _run(model, prompt, want, drafter, params)
        assert out == want
        assert stats.accepted_tokens == stats.drafted_tokens > 0
        runs.append((drafter.rounds, steps, drafter.cache))
    (plain, plain_steps, _), (staged, staged_steps, cache) = runs
    assert staged == plain
    assert cache is not None
    if cache.has_recurrent_state:
        assert staged_steps == plain_steps
    else:
        assert len(staged_steps) < len(plain_steps) and max(staged_steps) > 2, staged_steps


class WholeRoom(DraftBudget):
    """A budget that drafts all the room asked for: what prompt lookup copies, apart from
    how much of it the budget takes."""

    def length(self, room: int) -> int:
        return room


def _lookup(params: SpecParams | None = None) -> NgramDrafter:
    return NgramDrafter(params or SpecParams(), WholeRoom())


def test_ngram_drafter_continues_the_latest_match() -> None:
    d = _lookup(SpecParams(ngram_min=2, ngram_max=3))
    history = [1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 7, 2, 3]
    assert d.draft(history, 3) == [4, 5, 7]  # "2 3" last seen before 4 5 7
    assert d.draft([5, 6, 7], 4) == []
    assert d.draft(history, 0) == []


def _lookup_run(
    prompt: list[int], answer: list[int], d: NgramDrafter | None = None, room: int = 8
) -> list[tuple[list[int], int]]:
    """Greedy speculation as speculative_tokens runs it, with the answer known: each
    round's draft from NgramDrafter (one drafting all the room by default) and how many of
    its tokens the answer keeps."""
    d = d if d is not None else _lookup()
    history, rounds = [*prompt, answer[0]], []
    while len(history) < len(prompt) + len(answer):
        draft = d.draft(history, room)
        done = len(history) - len(prompt)
        kept = 0
        while (
            kept < len(draft) and done + kept < len(answer) and draft[kept] == answer[done + kept]
        ):
            kept += 1
        rounds.append((draft, kept))
        history += answer[done : done + kept + 1]
    return rounds


def test_prompt_lookup_drafts_on_three_matched_tokens_only() -> None:
    d = _lookup()
    assert d.draft([1, 2, 7, 8, 9, 1, 2], 4) == []  # two tokens matched: no draft
    assert d.draft([1, 2, 3, 7, 8, 9, 1, 2, 3], 4) == [7, 8, 9, 1]
    # Of two occurrences of "2 3 4", the one matching further back ("1 2 3 4") wins.
    assert d.draft([1, 2, 3, 4, 5, 6, 0, 2, 3, 4, 8, 9, 1, 2, 3, 4], 2) == [5, 6]


def test_a_host_verify_step_costs_by_its_tiles() -> None:
    """Rows cost what the kernels' tiles of 1, 2, 4 and 8 rows cost: a draft that spills
    into another tile pays for all of it; a backend's rows cost little more than one."""
    host = [verify_cost(rows, backend=False) for rows in range(1, 17)]
    assert host == sorted(host) and host[0] == 1.0
    assert verify_cost(3, False) == verify_cost(4, False)
    assert verify_cost(5, False) == verify_cost(8, False) > verify_cost(4, False)
    assert verify_cost(16, False) == 2 * verify_cost(8, False)
    assert verify_cost(16, True) < verify_cost(4, False)


def test_prompt_lookup_shrinks_its_drafts_on_text_it_does_not_repeat() -> None:
    """A prompt whose words recur (matches every round) and an answer that never follows
    them: the first draft is one tile of verify rows (7 tokens), each draft cut at its
    first token makes the next shorter, then lookup stops drafting; after PROBE_AFTER
    refusals it tries again with one token."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] * 4
    answer = [100 + i for i in range(40)]  # the target never copies
    d = NgramDrafter(SpecParams(ngram_min=1))
    lengths = []
    history = [*prompt, 1]  # "1" recurs: a match, whose continuation is never kept
    for i in range(24):
        lengths.append(len(d.draft(history, 15)))
        history = [*history, answer[i], 1]  # the target's own token, then a match again
    first_stop = lengths.index(0)
    assert lengths[0] == 7 and lengths[:first_stop] == sorted(lengths[:first_stop], reverse=True)
    assert lengths[first_stop : first_stop + PROBE_AFTER] == [0] * PROBE_AFTER
    assert 0 < lengths[first_stop + PROBE_AFTER] <= 3, lengths


def test_prompt_lookup_drafts_whole_tiles_while_the_answer_copies() -> None:
    """An answer that repeats its prompt: every draft is kept, so each is a whole tile of
    8 verify rows on the host (a tile of 16 costs two of 8 and would gain one round), and
    the room itself where a backend verifies."""
    source = list(range(1, 60))
    rounds = _lookup_run([*source, 99], source, NgramDrafter(SpecParams()), room=15)
    host = [r for r in rounds if r[0]][:-1]  # (the first rounds match nothing yet)
    assert len(host) > 4 and all(len(draft) == 7 == kept for draft, kept in host), host
    backend = NgramDrafter(SpecParams(), DraftBudget(backend=True))
    rounds = _lookup_run([*source, 99], source, backend, room=15)
    gpu = [r for r in rounds if r[0]][:-1]
    assert len(gpu) > 2 and all(len(draft) == 15 == kept for draft, kept in gpu), gpu


def test_prompt_lookup_carries_a_rename_into_later_drafts() -> None:
    """A code edit renames token 5 to 50: once a draft is rejected at the first 5, the
    later drafts write 50 where the prompt has 5 and are kept whole."""
    source = [1, 2, 3, 4, 5, 6, 7, 8, 5, 9, 5, 6, 7, 11, 12]
    answer = [50 if t == 5 else t for t in source]
    rounds = _lookup_run([*source, 99], answer)
    drafts = [r for r in rounds if r[0]]
    assert drafts[0] == ([4, 5, 6, 7, 8, 5, 9, 5], 1)  # rejected at the first rename
    # Back on the prompt's text after "6 7 8": the rename applied, every token kept (the
    # draft's last token, the separator 99, runs past the answer).
    assert drafts[1] == ([50, 9, 50, 6, 7, 11, 12, 99], 7)


def test_verification_keeps_the_sampler_distribution() -> None:
    """Speculative rejection sampling against a point-mass draft: the emitted token is
    distributed as the sampler's final distribution, whichever token was drafted (one the
    sampler may pick, and one it never picks)."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50).astype(np.float32) * 2
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.95, min_p=0.0, seed=1)
    ids, probs = Sampler(params, 50).distribution(logits, [])
    want = np.zeros(50)
    want[ids] = probs
    n = 40000
    for proposed in (int(ids[1]), int(np.argmin(logits))):
        sampler = Sampler(params, 50)
        got = np.bincount([verify(sampler, logits, [], proposed) for _ in range(n)], minlength=50)
        tv = 0.5 * np.abs(got / n - want).sum()
        assert tv < 0.015, (proposed, tv)
        assert got[want == 0].sum() == 0


@pytest.mark.real
def test_a_real_draft_with_other_tokens_is_refused(smollm2_path, gemma3_path) -> None:
    r = frink("run", smollm2_path, "-p", "hi", "-n", "2", "-md", gemma3_path)
    assert r.returncode != 0 and len(r.lines()) == 1, r.describe()
    assert "draft model" in r.stderr and "same vocabulary" in r.stderr, r.describe()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--spec", "lookahead"), "--spec: unknown type 'lookahead'"),
        (("--spec", "draft"), "--spec draft needs -md/--draft-model"),
        (("--spec", "ngram", "--draft-max", "0"), "--draft-max must be 1..256"),
        (("--spec", "ngram", "--draft-min", "20"), "--draft-min must be 0..--draft-max"),
        (("--spec", "ngram", "--draft-p-min", "2"), "--draft-p-min must be in [0, 1]"),
        (("--spec", "ngram", "--draft-vocab", "-1"), "--draft-vocab must be 0"),
    ],
)
def test_bad_speculation_flags_get_one_line(tiny_model, args, message: str) -> None:
    r = frink("run", tiny_model("granite").gguf, "-p", "hi", "-n", "2", *args)
    assert r.returncode != 0 and len(r.lines()) == 1, r.describe()
    assert message in r.stderr, r.describe()


PROMPTS = [
    "Rename the variable x to count in: x = 0\nfor i in range(10):\n    x += i\nprint(x)",
    "Repeat after me: the quick brown fox jumps over the lazy dog.",
    "List the numbers from 1 to 12, separated by commas.",
    "Write a haiku about autumn leaves.",
    "What is the capital of France? Answer in one sentence.",
    'Fix the typo: "Teh cat sat on teh mat and teh dog sat on teh rug."',
    "Translate to French: good morning, my friend.",
    "def add(a, b):\n    return a + b\n\nRewrite add to also accept a third argument c.",
]


@pytest.mark.real
def test_real_smollm2_speculation_is_plain_greedy(smollm2_path, smollm2_f32) -> None:
    """On the real SmolLM2 (F32 target), 8 prompts: prompt lookup and the Q4_1 file as a
    draft model each give plain greedy decoding's tokens, and both draft something."""
    target = frink_cli.load(smollm2_f32)
    draft = frink_cli.load(smollm2_path)
    totals = {"ngram": [0, 0], "draft": [0, 0]}
    for text in PROMPTS:
        ids = target.prompt_ids(text)
        target.speculate(None)
        plain = list(target.generate_ids(ids, max_tokens=24, temperature=0.0))
        for kind, d in (("ngram", None), ("draft", draft)):
            target.speculate(SpecParams(p_min=0.5), d)
            stats = GenerationStats()
            got = list(target.generate_ids(ids, max_tokens=24, temperature=0.0, stats=stats))
            assert got == plain, (kind, text)
            totals[kind][0] += stats.drafted_tokens
            totals[kind][1] += stats.accepted_tokens
    for kind, (drafted, accepted) in totals.items():
        assert drafted > 0 and accepted > 0, (kind, drafted, accepted)


@pytest.mark.real
def test_run_reports_speculation(smollm2_path) -> None:
    data = one_json_object(
        frink(
            "run",
            smollm2_path,
            "-p",
            PROMPTS[1],
            "-n",
            "16",
            "--temp",
            "0",
            "--spec",
            "ngram",
            "--json",
        )
    )
    spec = data["speculation"]
    assert spec["drafted_tokens"] >= spec["accepted_tokens"] >= 0
    plain = one_json_object(
        frink("run", smollm2_path, "-p", PROMPTS[1], "-n", "16", "--temp", "0", "--json")
    )
    assert data["token_ids"] == plain["token_ids"]


class Corrupting:
    """A drafter whose every third token is wrong: drafts to reject, in every round."""

    def __init__(self, inner, n_vocab: int) -> None:
        self.inner, self.n_vocab = inner, n_vocab

    def prepare(self, prompt: Sequence[int]) -> None:
        self.inner.prepare(prompt)

    def draft(self, history: Sequence[int], n: int) -> list[int]:
        out = self.inner.draft(history, n)
        return [(t + 1) % self.n_vocab if j % 3 == 2 else t for j, t in enumerate(out)]


@pytest.mark.parametrize("name", ["granite", "gpt_oss", "gemma4", "qwen35"])
def test_serve_engine_speculates_per_job_and_answers_as_plain(tiny_model, name: str) -> None:
    """8 concurrent greedy jobs on an engine that drafts for each (the model drafting for
    itself, every third draft corrupted): llama.cpp's greedy run comes out of the first,
    every job's answer is what a plain engine gives it, and drafts were kept and rejected
    (qwen35: recurrent layers, their state restored and the kept ids fed again)."""
    from test_engine import _engine, _others, _run, _stop

    model, prompt, want = _reference(tiny_model, name)
    params = SpecParams(draft_max=4, p_min=0.0)

    def drafter(n_ctx: int) -> Corrupting:
        return Corrupting(ModelDrafter(model.decoder, n_ctx, params), model.n_vocab)

    prompts = [prompt] + [p.tolist() for p in _others(model.n_vocab, [3, 9, 17, 30, 41, 5, 12])]
    plain, t = _engine(model, n_parallel=8, n_ctx=128, prefill_chunk=16)
    try:
        want_all = [tokens for tokens, _ in _run(plain, prompts, len(want))]
    finally:
        _stop(plain, t)
    spec, t = _engine(
        model, n_parallel=8, n_ctx=128, prefill_chunk=16, drafter=drafter, spec=params
    )
    try:
        got = [tokens for tokens, _ in _run(spec, prompts, len(want))]
    finally:
        _stop(spec, t)
    assert got[0] == want
    assert got == want_all
    assert 0 < spec.accepted < spec.drafted, (spec.accepted, spec.drafted)


@pytest.mark.real
def test_real_serve_with_prompt_lookup_answers_as_plain(smollm2_path) -> None:
    """`frink serve --spec ngram` on the real SmolLM2, 4 concurrent greedy chats through the
    official openai client: every answer is the plain server's."""
    import concurrent.futures
    import urllib.request

    import openai
    from serve_process import Server, clean_stop

    def answers(*args: str) -> list[str]:
        with clean_stop(Server(smollm2_path, "--alias", "m", "-np", "4", *args)) as s:
            client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)

            def chat(text: str) -> str:
                r = client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": text}],
                    max_tokens=24,
                    temperature=0,
                )
                return r.choices[0].message.content or ""

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                out = list(pool.map(chat, PROMPTS[:4]))
            metrics = urllib.request.urlopen(s.url + "/metrics", timeout=30).read().decode()
            drafted[args != ()] = _counter(metrics, "frink_spec_draft_tokens_total")
            accepted[args != ()] = _counter(metrics, "frink_spec_accepted_tokens_total")
            return out

    drafted: dict[bool, float] = {}
    accepted: dict[bool, float] = {}
    assert answers("--spec", "ngram") == answers()
    assert drafted[True] > 0 and 0 < accepted[True] <= drafted[True]
    assert drafted[False] == accepted[False] == 0


def _counter(text: str, name: str) -> float:
    """A counter's value in Prometheus's text format, read by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.real
def test_spec_ngram_with_a_draft_model_runs_both(smollm2_path) -> None:
    """`--spec ngram -md FILE` is accepted (the draft model's steps verifying lookup's
    proposals) and gives plain greedy's tokens; `--spec mtp -md FILE` is refused in one
    line."""
    args = ("run", smollm2_path, "-p", PROMPTS[1], "-n", "16", "--temp", "0", "--json")
    both = one_json_object(frink(*args, "--spec", "ngram", "-md", smollm2_path))
    assert both["token_ids"] == one_json_object(frink(*args))["token_ids"]
    assert both["speculation"]["drafted_tokens"] > 0, both
    r = frink("run", smollm2_path, "-p", "hi", "-n", "2", "--spec", "mtp", "-md", smollm2_path)
    assert r.returncode != 0 and len(r.lines()) == 1, r.describe()
    assert "--spec mtp drafts with the file's own head" in r.stderr, r.describe()
