"""VLA fine-tuning gain and forgetting: `algo=vla_qc` (route (a)) or `algo=vla_ppo` (route (b)) from one saved
pretraining, per fine-tuned task and seed, `--jobs` at a time. Per job: the fine-tuned task's success before
and after, the other tasks' success before and after (forgetting), and the divergence from the pretrained
policy over the last online records: for vla_qc the action distance to the VLA's samples (and their spread),
for vla_ppo the chain KL and the action distance to the pretrained policy. "Before" is the end of
pretraining for vla_qc and the online step-0 eval for vla_ppo (the pretrained VLA at its fine-tuned step count).
Success CIs are Wilson intervals over the pooled episodes of all seeds after fine-tuning; the pretraining
is shared and evaluated once (fixed start states and noise), so "before" counts its episodes once. The
seeds vary the critic's init, the exploration noise and the online episodes. `--slices --before EVAL_JSON`
gives seed k its own E start states (k E .. (k + 1) E - 1, E = eval.episodes) and takes "before" from a
`benchmarks/vla_eval_sets.py` eval of the same policy on all n E of them: both sides then cover the same n E
start states, where without it every seed repeats the pretraining eval's first E. For vla_ppo, whose
step-0 eval is the pretrained VLA at its fine-tuned sampler, `--slices` alone is enough: each seed's own step-0
eval on its slice is its "before" (same states and noise as its "after"). Each finished
job leaves `<out>/task<T>_s<S>.json`; a later call with the same `--out` and command reuses it, so seeds can be
added (`--seed-list`) or an interrupted sweep finished without rerunning what is done. Calls that share an
`--out` may run side by side: a job another call is running waits for it (`<out>/task<T>_s<S>.lock`).

    python benchmarks/vla_finetune.py --pretrained RUN --tasks 2 4 --seeds 3 --online-steps 3000 \
        -- eval.episodes=10 budget.batch_size=256
    python benchmarks/vla_finetune.py --algo vla_ppo --pretrained RUN --env mt10-suite --tasks 1 8 --seeds 3 \
        --online-steps 8000 -- eval.episodes=20 algo.online_agent.bc_coef=0.1
    python benchmarks/vla_eval_sets.py --policy RUN/policy --env mt10 --episodes 100 --sets none --out BEFORE.json
    python benchmarks/vla_finetune.py --pretrained RUN --env mt10-suite --tasks 8 --seeds 5 --slices \
        --before BEFORE.json -- eval.episodes=20
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.machine import cpu_info, uptime  # noqa: E402
from embodied.stats import seed_t_test, wilson  # noqa: E402


ON_POLICY = ("vla_ppo", "vla_ppo_manip")   # route (b) presets; "before" is their own online step-0 eval
DIAGNOSTICS = {"vla_qc": ("finetune/action_distance", "finetune/candidate_spread"),
               **{algo: ("finetune/action_distance", "finetune/chain_kl") for algo in ON_POLICY}}


def last_online_mean(metrics: Path, key: str, records: int = 3) -> float | None:
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    values = [line[key] for line in lines if line.get("phase") == "online" and key in line][-records:]
    return round(sum(values) / len(values), 4) if values else None


class JobLock:
    """One invocation at a time per job under a shared --out: the second waits, then reuses the first's
    record. A lock left by a process that is gone is taken over."""

    def __init__(self, path: Path, poll_s: float = 5.0):
        self.path, self.poll_s = path, poll_s

    def __enter__(self):
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    os.kill(int(self.path.read_text() or 0), 0)
                except (ProcessLookupError, ValueError, FileNotFoundError):
                    self.path.unlink(missing_ok=True)   # its owner died: take it over
                    continue
                except PermissionError:
                    pass
                time.sleep(self.poll_s)
                continue
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)


def eval_episodes(algo: str, env: str, overrides: list[str]) -> int:
    """The jobs' eval.episodes, from the composed config (the overrides, else the algo's or train.yaml's)."""
    from embodied.train import compose_train

    return int(compose_train([f"algo={algo}", f"env={env}", *overrides]).eval.episodes)


