"""The offline->online runner's switch knobs, on real PointMaze physics with a small generated dataset."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from embodied.agents.runner import Runner, RunnerConfig
from embodied.checkpoints import dataset_fingerprint, read_pretrained, write_folder
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
    """[update calls, critic steps, batch rows seen]."""
    calls = [0, 0, 0]
    original = runner.agent.update

    def counted(batch, utd=1, **kwargs):
        calls[0] += 1
        calls[1] += utd
        calls[2] += len(batch["rewards"])
        return original(batch, utd=utd, **kwargs)

    runner.agent.update = counted
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("critic_only_utd", [False, True])
def test_warmup_takes_no_gradient_steps_and_utd_multiplies_them(dataset, tmp_path, critic_only_utd):
    runner = Runner(small(warmup_steps=40, utd=3, critic_only_utd=critic_only_utd), dataset, tmp_path,
                    CountingLogger(), progress=False)
    runner._run_offline()
    runner._switch()
    calls = count_updates(runner)
    runner._run_online()
    assert calls[1] == (60 - 40) * 3 and calls[2] == (60 - 40) * 3 * 32  # critic steps and rows: the same budget
    assert calls[0] == (60 - 40) * (1 if critic_only_utd else 3)  # one actor step per env step (WSRL) or per update


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


@pytest.mark.slow
def test_offline_ratio_zero_never_samples_offline_data(dataset, tmp_path):
    runner = Runner(small(offline_ratio=0.0), dataset, tmp_path, CountingLogger(), progress=False)
    runner._run_offline()
    runner._switch()
    # mark offline data so a leak would show: online rewards are in {-1, 0}, these are 123
    runner.offline_buffer.rewards[:] = 123.0
    seen = []
    original = runner.agent.update
    runner.agent.update = lambda batch, **kw: (seen.append(batch["rewards"]), original(batch, **kw))[1]
    runner._run_online()
    assert seen and not np.any(np.concatenate(seen) == 123.0)


def test_bad_knobs_are_rejected_before_work(dataset, tmp_path):
    with pytest.raises(ConfigError, match="offline_ratio"):
        Runner(small(offline_ratio=1.5), dataset, tmp_path, CountingLogger())
    with pytest.raises(ConfigError, match="online_algo=same"):
        Runner(small(offline_algo=None, online_algo="same"), None, tmp_path, CountingLogger())
    with pytest.raises(ConfigError, match="dataset"):
        Runner(small(), None, tmp_path, CountingLogger())


@pytest.mark.slow
def test_switch_diagnostics_are_logged(dataset, tmp_path):
    logger = CountingLogger()
    runner = Runner(small(warmup_steps=20), dataset, tmp_path, logger, progress=False)
    summary = runner.run()
    online_evals = [m for phase, kind, _, m in logger.records if phase == "online" and kind == "eval"]
    assert all("switch/calibration_gap" in m and "switch/action_distance" in m for m in online_evals[1:])
    last_offline = [r for r in runner.eval_history if r["phase"] == "offline"][-1]
    assert math.isfinite(summary["dip"]) and summary["offline_score"] == last_offline["eval/score"]
    assert summary["calibration_gap_final"] == online_evals[-1]["switch/calibration_gap"]


@pytest.mark.parametrize("at_start", [True, False])
def test_the_step_zero_eval_can_be_skipped(dataset, tmp_path, at_start):
    """eval.at_start=false: a from-scratch pretraining skips its step-0 eval (a VLA suite's costs 10-20 min)."""
    runner = Runner(small(eval_at_start=at_start, online_steps=0), dataset, tmp_path, CountingLogger(),
                    progress=False)
    runner.run()
    steps = [(r["phase"], r["step"]) for r in runner.eval_history]
    assert (("offline", 0) in steps) is at_start
    assert steps[-1] == ("offline", 20)


def test_every_eval_uses_the_same_start_states(dataset, tmp_path):
    """Paired evals: the dip compares the same episodes, not new draws (before: seeds moved with the step)."""
    runner = Runner(small(), dataset, tmp_path, CountingLogger(), progress=False)
    first, later = runner.evaluate(0, 0), runner.evaluate(0, 5000)
    assert first["eval/return"] == later["eval/return"] and first["eval/length"] == later["eval/length"]


@pytest.mark.slow
def test_the_eval_schedule_leaves_training_unchanged(dataset, tmp_path):
    """An eval's action-distance probe reads the online replay with its own stream (before: it drew from the
    training sampler's, so runs that differed only in eval.every_online trained on different batches)."""
    actors = []
    for every in (10, 60):
        runner = Runner(small(warmup_steps=10, eval_every_online=every), dataset, tmp_path / str(every),
                        CountingLogger(), progress=False)
        runner.run()
        assert len([r for r in runner.eval_history if r["phase"] == "online"]) >= (6 if every == 10 else 2)
        actors.append(torch.cat([p.detach().flatten() for p in runner.agent.actor.parameters()]))
    assert torch.equal(actors[0], actors[1])


@pytest.mark.slow
def test_calql_fine_tuning_defers_the_updates_of_its_first_episode(dataset, tmp_path):
    """Before: Cal-QL `same` added transitions at episode end and skipped the first episode's updates."""
    runner = Runner(small(online_algo="same", offline_ratio=0.5, online_steps=400, eval_every_online=400, utd=2),
                    dataset, tmp_path, CountingLogger(), progress=False)
    runner._run_offline()
    runner._switch()
    calls = count_updates(runner)
    runner._run_online()
    assert runner.episodes_done >= 1
    assert 0 < len(runner.online_buffer) < 400  # the first episode ended inside the budget ...
    assert calls[1] == 400 * 2  # ... and its updates were taken when it did, not skipped


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["keep", "reset", "fast", "refit"])
def test_switch_temperature_knob(dataset, tmp_path, mode):
    logger = CountingLogger()
    runner = Runner(small(switch_temperature=mode, switch_temperature_value=0.05, switch_temperature_steps=5,
                          warmup_steps=20), dataset, tmp_path, logger, progress=False)
    runner._run_offline()
    pretrained = float(runner.offline_agent.alpha())
    runner._switch()
    at_switch = float(runner.agent.alpha())
    lr = runner.agent.alpha_optimizer.param_groups[0]["lr"]
    if mode == "reset":
        assert at_switch == pytest.approx(0.05)
    else:
        assert at_switch == pytest.approx(pretrained)
    assert lr == pytest.approx(runner.agent.cfg.alpha_lr * (10.0 if mode == "fast" else 1.0))
    runner._run_online()
    assert runner.agent.alpha_optimizer.param_groups[0]["lr"] == pytest.approx(runner.agent.cfg.alpha_lr)
    refits = [r for r in logger.records if r[1] == "refit"]
    assert len(refits) == (1 if mode == "refit" else 0)
    with pytest.raises(ConfigError, match="switch_temperature"):
        Runner(small(switch_temperature="warm"), dataset, tmp_path, CountingLogger())


