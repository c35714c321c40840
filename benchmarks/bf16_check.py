"""Does bf16 autocast learn like fp32? SAC from scratch on hopper, 3 seeds per precision.

Same seeds, environment, replay and hyper-parameters for both precisions; only `SACConfig.bf16`
differs. Prints each run's final deterministic return and the mean return of its last training
episodes, then each precision's mean and the paired difference. A few thousand steps only show
early learning (Hopper returns of a few hundred), enough to catch a precision that breaks SAC.

    python benchmarks/bf16_check.py                 # 5,000 steps x 3 seeds x 2 precisions, ~5-10 min
    python benchmarks/bf16_check.py --steps 1500    # quicker
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see update_speed.py: shared 2-core machines

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embodied.agents.sac import SAC, SACConfig  # noqa: E402
from embodied.data.replay import ReplayBuffer  # noqa: E402


def make_env(seed: int):
    """sims hopper (dict observations) if available, else gymnasium Hopper-v5 with a flat state."""
    try:
        import sims
        return sims.make("hopper", seed=seed), lambda obs: obs["observation.state"]
    except ImportError:
        import gymnasium
        return gymnasium.make("Hopper-v5"), lambda obs: np.asarray(obs, np.float32)


def evaluate(agent: SAC, seed: int, episodes: int) -> float:
    env, state_of = make_env(seed + 1000)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + 1000 + episode)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.act(state_of(obs), deterministic=True))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def run(seed: int, bf16: bool, steps: int, random_steps: int, batch_size: int, eval_episodes: int) -> dict:
    torch.manual_seed(seed)
    np.random.seed(seed)
    env, state_of = make_env(seed)
    space = env.observation_space
    obs_dim = (space["observation.state"] if hasattr(space, "spaces") else space).shape[0]
    act_dim = env.action_space.shape[0]
    env.action_space.seed(seed)
    agent = SAC(obs_dim, act_dim, SACConfig(bf16=bf16), seed=seed)
    replay = ReplayBuffer(obs_dim, act_dim, capacity=steps, seed=seed)
    obs, _ = env.reset(seed=seed)
    state, episode_return, episode_returns = state_of(obs), 0.0, []
    start = time.perf_counter()
    for step in range(steps):
        action = env.action_space.sample() if step < random_steps else agent.act(state, deterministic=False)
        obs, reward, terminated, truncated, _ = env.step(action)
        next_state = state_of(obs)
        replay.add(state, action, reward, next_state, terminated, truncated)
        episode_return += float(reward)
        state = next_state
        if terminated or truncated:
            episode_returns.append(episode_return)
            obs, _ = env.reset()
            state, episode_return = state_of(obs), 0.0
        if step >= random_steps:
            agent.update(replay.sample(batch_size))
    seconds = time.perf_counter() - start
    last = episode_returns[-10:] or [episode_return]
    return dict(seed=seed, precision="bf16" if bf16 else "fp32", eval_return=evaluate(agent, seed, eval_episodes),
                train_return_last10=float(np.mean(last)), episodes=len(episode_returns), seconds=round(seconds, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5000, help="environment steps per run (1 update per step)")
    parser.add_argument("--random-steps", type=int, default=1000, help="uniform random actions before learning")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--eval-episodes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.random_steps = min(args.random_steps, args.steps // 2)

    results = []
    for seed in range(args.seeds):
        for bf16 in (False, True):  # interleaved, so machine noise hits both precisions alike
            result = run(seed, bf16, args.steps, args.random_steps, args.batch_size, args.eval_episodes)
            results.append(result)
            print(f"seed {seed} {result['precision']}: eval return {result['eval_return']:8.1f}   "
                  f"last-10 train return {result['train_return_last10']:8.1f}   ({result['episodes']} episodes, "
                  f"{result['seconds']:.0f} s)", flush=True)

    summary = {}
    for precision in ("fp32", "bf16"):
        evals = [r["eval_return"] for r in results if r["precision"] == precision]
        summary[precision] = dict(mean=statistics.mean(evals), std=statistics.pstdev(evals))
        print(f"{precision}: eval return {summary[precision]['mean']:.1f} +- {summary[precision]['std']:.1f} "
              f"over {len(evals)} seeds")
    diffs = [b["eval_return"] - a["eval_return"] for a, b in zip(results[::2], results[1::2])]
    summary["paired_bf16_minus_fp32"] = statistics.mean(diffs)
    print(f"paired difference bf16 - fp32: {summary['paired_bf16_minus_fp32']:+.1f} (per seed: "
          f"{', '.join(f'{d:+.0f}' for d in diffs)})")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bf16_check-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(dict(args=vars(args), runs=results, summary=summary), indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
