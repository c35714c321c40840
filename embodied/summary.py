"""Summarise a sweep: `python -m embodied.summary SWEEP_DIR [--out DIR] [--metric final_score]`.

Reads every run's summary.json (and metrics.jsonl for curves) under SWEEP_DIR, groups runs by
(task, method) and reports what DESIGN.md §5 asks for: end-of-offline → end-of-online, final and
best scores, episodes per eval, and the post-switch dip, each as mean [95% bootstrap CI over seeds].
Jobs that failed (status.json), never finished, or never started (jobs.json, written when the sweep
started) are listed with their error line, and the exit status is 1 when there are any.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import yaml
from hydra.experimental.callback import Callback

from embodied.errors import UserError, exit_on_user_error
from embodied.logging import SUMMARY_FILE, read_metrics, write_json_atomic
from embodied.stats import bootstrap_ci

STATUS_FILE = "status.json"   # per job, written by embodied.train: running | done | failed (+ error line)
JOBS_FILE = "jobs.json"       # per sweep, written when it starts: every job's number and overrides
LAST_SWEEP_DIR: Path | None = None  # set in the launching process when a sweep starts (its exit status)

SCORE_FIELDS = ("offline_score", "online_score", "final_score", "best_score", "dip",
                "dip_after_learning_starts", "calibration_gap_final", "action_distance_final",
                "offline_success", "online_success")
GROUPING_KEYS = {"env", "algo", "preset", "seed", "pretrained", "threads", "progress"}  # overrides that never split a method
MIN_EPISODES = 20  # DESIGN.md §5
CI_NOTE = ("mean [95% CI]: percentile bootstrap of the mean over seeds, 10,000 resamples. "
           "dip = worst eval in the first 10% of online steps minus end-of-offline "
           "(negative = dropped after the switch); dip (learning) = the same window starting at the first "
           "gradient step (after WSRL's warmup or the random steps). calib. gap = critic Q minus Monte-Carlo "
           "return on the last evaluation's episodes; drift = mean |a_finetuned - a_pretrained| on online states.")


@dataclass
class Run:
    """One finished train job: its directory and what its summary.json says."""
    path: Path
    summary: dict
    overrides: dict = field(default_factory=dict)

    @property
    def task(self) -> str:
        return str(self.summary.get("env"))

    @property
    def base_method(self) -> str:
        return str(self.summary.get("preset") or self.summary.get("algo"))


# ---- jobs of a sweep: finished, failed, unfinished, never started ----------------------------------

class SweepManifest(Callback):
    """Hydra callback (hydra.callbacks in conf/train.yaml): when a -m sweep starts, write <sweep>/jobs.json with
    every job's number and overrides, so jobs that never ran are known afterwards; remember the sweep dir."""

    def on_multirun_start(self, config, **kwargs) -> None:
        global LAST_SWEEP_DIR
        from embodied.config_check import expand_jobs

        sweep_dir = Path(str(config.hydra.sweep.dir))
        params = config.hydra.sweeper.get("params") or {}
        args = [f"{key}={value}" for key, value in params.items()] + list(config.hydra.overrides.task)
        jobs = [{"num": num, "overrides": overrides} for num, overrides in enumerate(expand_jobs(args))]
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(sweep_dir / JOBS_FILE, {"jobs": jobs})
        LAST_SWEEP_DIR = sweep_dir


@dataclass
class Job:
    """One job of a sweep and how it ended: done, failed, running (killed, or still going), missing (never ran)."""
    num: int | None
    run_dir: Path | None
    overrides: list[str]
    status: str
    error: str | None = None

    def describe(self, varying: set[str] | None = None) -> str:
        name = self.run_dir.name if self.run_dir is not None else f"job {self.num} (never started)"
        shown = [o for o in self.overrides if varying is None or o.partition("=")[0] in varying]
        text = f"{name} [{' '.join(shown)}]" if shown else name
        if self.error:
            return f"{text}: {self.error}"
        return text + (": no summary.json (killed, or still running)" if self.status == "running" else "")


