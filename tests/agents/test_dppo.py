"""DPPO: per-step Gaussian log-probabilities, the clip/discount schedules, GAE, PPO direction, a run."""
import json

import numpy as np
import pytest
import torch
from torch.distributions import Normal

from embodied import agents
from embodied.agents.dppo import DPPO, DPPOConfig, RunningReturnStd, clip_ratios, gae
from policies.diffusion import DiffusionPolicy


def small_agent(**kw) -> DPPO:
    torch.manual_seed(0)
    base = DiffusionPolicy(3, 2, obs_horizon=1, pred_horizon=4, execute_horizon=4, denoiser="mlp",
                           denoiser_kwargs={"hidden": [32, 32]}, num_train_steps=20)
    cfg = DPPOConfig(**{"denoising_steps": 20, "ft_denoising_steps": 10, "hidden": (32, 32), **kw})
    return DPPO(3, 2, cfg, base=base)


def test_log_probs_match_a_direct_gaussian_computation():
    agent = small_agent(min_std=0.1)
    obs = torch.randn(5, 3)
    chunk, latents, cond = agent.sample_chain(obs)
    assert latents.shape == (5, 11, 4, 2) and chunk.shape == (5, 4, 2)
    batched = agent.log_probs(cond, latents)
    direct = torch.zeros(5, 10)
    co = agent.actor.coefficients("ddpm", 20)
    for j in range(10):
        i = 10 + j
        x = latents[:, j]
        eps = agent.actor.net_ft(x, torch.full((5,), float(co["t_unit"][i])), cond)
        x0 = ((x - co["sqrt_1mab"][i] * eps) / co["sqrt_ab"][i]).clamp(-1, 1)
        mean = co["a"][i] * x0 + co["b"][i] * x
        std = max(float(co["sigma"][i]), 0.1)
        direct[:, j] = Normal(mean, std).log_prob(latents[:, j + 1]).sum((-1, -2))
    torch.testing.assert_close(batched, direct, rtol=1e-4, atol=1e-3)
    # DPPO's ratio uses the clamped per-element mean (chunk-size independent)
    with torch.no_grad():
        mean = agent.log_probs(cond, latents, "mean")
    assert mean.shape == (5, 10) and float(mean.max()) <= 2.0 and float(mean.min()) >= -5.0
    # the min-std floor is active on the last steps (DDPM's posterior std collapses there)
    assert float(co["sigma"][-1]) == 0.0 and float(co["sigma"][-2]) < 0.1


def test_clip_schedule_and_denoising_discount():
    clips = clip_ratios(DPPOConfig())
    assert clips[0] == pytest.approx(0.001) and clips[-1] == pytest.approx(0.01)
    assert torch.all(clips[1:] > clips[:-1])
    agent = small_agent(gamma_denoise=0.9)
    assert agent.denoise_discount[-1] == 1.0 and agent.denoise_discount[0] == pytest.approx(0.9**9)


def test_gae_against_hand_computation():
    r = np.array([[1.0], [2.0], [3.0]], np.float32)
    v = np.array([[0.5], [0.5], [0.5]], np.float32)
    nv = np.array([[0.5], [0.5], [9.0]], np.float32)
    term = np.array([[0.0], [1.0], [0.0]], np.float32)
    done = np.array([[0.0], [1.0], [0.0]], np.float32)
    adv, ret = gae(r, v, nv, term, done, gamma=0.9, lam=0.5)
    d2 = 3 + 0.9 * 9 - 0.5
    d1 = 2 - 0.5                     # terminal: no bootstrap, and the trace stops
    d0 = 1 + 0.9 * 0.5 - 0.5
    np.testing.assert_allclose(adv[:, 0], [d0 + 0.45 * d1, d1, d2], rtol=1e-6)
    np.testing.assert_allclose(ret, adv + v)


