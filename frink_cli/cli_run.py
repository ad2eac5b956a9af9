"""`frink run` after the prompt: the answer streamed to stdout (the final channel; the
others to stderr with -v), then the stats line on stderr, or one JSON object on stdout.

Its imports stay light (the api's are taken when a run gets here): `frink --help` stays
quick.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

from .channels import FINAL, generated_channels
from .cli_exit import err
from .errors import printable, terminal_text


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def generate_and_print(
    m: Any,
    ids: list[int],
    raw: bool,
    max_tokens: int,
    ctx_size: int,
    sampling: dict[str, Any],
    constraint: Any,
    as_json: bool,
    verbose: bool,
) -> None:
    """`frink run` after the prompt: the answer streamed to stdout then the stats line on
    stderr, or (as_json) one JSON object on stdout."""
    from .bench import peak_memory_mib  # bench/cases.py says why it is not ru_maxrss
    from .generate import GenerationStats
    from .report import ledger_summary

    stats = GenerationStats()
    n_ctx_arg = ctx_size or None
    generated = generated_channels(m, ids, raw, max_tokens, n_ctx_arg, stats, sampling, constraint)
    pieces, channels = _stream(generated, as_json, verbose)
    peak = peak_memory_mib()
    ledger = ledger_summary(m.decoder.backend)
    if as_json:
        result = _run_result(m, ids, stats, pieces, channels, peak, ledger)
        sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    _print_run_stats(m, stats, peak, ledger, verbose)


def _stream(
    generated: Iterator[tuple[str, str]], as_json: bool, verbose: bool
) -> tuple[list[str], dict[str, list[str]]]:
    """Write the answer to stdout as it comes (unless as_json) and collect it: (the final
    channel's pieces, the other channels' pieces by name)."""
    pieces: list[str] = []
    # gpt-oss's harmony channels: the final one is the answer (stdout); the others go to
    # stderr with -v, and into the JSON output by name.
    channels: dict[str, list[str]] = {}
    out = sys.stdout
    # On a terminal, a control sequence the model writes shows as its escape (it would
    # drive the terminal); a pipe or file gets the text exactly.
    shown = terminal_text if _is_terminal(out) else (lambda text: text)
    for channel, piece in generated:
        if channel != FINAL:
            channels.setdefault(channel, []).append(piece)
            if verbose and not as_json:
                err.print(printable(piece), style="dim", markup=False, highlight=False, end="")
            continue
        pieces.append(piece)
        if not as_json:
            out.write(shown(piece))
            out.flush()
    return pieces, channels


def _run_result(
    m: Any,
    ids: list[int],
    stats: Any,
    pieces: list[str],
    channels: dict[str, list[str]],
    peak: float,
    ledger: dict[str, Any] | None,
) -> dict[str, Any]:
    """`frink run --json`'s object."""
    return {
        "text": "".join(pieces),
        "model": str(m.checkpoint.path),
        "backend": m.backend_name,
        "prompt_tokens": stats.prompt_tokens,
        "prompt_ids": list(map(int, ids)),
        "token_ids": list(map(int, stats.token_ids)),
        "stop_reason": stats.stop_reason,
        **({"channels": {k: "".join(v) for k, v in channels.items()}} if channels else {}),
        "timings": {
            "prompt_seconds": stats.prompt_seconds,
            "prompt_tokens_per_second": stats.prompt_tps,
            "generate_seconds": stats.generate_seconds,
            "generated_tokens": stats.generated_tokens,
            "generate_tokens_per_second": stats.generate_tps,
        },
        **(
            {
                "speculation": {
                    "drafted_tokens": stats.drafted_tokens,
                    "accepted_tokens": stats.accepted_tokens,
                    "acceptance": stats.acceptance,
                }
            }
            if m.speculation is not None
            else {}
        ),
        "peak_memory_mib": peak,
        "device": ledger,
    }


def _print_run_stats(
    m: Any, stats: Any, peak: float, ledger: dict[str, Any] | None, verbose: bool
) -> None:
    """`frink run`'s stats line on stderr, and with -v the device ledger's."""
    err.print(
        f"[dim]prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.1f} tok/s | "
        f"generated: {stats.generated_tokens} tokens, {stats.generate_tps:.1f} tok/s | "
        f"peak memory: {peak:.0f} MiB | backend: {m.backend_name}[/dim]"
    )
    if m.speculation is not None:
        err.print(
            f"[dim]speculation: {stats.accepted_tokens} of {stats.drafted_tokens} drafted "
            f"tokens accepted ({100 * stats.acceptance:.0f}%)[/dim]"
        )
    if ledger is not None and verbose:
        err.print(
            f"[dim]device: {ledger['submissions']} submissions ("
            + ", ".join(f"{k} {v}" for k, v in ledger["by_kind"].items())
            + ")"
            + "".join(f" | refused x{v}: {k}" for k, v in ledger["refusals"].items())
            + "".join(f" | FAILED x{v}: {k}" for k, v in ledger["failures"].items())
            + "[/dim]",
            markup=True,
            highlight=False,
        )
