"""One exception type for every bad input a user can cause.

The CLI turns a FrinkError into one line on stderr and a non-zero exit; anything else
is a bug and keeps its traceback. Raise it with a message that names the problem and
the thing it concerns (file, tensor, flag), never a bare "invalid input".
"""


class FrinkError(Exception):
    """A problem with the user's input (file, flag, prompt), reported as one line."""
