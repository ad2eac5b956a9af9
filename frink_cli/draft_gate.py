"""Where a model drafter stops drafting: its confidence, calibrated against the target.

A draft model (or an MTP head) stops at its first pick whose probability is under p_min
(llama.cpp's `--draft-p-min`). That bar is fixed, but how far a drafter's doubtful picks
can be trusted is not: on a code edit a 0.5B draft's picks under 0.75 are the target's own
nearly every time, on free text about half the time. Each round the gate records the
doubtful picks (probability under p_min, the pick it stopped at included) and, once the
target's tokens for those positions are known, whether the target made the same pick. While
the doubtful picks of the recent rounds were mostly the target's (Laplace's estimate
(agreed + 1) / (judged + 2) over the last WINDOW verdicts at least TRUST: two agreeing
verdicts and none against, to begin with), the bar is halved and the drafts run on where
they pay; picks the target did not make bring the bar back. Before any verdict a doubtful
pick counts as a coin flip, so text the drafter does not know keeps llama.cpp's bar.

The gate only sets the drafts' length: the tokens are verified as ever, so the output is
the same; a wrong trust costs speed only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

WINDOW = 8  # verdicts kept
TRUST = 0.75  # the agreement estimate that halves the bar


class ConfidenceGate:
    """The stop rule of one drafter: `begin` a round at a history position, `admit` each
    greedy pick with its probability (False: stop before it), `judge` the last round's
    doubtful picks against the history that followed."""

    def __init__(self, p_min: float) -> None:
        self.p_min = p_min
        self.verdicts: deque[bool] = deque(maxlen=WINDOW)
        self._start = 0
        self._picks: list[tuple[int, float]] = []  # this round's picks and probabilities

    @property
    def trusted(self) -> bool:
        agreed = sum(self.verdicts)
        return (agreed + 1) / (len(self.verdicts) + 2) >= TRUST

    @property
    def bar(self) -> float:
        return self.p_min / 2 if self.trusted else self.p_min

    def begin(self, start: int) -> None:
        """A round whose first pick is for history position `start`."""
        self._start, self._picks = start, []

    def admit(self, token: int, logits: np.ndarray) -> bool:
        """Whether to draft `token`, the greedy pick from `logits` (always, with p_min 0)."""
        if self.p_min <= 0:
            return True
        probability = top_probability(logits)
        self._picks.append((token, probability))
        return probability >= self.bar

    def judge(self, history: Sequence[int]) -> None:
        """Verdicts on the last round's doubtful picks: a pick is judged where the history's
        tokens before it are the round's earlier picks (agreed: the history's token there is
        the pick itself)."""
        at = self._start
        for token, probability in self._picks:
            if at >= len(history):
                break
            if probability < self.p_min:
                self.verdicts.append(history[at] == token)
            if history[at] != token:
                break
            at += 1
        self._picks = []


def top_probability(logits: np.ndarray) -> float:
    """The softmax probability of the best of `logits`."""
    z = logits.astype(np.float64)
    e = np.exp(z - z.max())
    return float(e.max() / e.sum())
