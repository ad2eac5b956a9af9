"""A GGUF vocabulary's encoding and pieces, ported from llama-vocab.cpp.

`GgufVocab` splits special tokens written as text out first (tokenizer_st_partition),
then encodes the text between them by the vocabulary's kind:
- "bpe" byte-level: a `tokenizers` BPE built by `build_bpe` behind the pre-tokenizer regexes;
- "bpe" with escaped whitespace (Gemma 4): the same BPE on raw UTF-8 with byte fallback,
  per line and per newline run;
- "spm" SentencePiece: spm.py's score-driven merges;
- "wpm" BERT WordPiece: wpm.py's greedy longest match over normalized words.
"""

from __future__ import annotations

from typing import Any

from .byte_level import HEX_BYTE, byte_level_decode
from .core import Core
from .pretokenizers import LINES_OR_NEWLINES
from .special import A_BYTE, A_CONTROL, A_LSTRIP, A_NORMAL, A_RSTRIP, A_UNKNOWN, A_USER_DEFINED
from .spm import spm_tokenize
from .wpm import WordPiece

_ISSPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale, what llama.cpp's lstrip/rstrip use


class GgufVocab(Core):
    """A GGUF vocabulary as a `Core`: tokens, their attributes and (SPM) scores, and the
    `tokenizers` BPE model for "bpe" kinds."""

    def __init__(
        self,
        tokens: list[str],
        to_id: dict[str, int],
        attrs: list[int],
        scores: list[float] | None,
        kind: str,
        add_space_prefix: bool,
        unk_id: int | None,
        bpe: Any | None,
        escape_whitespace: bool = False,
        wpm: WordPiece | None = None,
    ) -> None:
        self.tokens = tokens
        self.attrs = attrs
        self.scores = scores
        self.kind = kind  # "spm" | "bpe" | "wpm"
        self._wpm = wpm  # the WordPiece encoder of a "wpm" vocabulary
        self.add_space_prefix = add_space_prefix
        self.unk_id = unk_id
        self.n_vocab = len(tokens)
        self.to_id = to_id
        self._bpe = bpe  # tokenizers.Tokenizer for "bpe"
        # llama.cpp's escape_whitespaces for BPE: spaces are "▁" in tokens (Gemma 4)
        self.escape_whitespace = escape_whitespace
        self._pieces: dict[int, bytes] = {}
        # tokenizer_st_partition's order: control, user-defined and unknown tokens, longest
        # (in bytes) first. std::sort leaves equal lengths in no defined order; id order here.
        mask = A_CONTROL | A_USER_DEFINED | A_UNKNOWN
        special = [i for i, a in enumerate(attrs) if a & mask]
        special.sort(key=lambda i: -len(tokens[i].encode("utf-8", "surrogateescape")))
        self.special = [(tokens[i], i, attrs[i]) for i in special]

    # -- encoding ---------------------------------------------------------------------
    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split out special tokens written as text (tokenizer_st_partition)."""
        frags: list[str | int] = [text]
        for stext, sid, attr in self.special:
            if not parse_special and attr & (A_CONTROL | A_UNKNOWN):
                continue  # user-defined tokens are split out even without parse_special
            if stext not in text:
                continue  # cannot be in any fragment either: fragments are substrings
            out: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or stext not in frag:
                    out.append(frag)
                    continue
                start = 0
                while True:
                    m = frag.find(stext, start)
                    if m < 0:
                        break
                    left = frag[start:m]
                    if attr & A_LSTRIP:
                        left = left.rstrip(_ISSPACE)
                    if left:
                        out.append(left)
                    out.append(sid)
                    start = m + len(stext)
                    if attr & A_RSTRIP:
                        while start < len(frag) and frag[start] in _ISSPACE:
                            start += 1
                rest = frag[start:]
                if rest:
                    out.append(rest)
            frags = out
        return frags

    def encode_text(self, text: str, parse_special: bool) -> list[int]:
        if not text:
            return []
        ids: list[int] = []
        prev_special = True  # SPM: a word prefix space at the start and after special tokens
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                ids.append(frag)
                prev_special = True
                continue
            if self.kind == "wpm":
                assert self._wpm is not None  # load_gguf builds one for every "wpm" vocabulary
                self._wpm.encode(frag, ids)
            elif self.kind == "spm":
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._spm(frag.replace(" ", "\u2581"), ids)
            else:
                assert self._bpe is not None  # load_gguf builds one for every "bpe" vocabulary
                if self.escape_whitespace:
                    self._spm_style_bpe(frag.replace(" ", "\u2581"), ids)
                else:
                    ids.extend(self._bpe.encode(frag, add_special_tokens=False).ids)
            prev_special = False
        return ids

    def _spm_style_bpe(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_bpe_session for the gemma4 pre-tokenizer: BPE over each line and each
        newline run ("[^\\n]+|[\\n]+"), except that a newline run which is itself a token is
        taken whole (llama.cpp's Gemma 4 fix: its multi-newline tokens have no merge path)."""
        assert self._bpe is not None
        for word in LINES_OR_NEWLINES.findall(text):
            tid = self.to_id.get(word) if word[0] == "\n" else None
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._bpe.encode(word, add_special_tokens=False).ids)

    def _spm(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize over this vocabulary (spm.py)."""
        assert self.scores is not None  # every "spm" vocabulary has scores (0.0 when none stored)
        spm_tokenize(text, self.to_id, self.scores, self.unk_id, out)

    # -- decoding ---------------------------------------------------------------------
    def piece(self, token_id: int) -> bytes:
        """llama_token_to_piece(token, special=False)."""
        p = self._pieces.get(token_id)
        if p is not None:
            return p
        attr = self.attrs[token_id]
        text = self.tokens[token_id]
        if attr & (A_UNKNOWN | A_CONTROL):
            p = b""
        elif attr & A_USER_DEFINED:
            p = text.encode("utf-8", "surrogateescape")
        elif attr & A_NORMAL:
            if self.kind in ("spm", "wpm") or self.escape_whitespace:
                p = text.replace("\u2581", " ").encode("utf-8", "surrogateescape")
            else:
                p = byte_level_decode(text)
        elif attr & A_BYTE:
            m = HEX_BYTE.fullmatch(text)
            p = bytes([int(m.group(1), 16)]) if m else b""
        else:  # unused / undefined
            p = b""
        self._pieces[token_id] = p
        return p

    def token_text(self, token_id: int) -> str:
        return self.tokens[token_id]

    def max_token_chars(self) -> int:
        return max(map(len, self.tokens), default=1)

    def control_texts(self) -> list[str]:
        return [t for t, _, attr in self.special if attr & (A_CONTROL | A_UNKNOWN)]

    def token_id(self, text: str) -> int | None:
        return self.to_id.get(text)


def build_bpe(
    to_id: dict[str, int],
    merges_raw: list[str],
    regexes: list[str] | None,
    ignore_merges: bool,
    notes: list[str],
) -> Any:
    """A `tokenizers` BPE over the GGUF vocab: Split(regex, isolated)* + ByteLevel bytes, or
    with `regexes` None a bare BPE on raw UTF-8 with <0xXX> byte fallback, fed one word at a
    time (the SentencePiece-style vocabularies, GgufVocab._spm_style_bpe)."""
    from tokenizers import Regex, models, pre_tokenizers
    from tokenizers import Tokenizer as HfTokenizer

    # llama.cpp splits a merge at the first space after position 0 (one may start with " ")
    merges = [(m[:p], m[p + 1 :]) for m in merges_raw if (p := m.find(" ", 1)) > 0]
    options = {"ignore_merges": ignore_merges, "byte_fallback": regexes is None}
    try:
        model = models.BPE(vocab=dict(to_id), merges=merges, **options)
        dropped = len(merges_raw) - len(merges)
    except Exception:
        # `tokenizers` requires both halves and the result to be tokens; llama.cpp would
        # still merge and then spell the unknown result byte by byte. (Checked only here:
        # checking every merge in Python was a fifth of a model's load.)
        kept = [(a, b) for a, b in merges if a in to_id and b in to_id and a + b in to_id]
        dropped = len(merges_raw) - len(kept)
        model = models.BPE(vocab=dict(to_id), merges=kept, **options)
    if dropped:
        notes.append(
            f"tokenizer: {dropped} BPE merges name tokens missing from the vocabulary "
            "and were dropped"
        )
    tk = HfTokenizer(model)
    if regexes is None:
        return tk
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return tk
