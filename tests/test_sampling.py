"""frink's sampler chain against llama.cpp's own samplers, stage by stage.

The reference is llama.cpp's sampler code, driven through llama-cpp-python's low-level
API on the same logits and history: a chain of penalties -> top-k -> top-p -> min-p ->
temp -> dist built exactly as llama.cpp's common_sampler builds it. After every stage the
surviving candidates and their logits must match, and after dist, the probabilities the
draw is made from. Only the random generator differs (mt19937 vs NumPy), so draws are
checked for determinism and against llama.cpp's probabilities, not token by token.
"""

from __future__ import annotations

import ctypes
import zlib
from dataclasses import replace

import llama_cpp as lc
import numpy as np
import pytest

from frink_cli.errors import FrinkError
from frink_cli.sampling import Sampler, SamplingParams, token_logprob

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def _token_array(logits: np.ndarray) -> tuple[lc.llama_token_data_array, object]:
    n = logits.shape[0]
    buf = (lc.llama_token_data * n)()
    view = np.frombuffer(buf, dtype=_TOKEN_DATA)
    view["id"] = np.arange(n)
    view["logit"] = logits
    view["p"] = 0.0
    arr = lc.llama_token_data_array(
        data=ctypes.cast(buf, lc.llama_token_data_p), size=n, selected=-1, sorted=False
    )
    return arr, buf  # the buffer must outlive the array that points into it


def _read(arr: lc.llama_token_data_array) -> np.ndarray:
    n = arr.size
    items = ctypes.cast(arr.data, ctypes.POINTER(lc.llama_token_data * n)).contents
    return np.frombuffer(items, dtype=_TOKEN_DATA).copy()


def _llama_chain(params: SamplingParams, n_vocab: int, history: list[int]):
    """The chain llama.cpp's common_sampler_init builds for these settings (no dry, xtc,
    typical, top-n-sigma: all off by default), with the history accepted into it."""
    last_n = params.repeat_last_n
    if last_n == -1:  # llama.cpp's CLI turns -1 into the context size; the history fits
        last_n = max(len(history), 1)
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    for smpl in (
        lc.llama_sampler_init_penalties(
            n_vocab, last_n, params.repeat_penalty, params.frequency_penalty,
            params.presence_penalty,
        ),
        lc.llama_sampler_init_top_k(params.top_k),
        lc.llama_sampler_init_top_p(params.top_p, 0),
        lc.llama_sampler_init_min_p(params.min_p, 0),
        lc.llama_sampler_init_temp_ext(params.temperature, 0.0, 1.0),
        lc.llama_sampler_init_dist(1234),
    ):  # fmt: skip
        lc.llama_sampler_chain_add(chain, smpl)
    for tok in history:
        lc.llama_sampler_accept(chain, tok)
    return chain


