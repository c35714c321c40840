"""Offline-to-online presets side by side: wsrl, naive, calql, rlpd and scratch, same seeds, same dataset,
same budgets, on Hopper (medium-replay), sparse PointMaze-medium, OGBench cube-single, and the main job
(InvertedPendulum medium-replay, `experiment=default`).

Pretrain once, fine-tune many: per task and seed, the wsrl job pretrains and saves its agent
(`checkpoints/pretrained/`); naive, and calql where its pretraining is the same (Cal-QL tasks), start online
from it with `pretrained=<that run>`, so the methods differ only after the switch. Jobs run as
`python -m embodied.train` processes, `--jobs` at a time with one thread each, and write raw runs under
`--out` (default `benchmarks/results/raw/`, ignored by git); `embodied.summary` turns each task into the
DESIGN.md §5 table and curves, which this script copies next to the summary it commits.

    python benchmarks/o2o_compare.py                              # every task, 3 seeds (hours on 2 cores)
    python benchmarks/o2o_compare.py --tasks pointmaze --seeds 3  # one task
    python benchmarks/o2o_compare.py --quick                      # seconds-long check of the plumbing

A sweep too long for one sitting runs in pieces into one `--out` with `--resume`: a job whose run folder
there finished with the same composed config is not rerun, and a naive or calql job whose wsrl pretraining
finished in an earlier piece starts from it, so `--presets naive,calql --resume` adds methods to seeds
whose wsrl runs are done.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASKS = {"hopper": "o2o_hopper", "pointmaze": "o2o_pointmaze", "cube-single": "o2o_cube_single",
         "inverted-pendulum": "default"}  # the main job's preset, so its single run gets seeds and peers
PRESETS = ["wsrl", "naive", "calql", "rlpd", "scratch"]
SHARES_PRETRAINING = {"naive": "wsrl", "calql": "wsrl"}  # reuses wsrl's pretraining when the offline agent matches
QUICK = ["experiment=smoke"]


def job_overrides(task: str, preset: str, seed: int, quick: bool, extra: list[str]) -> list[str]:
    experiment = QUICK + [f"env={'hopper' if task == 'hopper' else 'pointmaze-umaze'}"] if quick else [
        f"experiment={TASKS[task]}"]
    if quick and task == "hopper":
        experiment.append("dataset=random")
    return [*experiment, f"algo={preset}", f"seed={seed}", "threads=1", "progress=false", *extra]


def offline_algo(overrides: list[str]) -> str | None:
    """The offline agent a job would pretrain, from its composed config (to know who can share)."""
    from embodied.train import compose_train

    return compose_train(overrides).algo.offline_algo


def finished_run(overrides: list[str], run_dir: Path) -> bool:
    """Did a job with exactly this composed config already finish in `run_dir`?"""
    import yaml
    from omegaconf import OmegaConf

    from embodied.train import compose_train, run_finished

    saved = run_dir / "config.yaml"
    if not (run_finished(run_dir) and saved.exists()):
        return False
    return OmegaConf.to_container(compose_train(overrides), resolve=True) == yaml.safe_load(saved.read_text())


def run_job(overrides: list[str], run_dir: Path, reuse: bool = False) -> tuple[Path, int, float]:
    """`reuse`: `finished_run` said yes (asked from the main thread: Hydra's compose is not thread-safe)."""
    if reuse:
        print(f"  {run_dir.name}: finished earlier with this config, reused", flush=True)
        return run_dir, 0, 0.0
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with open(run_dir / "train.log", "w") as log:
        code = subprocess.call([sys.executable, "-m", "embodied.train", *overrides, f"hydra.run.dir={run_dir}"],
                               cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return run_dir, code, time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma list of: " + ", ".join(TASKS))
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="run seeds first..first+seeds-1 (sweeps in pieces)")
    parser.add_argument("--jobs", type=int, default=2, help="train processes at a time (one thread each)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "raw" / "o2o")
    parser.add_argument("--summary", type=Path, default=REPO / "benchmarks" / "results" / "o2o",
                        help="where each task's summary (md, csv, curves) is copied")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks the plumbing, not the methods")
    parser.add_argument("--resume", action="store_true",
                        help="reuse runs in --out that finished with the same config (sweeps in pieces)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every job")
    args = parser.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    presets = [p for p in args.presets.split(",") if p]
    unknown = [t for t in tasks if t not in TASKS] + [p for p in presets if p not in PRESETS]
    if unknown or args.seeds < 1 or args.jobs < 1:
        parser.error(f"unknown task/preset {unknown}; tasks: {', '.join(TASKS)}; presets: {', '.join(PRESETS)}"
                     if unknown else "--seeds and --jobs must be >= 1")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    started, failed = time.time(), []
    with ThreadPoolExecutor(args.jobs) as pool:
        def submit(overrides: list[str], run_dir: Path):
            return pool.submit(run_job, overrides, run_dir, args.resume and finished_run(overrides, run_dir))

        for task in tasks:
            # owners first (they pretrain), then the jobs that start from an owner's pretraining
            owners = {(p, s): submit(job_overrides(task, p, s, args.quick, args.overrides), args.out / task / f"{p}_s{s}")
                      for s in seeds for p in presets if p not in SHARES_PRETRAINING}
            followers = []
            for s in seeds:
                for p in presets:
                    if p not in SHARES_PRETRAINING:
                        continue
                    overrides = job_overrides(task, p, s, args.quick, args.overrides)
                    owner = SHARES_PRETRAINING[p]
                    owner_overrides = job_overrides(task, owner, s, args.quick, args.overrides)
                    owner_dir = args.out / task / f"{owner}_s{s}"
                    earlier = (owner not in presets and args.resume and finished_run(owner_overrides, owner_dir)
                               and (owner_dir / "checkpoints" / "pretrained").is_dir())
                    shares = (owner in presets or earlier) and offline_algo(overrides) == offline_algo(owner_overrides)
                    if shares:
                        run_dir, code, _ = owners[(owner, s)].result() if owner in presets else (owner_dir, 0, 0.0)
                        if code == 0:
                            overrides = overrides + [f"pretrained={run_dir}"]
                    followers.append(submit(overrides, args.out / task / f"{p}_s{s}"))
            for future in [*owners.values(), *followers]:
                run_dir, code, seconds = future.result()
                print(f"[{task}] {run_dir.name}: {'ok' if code == 0 else f'FAILED (rc {code})'} in {seconds / 60:.1f} min",
                      flush=True)
                if code != 0:
                    failed.append(str(run_dir))
    elapsed = time.time() - started
    for task in tasks:
        summary_dir = args.summary / task
        result = subprocess.run([sys.executable, "-m", "embodied.summary", str(args.out / task), "--out",
                                 str(summary_dir)], cwd=REPO, capture_output=True, text=True)
        print(f"\n## {task}\n\n{result.stdout.strip() or result.stderr.strip()}")
        summary_dir.mkdir(parents=True, exist_ok=True)
        record = {**vars(args), "seeds": list(seeds), "wall_clock_min": round(elapsed / 60, 1), "failed": failed,
                  "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        (summary_dir / "args.json").write_text(json.dumps(record, default=str, indent=2))
        # a sweep built in pieces into one --out: the summary covers every run there, args.json only this piece
        with open(summary_dir / "invocations.jsonl", "a") as log:
            log.write(json.dumps(record, default=str) + "\n")
        for name in ("summary.json",):
            for path in (args.out / task).glob(f"*/{name}"):
                shutil.copy(path, summary_dir / f"{path.parent.name}.json")
    print(f"\nwall clock {elapsed / 60:.1f} min; {len(failed)} failed job(s)")
    if failed:
        raise SystemExit(f"failed jobs: {', '.join(failed)}")


if __name__ == "__main__":
    main()
