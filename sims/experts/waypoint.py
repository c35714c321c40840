"""Waypoint-following maze controller, the way D4RL's maze2d data was made.

BFS over the free cells gives, for every cell, the neighbour one step closer to the current target;
a PD law drives the point mass toward that neighbour's centre. Suboptimal levels first visit random
"detour" cells, so their data holds longer, wandering paths.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from embodied.constants import STATE_KEY

Cell = tuple[int, int]
_NEIGHBOUR_STEPS = ((-1, 0), (1, 0), (0, -1), (0, 1))
_NEW_EPISODE_JUMP = 0.5  # metres between consecutive states; one step moves at most 0.05 m


class WaypointController:
    """Callable `state[6] -> action[2]` for a PointMaze task; keeps a little per-episode state.

    detour_prob: before each leg, the chance to head to a random free cell instead of the goal.
    A position jump (a reset) starts a new episode by itself; `reset()` does it explicitly.
    """

    def __init__(self, maze, goal_cell: Cell, detour_prob: float = 0.0, seed: int = 0,
                 kp: float = 10.0, kd: float = 1.0):
        self._maze = maze
        self._goal_cell = tuple(goal_cell)
        self._detour_prob = detour_prob
        self._rng = np.random.default_rng(seed)
        self._kp, self._kd = kp, kd
        layout = maze.maze_map
        self._free = [
            (row, col)
            for row in range(len(layout))
            for col in range(len(layout[0]))
            if layout[row][col] != 1
        ]
        self._free_set = set(self._free)
        self._centres = {cell: maze.cell_rowcol_to_xy(np.asarray(cell)) for cell in self._free}
        self._routes: dict[Cell, dict[Cell, Cell]] = {}
        self.reset()

    def reset(self) -> None:
        self._target: Cell | None = None
        self._cell: Cell | None = None
        self._last_xy: np.ndarray | None = None

    def __call__(self, state) -> np.ndarray:
        if isinstance(state, dict):  # the env's observation dict works too
            state = state[STATE_KEY]
        state = np.asarray(state, dtype=np.float64)
        xy, velocity = state[:2], state[2:4]
        if self._last_xy is None or np.linalg.norm(xy - self._last_xy) > _NEW_EPISODE_JUMP:
            self.reset()
            self._target = self._pick_target()
        self._last_xy = xy
        self._cell = self._locate(xy)
        while self._cell == self._target and self._target != self._goal_cell:
            self._target = self._pick_target()  # detour reached: next leg
        if self._cell == self._goal_cell and self._target == self._goal_cell:
            aim = state[4:6]  # the goal point itself
        else:
            aim = self._centres[self._next_hop(self._cell, self._target)]
        action = self._kp * (aim - xy) - self._kd * velocity
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def _pick_target(self) -> Cell:
        if self._rng.random() < self._detour_prob:
            return self._free[self._rng.integers(len(self._free))]
        return self._goal_cell

    def _locate(self, xy: np.ndarray) -> Cell:
        cell = tuple(int(v) for v in self._maze.cell_xy_to_rowcol(xy))
        # Contact can push the centre a hair into a wall cell: keep the last free cell then.
        if cell in self._free_set or self._cell is None:
            return cell
        return self._cell

    def _next_hop(self, cell: Cell, target: Cell) -> Cell:
        if target not in self._routes:
            self._routes[target] = self._bfs_towards(target)
        return self._routes[target].get(cell, target)

    def _bfs_towards(self, target: Cell) -> dict[Cell, Cell]:
        """For each free cell, its neighbour on a shortest path to `target`."""
        next_hop = {target: target}
        frontier = deque([target])
        while frontier:
            row, col = frontier.popleft()
            for d_row, d_col in _NEIGHBOUR_STEPS:
                neighbour = (row + d_row, col + d_col)
                if neighbour in self._free_set and neighbour not in next_hop:
                    next_hop[neighbour] = (row, col)
                    frontier.append(neighbour)
        return next_hop
