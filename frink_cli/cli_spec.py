"""Speculative decoding's flags, as llama.cpp spells them (`-md/--draft-model`,
`--draft-max`, `--draft-min`, `--draft-p-min`; `--spec ngram` for prompt lookup (with `-md`:
lookup's proposals verified by the draft model's own steps), `--spec mtp` (`--spec-type
draft-mtp`) for a file's MTP head), one flag
group (cli_groups) that `frink run`, `frink bench` and `frink serve` take as
`speculation: SpecFlags | None`."""

from __future__ import annotations

from dataclasses import dataclass

import typer

from .cli_groups import flag_group
from .errors import FrinkError
from .speculative import SPEC_TYPES, SpecParams

# llama.cpp's --spec-type names for the same drafters.
LLAMA_SPEC_TYPES = {"draft-mtp": "mtp", "draft-simple": "draft", "ngram-simple": "ngram"}


@dataclass(frozen=True)
class SpecFlags:
    """What the flags ask for: the settings and the draft model's path (None: prompt
    lookup)."""

    params: SpecParams
    draft_model: str | None


def spec_flags(
    spec: str | None = typer.Option(
        None,
        "--spec",
        "--spec-type",
        help="speculative decoding: ngram (prompt lookup, no second model, drafts as long as "
        "the earlier ones were kept; with -md: the draft model's steps verify lookup's "
        "proposals, so its own drafts cost fewer steps), draft (-md) or "
        "mtp (the file's multi-token-prediction head; llama.cpp: draft-mtp)",
    ),
    draft_model: str | None = typer.Option(
        None,
        "-md",
        "--draft-model",
        help="a smaller model with the same vocabulary that drafts tokens (implies --spec draft)",
    ),
    draft_max: int = typer.Option(16, "--draft-max", help="tokens drafted per step at most"),
    draft_min: int = typer.Option(
        0, "--draft-min", help="fewer drafted tokens than this are not verified"
    ),
    draft_p_min: float = typer.Option(
        0.75,
        "--draft-p-min",
        help="the draft model stops where its best token is less likely (halved while the "
        "target keeps making its doubtful picks)",
    ),
    draft_vocab: int = typer.Option(
        32768,
        "--draft-vocab",
        help="the draft model proposes only the first N token ids and the generation's own "
        "tokens (its head reads those rows only; 0: every token)",
    ),
) -> SpecFlags | None:
    """The flags as SpecFlags, or None for plain decoding (no --spec, no -md); FrinkError
    (one line, naming the flag) for a value or a combination that cannot run."""
    if spec is None and not draft_model:
        return None
    spec = LLAMA_SPEC_TYPES.get(spec, spec) if spec is not None else None
    if spec is not None and spec not in SPEC_TYPES:
        raise FrinkError(f"--spec: unknown type {spec!r} (one of: {', '.join(SPEC_TYPES)})")
    if spec == "draft" and not draft_model:
        raise FrinkError("--spec draft needs -md/--draft-model FILE")
    if spec == "mtp" and draft_model:
        raise FrinkError("--spec mtp drafts with the file's own head: drop -md/--draft-model")
    params = SpecParams(
        draft_max=draft_max,
        draft_min=draft_min,
        p_min=draft_p_min,
        draft_vocab=draft_vocab,
        mtp=spec == "mtp",
        lookup=spec == "ngram" and bool(draft_model),
    )
    return SpecFlags(params, draft_model or None)


speculation_flags = flag_group("speculation", spec_flags)
