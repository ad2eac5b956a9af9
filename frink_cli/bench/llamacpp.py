"""llama.cpp's side of `frink bench --compare llama.cpp`: llama-cpp-python's C API driven
as llama-bench drives it, and its peak memory measured in a child process."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FrinkError
from .cases import BenchTest, Sample, peak_memory_mib

# Set (to anything): llama.cpp runs without its extra CPU buffer types (AMX, repacked
# weights), ggml's plain CPU path. Some virtual machines advertise AMX, grant it, and then
# crash llama.cpp's AMX path (a segfault on the first decode of a quantized file); the test
# suite sets it, since its llama.cpp is a reference and the plain path is the same
# everywhere. Unset, llama.cpp runs as llama-bench would.
PLAIN_CPU_ENV = "FRINK_LLAMA_CPP_NO_EXTRA_BUFTS"

# ggml's type ids of the KV cache types (llama.cpp's -ctk / -ctv), and its default.
GGML_CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "bf16": 30}
LLAMA_CPP_CACHE = ("f16", "f16")


def cache_params(cache: tuple[str, str]) -> dict[str, Any]:
    """llama-cpp-python's Llama arguments for K/V cache types `cache` (frink's -ctk/-ctv):
    none for llama.cpp's own default, so it runs as it would; a quantized V cache is read
    only by llama.cpp's flash attention, which it then needs."""
    if cache == LLAMA_CPP_CACHE:
        return {}
    k, v = cache
    params: dict[str, Any] = dict(type_k=GGML_CACHE_TYPES[k], type_v=GGML_CACHE_TYPES[v])
    if v in ("q8_0", "q4_0"):
        params["flash_attn"] = True
    return params


def llama_cpp_plain_cpu_buffers() -> None:
    """From now on, every llama.cpp model this process loads (llama-cpp-python's Llama and
    the C API alike take llama_model_default_params) uses no extra CPU buffer types."""
    import llama_cpp.llama_cpp as C

    if getattr(C.llama_model_default_params, "_frink_plain", False):
        return
    default = C.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    params._frink_plain = True  # type: ignore[attr-defined]
    C.llama_model_default_params = params


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python's C API, as llama-bench drives it: batches from
    llama_batch_get_one (logits of the last token only), the KV memory cleared per sample."""

    runner = "llama.cpp"
    name = "llama.cpp"

    @staticmethod
    def check(path: Path) -> Any:
        """The llama_cpp module, or a FrinkError saying why this comparison cannot run."""
        if path.is_dir() or path.suffix.lower() != ".gguf":
            raise FrinkError(f"--compare llama.cpp needs a GGUF file, not {path}")
        try:
            import llama_cpp
        except ImportError:
            raise FrinkError(
                "--compare llama.cpp needs llama-cpp-python (pip install llama-cpp-python)"
            ) from None
        return llama_cpp

    def __init__(
        self, path: Path, n_ctx: int, n_threads: int, cache: tuple[str, str] = LLAMA_CPP_CACHE
    ) -> None:
        """cache: the K and V cache types, frink's (so both sides store the same rows)."""
        llama_cpp = self.check(path)
        if os.environ.get(PLAIN_CPU_ENV):
            llama_cpp_plain_cpu_buffers()
        self._L = llama_cpp
        self.n_batch = 512
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=max(n_ctx, 64),
                n_batch=self.n_batch,
                n_ubatch=self.n_batch,
                # Its default is half the cores for generation; llama-bench uses them all.
                n_threads=n_threads,
                n_threads_batch=n_threads,
                verbose=False,
                **cache_params(cache),
            )
        except (ValueError, RuntimeError) as e:
            raise FrinkError(f"llama.cpp cannot load {path}: {e}") from None
        self.ctx = self.llm.ctx
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_threads = n_threads
        self.name = f"llama.cpp ({n_threads} threads)"

    def threads(self, test: BenchTest) -> int:
        return self.n_threads

    def _prefill(self, ids: np.ndarray, start: int, stop: int) -> None:
        for i in range(start, stop, self.n_batch):
            self._decode(ids[i : min(i + self.n_batch, stop)])

    def _decode(self, tokens: np.ndarray) -> None:
        L = self._L
        arr = (L.llama_token * len(tokens))(*(int(t) for t in tokens))
        rc = L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise FrinkError(f"llama.cpp decode failed (code {rc})")

    def run(self, test: BenchTest, ids: np.ndarray) -> Sample:
        L = self._L
        L.llama_memory_clear(self.memory, True)
        d = test.n_depth
        self._prefill(ids, 0, d)
        L.llama_synchronize(self.ctx)
        t0 = time.perf_counter()
        if test.n_prompt:
            self._prefill(ids, d, d + test.n_prompt)
        else:
            for i in range(d, d + test.n_gen):
                self._decode(ids[i : i + 1])
        L.llama_synchronize(self.ctx)
        return Sample(time.perf_counter() - t0)

    def close(self) -> None:
        self.llm.close()


def llama_cpp_peak_mib(
    path: Path,
    n_ctx: int,
    n_threads: int,
    tests: list[BenchTest],
    cache: tuple[str, str] = LLAMA_CPP_CACHE,
) -> float:
    """llama.cpp's peak resident memory on the same file and context after the same warm-up
    work, measured in a child process: in this one frink's own memory would count too. It
    maps the file, so the pages it reads count, as they do for a llama-cli run."""
    import subprocess

    args = {
        "path": str(path),
        "n_ctx": n_ctx,
        "n_threads": n_threads,
        "tests": [[t.name, t.n_prompt, t.n_gen, t.n_depth] for t in tests],
        "cache": list(cache),
    }
    code = "from frink_cli.bench.llamacpp import _llama_cpp_peak_child; _llama_cpp_peak_child()"
    r = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, timeout=600
    )
    if r.returncode != 0:
        raise FrinkError(f"llama.cpp's memory run failed: {r.stderr.strip()[-300:]}")
    return float(r.stdout.strip().splitlines()[-1])


def _llama_cpp_peak_child() -> None:
    args = json.loads(sys.argv[1])
    cache = tuple(args["cache"])
    runner = LlamaCppRunner(Path(args["path"]), args["n_ctx"], args["n_threads"], cache)
    ids = np.zeros(args["n_ctx"], np.int64) + 1
    for name, n_prompt, n_gen, n_depth in args["tests"]:
        runner.run(BenchTest(name, n_prompt, n_gen, n_depth).warm_up(), ids)
    print(peak_memory_mib())
