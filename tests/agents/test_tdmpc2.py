"""TD-MPC2: symlog two-hot regression and SimNorm on hand-computed cases, the losses on a fixed batch (and
their masks), MPPI's shapes, bounds and search, checkpoints through safetensors and `policies.load`, and tiny
runs of both presets through `embodied.train.run`, with a checkpoint resumed."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load, save as st_save

import policies
from embodied import agents
from embodied.data.replay import ReplayBuffer
from embodied.errors import ConfigError
from policies.base import STATE_KEY
from policies.tdmpc2 import SimNorm, TDMPC2Policy, soft_ce, symexp, symlog, two_hot, two_hot_inv

OBS, ACT = 5, 2
TINY = dict(latent_dim=16, enc_dim=32, mlp_dim=32, simnorm_dim=4, num_samples=32, num_elites=8, num_pi_trajs=4,
            iterations=3, episodic=True)


def tiny_agent(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return agents.make("tdmpc2", OBS, ACT, {**TINY, **overrides})


@pytest.fixture(scope="module")
def buffer() -> ReplayBuffer:
    """Twelve 15-step episodes whose reward is the first action and whose next state is a linear map of
    the state and action (learnable); odd episodes end in a terminal, even ones time out."""
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(OBS, ACT, capacity=400, seed=0)
    mix = rng.normal(size=(OBS + ACT, OBS)).astype(np.float32) * 0.4
    for episode in range(12):
        obs = rng.normal(size=OBS).astype(np.float32)
        for t in range(15):
            action = rng.uniform(-1, 1, ACT).astype(np.float32)
            nxt = np.tanh(np.concatenate([obs, action]) @ mix).astype(np.float32)
            end = t == 14
            buf.add(obs, action, float(action[0]), nxt, terminal=end and episode % 2, timeout=end and not episode % 2)
            obs = nxt
    return buf


# -- discrete regression and SimNorm ---------------------------------------------------------------------

def test_symlog_and_symexp_on_hand_computed_values():
    x = torch.tensor([0.0, math.e - 1, -(math.e ** 2 - 1), 1e3])
    np.testing.assert_allclose(symlog(x).numpy(), [0.0, 1.0, -2.0, math.log(1001.0)], rtol=1e-6)
    np.testing.assert_allclose(symexp(symlog(x)).numpy(), x.numpy(), rtol=1e-5)


def test_two_hot_splits_symlog_between_the_two_neighbouring_bins():
    # 5 bins at -2, -1, 0, 1, 2 (bin size 1, in symlog space)
    x = torch.tensor([math.exp(0.25) - 1, -(math.exp(1.5) - 1), 0.0, 1e6, -1e6])
    got = two_hot(x, 5, -2.0, 2.0)
    want = torch.tensor([[0, 0, 0.75, 0.25, 0],      # symlog = 0.25: 3/4 on bin 0, 1/4 on bin 1
                         [0.5, 0.5, 0, 0, 0],        # symlog = -1.5: halfway between -2 and -1
                         [0, 0, 1.0, 0, 0],          # exactly on a bin
                         [0, 0, 0, 0, 1.0],          # above the range: clipped to the top bin
                         [1.0, 0, 0, 0, 0]])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # decoding the encoding gives the number back (inside the range), as symexp of the expected bin
    decoded = two_hot_inv(torch.log(got[:3]), -2.0, 2.0)
    torch.testing.assert_close(decoded, x[:3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(two_hot_inv(torch.zeros(101), -10.0, 10.0), torch.tensor(0.0), atol=1e-6, rtol=0)


def test_soft_cross_entropy_against_the_two_hot_target():
    # uniform logits over 5 bins: CE = log 5 whatever the target
    torch.testing.assert_close(soft_ce(torch.zeros(3, 5), torch.tensor([0.0, 5.0, -1.0]), -2.0, 2.0),
                               torch.full((3,), math.log(5.0)))
    # logits putting [0.75, 0.25] on bins 2 and 3: CE = -(0.75 log 0.75 + 0.25 log 0.25) (the target's entropy)
    target = torch.tensor([math.exp(0.25) - 1])
    logits = torch.log(torch.tensor([[1e-9, 1e-9, 0.75, 0.25, 1e-9]]))
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    torch.testing.assert_close(soft_ce(logits, target, -2.0, 2.0), torch.tensor([entropy]), atol=1e-5, rtol=1e-5)


def test_simnorm_is_a_softmax_over_groups():
    x = torch.tensor([[0.0, math.log(3.0), math.log(2.0), math.log(2.0)]])
    torch.testing.assert_close(SimNorm(2)(x), torch.tensor([[0.25, 0.75, 0.5, 0.5]]))
    z = SimNorm(8)(torch.randn(3, 4, 64) * 5)
    groups = z.view(3, 4, 8, 8)
    torch.testing.assert_close(groups.sum(-1), torch.ones(3, 4, 8))
    assert (z >= 0).all() and z.shape == (3, 4, 64)


def test_the_encoder_and_dynamics_output_simnorm_latents():
    model = tiny_agent().actor
    z = model.encode(torch.randn(7, OBS))
    nxt = model.next(z, torch.rand(7, ACT) * 2 - 1)
    for latent in (z, nxt):
        torch.testing.assert_close(latent.view(7, -1, 4).sum(-1), torch.ones(7, 4))


# -- learning ----------------------------------------------------------------------------------------

def test_losses_decrease_on_a_fixed_batch(buffer):
    agent = tiny_agent(lr=3e-3)  # 10x the official lr: a hundred steps are enough here
    batch = buffer.sample_chunks(64, agent.chunk_horizon)
    torch.manual_seed(1)
    first = agent.update(batch)
    for _ in range(100):
        last = agent.update(batch)
    assert all(math.isfinite(v) for v in last.values())
    assert last["total_loss"] < 0.2 * first["total_loss"], (first, last)
    for key in ("consistency_loss", "reward_loss", "value_loss", "termination_loss"):
        assert last[key] < 0.5 * first[key], (key, first[key], last[key])
    assert last["pi_loss"] < first["pi_loss"]   # the prior moves to higher Q
    # the reward head has learnt r = a_0 on the batch's first steps
    with torch.no_grad():
        z = agent.actor.encode(torch.as_tensor(batch["observations"]))
        actions = torch.as_tensor(batch["actions"][:, 0])
        predicted = two_hot_inv(agent.actor.reward_logits(z, actions), agent.cfg.vmin, agent.cfg.vmax)
    assert float((predicted - actions[:, 0]).abs().mean()) < 0.1


def test_steps_past_an_episode_end_do_not_change_the_losses(buffer):
    """valid = 0 steps are masked: whatever a padded step holds, the update is the same."""
    batch = buffer.sample_chunks(32, 3)
    batch["valid"][:, 1:] = 0.0
    garbage = {k: v.copy() for k, v in batch.items()}
    rng = np.random.default_rng(3)
    garbage["rewards"][:, 1:] = rng.normal(size=garbage["rewards"][:, 1:].shape) * 100
    garbage["next_observations"][:, 1:] = rng.normal(size=garbage["next_observations"][:, 1:].shape)
    garbage["terminals"][:, 1:] = 1.0
    metrics = []
    for data in (batch, garbage):
        agent = tiny_agent()
        torch.manual_seed(5)
        metrics.append(agent.update(data))
    for key in ("consistency_loss", "reward_loss", "value_loss", "termination_loss", "pi_loss"):
        assert metrics[0][key] == pytest.approx(metrics[1][key], rel=1e-6), key


def test_a_transition_batch_is_a_one_step_chunk(buffer):
    agent = tiny_agent()
    metrics = agent.update(buffer.sample(16))
    assert all(math.isfinite(v) for v in metrics.values()) and metrics["consistency_loss"] > 0


def test_target_q_follows_the_q_heads_by_polyak_averaging(buffer):
    agent = tiny_agent(tau=0.5)
    before = [p.clone() for p in agent.target_q.parameters()]
    agent.update(buffer.sample_chunks(16, 3))
    for old, new, online in zip(before, agent.target_q.parameters(), agent.actor.q.parameters()):
        torch.testing.assert_close(new, 0.5 * old + 0.5 * online.detach())
    assert not any(p.requires_grad for p in agent.target_q.parameters())


# -- planning ------------------------------------------------------------------------------------------

def test_mppi_actions_have_the_documented_shapes_and_bounds(monkeypatch):
    agent = tiny_agent()
    obs = np.random.default_rng(0).normal(size=(3, OBS)).astype(np.float32) * 10
    assert agent.actor.act(obs[0]).shape == (1, ACT)
    assert agent.actor.act({STATE_KEY: obs[0]}).shape == (1, ACT)
    for deterministic in (True, False):
        batch = agent.actor.act(obs, deterministic=deterministic)
        assert batch.shape == (3, 1, ACT) and batch.dtype == np.float32
        assert np.isfinite(batch).all() and np.abs(batch).max() <= 1.0
    assert agent.act(obs[0]).shape == (ACT,) and agent.act(obs).shape == (3, ACT)
    samples = agent.actor.sample(obs[0], 6)
    assert samples.shape == (6, 1, ACT) and np.abs(samples).max() <= 1.0
    assert len(np.unique(samples[:, 0, 0])) > 1  # independent stochastic plans
    monkeypatch.setattr("policies.tdmpc2.PLAN_ROWS", 64)         # 2 states per MPPI pass (32 samples each)
    many = agent.actor.act(np.zeros((5, OBS), np.float32))        # planned in 3 groups, warm starts split alike
    again = agent.actor.act(np.ones((5, OBS), np.float32))
    assert many.shape == again.shape == (5, 1, ACT) and np.abs(again).max() <= 1.0
    assert agent.actor._warm[True][2].shape == (3, 5, ACT)       # the plan means of all 5 states are kept


def test_mppi_finds_the_best_action_sequence_of_a_known_value():
    """With the value replaced by -||a_0 - target||^2 - ||a_1||^2, the refitted mean converges on target."""
    torch.manual_seed(0)
    policy = TDMPC2Policy(OBS, ACT, latent_dim=16, enc_dim=16, mlp_dim=16, simnorm_dim=4, num_samples=256,
                          num_elites=32, num_pi_trajs=8, iterations=6, temperature=5.0).eval()
    target = torch.tensor([0.6, -0.3])
    policy.estimate_value = lambda z, actions, generator=None: (-(actions[0] - target).square().sum(-1)
                                                                - actions[1].square().sum(-1))
    action, mean = policy.plan(torch.zeros(4, OBS), deterministic=True)
    torch.testing.assert_close(action, target.expand(4, -1), atol=0.1, rtol=0)
    assert mean.shape == (3, 4, ACT) and float(mean[1].abs().max()) < 0.15


def test_deterministic_plans_are_a_function_of_the_query_and_the_warm_start():
    agent = tiny_agent()
    obs = np.random.default_rng(1).normal(size=(2, OBS)).astype(np.float32)
    first = agent.actor.act(obs, deterministic=True)
    agent.actor.act(obs, deterministic=False)                      # exploration keeps its own warm start
    np.testing.assert_array_equal(agent.actor.act(obs, deterministic=True), first)   # same query, same plan
    agent.actor.act(obs + 1, deterministic=True)                   # the next state: warm-started from this plan
    agent.actor.reset()
    np.testing.assert_array_equal(agent.actor.act(obs, deterministic=True), first)   # reset: a fresh start


# -- checkpoints and deployment ---------------------------------------------------------------------------

def test_state_dict_round_trip_gives_the_same_plan(buffer, tmp_path):
    agent = tiny_agent(seed=0)
    for _ in range(3):
        agent.update(buffer.sample_chunks(32, 3))
    state = st_load(st_save(agent.state_dict()))
    assert any(k.startswith("model_optimizer.") for k in state) and "scale.value" in state
    restored = tiny_agent(seed=1)
    restored.load_state_dict(state)
    obs = np.random.default_rng(2).normal(size=(3, OBS)).astype(np.float32)
    np.testing.assert_array_equal(restored.act(obs, deterministic=True), agent.act(obs, deterministic=True))
    torch.manual_seed(9)
    sampled = agent.act(obs, deterministic=False)
    torch.manual_seed(9)
    np.testing.assert_array_equal(restored.act(obs, deterministic=False), sampled)
    batch = buffer.sample_chunks(32, 3)
    torch.manual_seed(4)
    want = agent.update(batch)
    torch.manual_seed(4)
    assert restored.update(batch) == want   # optimizer moments and the Q scale came along too

    agent.actor.save(tmp_path / "policy")   # the deployable MPPI controller
    loaded = policies.load(tmp_path / "policy")
    assert isinstance(loaded, TDMPC2Policy) and loaded.config() == agent.actor.config()
    agent.actor.reset()
    np.testing.assert_array_equal(loaded.act(obs[0]), agent.actor.act(obs[0]))
    assert not hasattr(loaded, "horizon")   # the policy server would read it as a chunk length


def test_the_policy_server_serves_the_planner_one_action_per_request():
    """What `robots.deploy` talks to: the server reads a 1-row chunk from the planner and sends it."""
    from robots.server import PolicyServer

    server = PolicyServer(tiny_agent().actor)
    try:
        spec = server.spec()
        assert spec["obs_dim"] == OBS and spec["action_dim"] == ACT and spec["horizon"] == 1
        reply = server._infer({STATE_KEY: np.zeros(OBS, np.float32)}, 7, 0.0, b"id", 0.0)
        assert reply["type"] == "chunk" and reply["chunk"].shape == (1, ACT) and reply["obs_step"] == 7
        assert np.abs(reply["chunk"]).max() <= 1.0
    finally:
        server.close()


def test_bad_settings_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="latent_dim=30 must be a multiple of simnorm_dim=8"):
        agents.make_config("tdmpc2", {"latent_dim": 30})
    with pytest.raises(ConfigError, match="obs_type"):
        agents.make_config("tdmpc2", {"obs_type": "depth"})
    with pytest.raises(ConfigError, match="set latent_dim=512"):
        agents.make("tdmpc2", 3 * 64 * 64, ACT, {"obs_type": "rgb", "latent_dim": 256})


def test_the_image_encoder_plans_from_frames():
    torch.manual_seed(0)
    agent = agents.make("tdmpc2", 3 * 64 * 64, ACT, {"obs_type": "rgb", "num_channels": 8, "latent_dim": 128,
                                                     "mlp_dim": 32, "num_samples": 16, "num_elites": 4,
                                                     "num_pi_trajs": 2, "iterations": 2})
    frames = np.random.default_rng(0).integers(0, 256, size=(2, 64, 64, 3)).astype(np.uint8)
    flat = np.moveaxis(frames, -1, 1).reshape(2, -1).astype(np.float32)
    action = agent.actor.act({"observation.images.front": frames[0]})
    assert action.shape == (1, ACT) and np.abs(action).max() <= 1.0
    agent.actor.reset()
    np.testing.assert_array_equal(action, agent.actor.act(flat[0]))   # the dict frame is the flat CHW vector
    batch = {"observations": flat, "actions": np.zeros((2, 3, ACT), np.float32), "rewards": np.ones((2, 3), np.float32),
             "next_observations": np.repeat(flat[:, None], 3, 1), "terminals": np.zeros((2, 3), np.float32),
             "valid": np.ones((2, 3), np.float32)}
    assert math.isfinite(agent.update(batch)["total_loss"])


# -- the presets through the train job ---------------------------------------------------------------

def compose_train(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from embodied.train import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


TINY_RUN = ["experiment=smoke", "env=pointmaze-umaze", "dataset.size=1500", "budget.online_steps=120",
            "budget.random_steps=40", "budget.offline_steps=30", "eval.every_offline=30", "eval.every_online=120",
            "eval.episodes=1", "eval.dip_evals=1", "log_every=10", "checkpoint.every=50", "checkpoint.keep=5"]


def read_lines(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each preset once through `embodied.train.run` (shared by the tests below): preset -> (cfg, run dir, summary)."""
    from embodied.train import run

    cache, out = tmp_path_factory.mktemp("tdmpc2_cache"), {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EMBODIED_CACHE", str(cache))
        for preset in ("tdmpc2", "tdmpc2_o2o"):
            cfg = compose_train([f"algo={preset}", *TINY_RUN])
            run_dir = tmp_path_factory.mktemp(preset) / "run"
            out[preset] = (cfg, run_dir, run(cfg, run_dir))
        yield out, cache


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tdmpc2", "tdmpc2_o2o"])
def test_presets_run_end_to_end(preset, runs):
    _, run_dir, summary = runs[0][preset]
    lines = read_lines(run_dir)
    assert summary["online_steps"] == 120
    online_train = [x for x in lines if x["phase"] == "online" and x["kind"] == "train" and "train/total_loss" in x]
    online_evals = [x for x in lines if x["phase"] == "online" and x["kind"] == "eval"]
    assert online_evals[-1]["step"] == 120 and 0.0 <= online_evals[-1]["eval/success"] <= 1.0
    assert "switch/calibration_gap" in online_evals[-1]   # the Q heads' diagnostic against MC returns
    if preset == "tdmpc2":   # learning starts after the random seed steps
        assert summary["offline_score"] is None
        assert min(x["step"] for x in online_train) > 40
    else:
        assert summary["offline_score"] is not None and summary["offline_steps"] == 30
        offline = [x["step"] for x in lines if x["phase"] == "offline" and x["kind"] == "train"]
        assert offline == [10, 20, 30]
        assert "switch/action_distance" in online_evals[-1]
        assert (run_dir / "checkpoints" / "pretrained" / "model.safetensors").is_file()
    assert online_train and all(math.isfinite(x["train/consistency_loss"]) for x in online_train)
    policy = policies.load(summary["policy_dir"])          # the deployable planner
    assert isinstance(policy, TDMPC2Policy) and policy.act(np.zeros(6, np.float32)).shape == (1, 2)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tdmpc2", "tdmpc2_o2o"])
def test_a_checkpoint_resumes_the_online_phase(preset, runs, monkeypatch):
    from embodied.agents.runner import Runner
    from embodied.checkpoints import find_checkpoints, read_checkpoint
    from embodied.run_config import runner_config
    from embodied.train import load_dataset

    (cfg, run_dir, _), cache = runs[0][preset], runs[1]
    monkeypatch.setenv("EMBODIED_CACHE", str(cache))
    online = [p for p in find_checkpoints(run_dir) if json.loads((p / "state.json").read_text())["phase"] == "online"]
    assert online, "no online checkpoint was written"
    ckpt = read_checkpoint(online[0])     # total step 50: online step 50 (tdmpc2) or 30 offline + 20 online (o2o)
    resume_at = 50 - (30 if cfg.algo.offline_algo else 0)

    class Quiet:
        def log(self, *args, **kwargs):
            pass

        def truncate_after(self, *args, **kwargs):
            return 0

    dataset = load_dataset(cfg) if cfg.algo.offline_algo else None
    runner = Runner(runner_config(cfg), dataset, run_dir, Quiet(), progress=False)
    runner.resume_latest(ckpt)
    assert runner.phase == "online" and runner.online_step == resume_at and len(runner.online_buffer) == resume_at
    saved = {k[len("agent."):]: v for k, v in ckpt.tensors.items() if k.startswith("agent.")}
    assert set(saved) == set(runner.agent.state_dict())
    for key, value in runner.agent.state_dict().items():
        assert torch.equal(value, saved[key]), key
    if cfg.algo.offline_algo:   # the frozen pretrained planner (the action-drift reference) comes back too
        frozen = {k[len("pretrained_actor."):]: v for k, v in ckpt.tensors.items() if k.startswith("pretrained_actor.")}
        assert frozen and all(torch.equal(v, frozen[k]) for k, v in runner.pretrained_actor.state_dict().items())
    state = runner.online_buffer.sample(1)["observations"][0]
    runner.agent.act(state)                                # a plan to warm-start the next step from
    assert runner.agent.actor._warm
    runner._new_episode()                                  # what the online loop does at every episode start
    assert not runner.agent.actor._warm
    runner.agent.act(state)
    runner.evaluate(resume_at, resume_at)                  # evals plan from scratch and leave no plan behind
    assert not runner.agent.actor._warm
    summary = runner.run()                                 # and it finishes the remaining env steps
    assert runner.online_step == 120 and summary["online_steps"] == 120
    assert [r["step"] for r in runner.eval_history if r["phase"] == "online"][-1] == 120


@pytest.mark.slow
def test_the_sample_efficiency_table_reads_the_runs_at_one_budget(runs, tmp_path):
    import importlib.util

    from embodied.train import CONF_DIR

    spec = importlib.util.spec_from_file_location("world_model_bench", CONF_DIR.parents[1] / "benchmarks" / "world_model.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    folders = [runs[0][preset][1].parent for preset in ("tdmpc2", "tdmpc2_o2o")]
    table = bench.efficiency_rows(folders)
    assert table["env"] == "pointmaze-umaze" and table["eval_steps"][-1] == 120
    rows = {r["method"]: r for r in table["rows"]}
    assert rows["tdmpc2"]["offline_steps"] == [0] and rows["tdmpc2_o2o"]["offline_steps"] == [30]
    # PointMaze is sparse: the table reads success, not the return (which only counts steps to the goal)
    assert table["score_kind"] == "success"
    final = runs[0]["tdmpc2"][2]["online_success"]
    assert final is not None
    assert rows["tdmpc2"]["final"] == (final, final, final) == tuple(rows["tdmpc2"]["curve"][120])
    text = bench.efficiency_markdown(table)
    assert "| tdmpc2 | 1 | 0 |" in text and "| tdmpc2_o2o | 1 | 30 |" in text
    with pytest.raises(SystemExit, match="different online budgets"):
        other = tmp_path / "other"
        shutil.copytree(folders[0], other)
        summary = next(other.rglob("summary.json"))
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "online_steps": 99}))
        bench.efficiency_rows([folders[1], other])
