"""The expert trainer end to end on a tiny budget: three levels saved, each loadable as a policy."""
import json

import numpy as np
import pytest

import policies
from embodied.train_expert import main


@pytest.mark.slow  # trains an expert end to end
def test_train_expert_writes_loadable_levels(tmp_path):
    main(["env=hopper", "steps=600", "random_steps=300", "eval_every=200", "eval_episodes=1", "batch_size=32",
          f"out={tmp_path}", "threads=1"])
    for level in ("early", "medium", "expert"):
        meta = json.loads((tmp_path / level / "meta.json").read_text())
        assert meta["level"] == level and "python -m embodied.train_expert" in meta["command"]
        policy = policies.load(tmp_path / level)
        action = policy.act(np.zeros(11, np.float32))
        assert action.shape == (1, 3) and np.all(np.abs(action) <= 1)
    assert not (tmp_path / "_snapshots").exists()


def test_levels_are_picked_by_normalised_score_so_negative_returns_work():
    """Pendulum's returns are all negative: 35% of the best raw return (-119) would pick the best snapshot
    as "medium". By normalised score (random -1197 = 0, 0 = 100) medium is the one near 35% of the best's 90."""
    from embodied.train_expert import pick_levels

    snapshots = [(500, -1430.0), (2500, -1257.0), (3000, -921.0), (3500, -311.0), (15000, -119.0)]
    chosen = pick_levels(snapshots, "pendulum")
    assert chosen["expert"][0] == 15000
    assert chosen["medium"][0] == 3000      # normalised 23, nearest to 0.35 x 90 = 31.5
    assert chosen["early"][0] == 2500       # normalised -5, nearest to 0.10 x 90 = 9 (3000's 23 is farther)
    hopper = [(1, 100.0), (2, 1200.0), (3, 3000.0)]  # positive returns: the same rule as before
    assert pick_levels(hopper, "hopper")["medium"][0] == 2
