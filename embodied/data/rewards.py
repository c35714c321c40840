"""The reward transform r' = scale * r + bias: one object, made once per run from its config.

Agents only ever see transformed rewards (offline data, online transitions, DPPO's chunk rewards) and
the calibration diagnostic compares Q with MC returns of transformed rewards; scores and episode
returns are always reported on raw rewards. WSRL/Cal-QL's sparse tasks use x10 - 5, locomotion x1 + 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RewardTransform:
    scale: float = 1.0
    bias: float = 0.0
    sparse_failure_reward: float | None = None  # raw reward of a failed step on sparse tasks (Cal-QL MC returns)

    def __call__(self, rewards, steps=1) -> np.ndarray:
        """Transformed rewards; `steps` is how many env steps each reward sums (a chunk's executed rows)."""
        return (self.scale * np.asarray(rewards, np.float32) + self.bias * np.asarray(steps, np.float32)).astype(np.float32)

    def raw(self, rewards, steps=1) -> np.ndarray:
        """The inverse: raw rewards back from transformed ones."""
        return (np.asarray(rewards, np.float64) - self.bias * np.asarray(steps)) / (self.scale or 1.0)

    @property
    def failure_reward(self) -> float | None:
        """The transformed reward of a failed step (what Cal-QL's MC returns of never-successful episodes use)."""
        return None if self.sparse_failure_reward is None else float(self(self.sparse_failure_reward))
