"""Expert lookup errors: missing locomotion checkpoints and bad levels say what to do."""
from pathlib import Path

import numpy as np
import pytest

import policies
import sims
from embodied.errors import UserError
from sims import experts


def test_missing_locomotion_checkpoint_names_the_training_command(monkeypatch, tmp_path):
    monkeypatch.setattr(experts, "CHECKPOINT_ROOT", tmp_path)
    with pytest.raises(UserError) as err:
        sims.expert("hopper", "medium")
    message = str(err.value)
    assert "\n" not in message
    assert "python -m embodied.train_expert env=hopper" in message


def test_unknown_level_and_name():
    with pytest.raises(UserError, match="early, medium, expert"):
        sims.expert("pointmaze-umaze", "master")
    with pytest.raises(UserError, match="hopper"):
        sims.expert("nope")


def test_locomotion_expert_loads_a_saved_policy(monkeypatch, tmp_path):
    policies.make("gaussian", obs_dim=11, act_dim=3).save(tmp_path / "hopper" / "medium")
    monkeypatch.setattr(experts, "CHECKPOINT_ROOT", tmp_path)
    act = sims.expert("hopper", "medium")
    state = sims.make("hopper", seed=0).reset()[0]["observation.state"]
    action = act(state)
    assert action.shape == (3,) and action.dtype.name == "float32"
    assert (abs(action) <= 1).all()
    assert (action == act(state)).all()  # deterministic actor


def episode_return(env, policy, seed: int) -> float:
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(obs["observation.state"]))
        total, done = total + reward, terminated or truncated
    return total


COMMITTED = sorted(p.parent.parent.name + "/" + p.parent.name
                   for p in (Path(sims.__file__).parent / "experts").glob("*/*/meta.json"))


@pytest.mark.slow
@pytest.mark.parametrize("env_level", COMMITTED)
def test_committed_expert_checkpoints_reproduce_their_recorded_return(env_level):
    """Each committed SAC snapshot loads by name and, over three episodes, scores near its meta.json
    (which averaged five; single HalfCheetah episodes vary a lot when the cheetah flips)."""
    import json

    env_name, level = env_level.split("/")
    meta = json.loads((Path(sims.__file__).parent / "experts" / env_name / level / "meta.json").read_text())
    policy = sims.expert(env_name, level)
    env = sims.make(env_name)
    returns = [episode_return(env, policy, seed) for seed in range(3)]
    mean, recorded = float(np.mean(returns)), meta["eval_return"]
    assert abs(mean - recorded) <= 0.6 * abs(recorded) + 100, (env_level, returns, recorded)


def test_hopper_expert_levels_are_ordered():
    import json

    returns = {level: json.loads((Path(sims.__file__).parent / "experts" / "hopper" / level / "meta.json").read_text())
               ["eval_return"] for level in ("early", "medium", "expert")}
    assert returns["early"] < returns["medium"] < returns["expert"]


@pytest.mark.slow
def test_hopper_expert_snapshots_are_ordered_when_run():
    """The snapshots themselves, one seeded episode each (not only their recorded returns)."""
    env = sims.make("hopper")
    measured = {level: episode_return(env, sims.expert("hopper", level), seed=0)
                for level in ("early", "medium", "expert")}
    assert measured["early"] < measured["medium"] < measured["expert"], measured
