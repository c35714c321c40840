"""Keys every package shares (DESIGN.md §3), named once, the way LeRobot names its own.

Observations are dicts: `observation.state` (float32 state vector), `observation.images.<camera>`
(uint8 HWC frames) and `task` (the language instruction). Sims, policies, robots, data and the
learners read these names from here. `TASK_SEED_STRIDE` is the evaluation protocol's share of a suite:
the runner, the config check and the benchmarks number each task's start states from it.
"""
from __future__ import annotations

STATE_KEY = "observation.state"
IMAGES_PREFIX = "observation.images"
TASK_KEY = "task"
TASK_SEED_STRIDE = 100   # start seeds per suite task: task k's evals start at the run's eval seed + 100 k


def image_key(camera: str) -> str:
    """`observation.images.<camera>`."""
    return f"{IMAGES_PREFIX}.{camera}"
