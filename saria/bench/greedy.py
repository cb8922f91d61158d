"""Greedy outputs compared the way two computations of the same tokens can be.

KV restored from a cache and KV recomputed (or computed in another batch)
differ in their last bits on some CPUs -- other kernels, other summation
orders -- which can flip a near-tie between the two best tokens and nothing
else. Wrong KV parts at a step with a clear winner. So two greedy outputs
agree when they are identical, or part at a step where either run's two best
tokens were closer than `TIE` (in logprob). The tests and experiment 13 judge
outputs by this one rule.
"""

from __future__ import annotations

from dataclasses import dataclass

TIE = 1e-3  # two best tokens closer than this (in logprob) are a near-tie


@dataclass
class Greedy:
    """A greedy output and, per step, how far the chosen token led the
    runner-up (logprob difference)."""

    tokens: list[int]
    gaps: list[float]

    def head(self, n: int) -> "Greedy":
        return Greedy(self.tokens[:n], self.gaps[:n])


def gap(logprobs) -> float:
    """The lead of the best of `logprobs` (the values of one step's top-k)
    over the next; infinite when there is no runner-up."""
    best = sorted(logprobs, reverse=True)
    return best[0] - best[1] if len(best) > 1 else float("inf")


def first_difference(got: Greedy, want: Greedy) -> int | None:
    """The first step at which the two outputs differ; None if equal."""
    if got.tokens == want.tokens:
        return None
    return next((i for i, (x, y) in enumerate(zip(got.tokens, want.tokens)) if x != y),
                min(len(got.tokens), len(want.tokens)))


def same_greedy(got: Greedy, want: Greedy) -> bool:
    """Two computations of the same tokens agree: identical outputs, or
    outputs of one length that part at a near-tie of either run."""
    first = first_difference(got, want)
    if first is None:
        return True
    if len(got.tokens) != len(want.tokens):
        return False
    return min(got.gaps[first], want.gaps[first]) < TIE