def before_episodes(algo: str, pretrained: Path, episodes: int) -> int:
    """Episodes behind "before": vla_qc reads the pretraining's end-of-offline eval (its own eval.episodes),
    vla_ppo its online step-0 eval (the fine-tune's)."""
    if algo != "vla_qc":
        return episodes
    lines = [json.loads(line) for line in (pretrained / "metrics.jsonl").read_text().splitlines()]
    # the last eval that counted its episodes: the final per-variation evals after it do not
    evals = [line for line in lines if line.get("phase") == "offline" and line.get("kind") == "eval"
             and "eval/episodes" in line]
    return int(evals[-1]["eval/episodes"]) if evals else episodes


def sampler_steps(algo: str, pretrained: Path, overrides: list[str]) -> int | None:
    """The Euler steps "before" must be measured at: vla_ppo's `denoising_steps` (what it fine-tunes and
    deploys), vla_qc's the pretrained policy's own (None for a head without them)."""
    if algo in ON_POLICY:
        for override in overrides:
            if override.startswith("algo.online_agent.denoising_steps="):
                return int(override.split("=", 1)[1])
        from embodied.agents.vla_ppo import VLAPPOConfig

        return VLAPPOConfig().denoising_steps
    config = json.loads((Path(pretrained) / "policy" / "config.json").read_text())["config"]
    return config.get("flow_steps") if config.get("head") == "flow" else None


def read_before_eval(path: Path, pretrained: Path, env: str, algo: str, overrides: list[str]) -> dict:
    """A `benchmarks/vla_eval_sets.py` JSON of the pretrained policy (set `none`, the runner's start states,
    the fine-tuned policy's sampler): "before" with more episodes than the run's own eval, for every task."""
    data = json.loads(Path(path).read_text())
    if Path(data["policy"]).resolve() != (Path(pretrained) / "policy").resolve():
        raise SystemExit(f"--before {path}: evaluates {data['policy']}, not {Path(pretrained) / 'policy'}; "
                         f"run benchmarks/vla_eval_sets.py --policy {Path(pretrained) / 'policy'} --sets none")
    if data["env"] != env.removesuffix("-suite") or "none" not in data["sets"]:
        raise SystemExit(f"--before {path}: needs set 'none' on env {env.removesuffix('-suite')} "
                         f"(has env {data['env']}, sets {sorted(data['sets'])})")
    steps = sampler_steps(algo, pretrained, overrides)
    evaluated = data.get("flow_steps") or sampler_steps("vla_qc", pretrained, [])   # unrecorded: the policy's own
    if steps is not None and evaluated != steps:
        raise SystemExit(f"--before {path}: evaluated at {evaluated} flow steps, and {algo} acts at {steps}: "
                         f"rerun benchmarks/vla_eval_sets.py with --flow-steps {steps}")
    return {"episodes": int(data["episodes"]), "flow_steps": evaluated,
            "task_success": {int(t): v for t, v in data["sets"]["none"]["task_success"].items()},
            # per start state (evals from before this field existed lack it: the seed test is then unpaired)
            "episode_success": {int(t): v for t, v in data["sets"]["none"].get("episode_success", {}).items()}}


def check_pairing(before: bool, slices: bool, algo: str) -> None:
    if slices and not before and algo in ON_POLICY:
        return   # each seed's own step-0 eval covers its slice
    if before != slices:
        raise SystemExit("--before and --slices go together (vla_ppo may take --slices alone): a 'before' over more "
                         "start states than the fine-tunes' evals is not paired with them unless each seed evaluates "
                         "its own slice of those states")