def sweep_jobs(sweep_dir: str | Path) -> list[Job]:
    """Every job under sweep_dir: from each run dir's status.json (or a bare summary.json of an older run),
    plus the jobs jobs.json lists that left no run dir."""
    sweep_dir = Path(sweep_dir)
    jobs, seen_nums, seen_dirs = [], set(), set()
    for path in sorted(sweep_dir.rglob(STATUS_FILE)):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            record = {"status": "failed", "error": f"{STATUS_FILE} unreadable ({err})"}
        status = record.get("status", "running")
        if status == "done" and not (path.parent / SUMMARY_FILE).exists():
            status = "running"
        jobs.append(Job(record.get("job_num"), path.parent, list(record.get("overrides") or []), status,
                        record.get("error") if status == "failed" else None))
        seen_nums.add(record.get("job_num"))
        seen_dirs.add(path.parent)
    for path in sorted(sweep_dir.rglob(SUMMARY_FILE)):
        if path.parent not in seen_dirs:
            jobs.append(Job(None, path.parent, [], "done"))
    manifest = sweep_dir / JOBS_FILE
    if manifest.exists():
        try:
            listed = json.loads(manifest.read_text(encoding="utf-8")).get("jobs", [])
        except (OSError, json.JSONDecodeError, AttributeError):
            listed = []
        for entry in listed:
            if entry.get("num") not in seen_nums:
                jobs.append(Job(entry.get("num"), None, list(entry.get("overrides") or []), "missing"))
    return sorted(jobs, key=lambda job: (job.num is None, job.num if job.num is not None else 0, str(job.run_dir)))


def varying_keys(jobs: Sequence[Job]) -> set[str]:
    """Override keys whose value differs between jobs: what tells the jobs of one sweep apart."""
    values = defaultdict(set)
    for job in jobs:
        for override in job.overrides:
            key, _, value = override.partition("=")
            values[key].add(value)
    counted = [job for job in jobs if job.overrides]
    present = lambda key: sum(any(o.partition("=")[0] == key for o in job.overrides) for job in counted)
    return {key for key, seen in values.items() if len(seen) > 1 or present(key) < len(counted)}


def problems_table(jobs: Sequence[Job]) -> str:
    """Markdown list of the jobs that did not finish, with their error line."""
    bad = [job for job in jobs if job.status != "done"]
    if not bad:
        return ""
    varying = varying_keys(jobs)
    lines = [f"## Jobs that did not finish: {len(bad)} of {len(jobs)}", "",
             "| job | overrides | status | error |", "|---|---|---|---|"]
    for job in bad:
        name = job.run_dir.name if job.run_dir is not None else f"{job.num} (no run dir)"
        shown = " ".join(o for o in job.overrides if o.partition("=")[0] in varying) or " ".join(job.overrides)
        status = {"running": "not finished (killed, or still running)", "missing": "never started"}.get(
            job.status, job.status)
        error = (job.error or "").replace("|", "\\|")
        lines.append(f"| {name} | {shown} | {status} | {error} |")
    return "\n".join(lines) + "\n"


# ---- finding runs -----------------------------------------------------------------------------

def find_runs(sweep_dir: str | Path) -> tuple[list[Run], list[str]]:
    """Every run with a readable summary.json under sweep_dir (recursive), plus skip reasons."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise UserError(f"sweep directory '{sweep_dir}' does not exist; pass the Hydra multirun "
                        "folder that holds one sub-folder per job (e.g. multirun/<date>/<time>)")
    runs, skipped = [], []
    for path in sorted(sweep_dir.rglob(SUMMARY_FILE)):
        if run_status(path.parent) == "failed":  # listed with the failures, not scored
            continue
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            skipped.append(f"{path}: unreadable ({err})")
            continue
        if not isinstance(summary, dict) or not summary.get("env") or not (
                summary.get("preset") or summary.get("algo")):
            skipped.append(f"{path}: needs 'env' and 'algo' or 'preset'")
            continue
        runs.append(Run(path.parent, summary, _read_overrides(path.parent)))
    if not runs and not any(job.status != "done" for job in sweep_jobs(sweep_dir)):
        raise UserError(f"no {SUMMARY_FILE} found under '{sweep_dir}'; expected finished train runs "
                        f"as <sweep>/<job_num>/{SUMMARY_FILE} (Hydra multirun layout)"
                        + (f"; {len(skipped)} unreadable one(s) skipped" if skipped else ""))
    return runs, skipped


def run_status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / STATUS_FILE).read_text(encoding="utf-8")).get("status")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None


def _read_overrides(run_dir: Path) -> dict:
    """Hydra's command-line overrides of a job ({key: value}), so sweeps over knobs stay apart."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return {}
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except yaml.YAMLError:
        return {}
    overrides = {}
    for entry in entries:
        key, _, value = str(entry).partition("=")
        key = key.lstrip("+~")
        if not key.startswith("hydra") and key not in GROUPING_KEYS:
            overrides[key] = value
    return overrides


