"""Keys every package shares (DESIGN.md §3), named once, the way LeRobot names its own.

Observations are dicts: `observation.state` (float32 state vector), `observation.images.<camera>`
(uint8 HWC frames) and `task` (the language instruction). Sims, policies, robots, data and the
learners read these names from here.
"""
from __future__ import annotations

STATE_KEY = "observation.state"
IMAGES_PREFIX = "observation.images"
TASK_KEY = "task"


def image_key(camera: str) -> str:
    """`observation.images.<camera>`."""
    return f"{IMAGES_PREFIX}.{camera}"