def make_tables(jobs: list[dict], tasks: list[int], algo: str, pretrained: Path, before_eval: dict | None = None,
                slices: bool = False) -> dict:
    """Per fine-tuned task: before, after and the other tasks, pooled over seeds. With `slices` each seed k
    was evaluated on its own start states (k E .. (k + 1) E - 1), and `before_eval` (`read_before_eval`),
    the pretrained policy on all of them, replaces the runs' own "before" (their first E states only); without
    it (vla_ppo) each run's own step-0 eval on its slice is its "before"."""
    check_pairing(before_eval is not None, slices, algo)
    own_slices = slices and before_eval is None
    tables = {}
    # one pretraining for all; its own eval is "before" only without a --before eval
    first = before_episodes(algo, pretrained, jobs[0]["episodes"]) if jobs and before_eval is None else 0
    for task in tasks:
        runs = [j for j in jobs if j["task"] == task]
        if not runs:
            continue
        episodes = runs[0]["episodes"]
        others = sorted(runs[0]["other_tasks_before"])
        mean = lambda rows: [sum(r[t] for t in others) / len(others) for r in rows]
        success_before, others_before, n_before = runs[0]["success_before"], runs[0]["other_tasks_before"], first
        if before_eval is not None:
            missing = [t for t in [task, *others] if int(t) not in before_eval["task_success"]]
            if missing:
                raise SystemExit(f"--before eval has no tasks {missing}: evaluate every task of the suite")
            seeds = sorted(r["seed"] for r in runs)
            if seeds != list(range(len(seeds))) or before_eval["episodes"] != len(seeds) * episodes:
                raise SystemExit(f"--slices: seeds {seeds} evaluated {episodes} start states each, so the --before "
                                 f"eval must cover exactly seeds 0..n-1 x {episodes} states; it has "
                                 f"{before_eval['episodes']}: rerun benchmarks/vla_eval_sets.py with --episodes "
                                 f"{(max(seeds) + 1) * episodes}, or run seeds 0..{before_eval['episodes'] // episodes - 1}")
            success_before = before_eval["task_success"][task]
            others_before = {t: before_eval["task_success"][int(t)] for t in others}
            n_before = before_eval["episodes"]
        befores = [success_before]   # one shared pretraining, evaluated once: its episodes count once
        if own_slices:                # the same pretraining on each seed's own states: every slice counts
            befores, others_before, n_before = ([r["success_before"] for r in runs], None, episodes)
        tables[task] = {
            "seeds": len(runs), "episodes_per_seed": episodes, "episodes_before": n_before * len(befores),
            "before": pooled(befores, n_before),
            "after": pooled([r["success_after"] for r in runs], episodes),
            "other_tasks_before": pooled(mean([r["other_tasks_before"] for r in runs] if own_slices
                                              else [others_before]), n_before * len(others)),
            "other_tasks_after": pooled(mean([r["other_tasks_after"] for r in runs]), episodes * len(others)),
            **{key.split("/")[1]: [r[key.split("/")[1]] for r in runs] for key in DIAGNOSTICS[algo]},
            "seed_level": seed_level(runs, task, others, success_before, others_before,
                                     before_eval["episode_success"] if before_eval else None, episodes,
                                     same_states=before_eval is None and n_before == episodes,
                                     own_slices=own_slices),
        }
    return tables


def seed_level(runs: list[dict], task: int, others: list, success_before: float, others_before: dict,
               before_episodes: dict | None, episodes: int, same_states: bool = False,
               own_slices: bool = False) -> dict:
    """Gain and forgetting tested over seeds (Student t on after - before per seed), beside the tables' pooled
    Wilson intervals, which count episodes as independent. `pairing` says what each seed is compared with:
    "slice", the pretrained policy on that seed's own start states (`--slices` and a before eval that kept
    its per-episode outcomes); "own slice", that seed's own step-0 eval on its slice (`--slices` alone);
    "same states", the one shared before, on the start states every seed
    evaluated; "unpaired", a before over other or more start states (a pretraining eval of another
    eval.episodes, or a before eval from before per-episode outcomes were kept)."""
    slice_of = lambda outcomes, seed: outcomes[seed * episodes:(seed + 1) * episodes]
    mean = lambda values: sum(values) / len(values)
    paired = before_episodes is not None and all(int(t) in before_episodes for t in [task, *others])
    pairing = "slice" if paired else "own slice" if own_slices else "same states" if same_states else "unpaired"
    if own_slices:
        task_before = [r["success_before"] for r in runs]
        others_of = lambda r: mean([r["other_tasks_before"][t] for t in others])
    else:
        task_before = [mean(slice_of(before_episodes[task], r["seed"])) if paired else success_before for r in runs]
        others_of = lambda r: mean([mean(slice_of(before_episodes[int(t)], r["seed"])) for t in others]) if paired \
            else mean([others_before[t] for t in others])
    return {"pairing": pairing, "task_before_per_seed": [round(b, 3) for b in task_before],
            "gain": seed_t_test([r["success_after"] - b for r, b in zip(runs, task_before)]),
            "other_tasks_change": seed_t_test([mean([r["other_tasks_after"][t] for t in others]) - others_of(r)
                                               for r in runs])}


