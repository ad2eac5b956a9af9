"""The metal backend: MLX compiled graphs (Metal on Apple Silicon, MLX's CPU device on Linux).

Imported only when asked for, so frink runs where MLX is not installed.
"""

from __future__ import annotations

from ...errors import FrinkError


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


def make_metal_backend(cfg, checkpoint=None):
    if not mlx_available():
        raise FrinkError("backend 'metal' needs MLX: pip install 'frink[mlx]'")
    from .backend import MlxBackend

    return MlxBackend(cfg, checkpoint)
