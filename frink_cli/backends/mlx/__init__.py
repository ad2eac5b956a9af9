"""The metal backend: MLX compiled graphs (Metal on Apple Silicon, MLX's CPU device on Linux).

Imported only when asked for, so frink runs where MLX is not installed.
"""

from __future__ import annotations

import os

from ...cache.kv_types import F32_CACHE, CacheTypes
from ...errors import FrinkError
from ...paths import cache_dir


def mlx_available() -> bool:
    try:
        import mlx.core  # noqa: F401
    except ImportError:
        return False
    return True


def metal_gpu_available() -> bool:
    if not mlx_available():
        return False
    import mlx.core as mx

    return mx.default_device() == mx.gpu


def make_metal_backend(cfg, checkpoint=None, cache_types: CacheTypes = F32_CACHE):
    """The metal backend; its K/V mirrors hold f16 or bf16 rows where `cache_types` say."""
    if not mlx_available():
        raise FrinkError("backend 'metal' needs MLX: pip install 'frink[mlx]'")
    _keep_jit_cache_at_home()
    from .backend import MlxBackend

    return MlxBackend(cfg, checkpoint, cache_types)


def _keep_jit_cache_at_home() -> None:
    """MLX's CPU device compiles the kernels of a traced graph to C++ under the temp dir
    (std::filesystem::temp_directory_path() / "mlx"), which reads TMPDIR: point it at
    frink's own cache, so frink writes nothing outside FRINK_HOME (tests/test_writes.py).
    Process-wide, set before the first compile; the Metal GPU path writes no such files."""
    import mlx.core as mx

    if mx.default_device() != mx.gpu:
        os.environ["TMPDIR"] = str(cache_dir("mlx-cpu"))
