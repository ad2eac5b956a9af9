"""Accelerated backends and how the decoder loop asks them for work.

The decoder loop asks the active backend, before touching any cache, for the longest run
of layers it will take from layer l for this kind of step ("prefill" batch or "decode"
row). The answer is a Run or a named Refusal; on a refusal the host body runs the layer.
The NumPy host backend (host/: HostOps and HostBody) is not a Backend object: "numpy"
means no device backend, every layer on the host. Device backends never import each
other; they may reuse the host's NumPy kernels as their reference (cupy's ReferenceOps).
The protocol types live in protocol.py, which device backends import instead of this
package (this package imports them lazily).
"""

from __future__ import annotations

from ..cache.kv_types import CACHE_TYPES, F32_CACHE, CacheTypes
from ..errors import FrinkError
from .protocol import Backend, HeadBackend, LaunchFailed, Refusal, Run

BACKEND_NAMES = ("auto", "numpy", "metal", "cuda")


def check_backend_name(name: str, allowed: tuple[str, ...] = BACKEND_NAMES) -> str:
    """`name` if it is one of `allowed`, else a FrinkError naming the choices. The one check
    of a backend name: the CLI's --backend options and the library's entry points call it."""
    if name not in allowed:
        raise FrinkError(f"unknown backend {name!r} (choose from {', '.join(allowed)})")
    return name


def carried_cache_types(name: str) -> tuple[str, ...]:
    """The KV cache types backend `name` holds (the host body: every one); needs no device."""
    if name == "cuda":
        from .cupy.capabilities import KV_CACHE_TYPES
    elif name == "metal":
        from .mlx.capabilities import KV_CACHE_TYPES
    else:
        return CACHE_TYPES
    return KV_CACHE_TYPES


def cache_type_refusal(name: str, types: CacheTypes) -> str | None:
    """Why backend `name` cannot hold a KV cache of `types` (one line naming the option and
    what the backend carries), or None; needs no device. A type left to the default is
    never refused: it falls back to f32 there (CacheTypes.carried_by)."""
    return types.refusal(carried_cache_types(name), name)


def select_backend(
    name: str, cfg, checkpoint=None, cache_types: CacheTypes = F32_CACHE
) -> Backend | None:
    """None means the host body runs everything. "auto" is cuda when CuPy sees a GPU and the
    stack takes at least one layer of the model; else metal when MLX runs on a Metal GPU
    and takes a layer (MLX's CPU device on Linux is a correctness path, slower than NumPy,
    so auto never picks it); else the host body. Either is passed over by auto, and refused
    by name (FrinkError), when it cannot hold `cache_types`."""
    check_backend_name(name)
    if name == "numpy":
        return None
    if name == "auto":
        from .cupy import cuda_available, layer_refusals, make_cuda_backend

        if (
            cache_type_refusal("cuda", cache_types) is None
            and cuda_available()
            and any(r is None for r in layer_refusals(cfg, checkpoint))
        ):
            return make_cuda_backend(cfg, checkpoint=checkpoint)
        from .mlx import metal_gpu_available

        if (
            cache_type_refusal("metal", cache_types) is None
            and metal_gpu_available()
            and any(r is None for r in layer_support("metal", cfg, checkpoint))
        ):
            from .mlx import make_metal_backend

            return make_metal_backend(cfg, checkpoint, cache_types)
        return None
    refusal = cache_type_refusal(name, cache_types)
    if refusal is not None:
        raise FrinkError(refusal)
    if name == "cuda":
        from .cupy import make_cuda_backend

        return make_cuda_backend(cfg, checkpoint=checkpoint)
    from .mlx import make_metal_backend

    return make_metal_backend(cfg, checkpoint, cache_types)


def layer_support(name: str, cfg, source=None) -> list[str | None]:
    """Per layer, None if backend `name` takes it (prefill and decode steps), else every reason
    it does not, from the backend's own predicate over the layer's trace; needs no device.
    source: what the traces read the weights from (graph/trace.py: the checkpoint, the
    weights, or None for the shapes the config implies). The host body takes every layer."""
    if name == "cuda":
        from .cupy.eligibility import layer_reasons as reasons
    elif name == "metal":
        from .mlx.eligibility import layer_refusals as reasons
    else:
        return [None] * cfg.n_layer
    return [", ".join(reasons(cfg, i, source)) or None for i in range(cfg.n_layer)]


__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "HeadBackend",
    "LaunchFailed",
    "Refusal",
    "Run",
    "cache_type_refusal",
    "carried_cache_types",
    "check_backend_name",
    "layer_support",
    "select_backend",
]
