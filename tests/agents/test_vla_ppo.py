"""algo=vla_ppo: ReinFlow through the VLA's flow head (VLA fine-tuning route (b)). The chain's likelihood
against a hand computation, what each `finetune` mode trains, LoRA merging into a plain VLA, the noise
bounds and schedule, the divergence measures, the errors, and a tiny end-to-end fine-tune."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import policies
from embodied import agents
from embodied.agents.vla_ppo import VLAPPO
from embodied.config_check import check_config
from embodied.constants import STATE_KEY, image_key
from embodied.errors import ConfigError
from embodied.train import run
from tests.agents.test_vla_bc import TINY, compose_train

OBS, ACT, H, B = 4, 2, 3, 6
VLA = {"cameras": ("front",), "image_size": 32, "chunk": H, "head": "flow", "text_encoder": "hash",
       "vla_kwargs": {"dim": 16, "depth": 1, "num_heads": 2, "channels": (8, 16)}}
PPO = {"minibatches": 2, "update_epochs": 2, "sample_repeats": 2, "critic_hidden": (16, 16)}


def pretrained(**overrides):
    torch.manual_seed(0)
    return agents.make("vla_bc", OBS, ACT, {**VLA, **overrides})


def build(base=None, **overrides):
    return agents.continue_from("vla_ppo", base or pretrained(), {**PPO, **overrides})


def observations(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {STATE_KEY: rng.normal(size=(B, OBS)).astype(np.float32),
            image_key("front"): rng.integers(0, 255, (B, 32, 32, 3), dtype=np.uint8),
            "task": ["open the drawer", "push the block"] * (B // 2)}


def rollout(agent, seed: int = 0) -> dict:
    rows = agent.inputs(observations(seed))
    out = agent.explore(rows)
    g = torch.Generator().manual_seed(seed)
    return {"rows": rows, "chain": out["chain"], "log_prob": out["log_prob"],
            "advantages": torch.randn(B, generator=g), "returns": torch.randn(B, generator=g)}


def test_the_chain_log_likelihood_is_reinflows_normalised_gaussian_chain():
    agent = build()
    data = rollout(agent)
    rows, chain = data["rows"], data["chain"]
    with torch.no_grad():
        cache, context = agent.condition(agent.actor, agent.actor.prefix(rows["state"], rows["images"], rows["tasks"]))
        logp, entropy = agent.log_prob(cache, context, chain)
        # by hand: log N(x_0; 0, I) + sum_k log N(x_{k+1}; clip(x_k + v_k / K), sigma_k^2), / ((K + 1) * H * A)
        k_steps = agent.cfg.denoising_steps
        total = (-0.5 * chain[:, 0] ** 2 - 0.5 * math.log(2 * math.pi)).flatten(1).sum(1)
        for k in range(k_steps):
            s = torch.full((B,), k / k_steps)
            mean = (chain[:, k] + agent.actor.velocity(chain[:, k], s, cache) / k_steps).clamp(-1, 1)
            std = agent.noise(torch.cat([agent.actor.time_embed(s), context], -1)).view_as(mean)
            assert float(std.min()) >= 0.10 - 1e-6 and float(std.max()) <= 0.24 + 1e-6   # ReinFlow's bounds
            total += (-((chain[:, k + 1] - mean) ** 2) / (2 * std ** 2) - std.log()
                      - 0.5 * math.log(2 * math.pi)).flatten(1).sum(1)
        expected = (total / ((k_steps + 1) * H * ACT)).clamp(-1.0, 1.0)
    torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(data["log_prob"], expected, rtol=1e-5, atol=1e-5)   # what the rollout stored
    assert entropy.shape == (B,) and bool(torch.isfinite(entropy).all())
    assert bool((chain[:, -1].abs() <= 1).all())                                     # the chunk stays in range


@pytest.mark.parametrize("mode", ["head", "lora", "full"])
def test_each_finetune_mode_trains_what_it_names_and_the_first_ratio_is_one(mode):
    agent = build(finetune=mode)
    before = {k: v.clone() for k, v in agent.actor.state_dict().items()}
    metrics = agent.update(rollout(agent))
    assert metrics["train/first_ratio"] == pytest.approx(1.0, abs=1e-5)   # stored log-probs are recomputed exactly
    changed = {k for k, v in agent.actor.state_dict().items() if k in before and not torch.equal(v, before[k])}
    head = {k for k in changed if k.split(".")[0] in ("action_in", "action_pos", "time_embed", "action_out")}
    assert head, "the flow head always learns"
    vision = {k for k in changed if k.startswith("vision.")}
    base_backbone = {k for k in changed if k.startswith("backbone.") and "lora_" not in k}
    if mode == "head":
        assert changed == head
    if mode == "lora":
        assert not vision and not base_backbone            # the adapters learn, the base weights stay
        assert any("lora_B" in k for k in agent.actor.state_dict() if not torch.equal(
            agent.actor.state_dict()[k], before.get(k, torch.zeros(0))))
    if mode == "full":
        assert vision and base_backbone


def test_lora_merges_into_a_plain_vla_that_acts_the_same_and_reloads(tmp_path):
    agent = build(finetune="lora")
    with torch.no_grad():   # move the adapters away from their zero init so the merge has something to fold
        for name, p in agent.actor.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    obs = observations(1)
    adapted = agent.act_chunk(obs, True, torch.Generator().manual_seed(0))
    agent.merge_adapters()
    merged = agent.act_chunk(obs, True, torch.Generator().manual_seed(0))
    np.testing.assert_allclose(merged, adapted, atol=1e-5)
    agent.actor.save(tmp_path / "policy")
    loaded = policies.load(tmp_path / "policy")
    loaded.set_text_encoder(policies.vla.hash_text_encoder())
    assert loaded.flow_steps == agent.cfg.denoising_steps   # deploys with the fine-tuned step count
    np.testing.assert_allclose(loaded.act(obs, generator=torch.Generator().manual_seed(0)), merged, atol=1e-5)


def test_the_noise_bound_holds_then_decays_and_the_divergences_start_at_zero():
    agent = build()
    agent.set_progress(0.3)
    assert math.exp(0.5 * agent.noise.logvar_max) == pytest.approx(0.24)
    agent.set_progress(1.0)   # learn_decay ends at min * 0.3 + max * 0.7
    assert math.exp(0.5 * agent.noise.logvar_max) == pytest.approx(0.10 * 0.3 + 0.24 * 0.7)
    rows = agent.inputs(observations())
    start = agent.divergence(rows)
    assert start["finetune/chain_kl"] == pytest.approx(0.0, abs=1e-9)
    assert start["finetune/action_distance"] == pytest.approx(0.0, abs=1e-6)
    for seed in range(3):
        agent.update(rollout(agent, seed))
    moved = agent.divergence(rows)
    assert moved["finetune/chain_kl"] > 0 and moved["finetune/action_distance"] > 0


def test_the_retention_term_trains_on_pretraining_batches():
    """bc_coef > 0 draws a pretraining batch at every PPO minibatch and pulls the actor toward the demos:
    after the same PPO updates, the pretraining loss on the demos is lower than without the term."""
    rng = np.random.default_rng(3)
    demos = {**observations(2), "actions": rng.uniform(-1, 1, (B, H, ACT)).astype(np.float32),
             "valid": np.ones((B, H), np.float32)}
    demo_loss = {}
    for bc_coef in (1e-9, 50.0):   # the control draws the same batches and noise, and gives them no weight
        agent = build(bc_coef=bc_coef, actor_lr=1e-3)
        data, calls = rollout(agent), []

        def sampler(n):
            calls.append(n)
            return demos
        for _ in range(3):
            torch.manual_seed(7)   # the same minibatch order and loss noise in both arms
            metrics = agent.update(data, bc_sampler=sampler)
        torch.manual_seed(11)
        with torch.no_grad():
            demo_loss[bc_coef] = float(agent.actor.loss(demos, demos["actions"], demos["valid"]))
        assert calls == [agent.cfg.bc_batch_size] * int(3 * metrics["train/minibatches"])
        assert metrics["train/bc_loss"] > 0
    assert demo_loss[50.0] < demo_loss[1e-9] - 0.02
    agent, calls = build(), []   # bc_coef 0 (the default): no pretraining batches are drawn
    metrics = agent.update(rollout(agent), bc_sampler=lambda n: calls.append(n) or demos)
    assert not calls and "train/bc_loss" not in metrics


def test_vla_ppo_errors_name_the_field_and_the_fix():
    with pytest.raises(ConfigError, match="fine-tunes a pretrained vla_bc"):
        agents.make("vla_ppo", OBS, ACT)
    with pytest.raises(ConfigError, match="fine-tunes a pretrained VLA"):
        VLAPPO(OBS, ACT)
    with pytest.raises(ConfigError, match="needs the flow head.*head=flow"):
        build(pretrained(head="parallel"))
    with pytest.raises(ConfigError, match="finetune='adapters': choose one of head, lora, full"):
        build(finetune="adapters")
    with pytest.raises(ConfigError, match="0 < min_std <= max_std"):
        build(min_std=0.3)


VLA_PPO_TINY = ["algo=vla_ppo", "env=cube-single-suite", "env.tasks=[1,2]", "dataset=task", "dataset.size=300",
                "budget.offline_steps=6", "budget.online_steps=64", "budget.batch_size=8", "eval.episodes=1",
                "eval.every_offline=6", "eval.every_online=64", "logger=jsonl", "progress=false", "threads=1",
                "checkpoint.every=0", "eval.video_episodes=0", "algo.online_agent.task=2",
                "algo.online_agent.n_envs=2", "algo.online_agent.rollout_steps=2", "algo.online_agent.minibatches=2",
                "algo.online_agent.sample_repeats=2", "algo.online_agent.critic_hidden=[32,32]", *TINY]


def test_vla_ppo_config_errors_before_any_work():
    check_config(compose_train(VLA_PPO_TINY))
    with pytest.raises(ConfigError, match="algo.online_agent.task=7 is not in env.tasks"):
        check_config(compose_train([*VLA_PPO_TINY, "algo.online_agent.task=7"]))
    check_config(compose_train([*VLA_PPO_TINY, "checkpoint.every=10"]))   # online checkpoints are written


@pytest.mark.slow
def test_vla_ppo_resumes_from_an_online_checkpoint_with_its_loop_state(tmp_path, monkeypatch):
    """An online checkpoint carries the PPO iterations (the noise schedule reads them), the running returns,
    the return normaliser and the "before" eval; a run resumed from it finishes the budget without a second
    "before" eval, and its summary keeps the first one."""
    import shutil

    from embodied.checkpoints import find_checkpoints

    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    overrides = [*VLA_PPO_TINY, "checkpoint.every=32", "checkpoint.keep=5"]
    full = run(compose_train(overrides), tmp_path / "run")
    online = [p for p in find_checkpoints(tmp_path / "run")
              if json.loads((p / "state.json").read_text())["phase"] == "online"]
    assert [json.loads((p / "state.json").read_text())["online_step"] for p in online] == [32, 64]
    loop = json.loads((online[0] / "state.json").read_text())["loop"]
    assert loop["iteration"] == 1 and loop["checkpoints_written"] == 1 and len(loop["episode_return"]) == 2
    assert loop["before_finetune"]["step"] == 0

    shutil.copytree(tmp_path / "run", tmp_path / "resumed")   # as if killed after the first online checkpoint
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / online[1].name)
    resumed = run(compose_train([*overrides, "resume=true"]), tmp_path / "resumed")
    assert resumed["online_steps"] == 64
    assert resumed["finetune"]["success_before"] == full["finetune"]["success_before"]
    lines = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    online_evals = [line["step"] for line in lines if line["phase"] == "online" and line["kind"] == "eval"]
    iterations = [line["online/iteration"] for line in lines if "online/iteration" in line]
    assert online_evals == [0, 64] and iterations == [1, 2]


@pytest.mark.slow
def test_vla_ppo_fine_tunes_one_task_from_rendered_rollouts_and_evaluates_every_task(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    summary = run(compose_train(VLA_PPO_TINY), tmp_path / "run")
    finetune = summary["finetune"]
    assert finetune["task"] == 2 and set(finetune["other_tasks_after"]) == {1}
    assert 0.0 <= finetune["success_before"] <= 1.0 and 0.0 <= finetune["success_after"] <= 1.0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    online = [line for line in lines if line["phase"] == "online"]
    train = [line for line in online if line["kind"] == "train" and "train/pg_loss" in line]
    # 2 envs x 2 decisions x 8-step chunks = 32 env steps per PPO iteration
    assert [line["step"] for line in train] == [32, 64]
    assert all(line["train/first_ratio"] == pytest.approx(1.0, abs=1e-4) and line["finetune/chain_kl"] >= 0
               for line in train)
    evals = [line for line in online if line["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 64]   # "before" is the fine-tuned step count's eval at step 0
    assert finetune["success_before"] == evals[0]["eval/task2/success"]
    # the saved policy is the fine-tuned VLA (LoRA merged, K Euler steps), loadable for deployment
    lora = run(compose_train([*VLA_PPO_TINY, f"pretrained={tmp_path / 'run'}", "algo.online_agent.finetune=lora",
                              "algo.online_agent.bc_coef=0.1", "budget.online_steps=48", "eval.every_online=48"]),
               tmp_path / "lora")
    assert lora["online_steps"] == 48
    loaded = policies.load(tmp_path / "lora" / "policy")
    assert loaded.flow_steps == 4 and not any("lora" in k for k in loaded.state_dict())
    train = [json.loads(line) for line in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert any(line.get("train/bc_loss", 0) > 0 for line in train)
    # 32 steps make one PPO iteration; the budget cuts the second after 1 decision of 2 envs: not learned from
    assert [(line["step"], "train/pg_loss" in line, line.get("online/unused_decisions")) for line in train
            if line["phase"] == "online" and "online/iteration" in line] == [(32, True, None), (48, False, 2.0)]
    first = policies.load(tmp_path / "run" / "policy")   # the LoRA fine-tune moved the first fine-tune's weights
    assert first.state_dict().keys() == loaded.state_dict().keys()
    assert any(not torch.equal(first.state_dict()[k], v) for k, v in loaded.state_dict().items())
