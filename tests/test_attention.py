"""The host body's attention core (backends/host/attention.py) against softmax attention written
out in float64: a decode row over short and long caches (its scores taken in chunks of
keys past ROW_KEY_CHUNK), with grouped KV heads, a window, a soft cap and sinks; and a
prompt's blocked rows, whose last row must be the decode row's answer."""

from __future__ import annotations

import numpy as np
import pytest

from frink_cli.backends.host import attention as A


def reference(q, K, V, positions, first, window=None, softcap=None, sinks=None):
    """softmax(q K^T) V per query row and head in float64, key j at position first + j."""
    T, H, hk = q.shape
    Hkv, S, hv = V.shape
    g = H // Hkv
    out = np.zeros((T, H, hv))
    for t, p in enumerate(positions):
        keys = np.arange(S) + first
        seen = keys <= p
        if window is not None:
            seen &= p - keys < window
        for h in range(H):
            s = K[h // g].astype(np.float64) @ q[t, h].astype(np.float64)
            if softcap:
                s = np.tanh(s / softcap) * softcap
            s = np.where(seen, s, -np.inf)
            m = s.max() if sinks is None else max(s.max(), sinks[h])
            w = np.exp(s - m)
            total = w.sum() + (0.0 if sinks is None else np.exp(sinks[h] - m))
            out[t, h] = w @ V[h // g].astype(np.float64) / total
    return out.reshape(T, H * hv)


@pytest.mark.parametrize("n", [1, 5, A.ROW_KEY_CHUNK, A.ROW_KEY_CHUNK + 1, 700, 2100])
@pytest.mark.parametrize("heads", [(3, 3, 64), (1, 4, 256), (2, 1, 16)])
def test_a_decode_row_is_softmax_attention(n: int, heads: tuple[int, int, int]) -> None:
    Hkv, g, hk = heads
    rng = np.random.default_rng(n + hk)
    K = rng.standard_normal((Hkv, n + 3, hk)).astype(np.float32)[:, :n]  # a cache's view
    V = rng.standard_normal((Hkv, n + 3, hk)).astype(np.float32)[:, :n]
    q = (rng.standard_normal((1, Hkv * g, hk)) * hk**-0.5).astype(np.float32)
    got = A.attend(q, K, V, 0, np.array([n - 1]), None, None)
    np.testing.assert_allclose(got, reference(q, K, V, [n - 1], 0), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("decoration", ["window", "softcap", "sinks"])
def test_a_long_decode_row_keeps_its_decorations(decoration: str) -> None:
    rng = np.random.default_rng(3)
    # (a cache without a window holds every key from position 0)
    Hkv, g, hk, n = 2, 2, 32, 900
    first = 40 if decoration == "window" else 0
    K = rng.standard_normal((Hkv, n, hk)).astype(np.float32)
    V = rng.standard_normal((Hkv, n, hk)).astype(np.float32)
    q = (rng.standard_normal((1, Hkv * g, hk)) * 0.3).astype(np.float32)
    pos = first + n - 1
    kw: dict = {"window": 600} if decoration == "window" else {}
    if decoration == "softcap":
        kw["softcap"] = 5.0
    if decoration == "sinks":
        kw["sinks"] = rng.standard_normal(Hkv * g).astype(np.float32)
    got = A.attend(
        q, K, V, first, np.array([pos]), kw.get("window"), kw.get("softcap"), None, kw.get("sinks")
    )
    want = reference(q, K, V, [pos], first, kw.get("window"), kw.get("softcap"), kw.get("sinks"))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_prompts_last_row_is_the_decode_rows_answer() -> None:
    """The blocked prompt path and the decode row compute the same attention."""
    rng = np.random.default_rng(9)
    Hkv, g, hk, T = 2, 3, 64, 2 * A.QUERY_BLOCK + 300
    K = rng.standard_normal((Hkv, T, hk)).astype(np.float32)
    V = rng.standard_normal((Hkv, T, hk)).astype(np.float32)
    q = (rng.standard_normal((T, Hkv * g, hk)) * 0.125).astype(np.float32)
    prompt = A.attend(q, K, V, 0, np.arange(T), None, None)
    row = A.attend(q[-1:], K, V, 0, np.array([T - 1]), None, None)
    want = reference(q[-4:], K, V, np.arange(T - 4, T), 0)
    np.testing.assert_allclose(prompt[-4:], want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(row, want[-1:], rtol=2e-5, atol=2e-6)
