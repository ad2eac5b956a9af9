"""Accelerated backends and how the decoder loop asks them for work.

The decoder loop asks the active backend, before touching any cache, for the longest run
of layers it will take from layer l for this kind of step ("prefill" batch or "decode"
row). The answer is a Run or a named Refusal; on a refusal the host body runs the layer.
The NumPy host body itself is not a backend object: "numpy" means no backend, every
layer on the host. Backends never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import FrinkError
from .ledger import Ledger

BACKEND_NAMES = ("auto", "numpy", "metal", "cuda")


@dataclass(frozen=True)
class Refusal:
    reason: str


@dataclass(frozen=True)
class Run:
    start: int
    stop: int  # exclusive


class LaunchFailed(Exception):
    """A run the backend admitted failed on the device. Raised before any cache row was
    written; the decoder loop reports it (once per distinct message) and has the host body
    run the same layers."""


class Backend(Protocol):
    name: str
    ledger: Ledger

    def bind(self, weights) -> None:
        """Called once by the decoder with the loaded weights (upload what the device needs).
        Read a layer to upload through model.weights.borrow_layer(weights.layers, i): a
        layer store then loads it for the upload alone instead of keeping it on the host."""
        ...

    def resident_layers(self) -> set[int]:
        """After bind(): the layers the device holds whole. The decoder drops the host
        copies of these (the host body reloads one from the checkpoint if a launch fails
        after admission) and loads every other layer at once."""
        ...

    def plan(
        self, kind: str, layer: int, n_rows: int, cache, positions: np.ndarray | None = None
    ) -> Run | Refusal: ...

    def run(self, run: Run, x: np.ndarray, positions: np.ndarray, cache) -> np.ndarray: ...

    def end_thread(self) -> None:
        """The calling thread will run nothing more on this backend: free what the device
        runtime keeps per thread (a thread that ends holding it can abort the process)."""
        ...


class HeadBackend(Backend, Protocol):
    """A backend that can also run the lm head in a run's own submission (base.DeviceBackend
    does); the decoder asks for it only where `runs_head` says the head is resident."""

    @property
    def runs_head(self) -> bool: ...

    def run_head(
        self, run: Run, x: np.ndarray, positions: np.ndarray, cache, all_rows: bool
    ) -> np.ndarray: ...


def check_backend_name(name: str, allowed: tuple[str, ...] = BACKEND_NAMES) -> str:
    """`name` if it is one of `allowed`, else a FrinkError naming the choices. The one check
    of a backend name: the CLI's --backend options and the library's entry points call it."""
    if name not in allowed:
        raise FrinkError(f"unknown backend {name!r} (choose from {', '.join(allowed)})")
    return name


def select_backend(name: str, cfg, checkpoint=None) -> Backend | None:
    """None means the host body runs everything. "auto" is cuda when CuPy sees a GPU and the
    stack takes at least one layer of the model; else metal when MLX runs on a Metal GPU
    and takes a layer (MLX's CPU device on Linux is a correctness path, slower than NumPy,
    so auto never picks it); else the host body."""
    check_backend_name(name)
    if name == "numpy":
        return None
    if name == "auto":
        from .cupy import cuda_available, layer_refusals, make_cuda_backend

        if any(r is None for r in layer_refusals(cfg)) and cuda_available():
            return make_cuda_backend(cfg)
        from .mlx import metal_gpu_available

        if metal_gpu_available() and any(r is None for r in layer_support("metal", cfg)):
            from .mlx import make_metal_backend

            return make_metal_backend(cfg, checkpoint)
        return None
    if name == "cuda":
        from .cupy import make_cuda_backend

        return make_cuda_backend(cfg)
    from .mlx import make_metal_backend

    return make_metal_backend(cfg, checkpoint)


def layer_support(name: str, cfg) -> list[str | None]:
    """Per layer, None if backend `name` takes it (prefill and decode steps), else every reason
    it does not, from the backend's own predicate; needs no device. The host body takes
    every layer."""
    if name == "cuda":
        from .cupy.eligibility import layer_reasons

        return [", ".join(r) or None for r in (layer_reasons(cfg, i) for i in range(cfg.n_layer))]
    if name == "metal":
        from .mlx.eligibility import layer_refusals as metal_refusals

        return [", ".join(r) or None for r in (metal_refusals(cfg, i) for i in range(cfg.n_layer))]
    return [None] * cfg.n_layer
