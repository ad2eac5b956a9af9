"""The `Tokenizer`: encode, decode, BOS/EOS policy and end-of-generation ids over one
vocabulary source (`Core`), and `StreamDecoder` for text as ids arrive."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from typing import Protocol

from ..errors import FrinkError


class Core(Protocol):
    """What a vocabulary source provides: the text between BOS/EOS, and pieces."""

    n_vocab: int

    def encode_text(self, text: str, parse_special: bool) -> list[int]: ...

    def piece(self, token_id: int) -> bytes: ...

    def token_text(self, token_id: int) -> str: ...

    def token_id(self, text: str) -> int | None: ...

    def max_token_chars(self) -> int: ...

    def control_texts(self) -> list[str]: ...


class StreamDecoder:
    """Turns generated ids into text as they arrive, never splitting a UTF-8 character.

    A token may end in the middle of a multi-byte character (byte-fallback and byte-level
    BPE tokens do); its bytes are held until the character is complete. Invalid sequences
    come out as U+FFFD, as a final decode would.
    """

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class Tokenizer:
    """One model's vocabulary: encode, decode, BOS/EOS policy and end-of-generation ids."""

    def __init__(
        self,
        core: Core,
        *,
        bos_id: int | None,
        eos_id: int | None,
        eog_ids: Iterable[int],
        add_bos: bool,
        add_eos: bool,
        chat_template: str | None,
        source: str,
        sep_id: int | None = None,
        add_sep: bool = False,
    ) -> None:
        self._core = core
        self.n_vocab: int = core.n_vocab
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eog_ids: frozenset[int] = frozenset(eog_ids)
        self.add_bos = bool(add_bos) and bos_id is not None
        self.add_eos = bool(add_eos) and eos_id is not None
        self.sep_id = sep_id  # a BERT vocabulary's [SEP], appended after EOS when add_sep
        self.add_sep = bool(add_sep) and sep_id is not None
        self.chat_template = chat_template
        self.bos_text: str | None = core.token_text(bos_id) if bos_id is not None else None
        self.eos_text: str | None = core.token_text(eos_id) if eos_id is not None else None
        self.source = source  # "gguf" | "hf", for notes and error messages
        self._max_token_chars: int | None = None
        self._control_texts: tuple[str, ...] | None = None

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for `text`, as llama_tokenize(text, add_special, parse_special).

        One deliberate difference: when the text itself starts with the BOS token (written
        as text and parsed), BOS is not added a second time (nor EOS when it already ends
        with EOS). llama_tokenize would add it and warn; llama.cpp's chat path avoids the
        double BOS by stripping the BOS text first, and that is what every caller here wants.
        """
        ids = self._core.encode_text(text, parse_special)
        if add_special:
            bos, eos = self.bos_id, self.eos_id  # never None where add_bos / add_eos is set
            if self.add_bos and bos is not None and not (ids and ids[0] == bos):
                ids.insert(0, bos)
            if self.add_eos and eos is not None and not (ids and ids[-1] == eos):
                ids.append(eos)
            if self.add_sep and self.sep_id is not None:  # always, as llama_tokenize does
                ids.append(self.sep_id)
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token contributes to text (b"" for control tokens)."""
        if not 0 <= token_id < self.n_vocab:
            raise FrinkError(
                f"token id {token_id} is outside the vocabulary (0..{self.n_vocab - 1})"
            )
        return self._core.piece(token_id)

    def decode(self, ids: Sequence[int]) -> str:
        """Text for `ids`, as llama-cpp-python's Llama.detokenize(ids) decoded as UTF-8."""
        out = b"".join(self.token_bytes(int(i)) for i in ids)
        # llama-cpp-python drops one leading space after BOS (the SentencePiece word prefix).
        if len(ids) and self.bos_id is not None and ids[0] == self.bos_id and out[:1] == b" ":
            out = out[1:]
        return out.decode("utf-8", errors="replace")

    @property
    def max_token_chars(self) -> int:
        """The longest token's text in characters: n tokens spell at most n times this, so a
        text longer than that is refused untokenized (chat.prompt_ids)."""
        if self._max_token_chars is None:
            self._max_token_chars = self._core.max_token_chars()
        return self._max_token_chars

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)

    def token_text(self, token_id: int) -> str:
        """The token as the vocabulary spells it (e.g. "Ġthe", "▁the", "<|im_end|>")."""
        return self._core.token_text(token_id)

    def token_id(self, text: str) -> int | None:
        """The id of the vocabulary entry spelled exactly `text`, if there is one."""
        return self._core.token_id(text)

    @property
    def control_texts(self) -> tuple[str, ...]:
        """The spellings that encode(parse_special=True) reads as control tokens and
        parse_special=False as plain text, longest first."""
        if self._control_texts is None:
            texts = {t for t in self._core.control_texts() if t}
            self._control_texts = tuple(sorted(texts, key=lambda t: (-len(t), t)))
        return self._control_texts
