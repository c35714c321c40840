"""The expert trainer end to end on a tiny budget: three levels saved, each loadable as a policy."""
import json

import numpy as np
import pytest

import policies
from embodied.train_expert import main

pytestmark = pytest.mark.slow  # trains an expert end to end


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
