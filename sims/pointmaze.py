"""PointMaze as fixed-goal single tasks, like D4RL maze2d / antmaze.

gymnasium-robotics' PointMaze is goal-conditioned with random goals; here each maze has one goal cell
(a far corner), the goal sits exactly at its cell centre, the reward is sparse (1 within 0.45 m of the
goal) and the episode terminates there. The start is one reset cell (the opposite corner, as in D4RL
antmaze), or any free cell for the `-anystart` tasks (as D4RL maze2d resets): from a single start a
policy mostly reaches the goal in every episode or in none; from any start, success is the share of the
maze the policy can solve, which is what lets an offline score be partial. The state is
concat(observation[4] = x, y, vx, vy, desired_goal[2]) as float32.
"""
from __future__ import annotations

import contextlib
import copy
import io
from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs

from sims.registry import TaskSpec, register_task

CELL_SIZE = 1.0  # PointMazeEnv's maze_size_scaling
WALL_HEIGHT = 0.4  # PointMazeEnv's maze_height
GOAL_RADIUS = 0.45  # gymnasium-robotics' success distance


@dataclass(frozen=True)
class MazeTask:
    gym_id: str
    reset_cell: tuple[int, int] | None  # (row, col) in the maze map; None: any free cell not at the goal
    goal_cell: tuple[int, int]
    max_episode_steps: int


MAZES = {
    "pointmaze-umaze": MazeTask("PointMaze_UMaze-v3", (1, 1), (3, 1), 300),
    "pointmaze-medium": MazeTask("PointMaze_Medium-v3", (1, 1), (6, 6), 600),
    "pointmaze-large": MazeTask("PointMaze_Large-v3", (1, 1), (7, 9), 800),
    "pointmaze-medium-anystart": MazeTask("PointMaze_Medium-v3", None, (6, 6), 600),
    "pointmaze-large-anystart": MazeTask("PointMaze_Large-v3", None, (7, 9), 800),
}


def register_robotics_envs() -> None:
    """Register gymnasium-robotics envs, muting its import-time notice about Adroit envs."""
    with contextlib.redirect_stderr(io.StringIO()):
        import gymnasium_robotics
    gymnasium.register_envs(gymnasium_robotics)


def maze_layout(name: str) -> list[list]:
    """The maze's wall map (1 wall, 0 free) exactly as gymnasium-robotics registers it."""
    register_robotics_envs()
    return copy.deepcopy(gymnasium.spec(MAZES[name].gym_id).kwargs["maze_map"])


def task_layout(name: str) -> list[list]:
    """The wall map with the task's goal ('g') cell and its reset ('r') cell, if it has one, marked
    (gymnasium-robotics resets in any free cell when none is)."""
    task = MAZES[name]
    layout = maze_layout(name)
    marks = [(task.goal_cell, "g")] + ([(task.reset_cell, "r")] if task.reset_cell is not None else [])
    for (row, col), mark in marks:
        assert layout[row][col] == 0, f"{name}: cell {(row, col)} is a wall"
        layout[row][col] = mark
    return layout


def maze_geometry(name: str):
    """gymnasium-robotics' Maze object (cell <-> xy mapping) without building a simulator."""
    register_robotics_envs()
    from gymnasium_robotics.envs.maze.maze_v4 import Maze

    return Maze(maze_layout(name), CELL_SIZE, WALL_HEIGHT)


class FixedGoalMaze(gymnasium.Wrapper, RecordConstructorArgs):
    """Goal pinned to the goal cell's centre; dict observation flattened to a float32 state."""

    def __init__(self, env: gymnasium.Env, goal_cell: tuple[int, int]):
        RecordConstructorArgs.__init__(self, goal_cell=goal_cell)
        super().__init__(env)
        self._goal_xy = env.unwrapped.maze.cell_rowcol_to_xy(np.asarray(goal_cell)).astype(float)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(6,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        # Caller options (goal_cell / reset_cell) are ignored: the task is fixed.
        obs, info = self.env.reset(seed=seed)
        base = self.env.unwrapped
        base.goal = self._goal_xy.copy()  # undo the uniform goal noise the maze env adds
        base.update_target_site_pos()
        distance = np.linalg.norm(obs["achieved_goal"] - self._goal_xy)
        info["success"] = bool(distance <= GOAL_RADIUS)
        return self._state(obs["observation"], self._goal_xy), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        state = self._state(obs["observation"], obs["desired_goal"])
        return state, float(reward), terminated, truncated, info

    @staticmethod
    def _state(point_obs: np.ndarray, goal: np.ndarray) -> np.ndarray:
        state = np.empty(6, dtype=np.float32)
        state[:4] = point_obs
        state[4:] = goal
        return state


def build_pointmaze(spec: TaskSpec, *, render_mode, render_size, **kwargs) -> gymnasium.Env:
    register_robotics_envs()
    task = MAZES[spec.name]
    kwargs.setdefault("max_episode_steps", spec.max_episode_steps)
    env = gymnasium.make(
        spec.gym_id,
        maze_map=task_layout(spec.name),
        reward_type="sparse",
        continuing_task=False,
        reset_target=False,
        render_mode=render_mode,
        width=render_size,
        height=render_size,
        **kwargs,
    )
    return FixedGoalMaze(env, task.goal_cell)


for _name, _task in MAZES.items():
    register_task(
        TaskSpec(
            name=_name,
            gym_id=_task.gym_id,
            obs_dim=6,
            act_dim=2,
            max_episode_steps=_task.max_episode_steps,
            ref_min_score=0.0,  # like antmaze: normalised score = 100 * success
            ref_max_score=1.0,
            approximate_normalization=False,
            has_success=True,
            sparse=True,
            success_reward_threshold=1.0,
        )
    )(build_pointmaze)
