"""Multi-token-prediction (MTP, "NextN") heads as the drafter of speculative decoding
(`--spec mtp`, llama.cpp's `--spec-type draft-mtp`).

A GGUF from llama.cpp's converter may carry `<arch>.nextn_predict_layers` blocks after its
trunk (block_count counts them; the trunk runs without them). Such a block (DeepSeek-V3's
MTP module, Qwen3.5's `mtp.*`) guesses the token after next. For the token x at position
p and the target's last hidden state h at p - 1 (after its final norm):

    u = eh_proj([enorm(embed(x)); hnorm(h)])
    y = a decoder layer shaped as the trunk's attention layers, over its own KV rows
    logits = head(shared_head_norm(y))    (the target's output matrix and embedding)

and shared_head_norm(y) is the h of the next guess, so one block drafts a chain of tokens
(llama.cpp's graph_mtp in src/models/qwen35.cpp; vLLM's qwen3_next_mtp). The block's row
for (h at p - 1, x) sits at position p - 1, as vLLM places it (llama.cpp's server at p:
rope is relative, so only the differences count).

`MtpHead` holds the first NextN block's weights and runs it on the host body;
`MtpDrafter` keeps its KV rows in step with the history from the target's hidden states,
which speculative_tokens hands it (`observe`) after every target step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .backends.host.ops import HOST_OPS
from .cache.kv_cache import KvCache
from .decoder import Decoder
from .draft_gate import ConfidenceGate
from .errors import FrinkError
from .formats import Checkpoint
from .model.config import ModelConfig
from .model.reader import TensorReader
from .model.weights import load_layer
from .speculative import SpecParams


def nextn_layers(ckpt: Checkpoint, cfg: ModelConfig) -> int:
    """How many NextN (MTP) blocks the file stores after the trunk."""
    return int(ckpt.metadata.get(f"{cfg.arch}.nextn_predict_layers", 0) or 0)


class MtpHead:
    """The file's first NextN block, run as a one-layer model beside the target."""

    def __init__(self, ckpt: Checkpoint, decoder: Decoder) -> None:
        cfg = decoder.cfg
        n = nextn_layers(ckpt, cfg)
        if n <= 0:
            raise FrinkError(
                f"--spec mtp: {ckpt.path} has no MTP heads (nextn_predict_layers = {n})"
            )
        attn = [i for i in range(cfg.n_layer) if cfg.layer_shape(i).mixer == "attention"]
        if not attn:
            raise FrinkError(
                f"--spec mtp: {ckpt.path} has no attention layer to shape its MTP head as"
            )
        self.cfg, self.host, self.like = cfg, decoder.host, attn[-1]
        block, d = cfg.n_layer, cfg.n_embd
        p = f"blk.{block}.nextn."
        r = TensorReader(ckpt)
        if r.has(p + "embed_tokens.weight"):
            raise FrinkError(f"--spec mtp: {ckpt.path}: an MTP head with its own embedding")
        self.eh_proj = r.linear([(p + "eh_proj", d)], 2 * d, bias=False)
        self.enorm = r.get(p + "enorm.weight", (d,))
        self.hnorm = r.get(p + "hnorm.weight", (d,))
        w = decoder.host.w
        head_norm = r.optional(p + "shared_head_norm.weight", (d,))
        self.head_norm = w.output_norm if head_norm is None else head_norm
        self.output = w.output
        if r.has(p + "shared_head_head.weight"):
            self.output = r.linear([(p + "shared_head_head", cfg.n_vocab)], d, bias=False)
        self.layer = load_layer(r, cfg, block, like=self.like)

    def new_cache(self, n_ctx: int, rewind: int) -> KvCache:
        """The block's own KV rows: one slot, shaped as the trunk layer it is run as."""
        return KvCache(self.cfg, n_ctx, rewind=rewind, layers=range(self.like, self.like + 1))

    def forward(
        self, h: np.ndarray, ids: Sequence[int], positions: np.ndarray, cache: KvCache
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows (h[i], ids[i]) at positions -> (the next rows' h [T, d], the last row's
        logits [V])."""
        ops, cfg, eps = HOST_OPS, self.cfg, self.cfg.norm_eps
        e = self.host.embed(np.asarray(ids, dtype=np.int64), positions)
        u = ops.concat([ops.rms_norm(e, self.enorm, eps), ops.rms_norm(h, self.hnorm, eps)])
        x = ops.linear(u, self.eh_proj)
        cache.check_room(len(x))
        y = self.host.layer_as(self.like, self.layer, x, positions, cache)
        cache.commit(len(x))
        logits = cfg.ext.head(ops, cfg, self.head_norm, self.output, y[-1:], None)[0]
        return cfg.ext.final_norm(ops, cfg, self.head_norm, y, None), logits


class MtpDrafter:
    """Drafts with an MtpHead: its KV row k holds (h_k, history[k + 1]), the target's
    hidden state at k and the token after it; a draft feeds the rows the history gained
    since the last one, then chains guesses from the block's own h (greedy, stopping where
    its confidence gate does, as the draft model's), and takes the chained rows back
    afterwards."""

    reads_hidden = True

    def __init__(self, head: MtpHead, n_ctx: int, params: SpecParams) -> None:
        self.head, self.gate = head, ConfidenceGate(params.p_min)
        self.cache = head.new_cache(n_ctx, params.draft_max)
        self.hidden = np.zeros((n_ctx, head.cfg.n_embd), np.float32)  # the target's, by position
        self.fed: list[int] = []  # history[1:] as the cache's rows hold it

    def prepare(self, prompt: Sequence[int]) -> None:
        pass

    def observe(self, start: int, hidden: np.ndarray) -> None:
        self.hidden[start : start + len(hidden)] = hidden
        del self.fed[start:]  # the rows from start on read other states now

    def draft(self, history: Sequence[int], n: int) -> list[int]:
        end = len(history) - 1  # history[end] is not fed yet: the target has h up to end - 1
        if n <= 0 or end < 1:
            return []
        self.gate.judge(history)
        keep = 0
        for a, b in zip(self.fed, history[1:]):
            if a != b:
                break
            keep += 1
        keep = min(keep, end - 1)  # at least the newest row is fed: its logits are the guess
        self.cache.truncate(keep)
        pos = np.arange(keep, end)
        h, logits = self.head.forward(self.hidden[keep:end], history[keep + 1 :], pos, self.cache)
        self.fed = list(history[1:])
        drafted: list[int] = []
        self.gate.begin(len(history))
        while True:
            tok = int(np.argmax(logits))
            if not self.gate.admit(tok, logits):
                break
            drafted.append(tok)
            if len(drafted) == n:
                break
            at = np.asarray([end + len(drafted) - 1])
            h, logits = self.head.forward(h[-1:], [tok], at, self.cache)
        self.cache.truncate(end)  # the chained rows rest on guesses
        return drafted
