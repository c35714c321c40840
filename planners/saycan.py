"""SayCan scoring: pick the candidate maximising p_LLM(text | instruction, history) x V(state, skill).

Scores are kept in log space (log p + log V) so long candidates do not underflow; V = 0 (a failed
precondition) gives -inf, so an infeasible skill is never chosen while a feasible one exists.
"""
from __future__ import annotations

import math


def combine(loglik: float, value: float) -> float:
    """log(p x V) = log p + log V; -inf when V == 0."""
    if value < 0.0:
        raise ValueError(f"affordance value must be >= 0, got {value}")
    return loglik + math.log(value) if value > 0.0 else float("-inf")


def select(logliks: list[float], values: list[float]) -> tuple[int, list[float]]:
    """Index of the best candidate and every candidate's combined log score."""
    if len(logliks) != len(values) or not logliks:
        raise ValueError("need one affordance value per log-likelihood, and at least one candidate")
    scores = [combine(l, v) for l, v in zip(logliks, values)]
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    return best, scores
