"""Run the task suite for one planner on the real sims and summarise it.

Per planner (mode x back end): task success, sub-goal executability (sub-goals that passed grounding
and validation and reached a skill / all proposed), replans per task, LLM tokens and latency per
task, failure categories (ungrounded output, invalid precondition, skill failure, back-end error),
and the count of ungrounded sub-goals that reached a skill (must be 0). The adversarial set is run
through the same executor and counted as refused or grounded.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

import sims
from embodied.errors import UserError
from embodied.logging import write_json_atomic
from planners.backends.rule import RulePlanner
from planners.executor import FAILURES, Executor, ExecutorConfig, Trace
from planners.learned_skill import load_learned_skills
from planners.llm_planner import LLMPlanner, LLMPlannerConfig
from planners.sim import oracle_skills, world_from_env
from planners.tasks import ADVERSARIAL, TASKS, Task

PLANNERS = ("rule", "smollm2-generate", "smollm2-saycan", "smollm2-constrained")
# issue 19: the goal mode (LLM+P), and every LLM mode with retrieved bank examples ("+ret")
EXTRA_PLANNERS = ("smollm2-goal", "smollm2-goal+ret", "smollm2-generate+ret", "smollm2-saycan+ret",
                  "smollm2-constrained+ret")
ALL_PLANNERS = PLANNERS + EXTRA_PLANNERS


class EnvPool:
    """One env per suite (its `-goal` variant, which takes the OGBench task id at each reset)."""

    def __init__(self):
        self._envs = {}

    def get(self, name: str):
        if name not in self._envs:
            self._envs[name] = sims.make(f"{name}-goal", max_episode_steps=100_000)
        return self._envs[name]

    def close(self):
        for env in self._envs.values():
            env.close()
        self._envs.clear()


def make_planner(spec: str, library, backend=None, threshold: float = 0.8):
    """'rule' | '<backend>-generate|saycan|constrained|goal[+ret]' (backend: smollm2 local, or an object
    given); '+ret' puts the k=3 nearest bank examples (planners.examples) into the prompt."""
    if spec == "rule":
        return RulePlanner(library)
    name, _, mode = spec.rpartition("-")
    mode, plus, _ = mode.partition("+")
    k = 3 if plus else 0
    if backend is None:
        if name != "smollm2":
            raise UserError(f"planner {spec!r}: choose one of {', '.join(ALL_PLANNERS)} (or pass a backend)")
        from planners.backends.local import LocalBackend  # torch and transformers: only for the local model

        backend = LocalBackend()
    if mode == "goal":
        from planners.goal_planner import GoalConfig, GoalPlanner

        return GoalPlanner(backend, library, GoalConfig(k_examples=k))
    return LLMPlanner(backend, library, LLMPlannerConfig(mode=mode, threshold=threshold, retrieval_k=k))


def run_suite(spec: str, tasks=TASKS, adversarial=ADVERSARIAL, out_dir: str | Path | None = None, seed: int = 0,
              max_replans: int = 3, backend=None, wandb_run=None, log=print, name: str | None = None,
              skills: str = "oracle", skills_dir: str | Path | None = None, sample_skills: bool = True) -> dict:
    """`name` (default: spec) names the trace and partial files, e.g. '<spec>-heldout'. `skills`:
    "oracle" (the scripted OGBench oracles) or "learned" (checkpoints under `skills_dir`, written by
    `python -m planners.train_skills`)."""
    if skills not in ("oracle", "learned"):
        raise UserError(f"skills={skills!r}: choose oracle or learned")
    if skills == "learned" and not skills_dir:
        raise UserError("skills=learned needs skills_dir (the --out of `python -m planners.train_skills`)")
    library_fn = (oracle_skills if skills == "oracle"
                  else (lambda env: load_learned_skills(env, skills_dir, sample=sample_skills)))
    out_dir = Path(out_dir) if out_dir else None
    name = name or spec
    trace = Trace(out_dir / f"trace_{name}.jsonl" if out_dir else None, wandb_run)
    pool = EnvPool()
    rows = []
    try:
        for k, task in enumerate(tasks):
            rows.append(_run_task(spec, task, pool, trace, seed, max_replans, backend, k, library_fn))
            r = rows[-1]
            if out_dir:  # partial results survive a killed run
                write_json_atomic(out_dir / f"{name}.partial.json", {"planner": spec, "tasks": rows})
            trace.log_metrics({"task_success": r["success"], "replans": r["replans"],
                               "llm_latency_s": r["usage"]["latency_s"]}, step=k)
            log(f"[{spec}] {task.id}: success={r['success']} replans={r['replans']} "
                f"subgoals ok/run/valid/proposed={r['subgoals_succeeded']}/{r['subgoals_executable']}/"
                f"{r['subgoals_valid']}/{r['subgoals_proposed']} "
                f"tokens={r['usage']['prompt_tokens'] + r['usage']['completion_tokens']} "
                f"llm_s={r['usage']['latency_s']:.1f} refused={bool(r['refused'])}")
        adv = []
        for k, (env_name, task_id, instruction) in enumerate(adversarial):
            task = Task(f"adv{k}", env_name, task_id, instruction, (), 0)
            r = _run_task(spec, task, pool, trace, seed, 0, backend, 1000 + k, library_fn, goals=False)
            adv.append({"instruction": instruction, "refused": r["refused"],
                        "executed": [e for e in r.pop("executed")],
                        "ungrounded_reached_skill": r["ungrounded_reached_skill"]})
            log(f"[{spec}] adversarial {instruction!r}: refused={r['refused']!r} executed={adv[-1]['executed']}")
    finally:
        trace.close()
        pool.close()
    return {"planner": spec, "seed": seed, "skills": skills, "summary": summarise(rows, adv), "tasks": rows,
            "adversarial": adv}


def _run_task(spec, task: Task, pool: EnvPool, trace: Trace, seed: int, max_replans: int, backend, k: int,
              library_fn=oracle_skills, goals: bool = True) -> dict:
    import torch

    env = pool.get(task.env)
    obs, info = env.reset(seed=seed + k, options={"task_id": task.task_id})
    torch.manual_seed(seed + k)  # learned skills that sample draw from torch's global generator
    library = library_fn(env)
    planner = make_planner(spec, library, backend)
    executor = Executor(planner, library, world_from_env, ExecutorConfig(max_replans=max_replans, seed=seed), trace)
    first = len(trace.events)
    res = executor.run(env, task.instruction, obs, info, goals=list(task.goals) if goals else None, task_id=task.id)
    executed = [e["subgoal"]["skill"] + "(" + ",".join(e["subgoal"]["args"]) + ")"
                for e in trace.events[first:] if e["event"] == "subgoal"]
    outcomes: dict[str, list[int]] = {}  # skill -> [succeeded, run]
    for e in trace.events[first:]:
        if e["event"] == "subgoal":
            _tally(outcomes, e["subgoal"]["skill"], bool(e["success"]), 1)
    row = {"task": task.id, "env": task.env, "steps": task.steps, **res.to_json(), "executed": executed,
           "skill_outcomes": outcomes}
    if goals:
        row.pop("executed")
    return row


def summarise(rows: list[dict], adv: list[dict]) -> dict:
    n = len(rows)
    proposed = sum(r["subgoals_proposed"] for r in rows)
    return {
        "tasks": n,
        "success_rate": float(np.mean([r["success"] for r in rows])) if n else 0.0,
        # grounded and valid when proposed (later steps of a plan cut short by a failed skill still count)
        "subgoal_executability": (sum(r["subgoals_valid"] for r in rows) / proposed) if proposed else 0.0,
        "subgoals_reached_skill": sum(r["subgoals_executable"] for r in rows),
        "subgoals_succeeded": sum(r["subgoals_succeeded"] for r in rows),
        "replans_per_task": float(np.mean([r["replans"] for r in rows])) if n else 0.0,
        "tokens_per_task": float(np.mean([r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in rows])) if n else 0.0,
        "llm_latency_s_per_task": float(np.mean([r["usage"]["latency_s"] for r in rows])) if n else 0.0,
        "refused_tasks": sum(bool(r["refused"]) for r in rows),
        "failures": {k: sum(r["failures"][k] for r in rows) for k in FAILURES},
        "ungrounded_reached_skill": sum(r["ungrounded_reached_skill"] for r in rows)
        + sum(a["ungrounded_reached_skill"] for a in adv),
        "adversarial_refused": sum(bool(a["refused"]) for a in adv),
        "adversarial_total": len(adv),
        "wall_s_per_task": float(np.mean([r["wall_s"] for r in rows])) if n else 0.0,
        "per_skill": per_skill(rows),
        # where failed tasks failed: a skill that did not finish, or the plan (refused, invalid, wrong goal)
        "failed_tasks": {"skill": sum(1 for r in rows if not r["success"] and r["failures"]["skill_failure"]),
                         "planning": sum(1 for r in rows if not r["success"] and not r["failures"]["skill_failure"])},
    }


def _tally(counts: dict[str, list[int]], skill: str, succeeded: int, run: int) -> None:
    pair = counts.setdefault(skill, [0, 0])
    pair[0] += succeeded
    pair[1] += run


def per_skill(rows: list[dict]) -> dict[str, dict]:
    """Sub-goals run and finished per skill, over all tasks (retries after a replan included)."""
    total: dict[str, list[int]] = {}
    for r in rows:
        for skill, (ok, run) in r.get("skill_outcomes", {}).items():
            _tally(total, skill, ok, run)
    return {k: {"succeeded": ok, "run": run, "rate": ok / run} for k, (ok, run) in sorted(total.items())}


def table(results: list[dict]) -> str:
    head = ("| planner | success | sub-goal executability | replans/task | tokens/task | LLM s/task | "
            "ungrounded output | invalid precondition | skill failure | backend error | stopped (done/refusal) | "
            "ungrounded reached skill | adversarial refused |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for res in results:
        s = res["summary"]
        f = s["failures"]
        lines.append(
            f"| {res['planner']} | {s['success_rate'] * s['tasks']:.0f}/{s['tasks']} ({100 * s['success_rate']:.0f}%) | "
            f"{100 * s['subgoal_executability']:.0f}% | {s['replans_per_task']:.2f} | {s['tokens_per_task']:.0f} | "
            f"{s['llm_latency_s_per_task']:.2f} | {f['ungrounded_output']} | {f['invalid_precondition']} | "
            f"{f['skill_failure']} | {f['backend_error']} | {s['refused_tasks']} | {s['ungrounded_reached_skill']} | "
            f"{s['adversarial_refused']}/{s['adversarial_total']} |")
    return "\n".join(lines)


def skill_table(results: list[dict]) -> str:
    """Per-skill success (finished / run) and where failed tasks failed, one row per result."""
    results = [res for res in results if res["summary"].get("per_skill")]  # results from before the column
    skills = sorted({k for res in results for k in res["summary"]["per_skill"]})
    head = "| planner | " + " | ".join(skills) + " | failed in a skill | failed in planning |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for res in results:
        s = res["summary"]
        cells = []
        for k in skills:
            v = s["per_skill"].get(k)
            cells.append(f"{v['succeeded']}/{v['run']} ({100 * v['rate']:.0f}%)" if v else "-")
        failed = s["failed_tasks"]
        lines.append(f"| {res['planner']} | " + " | ".join(cells) + f" | {failed['skill']} | {failed['planning']} |")
    return "\n".join(lines)
