"""World-model RL, issue 17's table: DiWA (imagination only) against DPPO with real steps, and throughput.

    # (b) the two sweeps, same BC pretraining (150 steps, 3 seeds), same PPO settings and budget
    python -m embodied.train -m hydra/launcher=ray_local algo=diwa env=cube-single dataset=task \\
        dataset.size=50000 seed=0,1,2 threads=1 budget.offline_steps=150 budget.online_steps=200000 \\
        algo.online_agent.rollout_steps=50 algo.world_model.dataset=play algo.world_model.starts=policy \\
        algo.world_model.horizon=50 \\
        eval.episodes=50 eval.every_offline=150 eval.every_online=50000 eval.video_episodes=0 \\
        checkpoint.every=0 hydra.sweep.dir=DIWA_DIR
    python -m embodied.train -m ... algo=dppo ... (the same overrides, no world_model ones) hydra.sweep.dir=DPPO_DIR
    # the table
    python benchmarks/world_model.py --diwa DIWA_DIR --dppo DPPO_DIR

For each method: real success before (end of BC) and after fine-tuning, mean and 95% bootstrap CI over
seeds; the real and imagined env steps the fine-tuning used; PPO iterations (the same for both: the
gradient compute is matched by construction); and, for DiWA, the success the imagined rollouts reported
at the start and at the end, against the real one, which is how model exploitation shows. (c) comes from
the latest `results/world_model_throughput-*.json`.

(a) Sample efficiency: TD-MPC2 against SAC (`algo=scratch`) and WSRL at one online env-step budget. Give the
run folders (any nesting; o2o_compare's scratch and wsrl runs of a task count), one task at a time:

    python -m embodied.train experiment=o2o_hopper algo=tdmpc2 seed=0 hydra.run.dir=runs/tdmpc2_hopper_s0 ...
    python benchmarks/world_model.py --efficiency runs/tdmpc2_hopper_s* benchmarks/results/raw/o2o/hopper

Per method: the online eval score (success rate on sparse tasks) at each shared eval step (mean and 95%
bootstrap CI over seeds), the final score, the offline steps each run had before its online ones (WSRL's
pretraining; the others none) and the wall clock of each run from its status.json (pretraining included).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from embodied.stats import bootstrap_ci  # noqa: E402
from embodied.summary import find_runs  # noqa: E402
from embodied.plots import eval_points  # noqa: E402


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _imagined_success(lines: list[dict], fraction: float = 0.1) -> tuple[float, float] | None:
    """Mean success of the first and last `fraction` of the training episodes."""
    episodes = [x["online/success"] for x in lines if "online/success" in x]
    if not episodes:
        return None
    k = max(1, int(len(episodes) * fraction))
    return sum(episodes[:k]) / k, sum(episodes[-k:]) / k


def method_row(sweep: Path) -> dict:
    runs, skipped = find_runs(sweep)
    if not runs:
        raise SystemExit(f"error: no finished runs under {sweep}" + (f" ({skipped})" if skipped else ""))
    before = [r.summary["offline_success"] for r in runs]
    after = [r.summary["online_success"] for r in runs]
    iterations, training = [], []
    for run in runs:
        lines = _metrics(run.path)
        iterations.append(sum(1 for x in lines if "train/pg_loss" in x))
        training.append(_imagined_success(lines))
    return {
        "method": runs[0].summary.get("preset"), "sweep": str(sweep), "seeds": sorted(r.summary["seed"] for r in runs),
        "success_before": bootstrap_ci(before), "success_after": bootstrap_ci(after),
        "per_seed": [[b, a] for b, a in zip(before, after)],
        "real_env_steps_online": [r.summary.get("online_real_env_steps", r.summary["online_steps"]) for r in runs],
        "imagined_steps_online": [r.summary.get("online_imagined_steps", 0) for r in runs],
        "ppo_iterations": iterations, "training_episode_success_first_last": training,
        "eval_episodes": runs[0].summary.get("episodes"),
    }


def _fmt(ci, digits: int = 2) -> str:
    mean, low, high = ci
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def markdown(rows: list[dict], throughput: list[dict]) -> str:
    out = ["| method | success before -> after (95% CI) | per seed | real env steps online | imagined steps | "
           "PPO iterations | training-episode success first -> last 10% |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        seeds = ", ".join(f"{b:.2f}->{a:.2f}" for b, a in r["per_seed"])
        train = ", ".join("-" if t is None else f"{t[0]:.2f}->{t[1]:.2f}" for t in r["training_episode_success_first_last"])
        out.append(f"| {r['method']} | {_fmt(r['success_before'])} -> {_fmt(r['success_after'])} | {seeds} | "
                   f"{max(r['real_env_steps_online']):,} | {max(r['imagined_steps_online']):,} | "
                   f"{min(r['ppo_iterations'])}-{max(r['ppo_iterations'])} | {train} |")
    for row in throughput or []:
        out.append("")
        out.append(f"Throughput against {row['env']} (`{row['file']}`): " + "; ".join(
            f"{k}: {v}" for k, v in row.items() if k not in ("file", "env")))
    return "\n".join(out)


def latest_throughput() -> list[dict]:
    """Imagined transitions/s over real steps/s per model, from the latest throughput benchmark of each sim
    (files written before `--env` existed measured pointmaze-umaze)."""
    latest: dict[str, tuple[str, Path, dict]] = {}
    for path in (HERE / "results").glob("world_model_throughput-*.json"):
        stamp = "-".join(path.stem.split("-")[-2:])   # <date>-<time>
        data = json.loads(path.read_text())
        env = data.get("env", "pointmaze-umaze")
        if env not in latest or stamp > latest[env][0]:
            latest[env] = (stamp, path, data)
    out = []
    for env, (_, path, data) in sorted(latest.items()):
        ratios = {name: f"{m['ratio']:.1f}x ({m['transitions_per_s']:,.0f} vs {data['real_steps_per_s']:,.0f} real steps/s)"
                  for name, m in data.get("imagined", {}).items()}
        out.append({"file": f"results/{path.name}", "env": env, **ratios, "goal": f"{data.get('goal_ratio', 20):.0f}x"})
    return out


def _online_evals(run_dir: Path, key: str = "eval/score") -> dict[int, float]:
    return {x["step"]: x[key] for x in eval_points(_metrics(run_dir), key) if x.get("phase") == "online"}


def _wall_clock_min(run_dir: Path) -> float | None:
    try:
        status = json.loads((run_dir / "status.json").read_text())
        return (status["updated_at"] - status["started_at"]) / 60
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return None


def efficiency_rows(folders: list[Path]) -> dict:
    """Score against online env steps per method, over the runs found under `folders` (one task)."""
    runs = [run for folder in folders for run in find_runs(folder)[0]]
    if not runs:
        raise SystemExit(f"error: no finished runs under {', '.join(map(str, folders))}")
    envs = sorted({r.summary["env"] for r in runs})
    if len(envs) > 1:
        raise SystemExit(f"error: --efficiency compares one task at a time; these runs are on {envs}")
    by_method: dict[str, list] = {}
    for run in runs:
        by_method.setdefault(run.summary.get("preset") or run.summary["algo"], []).append(run)
    budgets = {m: {r.summary["online_steps"] for r in rs} for m, rs in by_method.items()}
    if len({b for bs in budgets.values() for b in bs}) > 1:
        raise SystemExit(f"error: the runs have different online budgets {budgets}; compare at one budget")
    # sparse tasks (cube-single, PointMaze) are read by success rate: their return only counts steps to success
    sparse = all(r.summary.get("online_success") is not None for r in runs)
    key, final_key = ("eval/success", "online_success") if sparse else ("eval/score", "final_score")
    curves = {m: [_online_evals(r.path, key) for r in rs] for m, rs in by_method.items()}
    shared = sorted(set.intersection(*[set(c) for cs in curves.values() for c in cs]))
    rows = []
    for method, rs in sorted(by_method.items()):
        rows.append({
            "method": method, "seeds": sorted(r.summary["seed"] for r in rs),
            "online_steps": rs[0].summary["online_steps"],
            "offline_steps": sorted({r.summary.get("offline_steps", 0) for r in rs}),
            "final": bootstrap_ci([r.summary[final_key] for r in rs]),
            "curve": {step: bootstrap_ci([c[step] for c in curves[method]]) for step in shared},
            "wall_clock_min": [_wall_clock_min(r.path) for r in rs],
        })
    score_kind = "success" if sparse else runs[0].summary.get("score_kind")
    return {"env": envs[0], "score_kind": score_kind, "eval_steps": shared, "rows": rows}


def efficiency_markdown(table: dict, points: int = 5) -> str:
    steps = table["eval_steps"]
    shown = sorted({steps[round(i * (len(steps) - 1) / max(1, points - 1))] for i in range(points)}) if steps else []
    out = [f"{table['env']} ({table['score_kind']}), online env steps on every run: {table['rows'][0]['online_steps']:,}", "",
           "| method | seeds | offline steps first | " + " | ".join(f"score at {s:,}" for s in shown)
           + " | final | wall clock per run (min) |", "|---" * (5 + len(shown)) + "|"]
    digits = 2 if table["score_kind"] == "success" else 1
    for r in table["rows"]:
        clocks = ", ".join("?" if w is None else f"{w:.0f}" for w in r["wall_clock_min"])
        cells = " | ".join(_fmt(r["curve"][s], digits) for s in shown)
        out.append(f"| {r['method']} | {len(r['seeds'])} | {'/'.join(f'{o:,}' for o in r['offline_steps'])} | "
                   f"{cells} | {_fmt(r['final'], digits)} | {clocks} |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--diwa", help="the algo=diwa sweep directory")
    ap.add_argument("--dppo", help="the algo=dppo sweep directory with the same overrides (real steps)")
    ap.add_argument("--efficiency", nargs="+", type=Path, metavar="DIR",
                    help="run folders of one task: TD-MPC2, SAC (scratch) and WSRL at one online budget")
    ap.add_argument("--out", default=None, help="json to write (default results/world_model.json, or "
                                                "results/world_model_efficiency-<env>.json)")
    args = ap.parse_args(argv)
    if args.out and args.diwa and args.efficiency:
        ap.error("--out names one json: give it with --diwa or with --efficiency, not both")
    if args.efficiency:
        table = efficiency_rows(args.efficiency)
        out = Path(args.out or HERE / "results" / f"world_model_efficiency-{table['env']}.json")
        out.write_text(json.dumps(table, indent=2))
        print(efficiency_markdown(table))
    if args.diwa:
        rows = [method_row(Path(args.diwa))] + ([method_row(Path(args.dppo))] if args.dppo else [])
        throughput = latest_throughput()
        Path(args.out or HERE / "results" / "world_model.json").write_text(
            json.dumps({"rows": rows, "throughput": throughput}, indent=2))
        print(markdown(rows, throughput))
    if not (args.diwa or args.efficiency):
        ap.error("give --diwa DIR (and --dppo DIR) for the DiWA table, or --efficiency DIR ... for (a)")


if __name__ == "__main__":
    main()
