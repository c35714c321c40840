"""Per-run online curve figures of an o2o sweep that the summary table does not give: the area under the
online curve, the first online eval at a target score, the late mean, and the fall-backs after the target. RESULTS.md's
o2o tables quote them.

    python benchmarks/o2o_curve_stats.py benchmarks/results/raw/inverted-pendulum

For each `<method>_s<seed>` run under the folder: area = the mean of the online evals at steps 0, every,
2*every, ..., the last online step; first = the first online step whose eval reaches --target; late = the mean
of the evals on that grid from half the online steps on (or from --late-from); falls = the evals on the grid after
the first at --target that score below --fall-below. Then one line per method: the mean [95% bootstrap CI] over
its runs of the final and late scores, its falls, and (where the runs log it) the critic's calibration gap, Q minus
the Monte-Carlo return on each eval's own episodes, at those falls and at the other evals after the target.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from embodied.plots import eval_points  # noqa: E402
from embodied.stats import bootstrap_ci  # noqa: E402


def curve_stats(metrics: list[dict], every: int, target: float, fall_below: float | None = None,
                late_from: int | None = None) -> dict:
    online = [line for line in eval_points(metrics, "eval/score") if line.get("phase") == "online"]
    scores = {line["step"]: line["eval/score"] for line in online}
    gaps = {line["step"]: line["switch/calibration_gap"] for line in online if "switch/calibration_gap" in line}
    if not scores:
        raise SystemExit("a run has no online evals: pass an o2o sweep's raw folder")
    last = max(scores)
    grid = list(range(0, last + 1, every))
    missing = [step for step in grid if step not in scores]
    if missing:
        raise SystemExit(f"no online eval at steps {missing[:5]}: pass --every to match eval.every_online")
    late = [scores[step] for step in grid if step >= (last / 2 if late_from is None else late_from)]
    if not late:
        raise SystemExit(f"--late-from {late_from}: past the last online eval ({last})")
    first = next((step for step in sorted(scores) if scores[step] >= target), None)
    after = [step for step in grid if first is not None and step > first]
    fall_below = target - 10 if fall_below is None else fall_below
    falls = [step for step in after if scores[step] < fall_below]
    return {"area": sum(scores[step] for step in grid) / len(grid), "first_at_target": first,
            "late_mean": sum(late) / len(late), "final": scores[last],
            "falls": len(falls), "evals_after_target": len(after),
            "gap_at_falls": [gaps[step] for step in falls if step in gaps],
            "gap_held": [gaps[step] for step in after if step in gaps and step not in falls]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="a task folder of o2o_compare.py's raw runs")
    parser.add_argument("--every", type=int, default=500, help="the eval grid (eval.every_online)")
    parser.add_argument("--target", type=float, default=100.0)
    parser.add_argument("--fall-below", type=float, help="a fall-back scores below this (default: target - 10)")
    parser.add_argument("--late-from", type=int, help="the late mean's first online step (default: half the run)")
    args = parser.parse_args(argv)
    runs = sorted(path.parent for path in args.sweep.glob("*_s*/metrics.jsonl"))
    if not runs:
        parser.error(f"{args.sweep}: no <method>_s<seed>/metrics.jsonl under it; pass o2o_compare's raw task folder")
    by_method: dict[str, list[dict]] = {}
    for run in runs:
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        stats = curve_stats(metrics, args.every, args.target, args.fall_below, args.late_from)
        by_method.setdefault(run.name.rsplit("_s", 1)[0], []).append(stats)
        print(f"{run.name}: area {stats['area']:.1f}, first at {args.target:g}: {stats['first_at_target']}, "
              f"late mean {stats['late_mean']:.1f}, final {stats['final']:.1f}, "
              f"falls {stats['falls']} of {stats['evals_after_target']}")
    for method, rows in by_method.items():
        summary = []
        for key in ("final", "late_mean"):
            mean, low, high = bootstrap_ci([row[key] for row in rows])
            summary.append(f"{key.replace('_', ' ')} {mean:.1f} [{low:.1f}, {high:.1f}]")
        falls, evals = sum(row["falls"] for row in rows), sum(row["evals_after_target"] for row in rows)
        gaps = []
        for key, name in (("gap_at_falls", "at the falls"), ("gap_held", "at the other evals after it")):
            values = [gap for row in rows for gap in row[key]]
            if values:
                gaps.append(f"{name} {sum(values) / len(values):+.1f} (n {len(values)})")
        print(f"{method} ({len(rows)} runs): {', '.join(summary)}; falls {falls} of {evals} evals after the first at "
              f"{args.target:g}, in {sum(row['falls'] > 0 for row in rows)} of {len(rows)} runs"
              + (f"; calibration gap {', '.join(gaps)}" if gaps else ""))


if __name__ == "__main__":
    main()
