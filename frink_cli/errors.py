"""One exception type for every bad input a user can cause.

The CLI turns a FrinkError into one line on stderr and a non-zero exit; anything else
is a bug and keeps its traceback. Raise it with a message that names the problem and
the thing it concerns (file, tensor, flag), never a bare "invalid input".
"""


class FrinkError(Exception):
    """A problem with the user's input (file, flag, prompt), reported as one line."""


def printable(text: str) -> str:
    """`text` with every non-printable character written as its Python escape.

    Messages quote strings from model files (tensor names, metadata keys, template
    errors); a name carrying ESC sequences, newlines or bidi overrides would otherwise
    drive the user's terminal. Printable text, non-ASCII letters included, is unchanged.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
