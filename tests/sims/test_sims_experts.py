"""Expert lookup errors: missing locomotion checkpoints and bad levels say what to do."""
import pytest

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
    policies = pytest.importorskip("policies")
    if "gaussian" not in policies.names():
        pytest.skip("policies.gaussian not available yet")
    policies.make("gaussian", obs_dim=11, act_dim=3).save(tmp_path / "hopper" / "medium")
    monkeypatch.setattr(experts, "CHECKPOINT_ROOT", tmp_path)
    act = sims.expert("hopper", "medium")
    state = sims.make("hopper", seed=0).reset()[0]["observation.state"]
    action = act(state)
    assert action.shape == (3,) and action.dtype.name == "float32"
    assert (abs(action) <= 1).all()
    assert (action == act(state)).all()  # deterministic actor
