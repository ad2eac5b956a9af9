"""frink: a local LLM runner. `frink_cli.load(path)` is the Python entry point."""

from . import interrupt  # noqa: F401, I001 - first: Ctrl-C during the imports below (see there)
from .api import Model, load
from .errors import FrinkError

__all__ = ["FrinkError", "Model", "load"]
__version__ = "0.1.0"
