"""The per-layer caches (frink_cli/cache/): a sliding-window layer keeps at most its window
of committed rows, answers exactly as a full cache would, survives a failed step, refuses a
truncation it can no longer serve; the cuda stack (NumPy stand-in) attends over it too."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from synthetic_models import synthetic_config

import frink_cli
from frink_cli.backends.cupy import make_cuda_backend
from frink_cli.cache import AttentionKv, KvCache, WindowKv
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError

MODEL = "gemma3_text"  # 5 local layers (window 6), 1 global, 1 local


def _rows(
    rng: np.random.Generator, T: int, hkv: int = 2, hd: int = 4
) -> tuple[np.ndarray, np.ndarray]:
    return (
        rng.standard_normal((T, hkv, hd)).astype(np.float32),
        rng.standard_normal((T, hkv, hd)).astype(np.float32),
    )


def _window_slots(cache: KvCache) -> list[WindowKv]:
    return [s for s in cache.slots if isinstance(s, WindowKv)]


def _held_rows(slot: WindowKv) -> int:
    first, k, v = slot.held()
    assert k.shape[1] == v.shape[1] == slot.n_past - first
    return k.shape[1]


# --- the window slot on its own -----------------------------------------------------------------


def test_window_slot_holds_its_window_after_a_long_prefill_and_many_decode_steps() -> None:
    rng = np.random.default_rng(0)
    window, n_ctx = 8, 4096
    slot, full = WindowKv(2, 4, 4, n_ctx, window), AttentionKv(2, 4, 4, n_ctx)
    k, v = _rows(rng, 300)
    for s in (slot, full):
        first, K, V = s.append(k, v)  # a batch much longer than the window: every row served
        assert first == 0 and K.shape[1] == 300
        s.commit(300)
    assert _held_rows(slot) == window
    for step in range(1000):  # many times the slack: the buffer drops rows as it goes
        k, v = _rows(rng, 1)
        first, K, V = slot.append(k, v)
        full.append(k, v)
        assert first <= 300 + step - window + 1  # every key the new query sees is there
        slot.commit(301 + step)
        full.commit(301 + step)
        assert _held_rows(slot) <= window
    first, K, V = slot.held()
    _, fk, fv = full.held()
    np.testing.assert_array_equal(K, fk[:, first:])
    np.testing.assert_array_equal(V, fv[:, first:])
    assert slot._k.shape[1] <= window + 128  # the buffer shrank back after the long batch


def test_a_failed_step_leaves_the_window_slot_as_it_was() -> None:
    rng = np.random.default_rng(1)
    slot = WindowKv(2, 4, 4, 4096, 8)
    for n in range(0, 40, 10):
        slot.append(*_rows(rng, 10))
        slot.commit(n + 10)
    first, K, V = slot.held()
    before = (first, K.copy(), V.copy(), slot.n_past)
    # A step long enough to move and grow the buffer, never committed.
    slot.rollback()
    slot.reserve(40 + 500)
    slot.append(*_rows(rng, 500))
    slot.rollback()
    first, K, V = slot.held()
    assert (first, slot.n_past) == (before[0], before[3])
    np.testing.assert_array_equal(K, before[1])
    np.testing.assert_array_equal(V, before[2])


def test_a_write_before_the_window_is_refused() -> None:
    rng = np.random.default_rng(2)
    slot = WindowKv(2, 4, 4, 4096, 8)
    slot.append(*_rows(rng, 30))
    slot.commit(30)
    with pytest.raises(FrinkError, match="holds positions 22"):
        slot.write(10, *_rows(rng, 1))


# --- through the decoder on gemma 3 -------------------------------------------------------------


def _tokens(tiny_model: Callable, n: int) -> list[int]:
    ref = [int(t) for t in tiny_model(MODEL).ref["tokens"]]
    return (ref * (n // len(ref) + 1))[:n]


def test_host_logits_with_window_caches_equal_full_caches(tiny_model: Callable) -> None:
    m = frink_cli.load(tiny_model(MODEL).gguf)
    cfg, dec = m.config, m.decoder
    window = cfg.sliding_window
    tokens = _tokens(tiny_model, 60)
    assert window is not None and len(tokens) > 4 * window
    full, win = KvCache(cfg, 64, windowed=False), dec.new_cache(64)
    assert len(_window_slots(win)) == sum(cfg.swa_layers) and not _window_slots(full)
    # A prefill longer than the window, a second one over its cached prefix, then decode.
    for chunk in (tokens[:30], tokens[30:45], *([t] for t in tokens[45:])):
        want = dec.step(np.asarray(chunk), full, all_logits=True)
        got = dec.step(np.asarray(chunk), win, all_logits=True)
        # The same keys in the same order; only the decoder's BLAS thread choice, which it
        # varies between steps, may round differently.
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        assert (got.argmax(-1) == want.argmax(-1)).all()
        assert all(_held_rows(s) <= window for s in _window_slots(win))


def test_a_failed_step_leaves_the_window_caches_untouched(
    tiny_model: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = frink_cli.load(tiny_model(MODEL).gguf)
    dec, cfg = m.decoder, m.config
    tokens = _tokens(tiny_model, 40)
    clean = dec.new_cache(64)
    dec.step(np.asarray(tokens[:20]), clean)
    want = dec.step(np.asarray(tokens[20:]), clean)

    cache = dec.new_cache(64)
    dec.step(np.asarray(tokens[:20]), cache)
    before = [(s.held()[0], s.held()[1].copy(), s.held()[2].copy()) for s in _window_slots(cache)]
    real_layer = dec.host.layer

    def failing(layer, *args, **kwargs):  # type: ignore[no-untyped-def]
        if layer == cfg.n_layer - 1:
            raise RuntimeError("simulated failure in the last layer")
        return real_layer(layer, *args, **kwargs)

    monkeypatch.setattr(dec.host, "layer", failing)
    with pytest.raises(RuntimeError):
        dec.step(np.asarray(tokens[20:]), cache)
    monkeypatch.setattr(dec.host, "layer", real_layer)
    assert cache.n_past == 20
    for (first, k, v), s in zip(before, _window_slots(cache)):
        got_first, got_k, got_v = s.held()
        assert got_first == first
        np.testing.assert_array_equal(got_k, k)
        np.testing.assert_array_equal(got_v, v)
    np.testing.assert_allclose(dec.step(np.asarray(tokens[20:]), cache), want, rtol=0, atol=1e-5)


def test_truncation_is_refused_once_the_window_rows_are_gone(tiny_model: Callable) -> None:
    m = frink_cli.load(tiny_model(MODEL).gguf)
    dec = m.decoder
    tokens = _tokens(tiny_model, 40)
    cache = dec.new_cache(64)
    first_logits = dec.step(np.asarray(tokens), cache)
    cache.truncate(39)  # the query at 39 sees 34..39: still held
    with pytest.raises(FrinkError, match="sliding window of 6 holds positions 34.. only"):
        cache.truncate(30)
    assert cache.n_past == 39  # refused before anything changed
    cache.truncate(0)  # back to the start always works
    np.testing.assert_allclose(dec.step(np.asarray(tokens), cache), first_logits, rtol=0, atol=1e-5)


def test_a_full_cache_still_truncates_anywhere() -> None:
    cfg = synthetic_config("llama", n_layer=2)
    cache = KvCache(cfg, 32)
    rng = np.random.default_rng(3)
    for layer in range(cfg.n_layer):
        cache.slot(layer).append(*_rows(rng, 20, cfg.n_head_kv, cfg.head_dim_k))
    cache.commit(20)
    cache.truncate(3)
    assert cache.n_past == 3 and cache.slot(0).held()[1].shape[1] == 3


# --- the cuda stack (NumPy stand-in) over window caches ---------------------------------------


def test_cuda_stack_over_window_caches_matches_the_host(tiny_model: Callable) -> None:
    """Prefill longer than the window, a short prefill the stack refuses (the host body writes
    those rows, so the mirrors re-sync from held rows that start after position 0), then
    decode: host logits over full caches, the device's over window caches."""
    path = tiny_model(MODEL).gguf
    host = frink_cli.load(path)
    cfg = host.config
    backend = make_cuda_backend(cfg, array_module="numpy")
    dev = Decoder(cfg, host.decoder.host.w, backend)
    tokens = _tokens(tiny_model, 48)
    hc, dc = KvCache(cfg, 64, windowed=False), dev.new_cache(64)
    for chunk in (tokens[:24], tokens[24:27], *([t] for t in tokens[27:])):
        want = host.decoder.step(np.asarray(chunk), hc, all_logits=True)
        got = dev.step(np.asarray(chunk), dc, all_logits=True)
        assert np.abs(got - want).max() <= 1e-4
        assert (got.argmax(-1) == want.argmax(-1)).all()
        assert all(_held_rows(s) <= cfg.sliding_window for s in _window_slots(dc))
    subs = backend.ledger.submissions
    assert subs.get("prefill-stack+lm-head", 0) + subs.get("prefill-stack", 0) >= 1
    assert subs.get("decode-stack+lm-head", 0) == len(tokens) - 27
    assert not backend.ledger.failures
