"""Which tool-call format a chat template teaches, picked from its markers (as mlx-lm
and llama.cpp pick theirs)."""

from __future__ import annotations

from .core import ToolFormat
from .gemma4 import Gemma4Format
from .generic import GenericFormat
from .granite import GraniteFormat
from .harmony import HarmonyFormat
from .hermes import HermesFormat
from .llama3 import Llama3Format
from .mistral import MistralFormat
from .qwen_xml import QwenXmlFormat

# In the order they are tried: Qwen's XML templates also write Hermes' <tool_call>.
FORMATS: tuple[ToolFormat, ...] = (
    HarmonyFormat(),
    GraniteFormat(),
    Gemma4Format(),
    QwenXmlFormat(),
    HermesFormat(),
    MistralFormat(),
    Llama3Format(),
)


def tool_format(template: str | None, renders_tools: bool) -> ToolFormat:
    """The format a chat template teaches: the first whose markers it writes, else the
    generic one (also for a template that does not render tools)."""
    if not template or not renders_tools:
        return GenericFormat()
    for fmt in FORMATS:
        if fmt.matches(template):
            if isinstance(fmt, MistralFormat) and "[ARGS]" in template:
                return MistralFormat(named=True)
            return fmt
    return GenericFormat()