@pytest.mark.slow
def test_pretrain_once_fine_tune_many(dataset, tmp_path):
    first = Runner(small(), dataset, tmp_path / "a", CountingLogger(), progress=False)
    summary = first.run()
    saved = tmp_path / "a" / "checkpoints" / "pretrained"
    assert (saved / "model.safetensors").is_file() and (saved / "state.json").is_file()
    logger = CountingLogger()
    second = Runner(small(pretrained=str(tmp_path / "a"), warmup_steps=10), dataset, tmp_path / "b", logger,
                    progress=False)
    calls = []
    second.offline_agent.update = lambda *a, **k: calls.append(1)
    resumed = second.run()
    assert not calls  # no offline gradient step: the pretraining was restored
    assert resumed["offline_score"] == summary["offline_score"] and resumed["offline_steps"] == 20
    assert any(phase == "offline" and kind == "eval" for phase, kind, _, _ in logger.records)
    # the compute precision is free: a bf16 pretraining fine-tunes in fp32
    precision = Runner(small(pretrained=str(tmp_path / "a"), offline_agent={"hidden": (32, 32), "bf16": True}),
                       dataset, tmp_path / "p", CountingLogger(), progress=False).run()
    assert precision["offline_score"] == summary["offline_score"]
    for bad, match in ((dict(offline_agent={"hidden": (16, 16)}), "offline_agent"), (dict(gamma=0.9), "gamma")):
        with pytest.raises(ConfigError, match=match):
            Runner(small(pretrained=str(tmp_path / "a"), **bad), dataset, tmp_path / "c", CountingLogger(),
                   progress=False).run()
    from embodied.errors import CheckpointError
    with pytest.raises(CheckpointError, match="no saved pretraining"):
        Runner(small(pretrained=str(tmp_path / "nothing")), dataset, tmp_path / "d", CountingLogger()).run()
    other = dataclasses.replace(dataset, rewards=dataset.rewards[::-1].copy())  # same size and config, other data
    with pytest.raises(ConfigError, match="other data of the same size"):
        Runner(small(pretrained=str(tmp_path / "a")), other, tmp_path / "e", CountingLogger(), progress=False).run()


