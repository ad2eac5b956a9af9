"""The compiled kernels' instruction-set variants, and which of them this CPU runs: the
tests that force each one (FRINK_NATIVE_ISA, as a user would) skip the others by name."""

from __future__ import annotations

from frink_cli.quant import kernels

# Every variant native.c carries, best first.
ISAS = ("avx512+amx", "avx512", "avx2", "base")


def runnable_isas() -> list[str]:
    """The variants this CPU (and its OS, for AMX's tile state) runs."""
    native = kernels._NATIVE
    if native is None:
        return []
    runnable = []
    for name in ISAS:
        try:
            before = native.use_isa(name)
        except ValueError:
            continue
        native.use_isa(before)
        runnable.append(name)
    return runnable


def unrunnable_reason(name: str) -> str | None:
    """Why variant `name` cannot run here (None: it can)."""
    if name in runnable_isas():
        return None
    return f"FRINK_NATIVE_ISA={name}: this CPU does not run it ({kernels.kernel_path()})"
