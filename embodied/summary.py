"""Summarise a sweep: `python -m embodied.summary SWEEP_DIR [--out DIR] [--metric final_score]`.

Reads every run's summary.json (and metrics.jsonl for curves) under SWEEP_DIR, groups runs by
(task, method) and reports what DESIGN.md §5 asks for: end-of-offline → end-of-online, final and
best scores, episodes per eval, and the post-switch dip, each as mean [95% bootstrap CI over seeds].
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

from embodied.errors import UserError, exit_on_user_error
from embodied.logging import SUMMARY_FILE, read_metrics
from embodied.stats import bootstrap_ci

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


# ---- finding runs -----------------------------------------------------------------------------

def find_runs(sweep_dir: str | Path) -> tuple[list[Run], list[str]]:
    """Every run with a readable summary.json under sweep_dir (recursive), plus skip reasons."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise UserError(f"sweep directory '{sweep_dir}' does not exist; pass the Hydra multirun "
                        "folder that holds one sub-folder per job (e.g. multirun/<date>/<time>)")
    runs, skipped = [], []
    for path in sorted(sweep_dir.rglob(SUMMARY_FILE)):
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
    if not runs:
        raise UserError(f"no {SUMMARY_FILE} found under '{sweep_dir}'; expected finished train runs "
                        f"as <sweep>/<job_num>/{SUMMARY_FILE} (Hydra multirun layout)"
                        + (f"; {len(skipped)} unreadable one(s) skipped" if skipped else ""))
    return runs, skipped


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
        row = {"task": task, "method": method, "seeds": len(group),
               "seed_list": sorted(str(run.summary.get("seed")) for run in group),
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
    headers = ["method", "task", "seeds", "episodes/eval", "offline → online", "final", "best", "dip",
               "dip (learning)", "calib. gap", "drift"]
    if with_success:
        headers.append("success offline → online")
    if metric not in SCORE_FIELDS:
        headers.append(metric)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [row["method"], row["task"], str(row["seeds"]), _episodes(row),
                 f"{_ci(row, 'offline_score')} → {_ci(row, 'online_score')}",
                 _ci(row, "final_score"), _ci(row, "best_score"), _ci(row, "dip"),
                 _ci(row, "dip_after_learning_starts"), _ci(row, "calibration_gap_final"),
                 _ci(row, "action_distance_final", 2)]
        if with_success:
            has_success = row["offline_success_n"] or row["online_success_n"]
            cells.append(f"{_ci(row, 'offline_success', 2)} → {_ci(row, 'online_success', 2)}"
                         if has_success else "–")
        if metric not in SCORE_FIELDS:
            cells.append(_ci(row, metric))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + _notes(rows)) + "\n"


def _notes(rows: Sequence[dict]) -> list[str]:
    notes = [CI_NOTE]
    if any(row["episodes_min"] is not None and row["episodes_min"] < MIN_EPISODES for row in rows):
        notes.append(f"(<20): fewer eval episodes than the protocol's {MIN_EPISODES}.")
    seed_sets = defaultdict(set)
    for row in rows:
        seed_sets[row["task"]].add(tuple(row["seed_list"]))
    for task, sets in sorted(seed_sets.items()):
        if len(sets) > 1:
            notes.append(f"{task}: methods ran on different seeds, compare with care.")
    return ["- " + note for note in notes]


CSV_BASE = ["task", "method", "seeds", "seed_list", "episodes_min", "episodes_max"]


def write_csv(rows: Sequence[dict], path: Path) -> None:
    """Flat numbers for spreadsheets: mean/low/high/n per score field."""
    columns = CSV_BASE + [key for key in rows[0] if key not in CSV_BASE and key != "run_dirs"]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "seed_list": " ".join(row["seed_list"])})


def write_plots(rows: Sequence[dict], out_dir: Path, metric: str) -> list[Path]:
    """Bar plot of `metric` and per-task learning curves from each run's metrics.jsonl."""
    from embodied import plots  # matplotlib only when plotting

    written = [plots.score_bars(rows, out_dir / "summary_bars.png", metric)]
    curves = defaultdict(dict)
    for row in rows:
        runs = [metrics for metrics in map(read_metrics, row["run_dirs"]) if metrics]
        if runs:
            curves[row["task"]][row["method"]] = runs
    if curves:
        written.append(plots.sweep_curves_by_task(curves, out_dir / "summary_curves.png"))
    return written


# ---- command line -------------------------------------------------------------------------------

@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m embodied.summary", description=__doc__.split("\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="Hydra multirun folder of the sweep")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: SWEEP_DIR)")
    parser.add_argument("--metric", default="final_score", help="score for ordering and bars")
    args = parser.parse_args(argv)

    runs, skipped = find_runs(args.sweep_dir)
    _check_metric(runs, args.metric)
    rows = summarize_runs(runs, args.metric)
    out_dir = args.out or args.sweep_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    table = markdown_table(rows, args.metric)
    header = f"# Sweep summary: {args.sweep_dir}\n\n{len(runs)} runs, {len(rows)} (task, method) groups.\n\n"
    (out_dir / "summary.md").write_text(header + table, encoding="utf-8")
    write_csv(rows, out_dir / "summary.csv")
    written = write_plots(rows, out_dir, args.metric)

    print(table)
    for reason in skipped:
        print(f"warning: skipped {reason}", file=sys.stderr)
    for path in [out_dir / "summary.md", out_dir / "summary.csv", *written]:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