def _method_labels(runs: Sequence[Run]) -> dict[int, str]:
    """Label = preset or algo, plus any override that varies among that method's runs on a task."""
    labels = {}
    by_base = defaultdict(list)
    for run in runs:
        by_base[(run.task, run.base_method)].append(run)
    for (_, base), group in by_base.items():
        keys = sorted({key for run in group for key in run.overrides})
        varying = [key for key in keys if len({run.overrides.get(key) for run in group}) > 1]
        for run in group:
            extra = ", ".join(f"{key}={run.overrides.get(key)}" for key in varying)
            labels[id(run)] = f"{base} [{extra}]" if extra else base
    return labels


# ---- aggregating --------------------------------------------------------------------------------

def group_runs(runs: Sequence[Run]) -> dict[tuple[str, str], list[Run]]:
    """{(task, method): runs}, in a stable order."""
    labels = _method_labels(runs)
    groups = defaultdict(list)
    for run in runs:
        groups[(run.task, labels[id(run)])].append(run)
    return dict(sorted(groups.items()))


def _numbers(runs: Sequence[Run], key: str) -> list[float]:
    values = [run.summary.get(key) for run in runs]
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def summarize_runs(runs: Sequence[Run], metric: str = "final_score") -> list[dict]:
    """One row per (task, method) with mean/low/high/n for every score field."""
    rows = []
    fields = list(SCORE_FIELDS) + ([metric] if metric not in SCORE_FIELDS else [])
    for (task, method), group in group_runs(runs).items():
        episodes = sorted({int(e) for e in _numbers(group, "episodes")})
        seeds = sorted(str(run.summary.get("seed")) for run in group)
        kinds = {str(run.summary.get("score_kind")) for run in group if run.summary.get("score_kind")}
        row = {"task": task, "method": method, "seeds": len(set(seeds)), "runs": len(group),
               "seed_list": seeds, "score_kind": "/".join(sorted(kinds)) or None,
               "approximate": any(bool(run.summary.get("approximate_normalization")) for run in group),
               "switch_steps": sorted({step for step in map(_switch_step, group) if step is not None}),
               "episodes_min": episodes[0] if episodes else None,
               "episodes_max": episodes[-1] if episodes else None,
               "run_dirs": [str(run.path) for run in group]}
        for key in fields:
            values = _numbers(group, key)
            mean, low, high = bootstrap_ci(values) if values else (None, None, None)
            row.update({f"{key}_mean": mean, f"{key}_low": low, f"{key}_high": high,
                        f"{key}_n": len(values)})
        rows.append(row)
    rows.sort(key=lambda row: (row["task"], -(row[f"{metric}_mean"] or float("-inf"))))
    return rows


def _switch_step(run: Run) -> float | None:
    """Total step of a run's switch (offline → online): its metrics' switch line, else its offline budget."""
    from embodied.plots import find_switch_step

    if "offline_algo" in run.summary and not run.summary["offline_algo"]:  # no pretraining: nothing to switch from
        return None
    step = find_switch_step(read_metrics(run.path))
    if step is None and run.summary.get("offline_algo") and run.summary.get("offline_steps"):
        step = float(run.summary["offline_steps"])
    return step


def summarize(sweep_dir: str | Path, metric: str = "final_score") -> list[dict]:
    """Rows of the sweep table (see summarize_runs); raises UserError on a missing or empty sweep."""
    runs, _ = find_runs(sweep_dir)
    _check_metric(runs, metric)
    return summarize_runs(runs, metric)


def _check_metric(runs: Sequence[Run], metric: str) -> None:
    if not any(_numbers([run], metric) for run in runs):
        available = sorted({key for run in runs for key, value in run.summary.items()
                            if isinstance(value, (int, float)) and not isinstance(value, bool)})
        raise UserError(f"--metric '{metric}' is not a number in any {SUMMARY_FILE}; "
                        f"choose one of: {', '.join(available)}")


# ---- rendering ----------------------------------------------------------------------------------

def _ci(row: dict, key: str, digits: int = 1) -> str:
    if row.get(f"{key}_mean") is None:
        return "n/a"
    text = f"{row[f'{key}_mean']:.{digits}f}"
    if row[f"{key}_n"] > 1:
        text += f" [{row[f'{key}_low']:.{digits}f}, {row[f'{key}_high']:.{digits}f}]"
    return text


