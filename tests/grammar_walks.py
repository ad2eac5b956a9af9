"""Texts drawn at random through a constraint's mask: what the grammar tests validate.

A model writes the likely text; a walk that picks uniformly among every allowed token
reaches the corners of a grammar (odd escapes, bounds, whitespace, rare tokens of the
vocabulary) and costs no forward pass, so the tests can draw many.
"""

from __future__ import annotations

import numpy as np

from frink_cli.constraint import Grammar, compile_constraint


def random_walks(tok, grammar: Grammar, n: int, cap: int = 600) -> list[str]:
    """n texts drawn through the mask, each token uniformly among the allowed ones (an
    end-of-generation token, where allowed, half the time): every allowed token is a
    possible pick, which probes the grammar far harder than a model that writes the
    likely JSON, and costs no forward pass. A walk ends where generate() ends (an
    end-of-generation token or a grammar that can only end); one that reaches `cap`
    tokens fails the test. (That the sampler keeps to the mask is
    test_greedy_under_a_mask_is_the_best_allowed_token.)"""
    eog = sorted(tok.eog_ids)
    rng = np.random.default_rng(0)
    texts = []
    for c in compile_constraint(tok, grammar, copies=n):
        ids: list[int] = []
        for _ in range(cap):
            allowed = c.allowed()
            assert allowed is not None
            ends = [t for t in eog if allowed[t]]
            if ends and rng.random() < 0.5:
                break
            choices = np.flatnonzero(allowed)
            choices = choices[~np.isin(choices, eog)]
            token = int(rng.choice(choices))
            c.accept(token)
            ids.append(token)
            if c.finished:
                break
        else:
            raise AssertionError(f"a walk ran {cap} tokens: {tok.decode(ids)[:200]!r}")
        texts.append(tok.decode(ids))
    return texts