def _llama_stages(
    params: SamplingParams, logits: np.ndarray, history: list[int]
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """Candidates after each of llama.cpp's stages, the final dist state, and the whole
    chain's pick when applied in one go."""
    n_vocab = logits.shape[0]
    chain = _llama_chain(params, n_vocab, history)
    try:
        arr, buf = _token_array(logits)
        stages = []
        for i in range(5):
            lc.llama_sampler_apply(lc.llama_sampler_chain_get(chain, i), ctypes.byref(arr))
            stages.append(_read(arr))
        lc.llama_sampler_apply(lc.llama_sampler_chain_get(chain, 5), ctypes.byref(arr))
        final = _read(arr)
        selected = int(final["id"][arr.selected])
    finally:
        lc.llama_sampler_free(chain)
    del buf
    return stages, final, selected


def _as_map(ids: np.ndarray, values: np.ndarray) -> dict[int, float]:
    return {int(i): float(v) for i, v in zip(ids, values)}


CASES = {
    # llama.cpp's defaults, and with every penalty on.
    "defaults": (SamplingParams(), 2000, 1.0),
    "penalties": (
        SamplingParams(
            repeat_penalty=1.3, repeat_last_n=16, frequency_penalty=0.2, presence_penalty=0.1
        ),
        2000,
        3.0,
    ),
    "penalties-whole-history": (SamplingParams(repeat_penalty=0.7, repeat_last_n=-1), 500, 2.0),
    "penalties-off-by-n": (SamplingParams(repeat_penalty=1.5, repeat_last_n=0), 500, 2.0),
    # top-k off on a big vocabulary: llama.cpp's partial-sort top-p path (> 1024 candidates).
    "no-top-k": (SamplingParams(top_k=0, top_p=0.9, min_p=0.0, temperature=1.2), 50000, 3.0),
    # flat logits: the nucleus is wider than llama.cpp's first 256 -> full sort.
    "wide-nucleus": (SamplingParams(top_k=0, top_p=0.5, min_p=0.0), 5000, 0.1),
    # k > 128: llama.cpp's bucketed partial sort.
    "big-k-min-p": (SamplingParams(top_k=300, top_p=1.0, min_p=0.1, temperature=1.5), 4000, 2.0),
    "min-p-only": (SamplingParams(top_k=0, top_p=1.0, min_p=0.3, temperature=0.5), 3000, 2.0),
    "k-larger-than-vocab": (SamplingParams(top_k=100, top_p=0.99), 50, 1.0),
    "top-p-zero": (SamplingParams(top_p=0.0), 1000, 1.0),
    "min-p-one": (SamplingParams(top_k=0, top_p=1.0, min_p=1.0), 1000, 1.0),
    "all-off": (SamplingParams(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0), 300, 1.0),
    "greedy": (SamplingParams(temperature=0.0, repeat_penalty=1.2), 1000, 2.0),
    "negative-temp": (SamplingParams(temperature=-1.0), 1000, 2.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stages_match_llama_cpp(case: str) -> None:
    params, n_vocab, scale = CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    logits = (rng.standard_normal(n_vocab) * scale).astype(np.float32)
    # A history with repeats, old tokens outside a short window, and the best tokens
    # in it, so penalties change the ranking.
    best = np.argsort(-logits)[:8]
    history = [int(t) for t in rng.integers(0, n_vocab, 40)] + [int(t) for t in best] * 2
    theirs, final, _ = _llama_stages(params, logits, history)

    sampler = Sampler(params, n_vocab)
    ours = sampler.trace(logits, history)
    assert [name for name, _ in ours] == ["penalties", "top_k", "top_p", "min_p", "temperature"]
    for (name, c), ref in zip(ours, theirs):
        # llama.cpp's temp <= 0 keeps every candidate but sets all but the best to -inf.
        ref = ref[np.isfinite(ref["logit"])]
        assert sorted(c.ids.tolist()) == sorted(ref["id"].tolist()), f"{case}: {name} set"
        mine, want = _as_map(c.ids, c.logits), _as_map(ref["id"], ref["logit"])
        np.testing.assert_allclose(
            [mine[i] for i in want], list(want.values()), rtol=1e-6, atol=1e-6,
            err_msg=f"{case}: logits after {name}",
        )  # fmt: skip

    ids, probs = sampler.distribution(logits, history)
    ref = final[final["p"] > 0]
    want = _as_map(ref["id"], ref["p"])
    mine = _as_map(ids, probs)
    assert {i for i, p in mine.items() if p > 0} == set(want), f"{case}: final support"
    np.testing.assert_allclose([mine[i] for i in want], list(want.values()), atol=1e-6)


def test_greedy_is_llama_cpp_greedy() -> None:
    rng = np.random.default_rng(7)
    n_vocab = 5000
    params = SamplingParams(temperature=0.0, repeat_penalty=1.5, repeat_last_n=8)
    sampler = Sampler(params, n_vocab)
    for step in range(20):
        logits = (rng.standard_normal(n_vocab) * 2).astype(np.float32)
        history = [int(t) for t in np.argsort(-logits)[: step % 4]] + [3, 3, 9]
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        lc.llama_sampler_chain_add(
            chain, lc.llama_sampler_init_penalties(n_vocab, 8, 1.5, 0.0, 0.0)
        )
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        for tok in history:
            lc.llama_sampler_accept(chain, tok)
        arr, _buf = _token_array(logits)
        lc.llama_sampler_apply(chain, ctypes.byref(arr))
        want = int(_read(arr)["id"][arr.selected])
        lc.llama_sampler_free(chain)
        assert sampler.sample(logits, history) == want
    # No penalties: plain argmax, and the lower id among equals.
    flat = np.zeros(10, dtype=np.float32)
    flat[[4, 7]] = 1.0
    assert Sampler(SamplingParams(temperature=0), 10).sample(flat, []) == 4


def test_same_seed_same_sequence() -> None:
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((50, 1000)) * 1.5).astype(np.float32)

    def run(seed: int | None) -> list[int]:
        sampler = Sampler(SamplingParams(seed=seed, repeat_penalty=1.1), 1000)
        history: list[int] = [1, 2, 3]
        for row in rows:
            history.append(sampler.sample(row, history))
        return history

    assert run(42) == run(42)
    assert run(42) != run(43)
    before = rows.copy()
    run(None)
    np.testing.assert_array_equal(rows, before)  # the caller's logits are not modified


def test_draws_follow_llama_cpp_probabilities() -> None:
    # Five candidates survive; the empirical frequencies of 20k seeded draws must match
    # the probabilities llama.cpp's dist sampler computes for them.
    logits = np.full(100, -20.0, dtype=np.float32)
    logits[[3, 10, 20, 50, 99]] = [2.0, 1.5, 1.0, 0.5, 0.0]
    params = SamplingParams(seed=5, top_k=5, top_p=1.0, min_p=0.0, temperature=0.9)
    _, final, _ = _llama_stages(params, logits, [])
    want = _as_map(final["id"], final["p"])
    sampler = Sampler(params, 100)
    draws = np.array([sampler.sample(logits, []) for _ in range(20000)])
    for tok, p in want.items():
        assert abs(np.mean(draws == tok) - p) < 0.015, (tok, p)
    assert set(np.unique(draws).tolist()) <= set(want)


@pytest.mark.parametrize(
    "change, flag",
    [
        ({"top_k": -1}, "--top-k"),
        ({"top_p": 1.5}, "--top-p"),
        ({"top_p": -0.1}, "--top-p"),
        ({"min_p": 2.0}, "--min-p"),
        ({"repeat_penalty": 0.0}, "--repeat-penalty"),
        ({"repeat_last_n": -2}, "--repeat-last-n"),
        ({"temperature": float("nan")}, "--temp"),
        ({"seed": -5}, "--seed"),
        ({"top_k": 2.5}, "--top-k"),
    ],
)
def test_bad_params(change: dict, flag: str) -> None:
    with pytest.raises(FrinkError, match=flag):
        replace(SamplingParams(), **change)


def test_defaults_are_llama_cpps() -> None:
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.repeat_last_n) == (
        pytest.approx(0.8), 40, pytest.approx(0.95), pytest.approx(0.05), 1.0, 64,
    )  # fmt: skip


def test_token_logprob_is_torch_log_softmax() -> None:
    """An API's logprobs: log softmax of the raw logits at the token, and the k best tokens
    best first (ties by id), against torch's log_softmax, with logits far from zero too."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    for scale, shift in ((1.0, 0.0), (30.0, 0.0), (1.0, 1e4), (1.0, -1e4)):
        z = (rng.standard_normal(5000) * scale + shift).astype(np.float32)
        z[[7, 9]] = z.max() + 1  # a tie for the best
        want = torch.log_softmax(torch.from_numpy(z).double(), -1).numpy()
        got = token_logprob(z, 123, 5)
        assert got.token == 123 and got.logprob == pytest.approx(want[123], abs=1e-9)
        assert [t for t, _ in got.top[:2]] == [7, 9]
        assert [t for t, _ in got.top] == list(np.argsort(-want, kind="stable")[:5])
        assert np.allclose([lp for _, lp in got.top], np.sort(want)[::-1][:5], atol=1e-9)
    assert token_logprob(np.zeros(4, np.float32), 0, 0).top == ()
