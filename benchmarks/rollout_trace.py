"""How does a saved policy fail? Roll it out over seeded episodes and trace chosen state dimensions.

An eval score says that episodes end early, not why. This prints, per episode, the length, whether the env
terminated it, the return, and for each traced dimension of `observation.state` its value at the start, its
range, its value at the step given by --at, and at the end. On InvertedPendulum, dimension 0 is the cart position
(the rail ends at +-1) and 1 the pole angle (the episode ends past +-0.2 rad): a cart that drifts into the rail
end and a pole that tips over read differently. With --dataset instead of a policy, it reads a D4RL-layout HDF5
file and shows the same dimensions in the next states of its terminal transitions: how the data's episodes end.

    python benchmarks/rollout_trace.py RUN_DIR/policy --env inverted-pendulum --dims 0,1 --episodes 5
    python benchmarks/rollout_trace.py RUN_DIR/policy --env inverted-pendulum --stochastic
    python benchmarks/rollout_trace.py --dataset FILE.hdf5 --dims 0,1 --beyond 0.9

Rollouts act with the policy's mean unless --stochastic; --json writes every episode's trace summary.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import policies  # noqa: E402
import sims  # noqa: E402
from embodied.data.d4rl import load_hdf5  # noqa: E402
from embodied.errors import UserError, exit_on_user_error  # noqa: E402


def trace_episode(env, policy, seed: int, deterministic: bool) -> dict:
    obs, _ = env.reset(seed=seed)
    states, actions, total, terminated, truncated = [obs["observation.state"]], [], 0.0, False, False
    while not (terminated or truncated):
        action = np.asarray(policy.act(obs, deterministic=deterministic)).reshape(-1)
        obs, reward, terminated, truncated, _ = env.step(action)
        states.append(obs["observation.state"])
        actions.append(action)
        total += float(reward)
    return {"seed": seed, "steps": len(actions), "terminated": bool(terminated), "return": total,
            "states": np.stack(states), "actions": np.stack(actions)}


def parse_dims(text: str, state_dim: int) -> list[int]:
    try:
        dims = [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        raise UserError(f"--dims {text!r}: pass comma-separated integers, e.g. 0,1") from None
    bad = [d for d in dims if not 0 <= d < state_dim]
    if not dims or bad:
        raise UserError(f"--dims {text!r}: the state has {state_dim} dimensions; pass indices in 0..{state_dim - 1}")
    return dims


def dataset_endings(path: Path, dims_text: str, beyond: float | None) -> dict:
    """Per traced dimension, its range in the next states of the file's terminal transitions, and how many of
    them lie at |value| >= `beyond`."""
    data = load_hdf5(path)
    dims = parse_dims(dims_text, data.obs_dim)
    ends = data.next_observations[data.terminals]
    record = {"dataset": str(path), "transitions": len(data), "terminals": len(ends), "beyond": beyond, "dims": {}}
    parts = []
    for d in dims:
        values = ends[:, d]
        entry = {"min": float(values.min()), "max": float(values.max())} if len(ends) else {}
        if beyond is not None:
            entry["at_or_beyond"] = int((np.abs(values) >= beyond).sum())
        record["dims"][str(d)] = entry
        if entry:
            parts.append(f"dim {d}: [{entry['min']:+.3f}, {entry['max']:+.3f}]"
                         + (f", |value| >= {beyond:g} in {entry['at_or_beyond']}" if beyond is not None else ""))
    print(f"{path}: {len(ends)} terminal transitions of {len(data)}" + (f"; {'; '.join(parts)}" if parts else ""))
    return record


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy_dir", nargs="?", help="a directory written by Policy.save() (a run's policy/)")
    parser.add_argument("--env", help="the env to roll the policy out in")
    parser.add_argument("--dataset", type=Path, help="instead of a policy: how this HDF5 file's episodes end")
    parser.add_argument("--beyond", type=float, help="--dataset: count terminal states with |value| >= this")
    parser.add_argument("--dims", default="0,1", help="state dimensions to trace")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--at", type=int, default=100,
                        help="also print each traced dimension at this step (the last one if the episode is shorter)")
    parser.add_argument("--stochastic", action="store_true", help="sample actions instead of the mean")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.dataset is not None:
        if args.policy_dir is not None:
            parser.error("pass a policy directory or --dataset, not both")
        record = dataset_endings(args.dataset, args.dims, args.beyond)
        if args.json:
            args.json.write_text(json.dumps(record, indent=1))
        return
    if args.policy_dir is None or args.env is None:
        parser.error("pass a policy directory and --env (or --dataset FILE)")
    if args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: pass at least 1")
    policy, env = policies.load(args.policy_dir), sims.make(args.env)
    state_dim = env.observation_space["observation.state"].shape[0]
    dims = parse_dims(args.dims, state_dim)
    torch.manual_seed(args.first_seed)  # --stochastic: the same samples on a rerun
    records = []
    for episode in range(args.episodes):
        trace = trace_episode(env, policy, args.first_seed + episode, not args.stochastic)
        states = trace["states"]
        at = min(args.at, len(states) - 1)
        per_dim = {str(d): {"start": float(states[0, d]), "min": float(states[:, d].min()),
                            "max": float(states[:, d].max()), "at": float(states[at, d]),
                            "end": float(states[-1, d])} for d in dims}
        mean_action = trace["actions"].mean(axis=0)
        records.append({"seed": trace["seed"], "steps": trace["steps"], "terminated": trace["terminated"],
                        "return": trace["return"], "mean_action": mean_action.tolist(), "at_step": at, "dims": per_dim})
        dims_text = "; ".join(f"dim {d}: {v['start']:+.3f} -> [{v['min']:+.3f}, {v['max']:+.3f}], "
                              f"{v['at']:+.3f} at step {at}, {v['end']:+.3f} at the end"
                              for d, v in per_dim.items())
        print(f"episode {episode} (seed {trace['seed']}): {trace['steps']} steps, "
              f"{'terminated' if trace['terminated'] else 'not terminated'}, return {trace['return']:.1f}, "
              f"mean action {np.array2string(mean_action, precision=3)} | {dims_text}", flush=True)
    mode = "sampled" if args.stochastic else "mean"
    print(f"{args.env}, {mode} actions: {sum(r['terminated'] for r in records)} of {len(records)} episodes "
          f"terminated; mean length {np.mean([r['steps'] for r in records]):.0f}")
    if args.json:
        args.json.write_text(json.dumps({"policy": str(args.policy_dir), "env": args.env, "actions": mode,
                                         "episodes": records}, indent=1))


if __name__ == "__main__":
    main()
