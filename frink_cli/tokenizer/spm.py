"""SentencePiece ("llama") tokenization, a port of llm_tokenizer_spm_session::tokenize.

`tokenizers` cannot express it exactly (its BPE merges are ranked pairs, not "any two
neighbours whose concatenation is a token, best score first"), and a faithful merge list
for a 262k vocab is large and slow to build, so it is plain Python.
"""

from __future__ import annotations

from heapq import heappop, heappush

from ..errors import FrinkError


def spm_tokenize(
    text: str, to_id: dict[str, int], scores: list[float], unk_id: int | None, out: list[int]
) -> None:
    """Append the ids of `text` (spaces already written as "▁") to `out`: best-scoring
    neighbour merges, then each symbol that is no token as its UTF-8 bytes."""
    n = len(text)
    if n == 0:
        return
    start = list(range(n))  # symbol i covers text[start[i] : start[i] + size[i]]
    size = [1] * n
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    heap: list[tuple[float, int, int, int]] = []

    def try_add(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        s = start[left]
        tid = to_id.get(text[s : s + size[left] + size[right]])
        if tid is None:
            return
        # max-heap on score, ties to the leftmost pair (llm_bigram_spm::comparator)
        heappush(heap, (-scores[tid], left, right, size[left] + size[right]))

    for i in range(1, n):
        try_add(i - 1, i)
    while heap:
        _, left, right, sz = heappop(heap)
        if size[left] == 0 or size[right] == 0 or size[left] + size[right] != sz:
            continue  # one side was merged away since this pair was queued
        size[left] = sz
        size[right] = 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        try_add(prev[left], left)
        try_add(left, nxt[left])
    i = 0
    while i != -1:
        piece = text[start[i] : start[i] + size[i]]
        tid = to_id.get(piece)
        if tid is not None:
            out.append(tid)
        else:
            _byte_tokens(piece, to_id, unk_id, out)
        i = nxt[i]


def _byte_tokens(piece: str, to_id: dict[str, int], unk_id: int | None, out: list[int]) -> None:
    """A symbol that is no token is a single character: its UTF-8 bytes as <0xXX> tokens
    (or bare one-byte tokens), as llama_vocab::byte_to_token."""
    for b in piece.encode("utf-8", "surrogateescape"):
        bid = to_id.get(f"<0x{b:02X}>")
        if bid is None:
            bid = to_id.get(chr(b)) if b < 0x80 else None
        if bid is None:
            # llama.cpp aborts here (the vocab has no byte tokens); unk is the only
            # sensible id left.
            if unk_id is None:
                raise FrinkError(f"vocabulary has no byte token for 0x{b:02X} and no unknown token")
            bid = unk_id
        out.append(bid)
