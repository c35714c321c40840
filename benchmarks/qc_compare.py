"""Offline->online with action chunks: Q-chunking (h=5) vs one-step FQL vs Q-chunking from scratch,
same seeds, dataset and budgets (DESIGN.md §5 table via `embodied.summary`).

One Hydra multirun sweep per method (`python -m embodied.train -m experiment=qc_manip algo=<m>
seed=0,1,2`), up to --parallel sweeps at once, then `embodied.summary` over all of them.

    python benchmarks/qc_compare.py --env cube-double                 # ~30-40 min on 2 busy cores
    python benchmarks/qc_compare.py --env cube-single --algos qc_fql,fql,qc_scratch,qc
    python benchmarks/qc_compare.py --quick                           # plumbing only (smoke budgets)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="cube-double")
    parser.add_argument("--algos", default="qc_fql,fql,qc_scratch")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=3, help="sweeps running at once")
    parser.add_argument("--split-seeds", action="store_true",
                        help="one job per (method, seed) instead of one sweep per method (more jobs at once)")
    parser.add_argument("--experiment", default="qc_manip")
    parser.add_argument("--out", type=Path, default=None, help="sweep root (default benchmarks/results/raw/qc_<env>_<time>, ignored by git)")
    parser.add_argument("--quick", action="store_true", help="smoke budgets: checks the plumbing, not the methods")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every job")
    args = parser.parse_args()
    algos = [a for a in args.algos.split(",") if a]
    root = args.out or REPO / "benchmarks" / "results" / "raw" / f"qc_{args.env}_{datetime.now():%Y%m%d-%H%M%S}"
    root.mkdir(parents=True, exist_ok=True)
    # quick: the smoke budgets with the qc_manip data and networks (oracle task data, flow policy)
    experiment = (["experiment=smoke", "dataset=task", "policy=flow"] if args.quick
                  else [f"experiment={args.experiment}"])
    if not args.quick:  # one dataset generation before the sweeps would race to make it
        subprocess.run([sys.executable, "-c", "import sys; from hydra import compose, initialize_config_dir\n"
                        "from embodied.train import CONF_DIR, load_dataset\n"
                        "with initialize_config_dir(config_dir=str(CONF_DIR), version_base='1.3'):\n"
                        "    cfg = compose(config_name='train', overrides=sys.argv[1:])\n"
                        "print(len(load_dataset(cfg)), 'transitions')",
                        *experiment, f"env={args.env}", *args.overrides], cwd=REPO, check=True)
    seeds = [str(s) for s in range(args.seeds)]
    jobs = [(f"{a}_s{s}", a, [s]) for a in algos for s in seeds] if args.split_seeds else [(a, a, seeds) for a in algos]
    started, pending, running, failed = time.time(), list(jobs), {}, []
    while pending or running:
        while pending and len(running) < args.parallel:
            algo, method, job_seeds = pending.pop(0)
            command = [sys.executable, "-m", "embodied.train", "-m", *experiment, f"env={args.env}", f"algo={method}",
                       f"seed={','.join(job_seeds)}", f"hydra.sweep.dir={root / algo}", *args.overrides]
            log = open(root / f"{algo}.log", "w")
            print(f"[{algo}] {' '.join(command[2:])}", flush=True)
            running[algo] = (subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), log)
        time.sleep(5)
        for algo, (process, log) in list(running.items()):
            if process.poll() is not None:
                log.close()
                del running[algo]
                if process.returncode != 0:
                    failed.append(algo)
                print(f"[{algo}] finished (exit {process.returncode}) after {(time.time() - started) / 60:.1f} min",
                      flush=True)
    elapsed = time.time() - started
    result = subprocess.run([sys.executable, "-m", "embodied.summary", str(root)], cwd=REPO, capture_output=True,
                            text=True)
    text = "\n".join([f"# Q-chunking vs FQL vs scratch on {args.env} ({'quick' if args.quick else 'full'})", "",
                      f"methods {', '.join(algos)}; {args.seeds} seeds; {args.parallel} sweeps at once; "
                      f"wall clock {elapsed / 60:.1f} min" + (f"; FAILED: {', '.join(failed)}" if failed else "")
                      + (f"; overrides: {' '.join(args.overrides)}" if args.overrides else ""), "",
                      result.stdout.strip() or result.stderr.strip(), ""])
    (root / "REPORT.md").write_text(text)
    (root / "args.json").write_text(json.dumps(vars(args), default=str, indent=2))
    print(text)
    if failed:
        raise SystemExit(f"sweeps failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
