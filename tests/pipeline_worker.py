"""One rank of the pipeline exactness test (tests/test_pipeline.py), or its one-process run.

    python tests/pipeline_worker.py OUT_DIR BACKEND STEPS MODEL [MODEL ...]
    python tests/pipeline_worker.py --micro-batch=N OUT_DIR BACKEND STEPS MODEL [MODEL ...]

Under a ring launch (MLX_RANK, MLX_HOSTFILE) each model is loaded as a pipeline stage;
rank 0 writes OUT_DIR/<i>.npz, the others follow. Without one, the whole model runs in
this process (the reference). Per model: the prefill's logits for every prompt row, then
STEPS greedy decode steps' logits and tokens, one two-sequence batched step, and a step
after a cache went back to a saved state. With --micro-batch=N, rank 0 feeds prompts in
parts of N rows, and a LONG prompt's last-row logits and the next step's are added.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from frink_cli.api import load
from frink_cli.distributed import launched
from frink_cli.distributed.pipeline import ledgers, load_stage
from frink_cli.distributed.stage import LeadDecoder
from frink_cli.errors import FrinkError

PROMPT = [1, 5, 9, 3, 7, 11, 2, 8, 4, 6, 10, 12]
LONG = 40  # prompt rows: several micro-batches


def measure(model, steps: int, micro_batch: int = 0) -> dict[str, np.ndarray]:
    dec = model.decoder
    if micro_batch and isinstance(dec, LeadDecoder):
        dec.micro_batch = micro_batch
    ids = np.array(PROMPT, np.int64) % model.n_vocab
    cache = dec.new_cache(len(ids) + steps + 1)
    prefill = dec.step(ids, cache, all_logits=True)
    print("decoding", file=sys.stderr, flush=True)
    tokens, decode = [], []
    tok = int(np.argmax(prefill[-1]))
    for _ in range(steps):
        tokens.append(tok)
        lg = dec.step(np.array([tok], np.int64), cache)
        decode.append(lg[-1])
        tok = int(np.argmax(lg[-1]))
    a, b = dec.new_cache(64), dec.new_cache(64)
    dec.step(ids[:5], a)
    batch = dec.step_batch([(ids[5:9], b), (ids[5:6], a)])
    # A server's prompt cache: a saved state, more rows, then back to the saved state.
    snap = a.snapshot()
    dec.step(ids[:3], a)
    a.restore(snap)
    again = dec.step(ids[3:5], a)
    out = dict(
        prefill=prefill, decode=np.array(decode), tokens=np.array(tokens), batch=batch, again=again
    )
    if micro_batch:  # only the last row's logits wanted: the parts before send nothing back
        long = np.arange(LONG, dtype=np.int64) * 7 % model.n_vocab
        c = dec.new_cache(LONG + 2)
        last = dec.step(long, c)
        out["long"] = np.concatenate([last, dec.step(long[:1], c)])
    return out


def main() -> None:
    try:
        run(*sys.argv[1:])
    except FrinkError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def run(*args: str) -> None:
    micro_batch = 0
    if args[0].startswith("--micro-batch="):
        micro_batch, args = int(args[0].split("=")[1]), args[1:]
    out, backend, steps, *models = args
    for i, path in enumerate(models):
        if launched():
            model = load_stage(path, backend)
            if model is None:
                continue  # a follower: rank 0 stopped this model's pipeline
        else:
            model = load(path, backend=backend)
        result = measure(model, int(steps), micro_batch)
        result["ledgers"] = np.array(json.dumps(ledgers(model)))
        np.savez(Path(out) / f"{i}.npz", **result)
        if isinstance(model.decoder, LeadDecoder):
            model.decoder.close()


if __name__ == "__main__":
    main()
