"""The `frink` commands' argument checks, in one place: numbers in range, text that is
UTF-8, and the files a flag names (prompt, grammar, schema, API key) read no further than
their limit. Each failed check raises FrinkError with the one line the command prints
(cli.main turns it into `frink: error: ...` and a non-zero exit)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .cli_pipeline import launched, read_relayed_stdin
from .constraint import GRAMMAR_MAX_BYTES
from .errors import FrinkError
from .formats.jsonfile import open_regular

# Bytes of prompt read per token of context at most: no vocabulary has tokens near this
# long, so a longer input cannot fit, and reading stops there (`-f /dev/zero` ends).
PROMPT_BYTES_PER_TOKEN = 1024
# The longest --api-key-file read, in bytes.
API_KEY_FILE_MAX_BYTES = 4096

Range = tuple[str, float, float | None, float | None]


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    """Refuse `value` of flag `name` outside [lo, hi] (a bound of None is open)."""
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise FrinkError(f"invalid value for {name}: {value} (must be {bounds})")


def check_ranges(*checks: Range) -> None:
    """check_range for each (name, value, lo, hi), in order: the first out of range fails."""
    for name, value, lo, hi in checks:
        check_range(name, value, lo, hi)


def check_utf8(text: str, flag: str) -> str:
    """Non-UTF-8 bytes in argv arrive as lone surrogates; refuse them by name."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise FrinkError(f"invalid value for {flag}: not UTF-8 text") from None
    return text


def read_limited(
    path: Path, limit: int, what: str, opener: Callable[[Path], IO[bytes]] | None = None
) -> bytes:
    """At most limit + 1 bytes of the file `what` names (the caller refuses more than limit);
    a file that cannot be read is `cannot read <what>: <reason>`."""
    try:
        with opener(path) if opener is not None else open(path, "rb") as f:
            return f.read(limit + 1)
    except OSError as e:
        raise FrinkError(f"cannot read {what}: {e.strerror or e}") from None


def decode_utf8(raw: bytes, what: str) -> str:
    """Bytes, decoded strictly: `<what> is not UTF-8 text` otherwise."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FrinkError(f"{what} is not UTF-8 text") from None


def read_prompt(prompt: str | None, file: Path | None, n_ctx: int = 0) -> str:
    """The prompt text; from a file or stdin, read only as far as a context of n_ctx tokens
    (0: the default 4096) could hold."""
    if prompt is not None and file is not None:
        raise FrinkError("give the prompt with -p or -f, not both")
    limit = (n_ctx or 4096) * PROMPT_BYTES_PER_TOKEN
    if file is not None:
        source = f"prompt file {file}"
        opener = open_regular if file.is_file() else None
        raw = read_limited(file, limit, source, opener)
    elif prompt == "-":
        if sys.stdin is None:
            raise FrinkError("cannot read the prompt from stdin: stdin is closed")
        try:
            # Under mlx.launch the pipe never closes (cli_pipeline.read_relayed_stdin).
            raw = read_relayed_stdin(limit + 1) if launched() else sys.stdin.buffer.read(limit + 1)
        except (OSError, ValueError) as e:
            raise FrinkError(
                f"cannot read the prompt from stdin: {getattr(e, 'strerror', e)}"
            ) from None
        source = "the prompt on stdin"
    elif prompt is None:
        raise FrinkError("no prompt: pass -p TEXT, -p - (stdin) or -f FILE")
    else:
        return check_utf8(prompt, "-p/--prompt")
    if len(raw) > limit:
        raise FrinkError(
            f"{source} is more than {limit} bytes, more than a context of {n_ctx or 4096} "
            "tokens can hold"
        )
    # Decoded strictly: the text stream's surrogateescape (C/POSIX locales) would hand
    # the tokenizer lone surrogates, which it cannot encode.
    text = decode_utf8(raw, source)
    # The newline translation text-mode reads apply.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_grammar_file(path: Path, flag: str) -> str:
    """A grammar or schema file's text, read no further than a grammar may be long."""
    data = read_limited(path, GRAMMAR_MAX_BYTES, f"{flag} {path}")
    if len(data) > GRAMMAR_MAX_BYTES:
        raise FrinkError(f"{flag} {path} is larger than {GRAMMAR_MAX_BYTES} bytes")
    return decode_utf8(data, f"{flag} {path}")


def constraint_args(
    grammar: str | None,
    grammar_file: Path | None,
    json_schema: str | None,
    json_schema_file: Path | None,
    regex: str | None,
) -> dict[str, Any]:
    """Model.constraint's keywords from run's flags (at most one of them given)."""
    given = [
        flag
        for flag, v in (
            ("--grammar", grammar),
            ("--grammar-file", grammar_file),
            ("-j/--json-schema", json_schema),
            ("--json-schema-file", json_schema_file),
            ("--regex", regex),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise FrinkError(f"give one constraint, not {' and '.join(given)}")
    if grammar_file is not None:
        grammar = read_grammar_file(grammar_file, "--grammar-file")
    if json_schema is not None and not json_schema.lstrip().startswith(("{", "[", "t", "f")):
        # llama.cpp's -j takes the schema itself; a path is taken too (FILE_OR_JSON).
        json_schema_file = Path(json_schema)
    if json_schema_file is not None:
        json_schema = read_grammar_file(json_schema_file, "--json-schema-file")
    if grammar is not None:
        check_utf8(grammar, "--grammar")
    if regex is not None:
        check_utf8(regex, "--regex")
    return {"grammar": grammar, "json_schema": json_schema, "regex": regex}


def read_api_key(key: str | None, file: Path | None) -> str | None:
    """The server's API key, from --api-key (or FRINK_API_KEY) or --api-key-file's first
    line."""
    if key is not None and file is not None:
        raise FrinkError("give the API key with --api-key or --api-key-file, not both")
    if file is not None:
        what = f"--api-key-file {file}"
        raw = read_limited(file, API_KEY_FILE_MAX_BYTES, what, open_regular)
        if len(raw) > API_KEY_FILE_MAX_BYTES:
            raise FrinkError(f"{what} is longer than {API_KEY_FILE_MAX_BYTES} bytes")
        key = decode_utf8(raw, what).splitlines()[0].strip() if raw.strip() else ""
        if not key:
            raise FrinkError(f"{what} is empty")
    if key is not None:
        if not key:
            raise FrinkError("--api-key is empty")
        check_utf8(key, "--api-key")
    return key
