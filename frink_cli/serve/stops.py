"""Answer text as it streams, cut at the first stop string.

Why hold text back: a stop string may arrive split over several tokens ("\\n\\nUser" as
"\\n", "\\n", "User"), and once a piece of it has been streamed it cannot be taken back.
So the longest tail of the text that could still begin a stop string is held until the
next token settles it; the stop string itself, and everything after it, is never sent.
"""

from __future__ import annotations

from ..tokenizer import Tokenizer


class StopText:
    def __init__(
        self, tok: Tokenizer | None, stops: tuple[str, ...], spell: frozenset[int] = frozenset()
    ) -> None:
        # Without a tokenizer (a model served on token ids alone) there is no text.
        self._tok = tok
        self._utf8 = tok.stream() if tok is not None else None
        # Control tokens written as their names (a tool-call format's markers).
        self._spell = spell
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.hit: str | None = None  # the stop string reached

    def push(self, token: int) -> tuple[str, bool]:
        """The text that can be sent now, and whether a stop string was reached."""
        if self._utf8 is None or self._tok is None:
            return self.push_text("")
        piece = self._utf8.push(token)
        if token in self._spell:
            piece += self._utf8.flush() + self._tok.token_text(token)
        return self.push_text(piece)

    def push_text(self, piece: str) -> tuple[str, bool]:
        """push() for text decoded elsewhere (a harmony answer's final channel)."""
        text = self._held + piece
        if not self.stops:
            self._held = ""
            return text, False
        found = [(i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if found:
            cut, self.hit = min(found, key=lambda f: f[0])
            self._held = ""
            self.stopped = True
            return text[:cut], True
        keep = self._partial_tail(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def _partial_tail(self, text: str) -> int:
        """The length of the longest suffix of `text` that is a proper prefix of a stop."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def flush(self) -> str:
        """What is left when the answer ends without a stop string."""
        tail = self._utf8.flush() if self._utf8 is not None else ""
        text, self._held = self._held + tail, ""
        return text
