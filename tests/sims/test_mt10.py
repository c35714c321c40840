"""Meta-World MT10 as a suite: real Meta-World envs, their scripted policies, frames and instructions."""
import numpy as np
import pytest

import sims
from embodied.constants import STATE_KEY, TASK_KEY, image_key
from embodied.errors import UserError
from sims import mt10

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_the_suite_is_registered_with_its_ten_tasks():
    spec = sims.spec("mt10")
    assert spec.num_tasks == 10 and (spec.obs_dim, spec.act_dim) == (39, 4) and spec.has_success
    assert mt10.TASKS[0] == "reach-v3" and mt10.TASKS[-1] == "window-close-v3"
    for task_id in range(1, 11):   # every task has training and held-out wording, disjoint
        assert set(mt10.instructions(task_id)).isdisjoint(mt10.instructions(task_id, "heldout"))
        assert mt10.scripted_policy(task_id) is not None


@pytest.mark.slow  # a few seconds on 2 cores
def test_the_scripted_policy_solves_reach_and_success_ends_the_episode():
    env = sims.make("mt10", task_id=1, images=("front",), image_size=32, language=True)
    policy = mt10.scripted_policy(1)
    obs, info = env.reset(seed=0)
    assert obs[STATE_KEY].shape == (39,) and obs[STATE_KEY].dtype == np.float32
    assert obs[image_key("front")].shape == (32, 32, 3) and obs[image_key("front")].dtype == np.uint8
    assert obs[TASK_KEY] in mt10.instructions(1) and info["success"] is False
    for step in range(200):
        obs, reward, terminated, truncated, info = env.step(np.clip(policy.get_action(obs[STATE_KEY]), -1, 1))
        if terminated or truncated:
            break
    env.close()
    assert terminated and info["success"] and not truncated and step < 150


def test_success_reward_pays_one_at_the_succeeding_step_only():
    rewards = {}
    for reward in ("dense", "success"):
        env = sims.make("mt10", task_id=1, reward=reward)
        policy = mt10.scripted_policy(1)
        obs, _ = env.reset(seed=0)
        rewards[reward] = []
        terminated = truncated = False
        while not (terminated or truncated):
            obs, r, terminated, truncated, info = env.step(np.clip(policy.get_action(obs[STATE_KEY]), -1, 1))
            rewards[reward].append(r)
        env.close()
        assert terminated and info["success"]
    assert rewards["success"] == [0.0] * (len(rewards["success"]) - 1) + [1.0]
    assert len(rewards["dense"]) == len(rewards["success"]) and len(set(rewards["dense"])) > 2  # same episode, shaped


@pytest.mark.slow  # a few seconds on 2 cores
def test_resets_are_seeded_and_positions_draws_other_starts():
    def start(seed, variation="none"):
        env = sims.make("mt10", task_id=2, variation=variation)
        state = env.reset(seed=seed)[0][STATE_KEY]
        env.close()
        return state

    np.testing.assert_array_equal(start(3), start(3))
    assert not np.array_equal(start(3), start(4))
    goals = {tuple(np.round(start(s)[36:39], 4)) for s in range(8)}
    unseen = {tuple(np.round(start(s, "positions")[36:39], 4)) for s in range(8)}
    assert goals.isdisjoint(unseen)   # the goal is in the state (MT10); positions uses 50 other configurations


def test_paraphrase_gives_held_out_instructions():
    env = sims.make("mt10", task_id=5, language=True, variation="paraphrase")
    said = {env.reset(seed=s)[0][TASK_KEY] for s in range(6)}
    env.close()
    assert said <= set(mt10.instructions(5, "heldout"))


@pytest.mark.parametrize("kwargs,needle", [({"task_id": 11}, "task_id=11"), ({"task_id": 0}, "choose 1..10"),
                                           ({"images": ("corner",)}, "unknown camera"),
                                           ({"variation": "lighting"}, "variation='lighting'"),
                                           ({"reward": "shaped"}, "reward='shaped'"),
                                           ({"colour": 1}, "unknown option")])
def test_bad_options_are_one_line_errors(kwargs, needle):
    with pytest.raises(UserError, match=needle) as err:
        sims.make("mt10", **kwargs)
    assert "\n" not in str(err.value)
