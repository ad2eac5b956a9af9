"""Where frink's data files are: the tables and templates in configs/, the device kernel
sources in kernels/.

configs/ sits at the repository root because it is data, not code; frink_cli/configs is a
symlink to it so that a built wheel carries the files as package data and an installed
frink finds them beside its modules, exactly as a checkout does.
"""

from __future__ import annotations

from pathlib import Path

CONFIGS_DIR = Path(__file__).parent / "configs"
# kernels/ is linked the same way, for the cuda backend's CUDA sources.
KERNELS_DIR = Path(__file__).parent / "kernels"


def config_file(*parts: str) -> Path:
    return CONFIGS_DIR.joinpath(*parts)
