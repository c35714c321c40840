"""Train the SAC experts that generate the locomotion datasets, and keep three snapshots.

    python -m embodied.train_expert env=hopper steps=150000 seed=0

Writes `sims/experts/<env>/{early,medium,expert}/` (policy weights + meta.json with the evaluation
return and the command). D4RL's "medium" policy scored about a third of its expert; we keep the
snapshot whose normalised score (raw return where the task has no references) is closest to 35% of the
best one's, and one near 10% as "early". Normalised, so that tasks with negative returns (pendulum) work.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import trange

import sims
from embodied.agents.sac import SAC, SACConfig
from embodied.constants import STATE_KEY
from embodied.data.replay import ReplayBuffer
from embodied.errors import exit_on_user_error

DEFAULTS = dict(env="hopper", steps=150_000, seed=0, random_steps=5_000, batch_size=256, eval_every=10_000,
                eval_episodes=5, bf16=True, threads=2, out=None)
LEVEL_FRACTIONS = {"early": 0.10, "medium": 0.35}


def evaluate(env, policy, episodes: int, seed: int) -> float:
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs, deterministic=True)[0])
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def pick_levels(snapshots: list[tuple], env: str) -> dict[str, tuple]:
    """{"expert": the best snapshot, level: the snapshot whose normalised score is nearest that fraction of
    the best one's}. Snapshots are (step, eval return, ...); raw returns where the task has no references."""
    level_of = (lambda ret: sims.normalized_score(env, ret)) if sims.spec(env).ref_min_score is not None else float
    best = max(snapshots, key=lambda s: s[1])
    chosen = {"expert": best}
    for level, fraction in LEVEL_FRACTIONS.items():
        chosen[level] = min(snapshots, key=lambda s: abs(level_of(s[1]) - fraction * level_of(best[1])))
    return chosen


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg = OmegaConf.merge(OmegaConf.create(DEFAULTS), OmegaConf.from_cli(argv if argv is not None else sys.argv[1:]))
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    spec = sims.spec(cfg.env)
    env, eval_env = sims.make(cfg.env, seed=cfg.seed), sims.make(cfg.env, seed=cfg.seed + 10_000)
    agent = SAC(spec.obs_dim, spec.act_dim, SACConfig(bf16=cfg.bf16), seed=cfg.seed)
    buffer = ReplayBuffer(spec.obs_dim, spec.act_dim, capacity=cfg.steps, seed=cfg.seed)
    out = Path(cfg.out or Path(sims.__file__).parent / "experts" / cfg.env)
    work = out / "_snapshots"
    work.mkdir(parents=True, exist_ok=True)

    snapshots: list[tuple[int, float, Path]] = []
    obs, _ = env.reset(seed=cfg.seed)
    state = obs[STATE_KEY]
    started = time.time()
    bar = trange(cfg.steps, desc=f"SAC expert {cfg.env}")
    for step in bar:
        if step < cfg.random_steps:
            action = rng.uniform(-1, 1, spec.act_dim).astype(np.float32)
        else:
            action = agent.act(state, deterministic=False)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        next_state = next_obs[STATE_KEY]
        buffer.add(state, action, reward, next_state, terminated, truncated)
        state = next_state
        if terminated or truncated:
            state = env.reset()[0][STATE_KEY]
        if step >= cfg.random_steps:
            agent.update(buffer.sample(cfg.batch_size))
        if (step + 1) % cfg.eval_every == 0:
            score = evaluate(eval_env, agent.actor, cfg.eval_episodes, seed=cfg.seed + 10_000)
            path = work / f"step_{step + 1}"
            agent.actor.save(path)
            snapshots.append((step + 1, score, path))
            bar.set_postfix(eval_return=f"{score:.0f}")
            print(f"step {step + 1}: eval return {score:.1f}", flush=True)

    chosen = pick_levels(snapshots, cfg.env)
    command = "python -m embodied.train_expert " + " ".join(f"{k}={v}" for k, v in cfg.items() if k != "out")
    for level, (step, score, path) in chosen.items():
        target = out / level
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(path, target)
        meta = dict(env=cfg.env, level=level, train_step=step, eval_return=score, eval_episodes=cfg.eval_episodes,
                    normalized_score=sims.normalized_score(cfg.env, score), command=command,
                    wall_clock_s=round(time.time() - started))
        (target / "meta.json").write_text(json.dumps(meta, indent=2))
        print(f"{level}: step {step}, eval return {score:.1f}")
    (out / "curve.json").write_text(json.dumps([dict(step=s, eval_return=r) for s, r, _ in snapshots]))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
