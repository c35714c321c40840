"""Learning-curve and sweep plots, drawn headless (Agg) so they work on servers and in sweeps.

Convention for the x axis: `total_step` = offline gradient steps first, then online env steps on
top of them; the switch is a vertical dashed line labelled "offline → online".
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from embodied.stats import bootstrap_means

X_LABEL = "total steps (offline gradient steps, then online env steps)"
ONLINE_X_LABEL = "online env steps (every method from its switch, or from scratch)"
SWITCH_LABEL = "offline → online"
PHASE_COLORS = {"offline": "tab:blue", "online": "tab:orange"}
BAND_RESAMPLES = 2000  # per-point bands only need to look right, not be table-grade


# ---- reading curves out of metric lines -------------------------------------------------------

def _x(line: dict) -> float:
    return float(line.get("total_step", line.get("step", 0)))


def eval_points(metrics: Sequence[dict], key: str) -> list[dict]:
    """Eval lines that carry a numeric `key`, sorted by total step."""
    points = [line for line in metrics
              if line.get("kind") == "eval" and isinstance(line.get(key), (int, float))]
    return sorted(points, key=_x)


def find_switch_step(metrics: Sequence[dict]) -> float | None:
    """Total step of the switch: the "switch" line, else the last offline line before online ones."""
    switches = [_x(line) for line in metrics if line.get("kind") == "switch"]
    if switches:
        return switches[0]
    offline = [_x(line) for line in metrics if line.get("phase") == "offline"]
    has_online = any(line.get("phase") == "online" for line in metrics)
    return max(offline) if offline and has_online else None


def online_view(metrics: Sequence[dict]) -> list[dict]:
    """The online phase alone, its x the online env step: methods with and without a pretraining then start
    together at 0 (on the total-step axis a from-scratch run sits under the others' offline phase)."""
    return [{**line, "total_step": line["step"]} for line in metrics
            if line.get("phase") == "online" and isinstance(line.get("step"), (int, float))]


def _curve(metrics: Sequence[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of one run; a repeated x keeps its last value (e.g. a re-evaluation after resume)."""
    by_x = {_x(line): float(line[key]) for line in eval_points(metrics, key)}
    xs = np.array(sorted(by_x))
    return xs, np.array([by_x[x] for x in xs])


# ---- one run ----------------------------------------------------------------------------------

def learning_curve(metrics: Sequence[dict], path: str | Path, switch_step: int | None = None,
                   title: str = "", score_key: str = "eval/score",
                   success_key: str = "eval/success") -> Path:
    """Eval score vs total step for one run; success rate on a right axis when logged.

    `switch_step` is in total steps; None takes it from the metrics (a "switch" line) if any.
    """
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    points = eval_points(metrics, score_key)
    if switch_step is None:
        switch_step = find_switch_step(metrics)

    previous = None
    for phase in ("offline", "online"):
        phase_points = [line for line in points if line.get("phase", "online") == phase]
        if not phase_points:
            continue
        joined = ([previous] if previous else []) + phase_points  # no gap across the switch
        ax.plot([_x(line) for line in joined], [line[score_key] for line in joined],
                marker="o", markersize=3, color=PHASE_COLORS[phase], label=f"{phase} {score_key}")
        previous = phase_points[-1]

    successes = eval_points(metrics, success_key)
    if successes:
        success_ax = ax.twinx()
        success_ax.plot([_x(line) for line in successes], [line[success_key] for line in successes],
                        linestyle=":", color="tab:green", label=success_key)
        success_ax.set_ylim(-0.02, 1.02)
        success_ax.set_ylabel("success rate", color="tab:green")
        success_ax.legend(loc="lower right", fontsize="small")

    if switch_step is not None:
        _mark_switch(ax, switch_step)
    if not points:
        ax.text(0.5, 0.5, f"no eval points with '{score_key}' yet", transform=ax.transAxes,
                ha="center", va="center", color="gray")
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(score_key)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if points:
        ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def _mark_switch(ax, switch_step: float) -> None:
    ax.axvline(switch_step, color="black", linestyle="--", linewidth=1)
    ax.text(switch_step, 0.98, f" {SWITCH_LABEL}", transform=ax.get_xaxis_transform(),
            ha="left", va="top", fontsize="small")


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


# ---- many runs --------------------------------------------------------------------------------

def method_colors(methods: Sequence[str]) -> dict[str, str]:
    """One stable colour per method, shared by every plot of a sweep."""
    palette = [f"C{i}" for i in range(10)]
    return {method: palette[i % len(palette)] for i, method in enumerate(sorted(methods))}


def mean_band(runs: Sequence[Sequence[dict]], score_key: str = "eval/score",
              confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, mean, low, high) across runs, each run interpolated onto the union of eval steps.

    A point averages the runs that reach it, so a run that stopped early shortens no curve.
    """
    curves = [_curve(run, score_key) for run in runs]
    curves = [(xs, ys) for xs, ys in curves if len(xs)]
    if not curves:
        empty = np.array([])
        return empty, empty, empty, empty
    grid = np.unique(np.concatenate([xs for xs, _ in curves]))
    table = np.full((len(curves), len(grid)), np.nan)
    for row, (xs, ys) in enumerate(curves):
        inside = (grid >= xs[0]) & (grid <= xs[-1])
        table[row, inside] = np.interp(grid[inside], xs, ys)
    present = ~np.isnan(table)
    mean = np.nansum(table, axis=0) / present.sum(axis=0)
    if len(curves) == 1:
        return grid, mean, mean, mean
    resampled = bootstrap_means(np.nan_to_num(table), BAND_RESAMPLES, seed=0)
    counts = bootstrap_means(present.astype(float), BAND_RESAMPLES, seed=0)  # same picks, same seed
    with np.errstate(invalid="ignore", divide="ignore"):
        resampled = np.where(counts > 0, resampled / counts, np.nan)
    tail = (1.0 - confidence) / 2.0
    low, high = np.nanquantile(resampled, [tail, 1.0 - tail], axis=0)
    return grid, mean, low, high


def _draw_methods(ax, runs_by_method: Mapping[str, Sequence[Sequence[dict]]], score_key: str,
                  colors: Mapping[str, str], switch_step: float | None) -> None:
    switches = set()
    for method, runs in sorted(runs_by_method.items()):
        xs, mean, low, high = mean_band(runs, score_key)
        if not len(xs):
            continue
        ax.plot(xs, mean, color=colors[method], label=f"{method} (n={len(runs)})")
        ax.fill_between(xs, low, high, color=colors[method], alpha=0.2, linewidth=0)
        switches.update(find_switch_step(run) for run in runs)
    switches.discard(None)
    if switch_step is None and len(switches) == 1:  # only draw a switch every run agrees on
        switch_step = switches.pop()
    if switch_step is not None:
        _mark_switch(ax, switch_step)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(f"{score_key} (mean, 95% CI)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small", loc="best")


def sweep_curves_by_task(runs: Mapping[str, Mapping[str, Sequence[Sequence[dict]]]],
                         path: str | Path, score_key: str = "eval/score") -> Path:
    """One panel per task ({task: {method: runs}}), colours shared across panels."""
    tasks = sorted(runs)
    columns = min(3, max(1, len(tasks)))
    rows = -(-len(tasks) // columns) if tasks else 1
    fig = Figure(figsize=(6.5 * columns, 4.2 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    colors = method_colors(sorted({method for by_method in runs.values() for method in by_method}))
    for index, task in enumerate(tasks):
        ax = fig.add_subplot(rows, columns, index + 1)
        _draw_methods(ax, runs[task], score_key, colors, None)
        ax.set_title(task)
    return _save(fig, path)


def score_bars(rows: Sequence[dict], path: str | Path, metric: str = "final_score") -> Path:
    """Grouped bars of `metric` per task and method with 95% CI whiskers (rows from summarize)."""
    tasks = sorted({row["task"] for row in rows})
    methods = sorted({row["method"] for row in rows})
    colors = method_colors(methods)
    width = 0.8 / max(1, len(methods))
    fig = Figure(figsize=(max(6.0, 1.2 * len(tasks) * max(1, len(methods)) + 2), 4.5),
                 layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for offset, method in enumerate(methods):
        xs, means, errors = [], [], [[], []]
        for task_index, task in enumerate(tasks):
            row = next((r for r in rows if r["task"] == task and r["method"] == method), None)
            if row is None or row.get(f"{metric}_mean") is None:
                continue
            mean = row[f"{metric}_mean"]
            xs.append(task_index + (offset - (len(methods) - 1) / 2) * width)
            means.append(mean)
            errors[0].append(mean - row[f"{metric}_low"])
            errors[1].append(row[f"{metric}_high"] - mean)
        ax.bar(xs, means, width=width, yerr=errors, capsize=3, color=colors[method], label=method)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel(f"{metric} (mean, 95% CI over seeds)")
    ax.set_title(f"{metric} per task")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)