def _episodes(row: dict) -> str:
    low, high = row["episodes_min"], row["episodes_max"]
    if low is None:
        return "n/a"
    text = str(low) if low == high else f"{low}–{high}"
    return text + " (<20)" if low < MIN_EPISODES else text


def markdown_table(rows: Sequence[dict], metric: str = "final_score") -> str:
    """The sweep table in markdown, with notes on anything that weakens a comparison."""
    with_success = any(row["online_success_n"] for row in rows)
    headers = ["method", "task", "score", "seeds", "episodes/eval", "offline → online", "final", "best", "dip",
               "dip (learning)", "calib. gap", "drift", "switch at"]
    if with_success:
        headers.append("success offline → online")
    if metric not in SCORE_FIELDS:
        headers.append(metric)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [row["method"], row["task"], _score_kind(row), _seeds(row), _episodes(row),
                 f"{_ci(row, 'offline_score')} → {_ci(row, 'online_score')}",
                 _ci(row, "final_score"), _ci(row, "best_score"), _ci(row, "dip"),
                 _ci(row, "dip_after_learning_starts"), _ci(row, "calibration_gap_final"),
                 _ci(row, "action_distance_final", 2),
                 ", ".join(f"{step:g}" for step in row["switch_steps"]) or "–"]
        if with_success:
            has_success = row["offline_success_n"] or row["online_success_n"]
            cells.append(f"{_ci(row, 'offline_success', 2)} → {_ci(row, 'online_success', 2)}"
                         if has_success else "–")
        if metric not in SCORE_FIELDS:
            cells.append(_ci(row, metric))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + _notes(rows)) + "\n"


def _score_kind(row: dict) -> str:
    kind = {"d4rl_normalized": "normalised", "return": "return"}.get(row["score_kind"], row["score_kind"] or "?")
    return f"{kind} ≈" if row["approximate"] else kind


def _seeds(row: dict) -> str:
    """Distinct seeds; the number of runs too when some runs repeat a seed."""
    return str(row["seeds"]) if row["runs"] == row["seeds"] else f"{row['seeds']} ({row['runs']} runs)"


def _notes(rows: Sequence[dict]) -> list[str]:
    notes = [CI_NOTE, "switch at: total step of the offline → online switch (dashed line in the curves); "
                      "– for methods without pretraining."]
    if any(row["approximate"] for row in rows):
        notes.append("≈: D4RL-normalised on gymnasium v5 physics, which differ from D4RL's v2 envs: approximate, "
                     "not comparable with published D4RL scores.")
    if any(row["runs"] != row["seeds"] for row in rows):
        notes.append("seeds (N runs): some runs repeat a seed; the CI treats them as independent, compare with care.")
    if any(row["episodes_min"] is not None and row["episodes_min"] < MIN_EPISODES for row in rows):
        notes.append(f"(<20): fewer eval episodes than the protocol's {MIN_EPISODES}.")
    seed_sets = defaultdict(set)
    for row in rows:
        seed_sets[row["task"]].add(tuple(row["seed_list"]))
    for task, sets in sorted(seed_sets.items()):
        if len(sets) > 1:
            notes.append(f"{task}: methods ran on different seeds, compare with care.")
    return ["- " + note for note in notes]


CSV_BASE = ["task", "method", "seeds", "runs", "seed_list", "score_kind", "approximate", "switch_steps",
            "episodes_min", "episodes_max"]


def write_csv(rows: Sequence[dict], path: Path) -> None:
    """Flat numbers for spreadsheets: mean/low/high/n per score field."""
    columns = CSV_BASE + [key for key in rows[0] if key not in CSV_BASE and key != "run_dirs"]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "seed_list": " ".join(row["seed_list"]),
                             "switch_steps": " ".join(f"{step:g}" for step in row["switch_steps"])})


def write_plots(rows: Sequence[dict], out_dir: Path, metric: str) -> list[Path]:
    """Bar plot of `metric` and per-task learning curves from each run's metrics.jsonl."""
    from embodied import plots  # matplotlib only when plotting

    written = [plots.score_bars(rows, out_dir / "summary_bars.png", metric)]
    curves, switches = defaultdict(dict), defaultdict(dict)
    for row in rows:
        runs = [metrics for metrics in map(read_metrics, row["run_dirs"]) if metrics]
        if runs:
            curves[row["task"]][row["method"]] = runs
            switches[row["task"]][row["method"]] = row["switch_steps"]
    if curves:
        written.append(sweep_curves(curves, switches, out_dir / "summary_curves.png"))
    return written


