"""Statistics for the evaluation protocol (DESIGN.md §5): bootstrap CIs over seeds, Wilson intervals over
episodes, a seed-level t-test, and the switch dip."""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np
from scipy import stats as scipy_stats

DIP_WINDOW_FRACTION = 0.1  # the dip looks at the first 10% of online steps


def bootstrap_means(values, n_resamples: int = 10000, seed: int = 0) -> np.ndarray:
    """Means of `n_resamples` resamples (with replacement) along axis 0; shape [n_resamples, ...].

    Works on [seeds] vectors and on [seeds, points] curves alike, so curves get per-point bands.
    """
    values = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(n_resamples, len(values)))
    return values[picks].mean(axis=1)


def bootstrap_ci(values, confidence: float = 0.95, n_resamples: int = 10000,
                 seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): percentile-bootstrap confidence interval of the mean across seeds.

    One value gives low = high = mean (no spread to resample). Seeded, so tables are reproducible.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    mean = float(values.mean())
    if values.size == 1:
        return mean, mean, mean
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(bootstrap_means(values, n_resamples, seed), [tail, 1.0 - tail])
    return mean, float(low), float(high)


def wilson(successes: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson interval of a success rate over n episodes (sound at 0 and 1, unlike the normal one)."""
    if n == 0:
        return [0.0, 1.0]
    p, denom = successes / n, 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / denom, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [round(max(0.0, centre - half), 3), round(min(1.0, centre + half), 3)]


def seed_t_test(values, reference: float = 0.0, confidence: float = 0.95) -> dict:
    """Student-t test of the mean over seeds against `reference`: the seed-level check, where a pooled
    Wilson interval treats every episode as independent and so overstates what a few seeds show.
    Pass per-seed differences (after - before on each seed's own start states) with reference 0 for a
    paired test. Returns mean, its t interval, t, the two-sided p and the degrees of freedom; with one
    seed, or no spread, there is no test (t and p are None)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("seed_t_test needs at least one value")
    mean, df = float(values.mean()), values.size - 1
    if df == 0 or np.ptp(values) == 0:   # std() of equal floats can come out at 1e-17, not 0
        return {"mean": round(mean, 4), "ci95": [round(mean, 4), round(mean, 4)], "t": None, "p": None, "df": df}
    sem = float(values.std(ddof=1) / math.sqrt(values.size))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, df)) * sem
    t = (mean - reference) / sem
    p = float(2 * scipy_stats.t.sf(abs(t), df))
    return {"mean": round(mean, 4), "ci95": [round(mean - half, 4), round(mean + half, 4)], "t": round(t, 3),
            "p": round(p, 4), "df": df}


def post_switch_dip(eval_scores_by_step: Mapping[int, float] | Iterable[tuple[int, float]],
                    switch_step: int, online_steps: int,
                    end_of_offline_score: float) -> float | None:
    """Worst eval score in the first 10% of online steps minus the end-of-offline score.

    Sign: negative = performance dropped after the switch (WSRL claims it stays near 0);
    positive = even the worst early online eval beat the offline policy.
    `eval_scores_by_step` and `switch_step` use the same step units (e.g. total steps, or online env
    steps with switch_step=0). The window is switch_step < step <= switch_step + 10% of
    online_steps; the eval at the switch itself is excluded because it still measures the offline
    policy. Returns None when no eval falls in the window (evaluate more often to measure the dip).
    """
    pairs = eval_scores_by_step.items() if isinstance(eval_scores_by_step, Mapping) else eval_scores_by_step
    window_end = switch_step + DIP_WINDOW_FRACTION * online_steps
    in_window = [float(score) for step, score in pairs if switch_step < step <= window_end]
    if not in_window:
        return None
    return min(in_window) - float(end_of_offline_score)
