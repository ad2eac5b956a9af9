"""BERT's WordPiece over a GGUF vocabulary (tokenizer.ggml.model "bert"), as llama.cpp's
llm_tokenizer_wpm_session tokenizes.

The GGUF spells a word's first piece with a leading "▁" (U+2581) and a continuation bare
(the converter rewrote HF's "##x" to "x" and "x" to "▁x"). Text becomes words first:
- each code point is replaced by the first code point of its NFD decomposition (llama.cpp's
  unicode_cpts_normalize_nfd maps one code point to one), when accents are stripped;
- whitespace (Unicode White_Space) ends a word; NUL, U+FFFD and control/format code points
  (Cc, Cf, Co, Cs) are dropped, and so are combining marks (M*) when accents are stripped;
- the rest is lowercased (the first code point of its lowercase) when asked, and
  punctuation (P*), ASCII symbols (S* below U+007F) and CJK ideographs are words of one.
Then each word, "▁" prepended, is matched greedily longest-first in UTF-8 bytes; a word
with a position no token starts at is [UNK] as a whole.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

# Unicode's White_Space property (llama.cpp's unicode_cpt_flags is_whitespace).
_WHITESPACE = frozenset(
    chr(c)
    for c in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B))
    + (0x2028, 0x2029, 0x202F, 0x205F, 0x3000)
)
# CJK ideograph blocks BERT splits into single-character words (the upper bound of the
# sixth range follows HF's Rust code, as llama.cpp's is_chinese_char does).
_CJK = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
_SPACE, _DROP, _ALONE = 0, 1, 2
_PHANTOM = "\u2581".encode()


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK)


class WordPiece:
    """The WPM encoder over a vocabulary: `to_id` keyed by each token's UTF-8 bytes."""

    def __init__(
        self, tokens: Iterable[str], unk_id: int | None, lowercase: bool, strip_accents: bool
    ) -> None:
        self.to_id: dict[bytes, int] = {}
        for i, t in enumerate(tokens):
            self.to_id.setdefault(t.encode("utf-8", "surrogateescape"), i)
        self.max_len = max(map(len, self.to_id), default=1)
        self.unk_id = unk_id
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self._chars: dict[str, tuple[int, str]] = {}

    def _char(self, c: str) -> tuple[int, str]:
        """(what c does to the word being built, the text it adds): _SPACE ends the word,
        _DROP adds nothing, _ALONE is a word of its own, else (-1) it is appended."""
        hit = self._chars.get(c)
        if hit is not None:
            return hit
        c2 = unicodedata.normalize("NFD", c)[0] if self.strip_accents else c
        cat = unicodedata.category(c2)
        dropped = c2 in "\x00\ufffd" or cat in ("Cc", "Cf", "Co", "Cs")
        if c2 in _WHITESPACE:
            out = (_SPACE, "")
        elif dropped or (self.strip_accents and cat[0] == "M"):
            out = (_DROP, "")
        else:
            s = c2.lower()[0] if self.lowercase else c2
            cp = ord(c2)
            alone = cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or _is_cjk(cp)
            out = (_ALONE if alone else -1, s)
        self._chars[c] = out
        return out

    def words(self, text: str) -> list[str]:
        """llm_tokenizer_wpm_session::preprocess: the normalized words of text."""
        words: list[str] = []
        cur: list[str] = []
        for c in text:
            kind, s = self._char(c)
            if kind == -1:
                cur.append(s)
                continue
            if kind == _DROP:
                continue
            if cur:
                words.append("".join(cur))
                cur = []
            if kind == _ALONE:
                words.append(s)
        if cur:
            words.append("".join(cur))
        return words

    def encode(self, text: str, out: list[int]) -> None:
        """Append text's ids: each word's greedy longest matches, or one [UNK]."""
        to_id, max_len = self.to_id, self.max_len
        for word in self.words(text):
            b = _PHANTOM + word.encode("utf-8", "surrogateescape")
            n, i, start = len(b), 0, len(out)
            while i < n:
                for j in range(min(n, i + max_len), i, -1):
                    tid = to_id.get(b[i:j])
                    if tid is not None:
                        out.append(tid)
                        i = j
                        break
                else:  # no token starts here: the whole word is unknown
                    del out[start:]
                    break
            if len(out) == start and self.unk_id is not None:
                out.append(self.unk_id)
