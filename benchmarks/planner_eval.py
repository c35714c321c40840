"""Evaluate language planners on the multi-step task suite (planners/tasks.py) on the real sims.

    python benchmarks/planner_eval.py --planners rule,smollm2-generate,smollm2-saycan,smollm2-constrained
    python benchmarks/planner_eval.py --planners smollm2-goal+ret --set heldout   # issue 19
    python benchmarks/planner_eval.py --planners rule --skills learned --skills-dir runs/skills

Planners: rule, smollm2-<mode> for mode generate / saycan / constrained / goal, each LLM mode also with
"+ret" (the k=3 nearest bank examples of planners/examples.py in the prompt). --set suite runs the
23-task suite (planners/tasks.py), --set heldout the held-out set (planners/heldout.py, never used for
tuning); result files of the held-out set end in "-heldout". The adversarial set runs with both unless
--no-adversarial. --skills learned swaps the scripted oracles for the checkpoints that
`python -m planners.train_skills` wrote (result files end in "-learned"; with --skill-noise fixed, the
policies' one fixed noise draw instead of fresh noise per chunk, "-learned-fixednoise"); the summary then has the
per-skill success rate and whether failed tasks failed in planning or in a skill. The summary records the CPU (avx512_bf16 or not), precision and the load average.

Every planner runs the same tasks, seeds and skill oracles in one process; SmolLM2 is loaded once and
shared. Writes benchmarks/results/planner_eval/<planner>.json (per-task rows + summary), the JSONL
trace of every plan and sub-goal, planner_eval.json (all summaries) and a markdown table; prints it.
Use --wandb offline to mirror per-task metrics into a local wandb run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from embodied.errors import UserError, exit_on_user_error  # noqa: E402
from embodied.logging import write_json_atomic  # noqa: E402
from machine import cpu_info, uptime  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "planner_eval"


@exit_on_user_error
def main(argv=None) -> None:
    from planners.evaluate import ALL_PLANNERS, PLANNERS, run_suite, skill_table, table
    from planners.heldout import HELDOUT
    from planners.tasks import ADVERSARIAL, TASKS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--planners", default=",".join(PLANNERS))
    ap.add_argument("--tasks", default="all", help="'all' or comma-separated task ids")
    ap.add_argument("--set", default="suite", choices=("suite", "heldout"))
    ap.add_argument("--no-adversarial", action="store_true")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-replans", type=int, default=3)
    ap.add_argument("--skills", default="oracle", choices=("oracle", "learned"))
    ap.add_argument("--skills-dir", default=None, help="with --skills learned: planners.train_skills' --out")
    ap.add_argument("--skill-noise", default="sampled", choices=("sampled", "fixed"),
                    help="learned skills: fresh noise per chunk, as Diffusion Policy samples (default), or the "
                         "policy's one fixed noise draw (deterministic acting)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wandb", default="disabled", choices=("disabled", "offline", "online"))
    ap.add_argument("--table-only", action="store_true", help="rebuild the table from saved results")
    args = ap.parse_args(argv)
    if args.table_only:
        return _write_table(Path(args.out))
    import torch

    torch.set_num_threads(args.threads)
    specs = [p.strip() for p in args.planners.split(",") if p.strip()]
    for spec in specs:
        if spec not in ALL_PLANNERS:
            raise UserError(f"--planners: unknown {spec!r}; choose from {', '.join(ALL_PLANNERS)}")
    pool = TASKS if args.set == "suite" else HELDOUT
    if args.skills == "learned" and not args.skills_dir:
        raise UserError("--skills learned needs --skills-dir (the --out of `python -m planners.train_skills`)")
    suffix = ("" if args.set == "suite" else "-heldout") + ("-learned" if args.skills == "learned" else "")
    if args.skills == "learned" and args.skill_noise == "fixed":
        suffix += "-fixednoise"
    tasks = pool if args.tasks == "all" else tuple(t for t in pool if t.id in args.tasks.split(","))
    if not tasks:
        raise UserError(f"--tasks {args.tasks!r} matches no task; ids: {', '.join(t.id for t in pool)}")
    adversarial = () if args.no_adversarial else ADVERSARIAL
    machine = _machine(args.threads)
    print(f"CPU avx512_bf16: {machine['avx512_bf16']}; precision: {machine['precision']}; load: {machine['uptime']}",
          flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    backend = None
    results = []
    for spec in specs:
        if spec.startswith("smollm2") and backend is None:
            from planners.backends.local import LocalBackend

            t0 = time.perf_counter()
            backend = LocalBackend()
            print(f"SmolLM2 loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        run = None
        if args.wandb != "disabled":
            import wandb

            run = wandb.init(project="embodied-planners", name=f"planner_eval-{spec}", mode=args.wandb,
                             dir=str(out), config={"planner": spec, "seed": args.seed, "tasks": len(tasks)})
        trace = out / f"trace_{spec}{suffix}.jsonl"
        trace.unlink(missing_ok=True)
        t0 = time.perf_counter()
        res = run_suite(spec, tasks, adversarial, out, seed=args.seed, max_replans=args.max_replans,
                        backend=backend if spec.startswith("smollm2") else None, wandb_run=run,
                        log=lambda m: print(m, flush=True), name=f"{spec}{suffix}", skills=args.skills,
                        skills_dir=args.skills_dir, sample_skills=args.skill_noise == "sampled")
        res["wall_s"] = time.perf_counter() - t0
        res["machine"] = {**machine, "uptime_after": uptime() or "unknown"}
        res["set"] = args.set
        if args.skills == "learned":
            res["skill_noise"] = args.skill_noise
        if run is not None:
            run.summary.update({k: v for k, v in res["summary"].items() if isinstance(v, (int, float))})
            run.finish()
        write_json_atomic(out / f"{spec}{suffix}.json", res)
        (out / f"{spec}{suffix}.partial.json").unlink(missing_ok=True)
        results.append(res)
        print(table([res]), flush=True)
        print(skill_table([res]), flush=True)
    _write_table(out)


def _machine(threads: int) -> dict:
    cpu = cpu_info()
    return {"threads": threads, "cpus": cpu["cores"], "avx512_bf16": cpu["avx512_bf16"],
            "precision": "fp32 (SmolLM2 dequantised from Q4_1 GGUF; MiniLM and learned skill policies fp32)", "uptime": uptime() or "unknown"}


def _write_table(out: Path) -> None:
    """Merge every planner's saved result (this run and earlier ones) into one JSON and one table."""
    from planners.evaluate import ALL_PLANNERS, skill_table, table

    merged = {}
    for spec in ALL_PLANNERS:
        for suffix in ("", "-heldout", "-learned", "-heldout-learned", "-learned-fixednoise"):
            path = out / f"{spec}{suffix}.json"
            if path.exists():
                res = json.loads(path.read_text())
                res["planner"] = f"{spec}{suffix}"
                merged[f"{spec}{suffix}"] = res
    write_json_atomic(out / "planner_eval.json", {k: {"summary": v["summary"], "wall_s": v.get("wall_s"),
                                                      "machine": v.get("machine")}
                                                  for k, v in merged.items()})
    text = table(list(merged.values())) + "\n\nPer skill (sub-goals finished / run):\n\n" + skill_table(list(merged.values()))
    (out / "planner_eval.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
