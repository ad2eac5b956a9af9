"""Speculative decoding's flags, as llama.cpp spells them (`-md/--draft-model`,
`--draft-max`, `--draft-min`, `--draft-p-min`; `--spec ngram` for prompt lookup), shared by
`frink run`, `frink bench` and `frink serve`, and the check that turns them into settings."""

from __future__ import annotations

import typer

from .errors import FrinkError
from .speculative import SPEC_TYPES, SpecParams

SPEC = typer.Option(
    None,
    "--spec",
    help="speculative decoding: ngram (prompt lookup, no second model) or draft (-md)",
)
DRAFT_MODEL = typer.Option(
    None,
    "-md",
    "--draft-model",
    help="a smaller model with the same vocabulary that drafts tokens (implies --spec draft)",
)
DRAFT_MAX = typer.Option(16, "--draft-max", help="tokens drafted per step at most")
DRAFT_MIN = typer.Option(0, "--draft-min", help="fewer drafted tokens than this are not verified")
DRAFT_P_MIN = typer.Option(
    0.75, "--draft-p-min", help="the draft model stops where its best token is less likely"
)


def spec_params(
    spec: str | None, draft_model: str | None, draft_max: int, draft_min: int, p_min: float
) -> SpecParams | None:
    """The flags as SpecParams, or None for plain decoding (no --spec, no -md); FrinkError
    (one line, naming the flag) for a value or a combination that cannot run."""
    if spec is None and not draft_model:
        return None
    if spec is not None and spec not in SPEC_TYPES:
        raise FrinkError(f"--spec: unknown type {spec!r} (one of: {', '.join(SPEC_TYPES)})")
    if spec == "draft" and not draft_model:
        raise FrinkError("--spec draft needs -md/--draft-model FILE")
    if spec == "ngram" and draft_model:
        raise FrinkError("--spec ngram drafts without a model: drop -md/--draft-model")
    return SpecParams(draft_max=draft_max, draft_min=draft_min, p_min=p_min)
