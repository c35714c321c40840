"""How the online training episodes of finished runs changed: success and return over the first and the
last fraction of episodes, per run (from `online/success` and `online/episode_return` in metrics.jsonl).

For on-policy fine-tuning (DPPO) these are the episodes of the policy being trained, with its
exploration noise, which the noise-free evaluation does not see.

    python benchmarks/training_episodes.py benchmarks/results/dppo_cube-single
    python benchmarks/training_episodes.py RUN_OR_SWEEP_DIR ... --fraction 0.1
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def episodes(metrics: Path) -> tuple[np.ndarray, np.ndarray]:
    success, returns = [], []
    with metrics.open() as lines:
        for line in lines:
            row = json.loads(line)
            if "online/episode_return" in row:
                returns.append(row["online/episode_return"])
                success.append(row.get("online/success", np.nan))
    return np.asarray(success, float), np.asarray(returns, float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run directories or sweeps containing them")
    parser.add_argument("--fraction", type=float, default=0.1, help="share of episodes at each end")
    args = parser.parse_args()
    if not 0 < args.fraction <= 0.5:
        sys.exit(f"error: --fraction={args.fraction} must be in (0, 0.5]")
    runs = sorted({m for d in args.dirs for m in ([d / "metrics.jsonl"] if (d / "metrics.jsonl").is_file()
                                                  else d.rglob("metrics.jsonl"))})
    if not runs:
        sys.exit(f"error: no metrics.jsonl under {', '.join(map(str, args.dirs))}; pass run or sweep directories")
    pct = f"{args.fraction:.0%}"
    print(f"| run | training episodes | success first {pct} -> last {pct} | return first {pct} -> last {pct} |")
    print("|---|---|---|---|")
    for metrics in runs:
        success, returns = episodes(metrics)
        name = f"{metrics.parent.parent.name}/{metrics.parent.name}"
        k = int(len(returns) * args.fraction)
        if k == 0:
            print(f"| {name} | {len(returns)} | too few episodes | |")
            continue
        print(f"| {name} | {len(returns)} | {np.nanmean(success[:k]):.3f} -> {np.nanmean(success[-k:]):.3f} "
              f"| {returns[:k].mean():.1f} -> {returns[-k:].mean():.1f} |")


if __name__ == "__main__":
    main()
