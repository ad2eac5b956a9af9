"""`frink serve` pages every layer kind (serve/paging.py), driven by the official `openai`
client on tiny models with no tokenizer (token ids in and out).

What must hold: a sliding-window model (gemma3: window 6, pages of 16), a hybrid (LFM2:
short-conv layers keeping a state per sequence beside paged attention layers) and an MLA
model (DeepSeek-V3: latent rows, one buffer for keys and values) start on the paged
engine and say what pages at start; greedy requests sent together answer as each does
alone on that server (resuming from their own indexed prefixes) and as the slot engine
(`--kv-slots`) answers them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from concurrency import all_at_once
from model_checks import _path
from serve_process import Server, clean_stop

openai = pytest.importorskip("openai")

KEY = "sekret-key"
N_NEW = 12
START = {
    "gemma3": ("full attention: 1 layer; sliding window 6: 6 layers, pages past it given back",),
    "lfm2": ("full attention: 2 layers", "recurrent layers keep a state per sequence"),
    "deepseek_v3": ("full attention: 3 layers, 3 of latent (MLA) rows), shared by prefix",),
}


def _completion(server: Server, prompt: list[int]) -> tuple[list[int], int]:
    """A greedy answer's tokens and the prompt tokens the server reports it reused."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    r = client.completions.create(
        model="model",
        prompt=prompt,
        max_tokens=N_NEW,
        temperature=0,
        extra_body={"return_tokens": True},
    )
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return r.choices[0].model_extra["tokens"], r.usage.prompt_tokens_details.cached_tokens


def _answers(server: Server, prompts: list[list[int]], together: bool) -> list[list[int]]:
    """Each prompt's greedy tokens, one request after another or all at once."""
    out: dict[int, list[int]] = {}

    def one(i: int) -> None:
        out[i] = _completion(server, prompts[i])[0]

    if not together:
        for i in range(len(prompts)):
            one(i)
        return [out[i] for i in range(len(prompts))]
    all_at_once(one, len(prompts))
    return [out[i] for i in range(len(prompts))]


@pytest.mark.parametrize("name", ["gemma3", "lfm2", "deepseek_v3"])
def test_every_layer_kind_pages_and_answers_alone(name: str, tiny_model: Callable) -> None:
    path = _path(tiny_model, name, "gguf")
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, 512, n).tolist() for n in (5, 19, 40, 8)]
    args = ("-np", "4", "-c", "96", "--prefill-chunk", "16", "--api-key", KEY)
    with clean_stop(Server(path, *args, "--backend", "numpy")) as paged:
        alone = _answers(paged, prompts, together=False)
        together = _answers(paged, prompts, together=True)
        log = paged.log()
    assert all(part in log for part in START[name]), log
    with clean_stop(Server(path, *args, "--backend", "numpy", "--kv-slots")) as slots:
        by_slots = _answers(slots, prompts, together=False)
    assert together == alone == by_slots


def test_a_hybrid_resumes_a_shared_prefix_where_prompts_part(tiny_model: Callable) -> None:
    """LFM2 (short-conv layers keeping a state per sequence beside paged attention): a
    prompt that parts from an indexed one inside it (a system prompt with another question
    after it) saves its state where they part, so the next prompt sharing that prefix
    resumes there; every answer is the one the slot engine gives each prompt alone."""
    path = _path(tiny_model, "lfm2", "gguf")
    rng = np.random.default_rng(4)
    system = rng.integers(0, 512, 37).tolist()
    prompts = [system + [q, *rng.integers(0, 512, 6).tolist()] for q in (11, 12, 13, 14)]
    args = ("-np", "2", "-c", "128", "--prefill-chunk", "16", "--api-key", KEY)
    with clean_stop(Server(path, *args, "--backend", "numpy")) as paged:
        got = [_completion(paged, p) for p in prompts]
    with clean_stop(Server(path, *args, "--backend", "numpy", "--kv-slots")) as slots:
        alone = [_completion(slots, p)[0] for p in prompts]
    assert [tokens for tokens, _ in got] == alone
    # The first has nothing to share; the second shares the system prompt's pages but no
    # state within them (it saves one where it parts); the rest resume there.
    assert [cached for _, cached in got] == [0, 0, len(system), len(system)]
