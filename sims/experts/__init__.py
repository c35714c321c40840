"""Experts by task and level: scripted waypoint controllers for mazes, SAC checkpoints otherwise.

Locomotion checkpoints live in `sims/experts/<env>/<level>/` (a `policies.load`-able folder).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from embodied.errors import UserError
from sims import pointmaze, registry
from sims.experts.waypoint import WaypointController

LEVELS = ("early", "medium", "expert")
CHECKPOINT_ROOT = Path(__file__).resolve().parent

# Chance, before each leg, to detour through a random free cell instead of heading to the goal.
MAZE_DETOUR_PROB = {"expert": 0.0, "medium": 0.5, "early": 0.9}


def expert(name: str, level: str = "expert", seed: int = 0) -> Callable[[np.ndarray], np.ndarray]:
    """state vector -> action in [-1, 1]; deterministic given `seed`."""
    registry.spec(name)  # unknown names raise UserError listing the valid ones
    if level not in LEVELS:
        raise UserError(f"unknown expert level {level!r}; choose one of: {', '.join(LEVELS)}")
    if name in pointmaze.MAZES:
        return _maze_expert(name, level, seed)
    return _checkpoint_expert(name, level)


def _maze_expert(name: str, level: str, seed: int):
    return WaypointController(
        pointmaze.maze_geometry(name),
        pointmaze.MAZES[name].goal_cell,
        detour_prob=MAZE_DETOUR_PROB[level],
        seed=seed,
    )


def _checkpoint_expert(name: str, level: str):
    directory = CHECKPOINT_ROOT / name / level
    if not directory.is_dir():
        raise UserError(
            f"expert checkpoint for env={name} level={level} is missing at {directory}; "
            f"train it with: python -m embodied.train_expert env={name}"
        )
    import policies  # torch: loaded only for the checkpoint experts

    policy = policies.load(directory)

    def act(state: np.ndarray) -> np.ndarray:
        return np.asarray(policy.act(state, deterministic=True)[0], dtype=np.float32)

    return act
