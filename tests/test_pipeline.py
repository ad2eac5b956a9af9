"""Pipeline parallelism over MLX's ring (frink_cli/distributed): two ranks on loopback,
started as mlx.launch starts them (tests/ring.py), against one process.

The reference is the same model in one process (the path every other test holds to
transformers and llama.cpp): the split must change nothing, so logits agree to 1e-5 for
the prefill, 32 greedy decode steps, a two-sequence batched step and a step after going
back to a saved (recurrent) state, and each rank makes one submission per step. Fed in
micro-batches (rank 0 sends a prompt on in parts, the ranks overlapping), a prompt's
logits are the same. A rank killed, or frozen (SIGSTOP), ends rank 0 within seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from ring import finish, launch, worker
from synthetic_models import synthetic_config

from frink_cli.cache import KvCache
from frink_cli.distributed.plan import (
    StagePlan,
    memory_shares,
    parse_split,
    split_layers,
    stored_bytes,
)
from frink_cli.errors import FrinkError
from frink_cli.formats.checkpoint import TensorInfo

STEPS = 32
# pipeline_worker.py's steps with --micro-batch=5 and 4 decode steps: its 12-row prompt
# in 3 parts, 4 decode steps, 4 single steps (prefix, batch, 3 rows, again), then the
# 40-row prompt in 8 parts and one more step.
PARTS = 3 + 4 + 4 + 8 + 1
TINY = ("llama", "qwen35", "qwen3moe")  # dense, hybrid GDN (recurrent state split), MoE


def _compare(single: Path, piped: Path, n: int, ledgers: bool = True) -> None:
    for i in range(n):
        with np.load(single / f"{i}.npz") as a, np.load(piped / f"{i}.npz") as b:
            assert np.array_equal(a["tokens"], b["tokens"])  # the same greedy text
            assert sorted(a.files) == sorted(b.files)
            for key in set(a.files) - {"tokens", "ledgers"}:
                np.testing.assert_allclose(b[key], a[key], atol=1e-5, rtol=0, err_msg=key)
            if not ledgers:  # parts of a prompt are steps of their own: 12 rows are 3, 40 are 8
                assert json.loads(str(b["ledgers"]))[1]["steps"] == PARTS
                continue
            one = json.loads(str(a["ledgers"]))[0]
            ranks = json.loads(str(b["ledgers"]))
            assert [r["rank"] for r in ranks] == [0, 1]
            assert ranks[0]["layers"][0] == 0 and ranks[1]["layers"][1] == one["layers"][1]
            assert ranks[0]["layers"][1] == ranks[1]["layers"][0]
            for r in ranks:  # each rank ran its layers on the device, once per step
                assert not r["failures"] and not r["refusals"]
                assert sum(r["submissions"].values()) == sum(one["submissions"].values())


def _run_both(
    tmp_path: Path, models: list[str], backend: str = "metal", micro_batch: int = 0
) -> None:
    single, piped = tmp_path / "single", tmp_path / "piped"
    single.mkdir()
    piped.mkdir()
    pre = [f"--micro-batch={micro_batch}"] if micro_batch else []
    args = [backend, str(STEPS if not micro_batch else 4), *models]
    ranks = launch(tmp_path, [worker(*pre, str(piped), *args)] * 2)
    alone = subprocess.Popen(worker(*pre, str(single), *args), stderr=subprocess.PIPE, text=True)
    for rc, _, err in finish(ranks):
        assert rc == 0, err[-3000:]
    _, err = alone.communicate(timeout=240)
    assert alone.returncode == 0, err[-3000:]
    _compare(single, piped, len(models), ledgers=not micro_batch)


def test_two_ranks_match_one_process(tmp_path: Path, tiny_model) -> None:
    _run_both(tmp_path, [str(tiny_model(n).gguf) for n in TINY])


def test_micro_batched_prompts_match_one_process(tmp_path: Path, tiny_model) -> None:
    """Prompts of 12 and 40 rows sent on in parts of 5 (every row's logits, and the last
    row's only), dense and GDN (its recurrent state carried from part to part), against
    the whole prompt in one step of one process."""
    models = [str(tiny_model(n).gguf) for n in ("llama", "qwen35")]
    _run_both(tmp_path, models, backend="numpy", micro_batch=5)


@pytest.mark.real
def test_two_ranks_match_one_process_smollm2(tmp_path: Path, smollm2_path: Path) -> None:
    # The host body's ranks (the metal path is the tiny models' test above; on Linux's CPU
    # device its compiles make the real model's run several times slower).
    _run_both(tmp_path, [str(smollm2_path)], backend="numpy")


@pytest.mark.parametrize(
    ("sig", "says"), [(signal.SIGKILL, "rank 1 stopped"), (signal.SIGSTOP, "rank 1 froze")]
)
def test_lost_rank_ends_rank0_with_one_clear_line(
    tmp_path: Path, tiny_model, sig: signal.Signals, says: str
) -> None:
    """Killed (its link drops) or frozen (alive, silent: the watchdog, 2 s here)."""
    model = str(tiny_model("llama").gguf)
    env = dict(os.environ, FRINK_PIPELINE_PATIENCE="2")
    ranks = launch(tmp_path, [worker(str(tmp_path), "numpy", "100000", model)] * 2, env)
    try:
        assert ranks[0].stderr is not None
        for line in ranks[0].stderr:  # rank 0 reaches the decode loop
            if "decoding" in line:
                break
        time.sleep(0.5)
        ranks[1].send_signal(sig)
        t0 = time.monotonic()
        ranks[0].wait(timeout=10)
        assert time.monotonic() - t0 < 10
        assert ranks[0].returncode == 1
        err = ranks[0].stderr.read()
        ours = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(ours) == 1 and says in ours[0], err[-2000:]
        assert "Traceback" not in err
    finally:
        ranks[1].kill()  # a stopped process too
        finish(ranks, timeout=5)


def test_mismatched_ranks_refused_before_any_token(tmp_path: Path, tiny_model) -> None:
    a, b = (str(tiny_model(n).gguf) for n in ("llama", "qwen3moe"))
    ranks = launch(
        tmp_path,
        [worker(str(tmp_path), "numpy", "4", a), worker(str(tmp_path), "numpy", "4", b)],
    )
    results = finish(ranks)
    for rc, _, err in results:
        assert rc == 1
        assert "decoding" not in err
    assert "rank(s) 1 differ from rank 0 in model file" in results[0][2]


def test_layer_split() -> None:
    assert split_layers(8, [1.0, 1.0]) == (range(0, 4), range(4, 8))
    assert split_layers(8, parse_split("3,1", 2)) == (range(0, 6), range(6, 8))
    assert split_layers(3, [1.0, 1.0, 1.0, 0.0][:3]) == (range(0, 1), range(1, 2), range(2, 3))
    assert split_layers(30, [1.0] * 4) == (range(0, 8), range(8, 16), range(16, 23), range(23, 30))
    with pytest.raises(FrinkError, match="one per rank"):
        parse_split("1,2,3", 2)
    with pytest.raises(FrinkError, match="2 ranks for a model of 1"):
        split_layers(1, [1.0, 1.0])
    stage = StagePlan(1, 2, range(4, 8), (range(0, 4), range(4, 8)))
    assert stage.reads("blk.5.attn_q.weight") and not stage.reads("blk.3.attn_q.weight")
    assert stage.reads("output.weight") and not stage.reads("token_embd.weight")


class _Sizes:
    """A TensorSource of F32 tensors of the given element counts (only names and infos)."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def names(self) -> list[str]:
        return list(self.counts)

    def info(self, name: str) -> TensorInfo:
        return TensorInfo(name, (self.counts[name],), "F32")


def test_default_split_balances_bytes_with_the_ends() -> None:
    """By default the end ranks hold the embedding (first) and the head (last; the tied
    embedding again) besides their layers, so they take fewer layers: 8 layers of 10
    weights and a 20-weight table on 3 equal ranks is 40 weights each, 2 / 4 / 2 layers."""
    cfg = synthetic_config("llama", n_layer=8)
    counts = {f"blk.{i}.attn_q.weight": 10 for i in range(8)}
    tied = _Sizes({"token_embd.weight": 20, **counts})
    shares = memory_shares(cfg, tied, [1.0, 1.0, 1.0])
    assert split_layers(8, shares) == (range(0, 2), range(2, 6), range(6, 8))
    # An untied 40-weight head: 140 weights, 70 a rank: 5 layers, then 3 beside the head.
    untied = _Sizes({"token_embd.weight": 20, "output.weight": 40, **counts})
    shares = memory_shares(cfg, untied, [1.0, 1.0])
    assert split_layers(8, shares) == (range(0, 5), range(5, 8))
    # Twice the memory on the last rank: 140 / 3 = 46.7 and 93.3 weights, 2.7 / 5.3 layers.
    assert split_layers(8, memory_shares(cfg, untied, [1.0, 2.0])) == (range(0, 3), range(3, 8))
    # A Q4_0 tensor counts its blocks' bytes: 32 weights in 18 bytes.
    assert stored_bytes(TensorInfo("x", (4, 64), "Q4_0")) == 4 * 2 * 18


def test_a_stage_cache_holds_only_its_own_layers() -> None:
    """A rank's KV rows are its layers' alone: half the layers, half the K/V bytes."""
    cfg = synthetic_config("llama", n_layer=4)
    whole, mine = KvCache(cfg, 32), KvCache(cfg, 32, layers=range(2, 4))
    for c in (whole, mine):
        c.check_room(32)
    assert whole.kv_bytes > 0 and mine.kv_bytes * 2 == whole.kv_bytes
    mine.commit(32)
    mine.truncate(8)  # the layers it does not hold move with it, holding nothing
    assert mine.n_past == 8 and mine.k[0].shape[1] == 0
