"""Success per task of a saved VLA policy on the issue's evaluation sets, one set at a time:
(i) `none`, the training distribution; (ii) `paraphrase`, held-out instructions; (iii) `positions`,
unseen start positions; (iv) `camera`, `lighting`, `distractor` perturbations (sims/manip_variations.py).
Every set uses the same start seeds as the runner's own eval (seed 0: 10,000 + 100 * task), so the
sets are paired. Rendering dominates, so each finished set is written to the JSON at once: a killed
run keeps what it finished, and `--sets` evaluates the rest later into the same file.

    python benchmarks/vla_eval_sets.py --policy RUN/policy --env cube-single --episodes 20 \
        --sets none paraphrase positions distractor lighting camera --out benchmarks/results/vla_eval_sets.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import cpu_info, uptime  # noqa: E402

import policies  # noqa: E402
import sims  # noqa: E402
from embodied.agents.runner import eval_seed  # noqa: E402
from embodied.agents.vla_bc import evaluate_tasks  # noqa: E402
from embodied.constants import TASK_SEED_STRIDE  # noqa: E402
from embodied.stats import wilson  # noqa: E402
from sims.manip_variations import VARIATIONS  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", required=True, help="a saved VLA policy directory (RUN/policy)")
    parser.add_argument("--env", default="cube-single", help="the suite's task name (cube-single, cube-double, scene, mt10)")
    parser.add_argument("--tasks", type=int, nargs="+", help="default: every task of the suite")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--sets", nargs="+", default=list(VARIATIONS), choices=VARIATIONS)
    parser.add_argument("--seed", type=int, default=0, help="the training run's seed: its eval start states")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--flow-steps", type=int, default=None,
                        help="Euler steps of a flow head (default: the policy's own); vla_ppo fine-tunes and "
                             "deploys at its denoising_steps (4), so its 'before' is this policy at 4")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.tasks = args.tasks or list(range(1, (sims.spec(args.env).num_tasks or 1) + 1))
    torch.set_num_threads(args.threads)
    policy = policies.load(args.policy)
    if not hasattr(policy, "cameras"):
        raise SystemExit(f"--policy {args.policy}: not a VLA policy (no cameras); train one with algo=vla_bc")
    if args.flow_steps is not None:
        if policy.head != "flow" or args.flow_steps < 1:
            raise SystemExit(f"--flow-steps {args.flow_steps}: needs a flow-head policy (this one: {policy.head}) "
                             "and at least 1 step")
        policy.flow_steps = args.flow_steps
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    previous = result.get("flow_steps")
    if previous is not None and previous != getattr(policy, "flow_steps", None):
        raise SystemExit(f"--out {args.out} holds sets evaluated at {previous} flow steps: pass --flow-steps "
                         f"{previous}, or write a new --out")
    result.update(policy=str(args.policy), env=args.env, head=policy.head, tasks=args.tasks, episodes=args.episodes,
                  cpu=cpu_info(), threads=args.threads, flow_steps=getattr(policy, "flow_steps", None))
    result.setdefault("sets", {})
    result.setdefault("commands", []).append(" ".join(["python benchmarks/vla_eval_sets.py", *(argv or sys.argv[1:])]))
    result.pop("command", None)
    first_seed = lambda task: eval_seed(args.seed) + TASK_SEED_STRIDE * task      # VLARunner._task_seed

    def chunk_fn(seed: int):
        generator = torch.Generator().manual_seed(seed)
        return lambda obs: policy.act(obs, deterministic=True, generator=generator)

    for variation in args.sets:
        start, load = time.time(), uptime()
        per_episode = {}
        metrics = evaluate_tasks(args.env, args.tasks, chunk_fn, policy, args.episodes, first_seed, variation, "e",
                                 episode_success=per_episode)
        per_task = {str(t): metrics[f"e/task{t}/success"] for t in args.tasks}
        wins = round(sum(per_task.values()) * args.episodes)
        result["sets"][variation] = {
            "task_success": per_task, "mean_success": round(metrics["e/success"], 3),
            "ci95": wilson(wins, args.episodes * len(args.tasks)), "wall_s": round(time.time() - start, 1),
            "load_before": load,
            # 0/1 per start state, in order: vla_finetune --slices pairs each seed's slice with these
            "episode_success": {str(t): v for t, v in per_episode.items()}}
        print(f"{variation:>11}: mean {metrics['e/success']:.2f} {result['sets'][variation]['ci95']}  per task "
              f"{per_task}  ({time.time() - start:.0f} s)", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
