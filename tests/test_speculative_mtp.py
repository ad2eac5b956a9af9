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


@pytest.mark.parametrize("spelling", [("--spec", "mtp"), ("--spec-type", "draft-mtp")])
def test_a_file_without_mtp_heads_is_refused(tiny_model, spelling) -> None:
    path = tiny_model("qwen35").gguf
    r = frink("run", path, "-p", "hi", "-n", "2", *spelling)
    assert r.returncode != 0 and len(r.lines()) == 1, r.describe()
    assert f"--spec mtp: {path} has no MTP heads (nextn_predict_layers = 0)" in r.stderr
