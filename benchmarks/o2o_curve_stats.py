"""Per-run online curve figures of an o2o sweep that the summary table does not give: the area under the
online curve, the first online eval at a target score, and the late mean. RESULTS.md's o2o tables quote them.

    python benchmarks/o2o_curve_stats.py benchmarks/results/raw/inverted-pendulum

For each `<method>_s<seed>` run under the folder: area = the mean of the online evals at steps 0, every,
2*every, ..., the last online step; first = the first online step whose eval reaches --target; late = the mean
of the evals on that grid from half the online steps on.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from embodied.plots import eval_points  # noqa: E402


def curve_stats(metrics: list[dict], every: int, target: float) -> dict:
    scores = {line["step"]: line["eval/score"] for line in eval_points(metrics, "eval/score")
              if line.get("phase") == "online"}
    if not scores:
        raise SystemExit("a run has no online evals: pass an o2o sweep's raw folder")
    last = max(scores)
    grid = list(range(0, last + 1, every))
    missing = [step for step in grid if step not in scores]
    if missing:
        raise SystemExit(f"no online eval at steps {missing[:5]}: pass --every to match eval.every_online")
    late = [scores[step] for step in grid if step >= last / 2]
    return {"area": sum(scores[step] for step in grid) / len(grid),
            "first_at_target": next((step for step in sorted(scores) if scores[step] >= target), None),
            "late_mean": sum(late) / len(late), "final": scores[last]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="a task folder of o2o_compare.py's raw runs")
    parser.add_argument("--every", type=int, default=500, help="the eval grid (eval.every_online)")
    parser.add_argument("--target", type=float, default=100.0)
    args = parser.parse_args(argv)
    runs = sorted(path.parent for path in args.sweep.glob("*_s*/metrics.jsonl"))
    if not runs:
        parser.error(f"{args.sweep}: no <method>_s<seed>/metrics.jsonl under it; pass o2o_compare's raw task folder")
    for run in runs:
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        stats = curve_stats(metrics, args.every, args.target)
        print(f"{run.name}: area {stats['area']:.1f}, first at {args.target:g}: {stats['first_at_target']}, "
              f"late mean {stats['late_mean']:.1f}, final {stats['final']:.1f}")


if __name__ == "__main__":
    main()
