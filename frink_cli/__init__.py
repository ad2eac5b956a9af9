"""frink: a local LLM runner. `frink_cli.load(path)` is the Python entry point."""

from .api import Model, load
from .errors import FrinkError

__all__ = ["FrinkError", "Model", "load"]
__version__ = "0.1.0"