def test_a_pretraining_is_refused_on_other_data_of_the_same_size(dataset, tmp_path):
    """dataset.env, dataset.quality or dataset.path can change the data and keep its size and the config; the
    saved fingerprint catches it, and a pretraining saved before fingerprints existed still loads."""
    config = {"env": "pointmaze-umaze"}
    state = dict(config=config, offline_step=5, dataset_size=len(dataset), eval_history=[])
    write_folder(tmp_path / "old", {"w": torch.zeros(1)}, state)
    write_folder(tmp_path / "new", {"w": torch.zeros(1)}, {**state, "dataset_fingerprint": dataset_fingerprint(dataset)})
    other = dataclasses.replace(dataset, observations=dataset.observations + 1e-3)
    assert dataset_fingerprint(other) != dataset_fingerprint(dataset)
    assert dataset_fingerprint(dataclasses.replace(dataset)) == dataset_fingerprint(dataset)
    read_pretrained(tmp_path / "new", config, dataset)
    read_pretrained(tmp_path / "old", config, other)
    with pytest.raises(ConfigError, match="dataset.env, dataset.quality and dataset.path"):
        read_pretrained(tmp_path / "new", config, other)


@pytest.mark.slow
def test_actor_delay_takes_critic_steps_only(dataset, tmp_path):
    runner = Runner(small(warmup_steps=20, actor_delay_steps=15, utd=2), dataset, tmp_path, CountingLogger(),
                    progress=False)
    runner._run_offline()
    runner._switch()
    actor_steps = [0]
    original = runner.agent.update_actor_and_alpha
    runner.agent.update_actor_and_alpha = lambda b: (actor_steps.__setitem__(0, actor_steps[0] + 1), original(b))[1]
    calls = count_updates(runner)
    runner._run_online()
    assert calls[1] == (60 - 20) * 2 and actor_steps[0] == 60 - 20 - 15


def test_the_runner_takes_its_envs_from_the_caller(tmp_path):
    """Agents never build envs (DESIGN.md): the online env comes from the EnvSource the runner is given."""
    from sims.source import EnvSource

    made = []

    class Recording(EnvSource):
        def make(self, seed=None, **kwargs):
            made.append(seed)
            return super().make(seed=seed, **kwargs)

    cfg = RunnerConfig(env="pointmaze-umaze", offline_algo=None, online_algo="sac", online_steps=30, random_steps=30,
                       eval_every_online=30, eval_episodes=1, video_episodes=0, online_agent={"hidden": [16, 16]})

    class Quiet:
        def log(self, *args, **kwargs):
            pass

    Runner(cfg, None, tmp_path, Quiet(), progress=False, envs=Recording("pointmaze-umaze")).run()
    assert made == [7], made  # one online env, seeded seed + 7
    with pytest.raises(ConfigError, match="envs of hopper for env=pointmaze-umaze"):
        Runner(cfg, None, tmp_path, Quiet(), progress=False, envs=EnvSource("hopper"))


def test_online_cql_alpha_sets_the_kept_penalty_after_the_switch_only(dataset, tmp_path):
    """Cal-QL fine-tuning with the official online_cql_alpha: the pretraining trains at cql_alpha, the switch
    changes the weight on the same agent, and a knob that cannot apply is an error before any work."""
    logger = CountingLogger()
    runner = Runner(small(online_algo="same", online_cql_alpha=0.5, log_every=10,
                          offline_agent={"hidden": (32, 32), "cql_alpha": 5.0}, online_agent={}),
                    dataset, tmp_path, logger, progress=False)
    runner._run_offline()
    assert {m["train/cql_alpha"] for phase, kind, _, m in logger.records if kind == "train"} == {5.0}
    runner._switch()
    assert runner.agent is runner.offline_agent and runner.agent.cfg.cql_alpha == 0.5
    batch = runner._batch(runner.offline_buffer, 32)
    metrics = runner.agent.update(batch)
    assert metrics["cql_alpha"] == 0.5  # the loss reads the new weight
    with pytest.raises(ConfigError, match="online_cql_alpha"):
        Runner(small(online_cql_alpha=0.5), dataset, tmp_path / "sac", CountingLogger())  # online_algo=sac
    with pytest.raises(ConfigError, match="CQL-family"):
        Runner(small(offline_algo="iql", online_algo="same", online_cql_alpha=0.5, offline_agent={}, online_agent={}),
               dataset, tmp_path / "iql", CountingLogger())
    with pytest.raises(ConfigError, match="Lagrange"):
        Runner(small(online_algo="same", online_cql_alpha=0.5, online_agent={},
                     offline_agent={"hidden": (32, 32), "lagrange": True}), dataset, tmp_path / "lg", CountingLogger())
