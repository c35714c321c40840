"""Offline-to-online presets side by side: wsrl, naive, rlpd, calql and scratch, same seeds, same
dataset, same budgets, on Hopper (medium-replay-like data) and sparse PointMaze.

Underneath it is one Hydra multirun sweep per task (`python -m embodied.train -m ...` with the
`o2o_<task>` experiment preset); the sweeps of different tasks run concurrently, one per core.
Then `embodied.summary` turns each sweep into the DESIGN.md §5 table.

    python benchmarks/o2o_compare.py                       # the full comparison (about an hour on 2 cores)
    python benchmarks/o2o_compare.py --quick               # seconds-long check of the plumbing
    python benchmarks/o2o_compare.py --launcher ray        # the same sweeps through the Ray launcher
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASKS = {"hopper": "o2o_hopper", "pointmaze": "o2o_pointmaze"}
PRESETS = ["wsrl", "naive", "rlpd", "calql", "scratch"]
QUICK = ["experiment=smoke"]


def sweep_command(task: str, presets: list[str], seeds: int, sweep_dir: Path, quick: bool, launcher: str,
                  extra: list[str]) -> list[str]:
    env = "hopper" if task == "hopper" else "pointmaze-umaze"
    experiment = [f"experiment={TASKS[task]}"] if not quick else QUICK + ["dataset=random" if task == "hopper" else "dataset=medium-replay"]
    command = [sys.executable, "-m", "embodied.train", "-m", *experiment, f"env={env}", f"algo={','.join(presets)}",
               f"seed={','.join(str(s) for s in range(seeds))}", f"hydra.sweep.dir={sweep_dir}", *extra]
    if launcher == "ray":
        command += ["hydra/launcher=ray_local"]
    return command


def pregenerate(task: str, quick: bool) -> None:
    """Make the task's dataset once, before the sweep's jobs would race to make it."""
    from hydra import compose, initialize_config_dir

    from embodied.train import CONF_DIR, load_dataset

    overrides = [f"experiment={TASKS[task]}"] if not quick else QUICK + (
        ["env=hopper", "dataset=random"] if task == "hopper" else [])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    dataset = load_dataset(cfg)
    returns = dataset.episode_returns()
    print(f"[{task}] dataset {cfg.env.name}/{cfg.dataset.quality}: {len(dataset)} transitions, "
          f"{dataset.num_episodes} episodes, return mean {returns.mean():.1f} (min {returns.min():.1f}, "
          f"max {returns.max():.1f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="hopper,pointmaze", help="comma list of: " + ", ".join(TASKS))
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="sweep root (default benchmarks/results/o2o_<time>)")
    parser.add_argument("--launcher", choices=["basic", "ray"], default="basic")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks the plumbing, not the methods")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every job")
    args = parser.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or args.seeds < 1:
        parser.error(f"unknown task(s) {unknown}; valid: {', '.join(TASKS)}" if unknown else "--seeds must be >= 1")
    presets = args.presets.split(",")
    root = args.out or REPO / "benchmarks" / "results" / f"o2o_{datetime.now():%Y%m%d-%H%M%S}"
    root.mkdir(parents=True, exist_ok=True)

    for task in tasks:
        pregenerate(task, args.quick)
    started = time.time()
    processes = {}
    for task in tasks:
        command = sweep_command(task, presets, args.seeds, root / task, args.quick, args.launcher, args.overrides)
        log = open(root / f"{task}.log", "w")
        print(f"[{task}] {' '.join(command[1:])}\n[{task}] log: {log.name}", flush=True)
        processes[task] = (subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), log)
        if args.launcher == "ray":  # one Ray instance at a time on this machine
            processes[task][0].wait()
    failed = []
    for task, (process, log) in processes.items():
        if process.wait() != 0:
            failed.append(task)
        log.close()
    elapsed = time.time() - started

    report = [f"# Offline-to-online comparison ({'quick' if args.quick else 'full'})", "",
              f"presets {', '.join(presets)}; {args.seeds} seeds; launcher {args.launcher}; "
              f"wall clock {elapsed / 60:.1f} min", ""]
    for task in tasks:
        if task in failed:
            report += [f"## {task}: sweep FAILED, see {root / (task + '.log')}", ""]
            continue
        result = subprocess.run([sys.executable, "-m", "embodied.summary", str(root / task)], cwd=REPO,
                                capture_output=True, text=True)
        report += [f"## {task}", "", result.stdout.strip() or result.stderr.strip(), ""]
    text = "\n".join(report)
    (root / "REPORT.md").write_text(text)
    print(text)
    (root / "args.json").write_text(json.dumps(vars(args), default=str, indent=2))
    if failed:
        raise SystemExit(f"sweeps failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