def test_ppo_step_raises_the_likelihood_of_advantaged_chains():
    agent = small_agent(update_epochs=1, minibatch_size=64, actor_lr=1e-3, clip_ratio=0.2, clip_ratio_base=0.2,
                        target_kl=None)
    obs = torch.randn(64, 3)
    _, latents, cond = agent.sample_chain(obs)
    with torch.no_grad():
        old = agent.log_probs(cond, latents, agent.cfg.logprob_reduce)
    adv = torch.where(torch.arange(64) < 32, 1.0, -1.0)
    frozen = [p.clone() for p in agent.actor.net.parameters()]
    metrics = agent.update({"cond": cond, "latents": latents, "old_log_probs": old, "advantages": adv,
                            "returns": torch.zeros(64)})
    with torch.no_grad():
        new = agent.log_probs(cond, latents, agent.cfg.logprob_reduce)
    gain = (new - old).sum(1)
    assert gain[:32].mean() > gain[32:].mean()
    assert all(torch.equal(a, b) for a, b in zip(frozen, agent.actor.net.parameters()))  # early steps frozen
    assert np.isfinite(list(metrics.values())).all()


def test_finetuned_policy_saves_and_loads(tmp_path):
    import policies

    agent = small_agent()
    with torch.no_grad():
        for p in agent.actor.net_ft.parameters():
            p.add_(0.01)
    agent.actor.save(tmp_path / "p")
    loaded = policies.load(tmp_path / "p")
    assert loaded.finetune_last == 10
    obs = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded.act(obs), agent.actor.act(obs))


@pytest.mark.slow
def test_dppo_runner_tiny_run(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    from hydra import compose, initialize_config_dir

    from embodied.train import CONF_DIR, run

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "algo=dppo", "experiment=smoke", "env=pointmaze-umaze", "budget.offline_steps=20", "budget.online_steps=200",
            "eval.every_online=100", "eval.episodes=2", "algo.online_agent.n_envs=2", "algo.online_agent.rollout_steps=8"])
    summary = run(cfg, tmp_path / "run")
    assert summary["online_steps"] == 200 and 0.0 <= summary["offline_success"] <= 1.0
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x["phase"] == "online" and x["kind"] == "train" and "train/pg_loss" in x]
    assert train and all(np.isfinite(x["train/approx_kl"]) for x in train)
    assert [x["step"] for x in lines if x["phase"] == "online" and x["kind"] == "eval"][-1] == 200


def test_dppo_registry_builds_a_fresh_policy():
    agent = agents.make("dppo", obs_dim=3, act_dim=2, overrides={"hidden": [16], "denoising_steps": 6,
                                                                 "ft_denoising_steps": 3})
    assert agent.actor.finetune_last == 3 and agent.act_chunk(np.zeros((1, 1, 3), np.float32)).shape == (1, 4, 2)


def test_running_return_std_scales_rewards_to_unit_returns():
    scale = RunningReturnStd(n_envs=2, gamma=0.9)
    rng = np.random.default_rng(0)
    out = []
    for t in range(2000):
        done = np.array([t % 50 == 49, t % 70 == 69])
        out.append(scale(rng.normal(-100.0, 10.0, 2), done))
    returns_std = np.sqrt(scale.m2 / scale.count)
    assert returns_std > 50  # returns of -100 rewards are large...
    assert 0.1 < np.abs(np.array(out[-100:])).mean() < 5  # ...the scaled rewards are O(1)


