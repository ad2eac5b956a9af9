"""One exception type for every bad input a user can cause.

The CLI turns a FrinkError into one line on stderr and a non-zero exit; anything else
is a bug and keeps its traceback. Raise it with a message that names the problem and
the thing it concerns (file, tensor, flag), never a bare "invalid input".
"""


class FrinkError(Exception):
    """A problem with the user's input (file, flag, prompt), reported as one line."""


class Unavailable(FrinkError):
    """The model cannot run any more (a pipeline rank was lost): a server answers the
    requests it held with a 503, as when it stops, not a 500."""


def printable(text: str) -> str:
    """`text` with every non-printable character written as its Python escape.

    Messages quote strings from model files (tensor names, metadata keys, template
    errors); a name carrying ESC sequences, newlines or bidi overrides would otherwise
    drive the user's terminal. Printable text, non-ASCII letters included, is unchanged.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# Characters a terminal acts on rather than shows: C0/C1 controls (ESC starts a sequence
# that can move the cursor, retitle the window, write the clipboard) and the bidirectional
# overrides and isolates that reorder what is shown.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def terminal_text(text: str) -> str:
    """Model output made safe to show in a terminal: controls (but newline and tab) and
    bidi overrides written as their escapes; everything else, joiners and non-ASCII
    letters included, unchanged. Applied piece by piece to a stream, it gives the same
    text as applied once to the whole."""
    if text.isprintable():
        return text
    return "".join(
        repr(c)[1:-1]
        if (c in _BIDI or ((c < " " or "\x7f" <= c <= "\x9f") and c not in "\n\t"))
        else c
        for c in text
    )