def sweep_curves(curves: dict, switches: dict, path: Path) -> Path:
    """Two panels per task ({task: {method: runs}}), mean ± 95% CI per method: the whole run on total steps with
    every method's switch marked, and the online phase alone, where every method starts at online step 0."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from embodied import plots

    tasks = sorted(curves)
    fig = Figure(figsize=(13.0, 4.2 * len(tasks)), layout="constrained")
    FigureCanvasAgg(fig)
    colors = plots.method_colors(sorted({method for by_method in curves.values() for method in by_method}))
    for index, task in enumerate(tasks):
        ax = fig.add_subplot(len(tasks), 2, 2 * index + 1)
        draw_task_curves(ax, curves[task], switches.get(task, {}), colors)
        ax.set_title(task)
        online = {method: [plots.online_view(run) for run in runs] for method, runs in curves[task].items()}
        ax = fig.add_subplot(len(tasks), 2, 2 * index + 2)
        draw_task_curves(ax, online, {}, colors)
        ax.set_xlabel(plots.ONLINE_X_LABEL)
        ax.set_title(f"{task}: online phase")
    fig.savefig(path, dpi=120)
    return path


def draw_task_curves(ax, runs_by_method: dict, switch_by_method: dict, colors: dict) -> list[float]:
    """Curves of one task; a dashed line at each switch step, named by its methods when methods switch at
    different steps (plots.sweep_curves_by_task draws a switch only when every run agrees). Returns the steps."""
    from embodied import plots

    for method, runs in sorted(runs_by_method.items()):
        xs, mean, low, high = plots.mean_band(runs)
        if not len(xs):
            continue
        ax.plot(xs, mean, color=colors[method], label=f"{method} (n={len(runs)})")
        ax.fill_between(xs, low, high, color=colors[method], alpha=0.2, linewidth=0)
    at = defaultdict(list)
    for method, steps in sorted(switch_by_method.items()):
        for step in steps:
            at[float(step)].append(method)
    for step, methods in sorted(at.items()):
        ax.axvline(step, color="black", linestyle="--", linewidth=1)
        label = plots.SWITCH_LABEL if len(at) == 1 else f"{plots.SWITCH_LABEL}: {', '.join(methods)}"
        ax.text(step, 0.98, f" {label}", transform=ax.get_xaxis_transform(), ha="left", va="top",
                fontsize="small")
    ax.set_xlabel(plots.X_LABEL)
    ax.set_ylabel("eval/score (mean, 95% CI)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small", loc="best")
    return sorted(at)


# ---- command line -------------------------------------------------------------------------------

@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    """Write the table, csv and plots; list the jobs that did not finish; exit 1 when there are any."""
    parser = argparse.ArgumentParser(prog="python -m embodied.summary", description=__doc__.split("\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="Hydra multirun folder of the sweep")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: SWEEP_DIR)")
    parser.add_argument("--metric", default="final_score", help="score for ordering and bars")
    args = parser.parse_args(argv)

    runs, skipped = find_runs(args.sweep_dir)
    jobs = sweep_jobs(args.sweep_dir)
    problems = problems_table(jobs)
    out_dir = args.out or args.sweep_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    table = ""
    if runs:
        _check_metric(runs, args.metric)
        rows = summarize_runs(runs, args.metric)
        table = markdown_table(rows, args.metric)
        write_csv(rows, out_dir / "summary.csv")
        written = [out_dir / "summary.csv", *write_plots(rows, out_dir, args.metric)]
        groups = f", {len(rows)} (task, method) groups"
    else:
        groups = ", no finished run"
    bad = [job for job in jobs if job.status != "done"]
    header = (f"# Sweep summary: {args.sweep_dir}\n\n{len(runs)} finished runs{groups}"
              + (f"; {len(bad)} of {len(jobs)} jobs did not finish (listed below)" if bad else "") + ".\n\n")
    (out_dir / "summary.md").write_text(header + table + ("\n" if table and problems else "") + problems,
                                        encoding="utf-8")

    print(table + ("\n" if table and problems else "") + problems, end="")
    for reason in skipped:
        print(f"warning: skipped {reason}", file=sys.stderr)
    for path in [out_dir / "summary.md", *written]:
        print(f"wrote {path}")
    if bad:
        print(f"{len(bad)} of {len(jobs)} jobs did not finish: "
              + "; ".join(job.describe(varying_keys(jobs)) for job in bad), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
