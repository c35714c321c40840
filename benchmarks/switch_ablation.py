"""Which of WSRL's online knobs matter? One pretraining, then WSRL's online phase from that same pretrained
agent with one faithful knob removed at a time (`pretrained=<run>`, so every variant starts from identical
weights and differs only after the switch).

    python benchmarks/switch_ablation.py                       # o2o_pointmaze budgets, seed 0
    python benchmarks/switch_ablation.py --experiment o2o_hopper --seeds 2
    python benchmarks/switch_ablation.py --quick               # seconds-long plumbing check
    python benchmarks/switch_ablation.py --experiment o2o_hopper --seeds 3 \
        --variants "wsrl (faithful),warmup 5,000 (the paper's count)"  # some variants; merged into the summary
    python benchmarks/switch_ablation.py --experiment o2o_hopper --seeds 3 --pretrained-from <o2o raw>/hopper

The experiments run the paper's recipe scaled in counts (2 critics, a shorter warmup); two variants put a
count back to the paper's: 10 critics, which changes the pretraining too and so gets its own (same seed and
budget), and the 5,000-step warmup, which needs an online phase longer than that (o2o_hopper, o2o_pointmaze).

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

from embodied.plots import eval_points  # noqa: E402
from embodied.train import compose_train  # noqa: E402

# name -> overrides that remove one faithful knob (the wsrl preset is the reference)
VARIANTS = {
    "wsrl (faithful)": [],
    "temperature reset to 0.05": ["algo.switch_temperature=reset"],
    "temperature: fast lr first 1k": ["algo.switch_temperature=fast"],
    "actor on mean of critics": ["algo.online_agent.actor_q=mean"],
    "full UTD (actor every critic step)": ["algo.critic_only_utd=false"],
    "entropy in the backup": ["algo.online_agent.backup_entropy=true"],
    "warmup 200 instead of the preset's": ["budget.warmup_steps=200"],
    "warmup 5,000 (the paper's count)": ["budget.warmup_steps=5000"],
    "Adam steps only for the updated networks": ["algo.online_agent.zero_grad_adam_steps=false"],
    "temperature entropy at s, not s'": ["algo.online_agent.temperature_entropy_obs=observations"],
    "temperature as exp(p), not softplus (own pretraining)": ["algo.offline_agent.multiplier_param=exp"],
    "PyTorch's default init (own pretraining)": ["algo.offline_agent.init=torch"],
    "all four optimiser details off (stop 40's recipe; own pretraining)": [
        "algo.offline_agent.init=torch", "algo.offline_agent.multiplier_param=exp",
        "algo.offline_agent.temperature_entropy_obs=observations", "algo.offline_agent.zero_grad_adam_steps=false"],
    "10 critics (the paper's count; own pretraining)": ["algo.num_critics=10"],
    "10 critics and warmup 5,000 (the paper's counts; own pretraining)": ["algo.num_critics=10",
                                                                          "budget.warmup_steps=5000"],
}
# variants whose knob changes the offline agent too: each gets its own pretraining (same seed and budget)
OWN_PRETRAINING = {name for name, extra in VARIANTS.items()
                   if any(o.startswith(("algo.num_critics=", "algo.offline_agent.")) for o in extra)}


def late_window(run_dir: Path) -> dict:
    """Mean and worst online eval score over the second half of the online steps: one final eval can be a
    single dip (the faithful recipe's seed 0 ended at 8 after 100 on its four evals before)."""
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    online = [(e["step"], e["eval/score"]) for e in eval_points(metrics, "eval/score") if e.get("phase") == "online"]
    if not online:
        return {}
    half = max(step for step, _ in online) / 2
    late = [score for step, score in online if step >= half]
    return {"late_mean": sum(late) / len(late), "late_worst": min(late), "late_evals": len(late)}


def summary_lines(rows: list[dict], experiment: str, seeds: int, minutes: float) -> list[str]:
    lines = [f"# WSRL ablation ({experiment}; the last command ran {seeds} seed(s) in {minutes:.0f} min: rows kept "
             "from earlier commands count their own seeds)", "",
             "Means over seeds; 'late' = the online evals in the second half of the online steps (per seed in the json).", "",
             "| variant | seeds | end of offline | final | late mean | late worst | best | dip from first gradient step |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda values: "n/a" if not values else f"{sum(values) / len(values):.1f}"
    for name in VARIANTS:
        mine = [r for r in rows if r["variant"] == name and r["rc"] == 0]
        if not any(r["variant"] == name for r in rows):
            continue  # not run (a warmup longer than this experiment's online phase, or not chosen)
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
    parser.add_argument("--variants", default=None,
                        help="comma list of variant names (default: every one the experiment's online phase "
                             "fits); rows of the others already in the summary json are kept")
    parser.add_argument("--pretrained-from", type=Path, default=None, metavar="DIR",
                        help="o2o_compare's raw runs of this task (DIR/wsrl_s<seed>): their saved pretraining is "
                             "the shared one, instead of pretraining again with the same seed and budget")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every job")
    args = parser.parse_args()
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
    if args.pretrained_from is not None:
        missing = [s for s in range(args.seeds)
                   if not (args.pretrained_from / f"wsrl_s{s}" / "checkpoints" / "pretrained").is_dir()]
        if missing:
            parser.error(f"--pretrained-from {args.pretrained_from}: no wsrl_s<seed>/checkpoints/pretrained for "
                         f"seeds {missing}; run o2o_compare.py with --presets wsrl for them, or drop the option")
    # split on the commas that start a known name: names hold commas ("warmup 5,000")
    named = args.variants if args.variants is not None else ",".join(VARIANTS)
    chosen = [name for name in VARIANTS if f",{name}," in f",{named},"]
    rest = f",{named},"
    for name in chosen:
        rest = rest.replace(f",{name},", ",", 1)
    if rest.strip(","):
        parser.error(f"--variants: unknown {rest.strip(',')!r}; known: {'; '.join(VARIANTS)}")
    # the reference is WSRL's recipe: the main job's temperature reset (a departure, conf/experiment/default.yaml)
    # is put back to WSRL's `keep`, so "temperature reset to 0.05" stays a variant there too
    base = (["experiment=smoke", "env=pointmaze-umaze", "dataset=medium-replay"] if args.quick
            else [f"experiment={args.experiment}"]) + ["algo=wsrl", "env.recipe.switch_temperature=keep",
                                                        "threads=1", "progress=false", *args.overrides]
    online_steps = compose_train(base).budget.online_steps
    too_long = [name for name in chosen for o in VARIANTS[name]
                if o.startswith("budget.warmup_steps=") and int(o.split("=")[1]) >= online_steps]
    if too_long and args.variants is None:
        print(f"skipped (the warmup would fill the {online_steps} online steps): {'; '.join(too_long)}")
        chosen = [name for name in chosen if name not in too_long]
    elif too_long:
        parser.error(f"--variants: {too_long} warm up for the whole online phase ({online_steps} steps) of "
                     f"{args.experiment}; use an experiment with more online steps (o2o_hopper, o2o_pointmaze)")
    out = args.out / (args.experiment if not args.quick else "quick")
    started, rows = time.time(), []
    slug = lambda name: "".join(c if c.isalnum() else "_" for c in name).strip("_")
    with ThreadPoolExecutor(args.jobs) as pool:
        def pretrain(s: int, extra: list[str], name: str):
            return pool.submit(run_job, base + [f"seed={s}", *extra, "budget.online_steps=0", "eval.video_episodes=0"],
                               out / name)

        shared = any(name not in OWN_PRETRAINING for name in chosen)
        if shared and args.pretrained_from is not None:  # already there: a finished job's result, run_job's shape
            pretrainings = {(None, s): pool.submit(lambda d: (d, 0, 0.0), args.pretrained_from / f"wsrl_s{s}")
                            for s in range(args.seeds)}
        else:
            pretrainings = {(None, s): pretrain(s, [], f"pretrain_s{s}") for s in range(args.seeds) if shared}
        pretrainings.update({(name, s): pretrain(s, VARIANTS[name], f"pretrain_{slug(name)}_s{s}")
                             for s in range(args.seeds) for name in chosen if name in OWN_PRETRAINING})
        jobs = []
        for s in range(args.seeds):
            for name in chosen:
                run_dir, code, _ = pretrainings[(name if name in OWN_PRETRAINING else None, s)].result()
                if code != 0:
                    raise SystemExit(f"pretraining failed: see {run_dir}/train.log")
                jobs.append((name, s, pool.submit(run_job, base + [f"seed={s}", f"pretrained={run_dir}",
                                                                   *VARIANTS[name]], out / f"{slug(name)}_s{s}")))
        for name, s, future in jobs:
            run_dir, code, seconds = future.result()
            summary = json.loads((run_dir / "summary.json").read_text()) if code == 0 else {}
            rows.append(dict(variant=name, seed=s, rc=code, minutes=round(seconds / 60, 1),
                             **{k: summary.get(k) for k in ("offline_score", "final_score", "best_score",
                                                             "dip_after_learning_starts", "online_success")},
                             **(late_window(run_dir) if code == 0 else {})))
            print(rows[-1], flush=True)
    args.summary.mkdir(parents=True, exist_ok=True)
    tag = "quick" if args.quick else args.experiment
    previous = args.summary / f"{tag}.json"
    if previous.is_file() and args.variants is not None:  # a partial rerun: keep the other variants' rows
        rows = [r for r in json.loads(previous.read_text()) if r["variant"] not in chosen] + rows
    lines = summary_lines(rows, args.experiment, args.seeds, (time.time() - started) / 60)
    text = "\n".join(lines)
    (args.summary / f"{tag}.md").write_text(text + "\n")
    (args.summary / f"{tag}.json").write_text(json.dumps(rows, indent=2))
    print(text)


if __name__ == "__main__":
    main()
