"""The paged KV cache (cache/paged.py, cache/prefix.py) on a tiny llama, in process.

What must hold: a sequence whose rows live in pool pages, read through its page table by
the one attention op, computes what llama.cpp and transformers compute (the fixture's
reference logits), also when it starts from another sequence's shared prefix pages and
copies the last, partly filled one at its first row of its own; a typed cache's paged rows
are its unpaged rows' bits; the pool gives back indexed pages (least recently used) when
it runs out, and refuses by name when nothing can be given back.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest
from model_checks import REF_TOL, REFERENCES, _against_references, _compare, _path

import frink_cli
from frink_cli.cache.paged import PAGE, PoolFull
from frink_cli.cache.prefix import PrefixIndex


def _llama(tiny_model: Callable, kinds: tuple[str, str] = ("f32", "f32")) -> frink_cli.Model:
    path = _path(tiny_model, "llama", "gguf")
    return frink_cli.load(path, backend="numpy", cache_type_k=kinds[0], cache_type_v=kinds[1])


def test_shared_prefix_pages_match_references(tiny_model: Callable) -> None:
    """Sequence A prefills the reference prompt into pages and publishes them; B adopts
    A's full pages, cut inside the last one (its first own row copies that page), and
    feeds the rest a row at a time: every row of B matches llama.cpp and transformers,
    and A's pages, still shared, are unchanged."""
    tm = tiny_model("llama")
    m = _llama(tiny_model)
    dec = m.decoder
    tokens = [int(t) for t in tm.ref["tokens"]]
    n = len(tokens)
    assert n > PAGE + 2, "the reference prompt must cross a page"
    pools = dec.new_pool(8, n + 4)
    (pool,) = pools
    index = PrefixIndex(pools)
    a = dec.new_cache(n + 4, pool=pools)
    a_rows = dec.step(np.asarray(tokens), a, all_logits=True)
    _against_references(a_rows, tm.ref, "llama paged")
    index.publish(tokens, [a.tables[0].pages], a.n_past)
    before = [k.copy() for k in pool.k.values()]
    shared, rows, _ = index.lookup(tokens)
    assert shared == [a.tables[0].pages[: n // PAGE]] and rows == n // PAGE * PAGE
    b = dec.new_cache(n + 4, pool=pools)
    keep = PAGE - 3  # inside the first page: B's first own row copies it
    b.adopt(shared, keep)
    assert pool.shared == len(shared[0])
    head = dec.step(np.asarray(tokens[:keep]), dec.new_cache(n), all_logits=True)
    got = [dec.step(np.asarray([t]), b)[-1] for t in tokens[keep:]]
    _against_references(np.concatenate([head, np.stack(got)]), tm.ref, "llama adopted")
    assert b.tables[0].pages[0] != a.tables[0].pages[0], "the shared page was written, not copied"
    for k0, k1 in zip(before, pool.k.values()):
        for p in a.tables[0].pages:
            np.testing.assert_array_equal(
                k0[:, p * PAGE : (p + 1) * PAGE], k1[:, p * PAGE : (p + 1) * PAGE]
            )


def _paged_is_flat(m: frink_cli.Model) -> None:
    dec = m.decoder
    ids = np.random.default_rng(3).integers(0, m.n_vocab, PAGE + 9)
    pools = dec.new_pool(4, 64)
    paged, flat = dec.new_cache(64, pool=pools), dec.new_cache(64)
    for chunk in (ids[:11], ids[11:12], ids[12:20], *([t] for t in ids[20:])):
        np.testing.assert_array_equal(
            dec.step(np.asarray(chunk), paged), dec.step(np.asarray(chunk), flat)
        )
    assert len(paged.tables[0].pages) == 2


@pytest.mark.parametrize("kinds", [("f16", "f16"), ("bf16", "f32")])
def test_typed_paged_rows_are_the_unpaged_bits(
    kinds: tuple[str, str], tiny_model: Callable
) -> None:
    """A typed cache in pages (prompt chunks, then decode rows across a page edge) gives
    the logits the contiguous typed cache gives, bit for bit: the C reads the same stored
    rows through the table."""
    _paged_is_flat(_llama(tiny_model, kinds))


@pytest.mark.parametrize("kinds", [("q8_0", "q4_0")])
def test_quantized_paged_rows_are_the_unpaged_bits(kinds: tuple[str, str], smollm2_path) -> None:
    """As above for the block types (head widths of 64: the tiny models' 16 cannot)."""
    path = smollm2_path
    _paged_is_flat(frink_cli.load(path, cache_type_k=kinds[0], cache_type_v=kinds[1]))


@pytest.mark.parametrize(
    ("name", "kind"), [("deepseek_v2_lite", "f32"), ("deepseek_v3", "f32"), ("deepseek_v3", "f16")]
)
def test_latent_paged_rows_are_the_unpaged_bits(name: str, kind: str, tiny_model: Callable) -> None:
    """MLA layers' [latent | k_pe] rows in the full-attention pool's pages (one buffer: the
    values are the keys) give the logits the unpaged latent cache gives, bit for bit."""
    path = _path(tiny_model, name, "gguf")
    m = frink_cli.load(path, backend="numpy", cache_type_k=kind, cache_type_v=kind)
    (pool,) = m.decoder.new_pool(4, 64)
    assert pool.latent == len(pool.k) == m.decoder.cfg.n_layer
    _paged_is_flat(m)


def test_pool_reclaims_indexed_pages_then_refuses(tiny_model: Callable) -> None:
    """A full pool takes back the least recently used indexed page held by nothing else;
    with every page in a table, a step is refused by name before any layer writes."""
    dec = _llama(tiny_model).decoder
    pools = dec.new_pool(3, 64)
    (pool,) = pools
    index = PrefixIndex(pools)
    ids = list(range(1, 2 * PAGE + 1))
    a = dec.new_cache(64, pool=pools)
    dec.step(np.asarray(ids), a)
    index.publish(ids, [a.tables[0].pages], a.n_past)
    a.truncate(0)
    assert pool.used == 2 and pool.available() == 3
    b = dec.new_cache(64, pool=pools)
    dec.step(np.asarray(ids[:PAGE] + [7] * (2 * PAGE)), b)  # 3 pages: both indexed ones go
    assert len(index) == 0 and pool.used == 3
    with pytest.raises(PoolFull, match=r"3 pages \(full attention\) are all in use"):
        dec.step(np.asarray([5]), b)
    assert b.n_past == 3 * PAGE


def _gemma3(tiny_model: Callable) -> frink_cli.Model:
    return frink_cli.load(_path(tiny_model, "gemma3", "gguf"), backend="numpy")


def test_window_layers_hold_only_their_window_pages(tiny_model: Callable) -> None:
    """gemma3's sliding-window layers (window 6) page in a pool of their own: as a sequence
    grows past many pages, its window table holds at most ceil(6 / PAGE) + 1 pages while
    the full-attention table holds them all, and every step's logits are the unpaged
    cache's bits (prompt chunks, then decode rows)."""
    dec = _gemma3(tiny_model).decoder
    pools = dec.new_pool(8, 96)
    assert [p.kind for p in pools] == ["full attention", "sliding window 6"]
    ids = np.random.default_rng(4).integers(0, dec.cfg.n_vocab, 70)
    paged, flat = dec.new_cache(96, pool=pools), dec.new_cache(96)
    full, window = paged.tables
    for chunk in (ids[:21], ids[21:40], *([t] for t in ids[40:])):
        np.testing.assert_array_equal(
            dec.step(np.asarray(chunk), paged), dec.step(np.asarray(chunk), flat)
        )
        assert window.held <= -(-6 // PAGE) + 1, window.pages
    assert full.held == -(-70 // PAGE) and window.start > 0
    assert pools.pools[1].used == window.held  # the pages it gave back are free
    paged.truncate(0)
    assert pools.used == 0


def test_windowed_prefix_resumes_where_its_window_is_held(tiny_model: Callable) -> None:
    """A windowed model's prefix is found only as far as the window pages its next query
    sees are indexed: a page published after the window left it cuts a lookup back to an
    earlier page's end; a sequence resuming from the shared pages answers as one computed
    afresh."""
    dec = _gemma3(tiny_model).decoder
    pools = dec.new_pool(16, 96)
    index = PrefixIndex(pools)
    ids = np.random.default_rng(5).integers(0, dec.cfg.n_vocab, 50).tolist()
    a = dec.new_cache(96, pool=pools)
    for chunk in (ids[:20], ids[20:40], *([t] for t in ids[40:])):
        dec.step(np.asarray(chunk), a)
        index.publish(ids, [t.pages for t in a.tables], a.n_past)
    a.truncate(0)
    # Page 1 filled in the step that also moved the window past it: indexed without its
    # window page, so a prefix ending in page 2 before row 37 cannot resume there.
    assert index.lookup(ids[:35] + [1, 2], most=36)[1] == PAGE
    q = ids[:45] + [1, 2, 3]
    pages, rows, _ = index.lookup(q, most=len(q) - 1)
    assert rows == 45 and pages[1][1] == -1
    b = dec.new_cache(96, pool=pools)
    b.adopt(pages, rows)
    got = [dec.step(np.asarray([t]), b)[-1] for t in q[rows:]]
    want = dec.step(np.asarray(q), dec.new_cache(96), all_logits=True)[rows:]
    np.testing.assert_array_equal(np.stack(got), want)


@pytest.mark.parametrize(
    ("name", "form", "refs"),
    [("gemma3", "gguf", REFERENCES), ("llama4_chunked", "hf", ("logits_hf",))],
)
def test_windowed_pages_match_references(
    name: str, form: str, refs: tuple[str, ...], tiny_model
) -> None:
    """A sliding-window model (gemma3, window 6) and a chunked-attention one (llama4, chunk
    8, from its HF directory: its GGUF states llama.cpp's chunk of 8192) through paged
    caches, a prompt chunk and then a row at a time across pages: every row matches
    transformers (and llama.cpp), while the windowed table holds at most
    ceil(span / PAGE) + 1 pages."""
    tm = tiny_model(name)
    dec = frink_cli.load(_path(tiny_model, name, form), backend="numpy").decoder
    tokens = [int(t) for t in tm.ref["tokens"]]
    cache = dec.new_cache(64, pool=dec.new_pool(8, 64))
    windowed = cache.tables[-1]
    assert windowed.pool.span is not None
    bound = -(-windowed.pool.span.size // PAGE) + 1
    rows = [dec.step(np.asarray(tokens[:9]), cache, all_logits=True)]
    for t in tokens[9:]:
        rows.append(dec.step(np.asarray([t]), cache, all_logits=True))
        assert windowed.held <= bound, windowed.pages
    assert windowed.start > 0
    got = np.concatenate(rows)
    for key in refs:
        _compare(got, tm.ref[key], REF_TOL, f"{name} paged vs {key}")


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_a_pool_takes_memory_as_its_rows_are_written(tiny_model: Callable) -> None:
    """A server's pool maps its memory as rows are written: a sequence's first token costs
    a few small pages, not the pool (each KV head's rows for every page lie apart, so in
    2 MB pages one token touched a huge page per head and layer: a server's first request
    paid for zeroing nearly the whole pool)."""
    m = _llama(tiny_model)
    dec = m.decoder
    dec.step(np.asarray([1, 2]), dec.new_cache(8))  # the step's own first allocations
    pools = dec.new_pool(4096, 8192)  # 65536 rows
    held = sum(b.nbytes for p in pools for bufs in (p.k, p.v) for b in bufs.values())
    assert held >= 16 << 20, held
    cache = dec.new_cache(8192, pool=pools)
    before = _resident_bytes()
    dec.step(np.asarray([1]), cache)
    grown = _resident_bytes() - before
    assert grown < held // 8, (grown, held)


def test_a_hybrids_index_keeps_at_most_its_states(tiny_model: Callable) -> None:
    """LFM2's prefix index (recurrent states beside paged attention) keeps at most
    max_states states, the least recently used let go first: a prefix whose state went no
    longer resumes, though its pages stay indexed; one looked up since and a newer one
    still do."""
    dec = frink_cli.load(_path(tiny_model, "lfm2", "gguf"), backend="numpy").decoder
    pools = dec.new_pool(16, 64)
    index = PrefixIndex(pools, stateful=True, max_states=2)
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, dec.cfg.n_vocab, 20).tolist() for _ in range(3)]

    def publish(ids: list[int]) -> None:
        c = dec.new_cache(64, pool=pools)
        dec.step(np.asarray(ids), c)
        index.publish(ids, [t.pages for t in c.tables], c.n_past, partial=True, state=c.snapshot())
        c.truncate(0)

    publish(prompts[0])
    publish(prompts[1])
    assert index.lookup(prompts[0] + [1]).rows == 20  # used: now the most recent
    publish(prompts[2])  # a third state: prompts[1]'s goes
    assert [index.lookup(p + [1]).rows for p in prompts] == [20, 0, 20]
    assert index.matched(prompts[1] + [1]) == 20