@pytest.mark.slow
def test_dppo_loop_state_survives_a_checkpoint(tmp_path, monkeypatch):
    """PPO iterations (the critic warmup counts them), running episode returns, the return normaliser and
    the checkpoint count are saved with the checkpoint and restored on resume (they used to be lost)."""
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    from hydra import compose, initialize_config_dir

    from embodied.checkpoints import find_checkpoints
    from embodied.train import CONF_DIR, run

    overrides = ["algo=dppo", "experiment=smoke", "env=pointmaze-umaze", "budget.offline_steps=20",
                 "budget.online_steps=160", "eval.every_online=160", "eval.episodes=1", "eval.video_episodes=0",
                 "algo.online_agent.n_envs=2", "algo.online_agent.rollout_steps=4", "checkpoint.every=100",
                 "checkpoint.keep=5"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    run(cfg, tmp_path / "run")
    online = [p for p in find_checkpoints(tmp_path / "run")
              if json.loads((p / "state.json").read_text())["phase"] == "online"]
    assert online, "no online checkpoint was written"
    saved = json.loads((online[-1] / "state.json").read_text())["loop"]
    assert saved["iteration"] >= 1 and saved["checkpoints_written"] >= 1
    assert saved["return_norm"]["count"] > 0 and len(saved["episode_return"]) == 2

    from embodied.agents.dppo import DPPORunner
    from embodied.run_config import runner_config
    from embodied.train import load_dataset

    class Quiet:
        def log(self, *args, **kwargs):
            pass

    runner = DPPORunner(runner_config(cfg), load_dataset(cfg), tmp_path / "run", Quiet(), progress=False)
    runner.load_checkpoint(online[-1])
    assert runner.loop.state_dict() == saved


@pytest.mark.slow
def test_diwa_fine_tunes_in_the_world_model_and_takes_no_real_step_online(tmp_path, monkeypatch):
    """algo=diwa: BC on task demos, a world model fitted on play data, DPPO rollouts in imagination only;
    the real sim is used for evaluation, never for a rollout (make_vec would raise)."""
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    from hydra import compose, initialize_config_dir

    from embodied.train import CONF_DIR, run
    from sims.source import EnvSource

    def no_real_rollouts(*args, **kwargs):
        raise AssertionError("algo=diwa asked for real envs to roll out in")

    monkeypatch.setattr(EnvSource, "make_vec", no_real_rollouts)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "algo=diwa", "experiment=smoke", "env=cube-single", "dataset=task", "dataset.size=2000",
            "budget.offline_steps=20", "budget.online_steps=96", "eval.every_online=96", "eval.episodes=1",
            "algo.online_agent.n_envs=4", "algo.online_agent.rollout_steps=4", "algo.world_model.dataset=play", "algo.world_model.size=2000",
            "algo.world_model.fit_steps=30", "algo.world_model.classifier_steps=30", "algo.world_model.members=2",
            "algo.world_model.hidden=32"])
    summary = run(cfg, tmp_path / "run")
    assert summary["online_real_env_steps"] == 0 and summary["online_imagined_steps"] >= 96
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    fitted = [x for x in lines if "world_model/fit_loss" in x]
    assert len(fitted) == 1 and fitted[0]["world_model/transitions"] == 2000
    assert fitted[0]["world_model/success_reward"] == 0.0 and fitted[0]["world_model/failure_reward"] == -1.0
    train = [x for x in lines if x["phase"] == "online" and x["kind"] == "train" and "train/pg_loss" in x]
    assert train and all("online/imagined_steps" in x and "online/env_steps" not in x for x in train)
    assert [x["step"] for x in lines if x["phase"] == "online" and x["kind"] == "eval"][-1] >= 96
    # the world-model benchmark's table reads the run back (a sweep of one)
    import importlib.util

    from embodied.train import CONF_DIR as _conf

    spec = importlib.util.spec_from_file_location("world_model_bench", _conf.parents[1] / "benchmarks" / "world_model.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = bench.method_row(tmp_path)
    assert row["method"] == "diwa" and row["real_env_steps_online"] == [0] and row["ppo_iterations"][0] == len(train)
    assert "| diwa |" in bench.markdown([row], [])
    ratio = {"file": "results/t.json", "env": "cube-single", "mopo_5x200x3": "63.5x", "goal": "20x"}
    assert "Throughput against cube-single (`results/t.json`): mopo_5x200x3: 63.5x" in bench.markdown([row], [ratio])
