"""The offline->online runner's switch knobs, on real PointMaze physics with a small generated dataset."""
from __future__ import annotations

import numpy as np
import pytest

from embodied.agents.runner import Runner, RunnerConfig
from embodied.data import catalog
from embodied.errors import ConfigError


class CountingLogger:
    def __init__(self):
        self.records = []

    def log(self, metrics, step, phase, kind):
        self.records.append((phase, kind, step, metrics))

    def truncate_after(self, step, phase=None):
        return 0


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return catalog.load_dataset("pointmaze-umaze", "medium-replay", 2000, cache_dir=tmp_path_factory.mktemp("c"),
                                progress=False)


def small(**overrides) -> RunnerConfig:
    base = dict(env="pointmaze-umaze", offline_algo="calql", online_algo="sac", offline_steps=20, online_steps=60,
                offline_batch_size=32, online_batch_size=32, eval_episodes=1, eval_every_offline=20,
                eval_every_online=60, video_episodes=0, dip_evals=1, reward_bias=-1.0, sparse_failure_reward=0.0,
                offline_agent={"hidden": (32, 32)}, online_agent={"hidden": (32, 32)})
    return RunnerConfig(**{**base, **overrides})


def count_updates(runner: Runner) -> list[int]:
    calls = [0]
    original = runner.agent.update

    def counted(batch):
        calls[0] += 1
        return original(batch)

    runner.agent.update = counted
    return calls


def test_warmup_takes_no_gradient_steps_and_utd_multiplies_them(dataset, tmp_path):
    runner = Runner(small(warmup_steps=40, utd=3), dataset, tmp_path, CountingLogger(), progress=False)
    runner._run_offline()
    runner._switch()
    calls = count_updates(runner)
    runner._run_online()
    assert calls[0] == (60 - 40) * 3


@pytest.mark.parametrize("reinit_critic", [False, True])
@pytest.mark.parametrize("reset_optimizers", [False, True])
def test_switch_keeps_or_resets_critic_and_optimizer_state(dataset, tmp_path, reinit_critic, reset_optimizers):
    runner = Runner(small(reinit_critic=reinit_critic, reset_optimizers=reset_optimizers), dataset, tmp_path,
                    CountingLogger(), progress=False)
    runner._run_offline()
    pretrained = runner.offline_agent
    critic, actor_optimizer = pretrained.critic, pretrained.actor_optimizer
    runner._switch()
    online = runner.agent
    assert online.actor is pretrained.actor  # the pretrained policy is fine-tuned, never rebuilt
    assert (online.critic is critic) == (not reinit_critic)
    assert (online.actor_optimizer is actor_optimizer) == (not reset_optimizers)
    if reset_optimizers:
        assert len(online.actor_optimizer.state) == 0
    else:
        assert len(online.actor_optimizer.state) > 0  # Adam moments carried across the switch


def test_offline_ratio_zero_never_samples_offline_data(dataset, tmp_path):
    runner = Runner(small(offline_ratio=0.0), dataset, tmp_path, CountingLogger(), progress=False)
    runner._run_offline()
    runner._switch()
    # mark offline data so a leak would show: online rewards are in {-1, 0}, these are 123
    runner.offline_buffer.rewards[:] = 123.0
    seen = []
    original = runner.agent.update
    runner.agent.update = lambda batch: (seen.append(batch["rewards"]), original(batch))[1]
    runner._run_online()
    assert seen and not np.any(np.concatenate(seen) == 123.0)


def test_bad_knobs_are_rejected_before_work(dataset, tmp_path):
    with pytest.raises(ConfigError, match="offline_ratio"):
        Runner(small(offline_ratio=1.5), dataset, tmp_path, CountingLogger())
    with pytest.raises(ConfigError, match="online_algo=same"):
        Runner(small(offline_algo=None, online_algo="same"), None, tmp_path, CountingLogger())
    with pytest.raises(ConfigError, match="dataset"):
        Runner(small(), None, tmp_path, CountingLogger())


def test_switch_diagnostics_are_logged(dataset, tmp_path):
    logger = CountingLogger()
    summary = Runner(small(warmup_steps=20), dataset, tmp_path, logger, progress=False).run()
    online_evals = [m for phase, kind, _, m in logger.records if phase == "online" and kind == "eval"]
    assert all("switch/calibration_gap" in m and "switch/action_distance" in m for m in online_evals[1:])
    assert summary["dip"] is not None and summary["offline_score"] is not None
    assert summary["calibration_gap_final"] == online_evals[-1]["switch/calibration_gap"]
