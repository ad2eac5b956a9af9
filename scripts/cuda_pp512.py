"""pp512 and tg on the GPU: the cuda backend's dense stack against the host body.

Why this exists: the cuda backend is only worth its refusals if it is faster where it
runs. This times one 512-token prefill (the decoder's hidden states, embedding through the
last layer; the LM head is left out) and then --tg decode tokens after it (each a whole
step: layers and the lm head, at a 4096-token vocabulary) on random weights of real model
shapes, on the host body (NumPy, every CPU core) and on the stack (f32 and f16 GEMM
operands), and prints tok/s, the speedups, the ledger's submissions per prefill and per
decode token, and how far the stack's hidden states are from the host body's. Needs CuPy
and a GPU; downloads nothing (weights are random, one layer's arrays shared by every layer).

With --qtype (Q4_0, Q8_0, ...: gguf-py's quantizer) every matrix is held in that type's
blocks, on the host and on the device (kernels/quant.cu: decode reads the blocks, a prompt
dequantizes tiles for cuBLAS), and the device's resident weight bytes are printed.

Usage: python scripts/cuda_pp512.py [--shapes smollm2-135m,llama-3.2-1b] [--n 512] [--tg 16]
                                   [--qtype Q4_0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# Runnable without an install: frink_cli from this checkout (synthetic_models sits beside
# this file, so it is on the path already).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synthetic_models import SHAPES, quantized_weights, shape_config, synthetic_weights

from frink_cli.backends.cupy import make_cuda_backend
from frink_cli.decoder import Decoder
from frink_cli.quant import kernels

# Vocab kept small: embedding and logits are outside the timed stack.
TIMING_VOCAB = 4096


def _time(fn, reps: int) -> float:
    """Best of reps, in seconds (best: the machine's noise only ever adds)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _decode(dec: Decoder, ids: np.ndarray, n_tg: int) -> float:
    """Seconds for n_tg decode tokens after a prefill of ids (the prefill is not timed)."""
    cache = dec.new_cache(len(ids) + n_tg)
    dec.hidden(ids, cache)
    t0 = time.perf_counter()
    for t in range(n_tg):
        dec.step(np.asarray([t % 97]), cache)
    return time.perf_counter() - t0


def _resident_bytes(backend) -> int:
    """Bytes of the matrices the backend holds on the device (blocks, or dense operands)."""
    from frink_cli.backends.cupy.ops import DeviceQuant
    from frink_cli.backends.cupy.stack import DeviceLinear

    total = 0
    for lin in [backend.head.output] + [
        v
        for lw in backend.layers.values()
        for v in vars(lw).values()
        if isinstance(v, DeviceLinear)
    ]:
        w = lin.w
        total += sum(p.data.nbytes for p in w.parts) if isinstance(w, DeviceQuant) else w.nbytes
    return int(total)


def run_shape(
    name: str,
    n: int,
    host_reps: int,
    dev_reps: int,
    dtypes: list[str],
    xp: str = "cupy",
    n_tg: int = 0,
    qtype: str | None = None,
) -> list[dict]:
    cfg = shape_config(name, n_vocab=TIMING_VOCAB)
    w = synthetic_weights(cfg, seed=0, share_layers=True)
    if qtype:
        w = quantized_weights(w, qtype)
    ids = np.random.default_rng(0).integers(0, cfg.n_vocab, n)
    rows = []

    host = Decoder(cfg, w)
    # The reference hidden states in exact f32 activations (the device's); the timing in
    # the host's default mode (8-bit activations for quantized weights, as llama.cpp).
    with kernels.exact_activations():
        ref = host.hidden(ids, host.new_cache(n))  # also warms BLAS
    host_s = _time(lambda: host.hidden(ids, host.new_cache(n)), host_reps)
    host_tg = _decode(host, ids, n_tg) if n_tg else None
    rows.append(
        {
            "shape": name,
            "backend": "numpy",
            "dtype": "float32",
            "weights": qtype or "f32",
            "tok_s": n / host_s,
            "seconds": host_s,
            "tg_tok_s": n_tg / host_tg if n_tg else None,
        }
    )
    print(
        f"{name}: host body pp{n} {n / host_s:,.0f} tok/s ({host_s * 1e3:.0f} ms)"
        + (f", tg{n_tg} {n_tg / host_tg:,.1f} tok/s" if n_tg else ""),
        flush=True,
    )

    scale = float(np.abs(ref).max())
    for dtype in dtypes:
        backend = make_cuda_backend(cfg, array_module=xp, weight_dtype=dtype)
        dev = Decoder(cfg, w, backend)
        out = dev.hidden(ids, dev.new_cache(n))  # compiles the kernels, fills the memory pool
        backend.ledger.reset()
        s = _time(lambda dev=dev: dev.hidden(ids, dev.new_cache(n)), dev_reps)
        subs = sum(backend.ledger.submissions.values()) / dev_reps
        d = float(np.abs(out.astype(np.float64) - ref).max())
        tg = tg_subs = None
        if n_tg:
            backend.ledger.reset()
            tg = _decode(dev, ids, n_tg)
            tg_subs = (sum(backend.ledger.submissions.values()) - 1) / n_tg  # less the prefill
        rows.append(
            {
                "shape": name,
                "backend": "cuda",
                "dtype": dtype,
                "weights": qtype or "f32",
                "resident_weight_bytes": _resident_bytes(backend),
                "tok_s": n / s,
                "seconds": s,
                "speedup": host_s / s,
                "submissions_per_prefill": subs,
                "tg_tok_s": n_tg / tg if n_tg else None,
                "tg_speedup": host_tg / tg if n_tg else None,
                "submissions_per_decode_token": tg_subs,
                "refusals": dict(backend.ledger.refusals),
                "failures": dict(backend.ledger.failures),
                "max_abs_diff": d,
                "hidden_scale": scale,
            }
        )
        print(
            f"{name}: cuda ({xp}) {dtype} pp{n} {n / s:,.0f} tok/s ({s * 1e3:.1f} ms), "
            f"x{host_s / s:.1f} the host body, "
            f"{subs:g} submission(s)/prefill, max|d| hidden {d:.3g} (scale {scale:.3g}), "
            f"weights {qtype or 'f32'}: {_resident_bytes(backend) / 2**20:,.0f} MiB resident"
            + (
                f"; tg{n_tg} {n_tg / tg:,.1f} tok/s, x{host_tg / tg:.1f}, "
                f"{tg_subs:g} submission(s)/token"
                if n_tg
                else ""
            )
            + (f", FAILURES {dict(backend.ledger.failures)}" if backend.ledger.failures else ""),
            flush=True,
        )
        # Free this backend's device weights before the next one uploads its own.
        del dev, backend
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shapes",
        default="smollm2-135m,llama-3.2-1b,llama-3.2-3b",
        help=f"comma-separated, from {', '.join(SHAPES)}",
    )
    ap.add_argument("--n", type=int, default=512, help="prompt tokens")
    ap.add_argument("--host-reps", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument(
        "--tg", type=int, default=16, help="decode tokens timed after the prefill (0: none)"
    )
    ap.add_argument("--qtype", help="hold every matrix in this type's blocks (e.g. Q4_0)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument(
        "--array-module", default="cupy", help="numpy: a dry run of this script on the CPU"
    )
    args = ap.parse_args()
    rows = []
    for name in args.shapes.split(","):
        rows += run_shape(
            name.strip(),
            args.n,
            args.host_reps,
            args.reps,
            args.dtypes.split(","),
            args.array_module,
            args.tg,
            args.qtype,
        )
    print(
        "\n| shape | weights | backend | operands | pp tok/s | vs host | submissions/prefill "
        "| tg tok/s | vs host | submissions/token | max abs diff (hidden) |"
    )
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        tg = f"{r['tg_tok_s']:,.1f}" if r.get("tg_tok_s") else "-"
        print(
            f"| {r['shape']} | {r['weights']} | {r['backend']} | {r['dtype']} | "
            f"{r['tok_s']:,.0f} | "
            f"{r.get('speedup', 1.0):.1f}x | {r.get('submissions_per_prefill', '-')} | {tg} | "
            f"{r.get('tg_speedup') or 1.0:.1f}x | {r.get('submissions_per_decode_token', '-')} | "
            f"{r.get('max_abs_diff', 0.0):.3g} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if any(r.get("failures") for r in rows):
        sys.exit("the stack failed after admission (see FAILURES above)")


if __name__ == "__main__":
    main()
