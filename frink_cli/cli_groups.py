"""Flags that several commands share, declared once as a group.

A group is a function whose parameters are typer options (their defaults are
`typer.Option(...)`) and whose result is the value the commands want (settings, or None).
`flag_group("name", build)` decorates a command that takes a parameter `name`: the
command's signature, as typer reads it, loses `name` and gains build's options; each call
passes build(**those options) as `name`. A FrinkError that build raises takes the same
one-line path as one raised in the command."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, get_type_hints

F = TypeVar("F", bound=Callable[..., Any])


def flag_group(name: str, build: Callable[..., Any]) -> Callable[[F], F]:
    """Decorate a command: replace its parameter `name` with build's options (see the
    module docstring). The options go before the command's trailing `verbose`/`**` ones,
    in build's order, so `--help` lists them together."""
    group = inspect.signature(build).parameters
    group_hints = get_type_hints(build)

    def decorate(command: F) -> F:
        own = inspect.signature(command).parameters
        if name not in own:
            raise TypeError(f"{command.__name__} takes no parameter {name!r}")
        clash = set(group) & set(own)
        if clash:
            raise TypeError(f"{command.__name__} already has {sorted(clash)}")
        hints = get_type_hints(command)
        params: list[inspect.Parameter] = []
        for p in own.values():
            if p.name == name:
                params.extend(
                    q.replace(annotation=group_hints[q.name], kind=p.kind) for q in group.values()
                )
            else:
                params.append(p.replace(annotation=hints.get(p.name, p.annotation)))

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = build(**{k: kwargs.pop(k) for k in group})
            return command(*args, **kwargs, **{name: value})

        del wrapper.__wrapped__  # typer reads the signature below, not the command's
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate
