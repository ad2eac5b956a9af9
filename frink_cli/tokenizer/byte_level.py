"""GPT-2 byte-level text: the printable characters byte-level BPE vocabularies store for
bytes, and their decoding back to bytes (llama_decode_text)."""

from __future__ import annotations

import re


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies store)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_BYTE_TO_CHAR = _bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
HEX_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_decode(text: str) -> bytes:
    """llama_decode_text: byte-level characters back to bytes, oddities spelled out."""
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in text)
    except KeyError:
        pass
    out = bytearray()
    for c in text:
        b = _CHAR_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:  # llama.cpp writes this marker for a character outside the byte table
            out += (
                "[UNK_BYTE_0x" + c.encode("utf-8", "surrogateescape").hex() + text + "]"
            ).encode("utf-8", "surrogateescape")
    return bytes(out)