def pooled(rates: list[float], episodes: int) -> dict:
    wins = round(sum(rates) * episodes)
    n = episodes * len(rates)
    return {"success": round(wins / n, 3), "ci95": wilson(wins, n), "per_seed": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrained", type=Path, help="a vla_bc/vla_qc run with the flow head")
    parser.add_argument("--recompute", type=Path, default=None,
                        help="rebuild the tables of this summary JSON from its jobs (no fine-tuning) and rewrite it")
    parser.add_argument("--algo", choices=sorted(DIAGNOSTICS), default="vla_qc", help="the fine-tuning route")
    parser.add_argument("--env", default="cube-single-suite")
    parser.add_argument("--dataset-size", type=int, default=2000, help="the pretraining's dataset.size")
    parser.add_argument("--tasks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-list", type=int, nargs="+", default=None,
                        help="these seeds instead of 0..seeds-1 (with --out: jobs already finished there are reused)")
    parser.add_argument("--online-steps", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=2, help="torch threads per job")
    parser.add_argument("--jobs", type=int, default=1, help="fine-tunes at a time (jobs x threads <= cores)")
    parser.add_argument("--out", type=Path, default=None, help="run root (default benchmarks/results/raw/..., ignored)")
    parser.add_argument("--json", type=Path, default=None, help="summary JSON (default benchmarks/results/...)")
    parser.add_argument("--before", type=Path, default=None,
                        help="a benchmarks/vla_eval_sets.py JSON of the pretrained policy (--sets none, every task, "
                             "more episodes): the tables' 'before' (with --recompute too)")
    parser.add_argument("--slices", action="store_true",
                        help="seed k evaluates start states k*E..(k+1)*E-1 (E = eval.episodes, via eval.first_episode): "
                             "seeds 0..n-1 cover the n*E states of a --before eval (needs --before, except for vla_ppo: "
                             "each seed's own step-0 eval is then its before)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every job")
    args = parser.parse_args()
    if args.recompute:
        result = json.loads(args.recompute.read_text())
        tasks = sorted({job["task"] for job in result["jobs"]})
        if args.before:
            result["before_eval"] = str(args.before)
        before = result.get("before_eval")
        before = read_before_eval(Path(before), Path(result["pretrained"]), result["env"], result["algo"],
                                  result["overrides"]) if before else None
        result["tables"] = make_tables(result["jobs"], tasks, result["algo"], Path(result["pretrained"]), before,
                                       result.get("slices", False))
        args.recompute.write_text(json.dumps(result, indent=2))
        report(result["tables"], args.recompute)
        return
    if args.pretrained is None:
        parser.error("--pretrained is required (a vla_bc run with the flow head)")
    check_pairing(bool(args.before), args.slices, args.algo)   # before any fine-tuning, not after the sweep
    episodes = eval_episodes(args.algo, args.env, args.overrides)
    if args.slices and any(o.startswith("eval.first_episode=") for o in args.overrides):
        parser.error("--slices sets eval.first_episode per seed: drop it from the overrides")
    before = read_before_eval(args.before, args.pretrained, args.env, args.algo,
                              args.overrides) if args.before else None
    stamp = f"{datetime.now():%Y%m%d-%H%M%S}"
    root = args.out or REPO / "benchmarks" / "results" / "raw" / f"vla_finetune_{stamp}"
    root.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": cpu_info(), "load_before": uptime()}

    def run_job(task: int, seed: int) -> dict | None:
        with JobLock(root / f"task{task}_s{seed}.lock"):   # another invocation on this --out may be running it
            return run_job_unlocked(task, seed)

    def run_job_unlocked(task: int, seed: int) -> dict | None:
        run_dir = root / f"task{task}_s{seed}"
        command = [sys.executable, "-m", "embodied.train", f"algo={args.algo}", f"env={args.env}", "dataset=task",
                   f"dataset.size={args.dataset_size}", f"pretrained={args.pretrained}",
                   f"algo.online_agent.task={task}", f"seed={seed}", f"budget.online_steps={args.online_steps}",
                   f"eval.every_online={args.online_steps}", "checkpoint.every=0", "eval.video_episodes=0",
                   "logger=jsonl", "progress=false", f"threads={args.threads}", f"hydra.run.dir={run_dir}",
                   *([f"eval.first_episode={seed * episodes}"] if args.slices else []), *args.overrides]
        record = root / f"task{task}_s{seed}.json"   # a finished job of the same command is reused, not rerun
        done = json.loads(record.read_text()) if record.exists() else {}
        if done.get("command") == command[2:]:
            job = done["job"]
            print(f"  task {task} seed {seed}: reused {record} ({job['success_before']:.2f} -> "
                  f"{job['success_after']:.2f})", flush=True)
            return job
        print(f"[task {task} seed {seed}] {' '.join(command[2:])}", flush=True)
        started = time.time()
        with open(root / f"task{task}_s{seed}.log", "w") as log:
            code = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0:
            print(f"  failed ({code}): see {root / f'task{task}_s{seed}.log'}", flush=True)
            return None
        summary = json.loads((run_dir / "summary.json").read_text())
        job = {"task": task, "seed": seed, "wall_s": round(time.time() - started, 1), **summary["finetune"],
               **{key.split("/")[1]: last_online_mean(run_dir / "metrics.jsonl", key)
                  for key in DIAGNOSTICS[args.algo]},
               "episodes": summary["episodes"]}
        record.write_text(json.dumps({"command": command[2:], "job": job}, indent=2))
        print(f"  task {task} seed {seed}: {job['success_before']:.2f} -> {job['success_after']:.2f}; other tasks "
              f"{job['other_tasks_before']} -> {job['other_tasks_after']} ({job['wall_s']:.0f} s)", flush=True)
        return job

    with ThreadPoolExecutor(args.jobs) as pool:   # each job is its own process
        seeds = args.seed_list if args.seed_list is not None else list(range(args.seeds))
        results = pool.map(lambda ts: run_job(*ts), [(t, s) for t in args.tasks for s in seeds])
        jobs = [job for job in results if job is not None]
    tables = make_tables(jobs, args.tasks, args.algo, args.pretrained, before, args.slices)
    result = {"benchmark": "vla_finetune", "algo": args.algo, "pretrained": str(args.pretrained), "env": args.env,
              "before_eval": str(args.before) if args.before else None, "slices": args.slices,
              "online_steps": args.online_steps, "overrides": args.overrides, "machine": machine,
              "load_after": uptime(), "jobs": jobs, "tables": tables}
    out = args.json or REPO / "benchmarks" / "results" / f"vla_finetune-{stamp}.json"
    out.write_text(json.dumps(result, indent=2))
    report(tables, out)


def report(tables: dict, out: Path) -> None:
    for task, table in tables.items():
        print(f"task {task}: {table['before']['success']:.2f} {table['before']['ci95']} -> "
              f"{table['after']['success']:.2f} {table['after']['ci95']}; other tasks "
              f"{table['other_tasks_before']['success']:.2f} -> {table['other_tasks_after']['success']:.2f}")
        gain, change = table["seed_level"]["gain"], table["seed_level"]["other_tasks_change"]
        print(f"  over seeds (before: {table['seed_level']['pairing']}): gain {gain['mean']:+.3f} {gain['ci95']} "
              f"t {gain['t']} p {gain['p']}; other tasks {change['mean']:+.3f} {change['ci95']} p {change['p']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
