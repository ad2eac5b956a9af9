"""What a backend implements, declared per op, and the refusals a layer's trace gets.

A backend declares its ops as a table: op name -> predicate over the recorded call
(graph/trace.py's OpCall), which returns None when the backend runs that call exactly as
the host body would, or the name of the argument it does not carry. An op absent from the
table is not implemented. A backend takes layer l when every call of l's trace is
supported (ggml's supports_op); each refusal reads "<op>: <argument>" or "<op>: not
implemented", a fixed string the ledger counts by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ..graph.trace import OpCall

Predicate = Callable[[OpCall], "str | None"]
Capabilities = Mapping[str, Predicate]
NOT_IMPLEMENTED = "not implemented"


def supported(call: OpCall) -> str | None:
    """The predicate of an op carried with every argument."""
    return None


def op_refusal(caps: Capabilities, call: OpCall) -> str | None:
    """None if the backend supports this call, else "<op>: <what it does not carry>"."""
    predicate = caps.get(call.op)
    refused = NOT_IMPLEMENTED if predicate is None else predicate(call)
    return None if refused is None else f"{call.op}: {refused}"


def trace_refusals(caps: Capabilities, calls: Iterable[OpCall]) -> list[str]:
    """Every distinct refusal of a layer's recorded calls, in the order the layer makes
    them ([]: the backend takes the layer)."""
    out: list[str] = []
    for call in calls:
        reason = op_refusal(caps, call)
        if reason is not None and reason not in out:
            out.append(reason)
    return out
