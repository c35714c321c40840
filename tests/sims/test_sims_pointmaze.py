"""PointMaze as a fixed-goal sparse task (from one start cell or any), and the waypoint expert's quality per level."""
import numpy as np
import pytest

import sims
from sims import pointmaze

MAZES = list(pointmaze.MAZES)
FIXED_START = [name for name in MAZES if pointmaze.MAZES[name].reset_cell is not None]
ANY_START = [name for name in MAZES if pointmaze.MAZES[name].reset_cell is None]


def _episode(env, policy):
    """Run one episode; return per-step rewards, last terminated flag and last info."""
    obs, info = env.reset()
    policy.reset()
    rewards = []
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs["observation.state"]))
        rewards.append(reward)
        if terminated or truncated:
            return rewards, terminated, info


def _start_cells(name, resets):
    """The (row, col) each of `resets` resets starts in, after checking the goal sits at its cell's centre."""
    env = sims.make(name, seed=0)
    maze = env.unwrapped.maze
    goal_xy = maze.cell_rowcol_to_xy(np.array(pointmaze.MAZES[name].goal_cell))
    cells = []
    for _ in range(resets):
        state, info = env.reset()
        state = state["observation.state"]
        np.testing.assert_allclose(state[4:], goal_xy, atol=1e-6)  # no goal noise
        np.testing.assert_allclose(env.unwrapped.goal, goal_xy)
        assert not info["success"]
        cells.append(tuple(int(v) for v in maze.cell_xy_to_rowcol(state[:2])))
    return cells, maze


@pytest.mark.parametrize("name", FIXED_START)
def test_goal_and_start_are_fixed(name):
    cells, _ = _start_cells(name, 3)
    assert set(cells) == {pointmaze.MAZES[name].reset_cell}


@pytest.mark.parametrize("name", ANY_START)
def test_anystart_resets_in_many_free_cells_never_the_goal_and_keeps_the_goal_fixed(name):
    cells, maze = _start_cells(name, 30)
    assert all(maze.maze_map[row][col] != 1 for row, col in cells)
    assert pointmaze.MAZES[name].goal_cell not in cells
    assert len(set(cells)) >= 8  # 30 draws over the medium maze's 20 free cells (large: 45)
    assert pointmaze.maze_layout(name) == pointmaze.maze_layout(name.removesuffix("-anystart"))


@pytest.mark.parametrize("name", MAZES)
def test_expert_geometry_matches_the_env(name):
    env_maze = sims.make(name).unwrapped.maze
    expert_maze = pointmaze.maze_geometry(name)
    assert expert_maze.maze_size_scaling == env_maze.maze_size_scaling
    walls = [[cell == 1 for cell in row] for row in env_maze.maze_map]
    assert walls == [[cell == 1 for cell in row] for row in expert_maze.maze_map]
    cell = (2, 3)
    np.testing.assert_allclose(expert_maze.cell_rowcol_to_xy(cell), env_maze.cell_rowcol_to_xy(cell))


def test_sparse_reward_terminates_with_success_at_goal():
    env = sims.make("pointmaze-umaze", seed=0)
    rewards, terminated, info = _episode(env, sims.expert("pointmaze-umaze"))
    assert terminated and info["success"]
    assert rewards[-1] == 1.0 and set(rewards[:-1]) == {0.0}
    assert sims.normalized_score("pointmaze-umaze", sum(rewards)) == pytest.approx(100.0)


def test_random_actions_rarely_reach_the_goal():
    env = sims.make("pointmaze-medium", seed=0)
    obs, info = env.reset()
    assert not info["success"]
    total = 0.0
    for _ in range(200):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total += reward
        assert not info["success"] and not terminated
    assert total == 0.0


def _quality(name, level, episodes):
    env = sims.make(name, seed=1)
    policy = sims.expert(name, level, seed=1)
    results = [_episode(env, policy) for _ in range(episodes)]
    success = np.mean([info["success"] for _, _, info in results])
    length = np.mean([len(rewards) for rewards, _, _ in results])
    return success, length


@pytest.mark.slow
@pytest.mark.parametrize("name", MAZES)
def test_expert_level_solves_each_maze(name):
    success, length = _quality(name, "expert", episodes=10)
    assert success >= 0.9
    assert length < 0.6 * sims.spec(name).max_episode_steps


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pointmaze-medium", "pointmaze-large"])
def test_lower_levels_are_worse(name):
    expert_success, expert_length = _quality(name, "expert", episodes=10)
    medium_success, medium_length = _quality(name, "medium", episodes=10)
    early_success, early_length = _quality(name, "early", episodes=10)
    assert medium_length > expert_length and early_length > medium_length
    assert early_success < expert_success


def test_expert_is_deterministic_given_seed():
    state = np.array([0.3, -0.2, 0.1, 0.0, 1.0, 1.0], np.float32)
    first = sims.expert("pointmaze-large", "early", seed=3)
    second = sims.expert("pointmaze-large", "early", seed=3)
    np.testing.assert_array_equal(first(state), second(state))
    assert first(state).dtype == np.float32 and np.all(np.abs(first(state)) <= 1)
