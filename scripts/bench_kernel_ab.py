"""Two builds of the compiled kernels in one process, their dots alternated: the only fair
old-against-new kernel comparison on a shared VM whose speed moves between minutes.

    python scripts/bench_kernel_ab.py A/_native.so B/_native.so Q4_K 32768 1536 [--threads 1]
        [--counts 1,2,4,8,16,256]

Build each variant (`python setup.py build_ext --inplace` in a worktree) and pass its
frink_cli/quant/_native*.so (copied to a path of its own: one path loads once). W is a
random matrix of the type, in panels for each build that has panel dots for it (else in
the file's order, as that build would load it); each row count of x is timed best-of-N
for A, then B, alternately, and whether the two builds give the same bits is printed
beside the times. FRINK_NATIVE_ISA=avx2 times both builds' AVX2 variants.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
from gguf import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from quant_weights import random_weights  # noqa: E402

from frink_cli.quant import kernels  # noqa: E402


def load_build(path: Path) -> ModuleType:
    """The compiled module at path, loaded as a module of its own."""
    loader = importlib.machinery.ExtensionFileLoader("_native", str(path))
    spec = importlib.util.spec_from_file_location("_native", str(path), loader=loader)
    if spec is None:
        raise SystemExit(f"{path}: not a loadable module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("qtype")
    ap.add_argument("rows", type=int)
    ap.add_argument("cols", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--counts", default="1,2,4,8,16", help="rows of x to time, comma-separated")
    args = ap.parse_args()
    if args.a.resolve() == args.b.resolve():
        raise SystemExit("A and B must be two files (one path loads once)")
    builds = {"A": load_build(args.a), "B": load_build(args.b)}
    qtype = GGMLQuantizationType[args.qtype]
    file_w = random_weights(qtype, args.rows, args.cols, seed=1)
    with kernels.exact_activations(False):
        panel_w = kernels.in_panels(file_w)
    # Each build reads W as it would load it: in panels where it has panel dots for the type.
    ws = {
        k: panel_w if panel_w.panels and m.panels_for(int(qtype), args.cols) else file_w
        for k, m in builds.items()
    }
    qts = {k: int(qtype) | (m.PANELS if ws[k].panels else 0) for k, m in builds.items()}
    layout = ", ".join(f"{k} {'panels' if w.panels else 'file order'}" for k, w in ws.items())
    print(f"{qtype.name} {args.rows} x {args.cols}, {layout}, {args.threads} threads")
    rng = np.random.default_rng(0)
    for n in (int(c) for c in args.counts.split(",")):
        x = rng.standard_normal((n, args.cols)).astype(np.float32)
        best = {k: float("inf") for k in builds}
        out = {k: np.empty((n, args.rows), np.float32) for k in builds}
        for _ in range(args.rounds):
            for k, m in builds.items():
                t0 = time.perf_counter()
                w = ws[k]
                m.dots(qts[k], w.data, w.rows, w.cols, x, n, out[k], args.threads, False)
                best[k] = min(best[k], time.perf_counter() - t0)
        same = np.array_equal(out["A"], out["B"])
        print(
            f"{n:3d} rows: A {best['A'] * 1e3:8.3f} ms  B {best['B'] * 1e3:8.3f} ms  "
            f"B/A {best['B'] / best['A']:.2f}  same bits: {same}  "
            f"(B: {n * args.rows * args.cols / best['B'] / 1e9:.0f} G products/s)"
        )


if __name__ == "__main__":
    main()
