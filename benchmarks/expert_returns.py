"""Returns of a committed expert snapshot over seeded episodes: the check behind the README's datasets table,
whose returns come from each training run's own 5-episode evals.

    python benchmarks/expert_returns.py --env ant --episodes 10 --first-seed 1000

Prints one line per episode and the mean, median and range; rollouts are deterministic (the policy's mean).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sims  # noqa: E402
from embodied.errors import exit_on_user_error  # noqa: E402
from sims.experts import LEVELS, expert  # noqa: E402


def rollout(env, act, seed: int) -> tuple[float, int]:
    state, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        state, reward, terminated, truncated, _ = env.step(act(state))
        total, steps, done = total + float(reward), steps + 1, terminated or truncated
    return total, steps


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="ant")
    parser.add_argument("--level", default="expert", choices=LEVELS)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: pass at least 1")
    torch.set_num_threads(args.threads)
    act, env = expert(args.env, args.level), sims.make(args.env)
    returns = []
    for episode in range(args.episodes):
        total, steps = rollout(env, act, args.first_seed + episode)
        returns.append(total)
        print(f"episode {episode} (seed {args.first_seed + episode}): return {total:.1f} in {steps} steps", flush=True)
    print(f"{args.env} {args.level}: mean {statistics.fmean(returns):.1f}, median {statistics.median(returns):.1f}, "
          f"range {min(returns):.1f} to {max(returns):.1f} over {len(returns)} episodes")


if __name__ == "__main__":
    main()
