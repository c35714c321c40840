"""Which of WSRL's online knobs matter? One pretraining, then WSRL's online phase from that same pretrained
agent with one faithful knob removed at a time (`pretrained=<run>`, so every variant starts from identical
weights and differs only after the switch).

    python benchmarks/switch_ablation.py                       # o2o_pointmaze budgets, seed 0
    python benchmarks/switch_ablation.py --experiment o2o_hopper --seeds 2
    python benchmarks/switch_ablation.py --quick               # seconds-long plumbing check

Raw runs go to benchmarks/results/raw/ablation/ (ignored by git); the table (md + csv) to --summary.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from o2o_compare import REPO, run_job  # noqa: E402

# name -> overrides that remove one faithful knob (the wsrl preset is the reference)
VARIANTS = {
    "wsrl (faithful)": [],
    "temperature reset to 0.05": ["algo.switch_temperature=reset"],
    "temperature: fast lr first 1k": ["algo.switch_temperature=fast"],
    "actor on mean of critics": ["algo.online_agent.actor_q=mean"],
    "full UTD (actor every critic step)": ["algo.critic_only_utd=false"],
    "entropy in the backup": ["algo.online_agent.backup_entropy=true"],
    "warmup 200 instead of the preset's": ["budget.warmup_steps=200"],
}


def late_window(run_dir: Path) -> dict:
    """Mean and worst online eval score over the second half of the online steps: one final eval can be a
    single dip (the faithful recipe's seed 0 ended at 8 after 100 on its four evals before)."""
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"kind": "eval"' in line]
    online = [(e["step"], e["eval/score"]) for e in evals if e.get("phase") == "online" and "eval/score" in e]
    if not online:
        return {}
    half = max(step for step, _ in online) / 2
    late = [score for step, score in online if step >= half]
    return {"late_mean": sum(late) / len(late), "late_worst": min(late), "late_evals": len(late)}


def summary_lines(rows: list[dict], experiment: str, seeds: int, minutes: float) -> list[str]:
    lines = [f"# WSRL ablation ({experiment}, {seeds} seed(s), {minutes:.0f} min)", "",
             "Means over seeds; 'late' = the online evals in the second half of the online steps (per seed in the json).", "",
             "| variant | seeds | end of offline | final | late mean | late worst | best | dip from first gradient step |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda values: "n/a" if not values else f"{sum(values) / len(values):.1f}"
    for name in VARIANTS:
        mine = [r for r in rows if r["variant"] == name and r["rc"] == 0]
        pick = lambda key: [r[key] for r in mine if r.get(key) is not None]
        lines.append(f"| {name} | {len(mine)} | {fmt(pick('offline_score'))} | {fmt(pick('final_score'))} | "
                     f"{fmt(pick('late_mean'))} | {fmt(pick('late_worst'))} | "
                     f"{fmt(pick('best_score'))} | {fmt(pick('dip_after_learning_starts'))} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="o2o_pointmaze")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "raw" / "ablation")
    parser.add_argument("--summary", type=Path, default=REPO / "benchmarks" / "results" / "ablation")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every job")
    args = parser.parse_args()
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
    base = (["experiment=smoke", "env=pointmaze-umaze", "dataset=medium-replay"] if args.quick
            else [f"experiment={args.experiment}"]) + ["algo=wsrl", "threads=1", "progress=false", *args.overrides]
    out = args.out / (args.experiment if not args.quick else "quick")
    started, rows = time.time(), []
    with ThreadPoolExecutor(args.jobs) as pool:
        pretrainings = {s: pool.submit(run_job, base + [f"seed={s}", "budget.online_steps=0", "eval.video_episodes=0"],
                                       out / f"pretrain_s{s}") for s in range(args.seeds)}
        jobs = []
        for s in range(args.seeds):
            run_dir, code, _ = pretrainings[s].result()
            if code != 0:
                raise SystemExit(f"pretraining failed: see {run_dir}/train.log")
            for name, extra in VARIANTS.items():
                slug = "".join(c if c.isalnum() else "_" for c in name).strip("_")
                jobs.append((name, s, pool.submit(run_job, base + [f"seed={s}", f"pretrained={run_dir}", *extra],
                                                  out / f"{slug}_s{s}")))
        for name, s, future in jobs:
            run_dir, code, seconds = future.result()
            summary = json.loads((run_dir / "summary.json").read_text()) if code == 0 else {}
            rows.append(dict(variant=name, seed=s, rc=code, minutes=round(seconds / 60, 1),
                             **{k: summary.get(k) for k in ("offline_score", "final_score", "best_score",
                                                             "dip_after_learning_starts", "online_success")},
                             **(late_window(run_dir) if code == 0 else {})))
            print(rows[-1], flush=True)
    args.summary.mkdir(parents=True, exist_ok=True)
    lines = summary_lines(rows, args.experiment, args.seeds, (time.time() - started) / 60)
    text = "\n".join(lines)
    tag = "quick" if args.quick else args.experiment
    (args.summary / f"{tag}.md").write_text(text + "\n")
    (args.summary / f"{tag}.json").write_text(json.dumps(rows, indent=2))
    print(text)


if __name__ == "__main__":
    main()
