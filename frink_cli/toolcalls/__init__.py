"""Tool calls in a model's output: which format a model writes them in, the grammar that
makes it write a valid one, and the parser that turns its text back into calls.

core.py holds what every format shares; one module per format family; detect.py picks a
template's format. This package's names are the ones importers use.
"""

from .core import Event, Parser, ToolCall, ToolFormat, call_schema
from .detect import FORMATS, tool_format
from .gemma4 import Gemma4Format
from .generic import GenericFormat
from .granite import GraniteFormat
from .harmony import HarmonyFormat
from .hermes import HermesFormat
from .llama3 import Llama3Format
from .mistral import MistralFormat
from .qwen_xml import QwenXmlFormat

__all__ = [
    "FORMATS",
    "Event",
    "Gemma4Format",
    "GenericFormat",
    "GraniteFormat",
    "HarmonyFormat",
    "HermesFormat",
    "Llama3Format",
    "MistralFormat",
    "Parser",
    "QwenXmlFormat",
    "ToolCall",
    "ToolFormat",
    "call_schema",
    "tool_format",
]
