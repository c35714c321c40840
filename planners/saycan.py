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


def done_value(goal_holds: bool | None, unmet: float = 0.02) -> float:
    """Affordance of "done": 1 when the parsed goal holds (or no goal was parsed: None), else `unmet`.

    Multiplied with p_LLM("done"), so the plan only stops early when the model is much surer of "done"
    than of any feasible step (issue 19: SmolLM2 said "done" too early).
    """
    if goal_holds is None or goal_holds:
        return 1.0
    if not 0.0 <= unmet <= 1.0:
        raise ValueError(f"done value for an unmet goal must be in [0, 1], got {unmet}")
    return unmet
