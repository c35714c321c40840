"""The sweep summary and plots, run on a small sweep directory laid out like a Hydra multirun."""
import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from embodied import plots
from embodied.errors import UserError
from embodied.summary import main, summarize

OFFLINE_STEPS, ONLINE_STEPS = 1000, 2000


def write_run(job_dir, env, seed, final, preset=None, algo="sac", overrides=(), success=False,
              episodes=20):
    """One finished job: summary.json, metrics.jsonl with an eval curve, Hydra overrides."""
    job_dir.mkdir(parents=True)
    (job_dir / ".hydra").mkdir()
    lines = [f"env={env}", f"seed={seed}", f"algo={algo}", *overrides]
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {line}\n" for line in lines))
    offline_score = final / 2
    metrics = []
    for step in range(0, OFFLINE_STEPS + 1, 250):
        metrics.append({"step": step, "phase": "offline", "kind": "eval", "total_step": step,
                        "eval/score": offline_score * step / OFFLINE_STEPS})
    metrics.append({"step": 0, "phase": "online", "kind": "switch", "total_step": OFFLINE_STEPS})
    for step in range(100, ONLINE_STEPS + 1, 100):
        score = offline_score + (final - offline_score) * step / ONLINE_STEPS - (5 if step == 100 else 0)
        line = {"step": step, "phase": "online", "kind": "eval",
                "total_step": OFFLINE_STEPS + step, "eval/score": score}
        if success:
            line["eval/success"] = min(1.0, score / 100)
        metrics.append(line)
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    summary = {"env": env, "algo": algo, "preset": preset, "seed": seed,
               "offline_score": offline_score, "online_score": final, "final_score": final,
               "best_score": final + 1, "dip": -5.0, "episodes": episodes}
    if success:
        summary.update(offline_success=offline_score / 100, online_success=final / 100)
    (job_dir / "summary.json").write_text(json.dumps(summary))
    return metrics


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "multirun" / "2026-01-01" / "12-00-00"
    job = iter(range(100))
    for seed, final in enumerate([80.0, 90.0, 85.0]):
        write_run(root / str(next(job)), "hopper", seed, final, preset="wsrl", algo="cql")
    for seed, final in enumerate([60.0, 70.0]):
        for utd in (1, 4):
            write_run(root / str(next(job)), "hopper", seed, final + utd, algo="sac",
                      overrides=[f"agent.utd={utd}"])
    write_run(root / "nested" / "0", "pointmaze-umaze", 0, 50.0, preset="wsrl", success=True,
              episodes=10)
    return root


def test_summarize_groups_by_task_and_method(sweep):
    rows = {(row["task"], row["method"]): row for row in summarize(sweep)}
    assert set(rows) == {("hopper", "wsrl"), ("hopper", "sac [agent.utd=1]"),
                         ("hopper", "sac [agent.utd=4]"), ("pointmaze-umaze", "wsrl")}
    wsrl = rows[("hopper", "wsrl")]
    assert wsrl["seeds"] == 3 and wsrl["seed_list"] == ["0", "1", "2"]
    assert wsrl["final_score_mean"] == pytest.approx(85.0)
    assert wsrl["offline_score_mean"] == pytest.approx(42.5)
    assert 80.0 <= wsrl["final_score_low"] <= 85.0 <= wsrl["final_score_high"] <= 90.0
    assert wsrl["dip_low"] == wsrl["dip_high"] == -5.0
    maze = rows[("pointmaze-umaze", "wsrl")]
    assert maze["online_success_mean"] == pytest.approx(0.5)
    assert maze["final_score_low"] == maze["final_score_high"] == 50.0  # one seed


def test_cli_writes_table_csv_and_plots(sweep, tmp_path, capsys):
    out = tmp_path / "report"
    main([str(sweep), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "| method | task | seeds | episodes/eval | offline → online |" in printed
    assert "| wsrl | hopper | 3 | 20 | 42.5 [" in printed
    assert "10 (<20)" in printed  # the maze run used too few eval episodes
    assert (out / "summary.md").read_text().count("\n| ") == 5  # header + 4 rows
    with open(out / "summary.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 and float(rows[0]["final_score_mean"]) > 0
    for name in ("summary_bars.png", "summary_curves.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_unknown_metric_is_a_user_error(sweep):
    with pytest.raises(UserError, match="choose one of"):
        summarize(sweep, metric="no_such_score")


def test_unreadable_summary_is_skipped_not_fatal(sweep, capsys):
    (sweep / "broken").mkdir()
    (sweep / "broken" / "summary.json").write_text("{not json")
    main([str(sweep)])
    assert "warning: skipped" in capsys.readouterr().err


@pytest.mark.parametrize("make_dir", [True, False])
def test_cli_error_on_empty_or_missing_dir(tmp_path, make_dir):
    target = tmp_path / "sweep"
    if make_dir:
        target.mkdir()
    result = subprocess.run([sys.executable, "-m", "embodied.summary", str(target)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    assert ("summary.json" if make_dir else "does not exist") in result.stderr


def test_learning_curve_png(tmp_path):
    metrics = write_run(tmp_path / "run", "pointmaze-umaze", 0, 80.0, success=True)
    path = plots.learning_curve(metrics, tmp_path / "curve.png", None, title="pointmaze-umaze")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert plots.find_switch_step(metrics) == OFFLINE_STEPS
    empty = plots.learning_curve([], tmp_path / "empty.png", None, title="nothing yet")
    assert empty.exists()


def test_mean_band_covers_runs_and_tolerates_short_runs(tmp_path):
    full = [{"kind": "eval", "total_step": s, "eval/score": float(s)} for s in (0, 10, 20)]
    higher = [{**line, "eval/score": line["eval/score"] + 2} for line in full]
    short = full[:2]
    xs, mean, low, high = plots.mean_band([full, higher, short])
    assert list(xs) == [0, 10, 20]
    assert mean[-1] == pytest.approx(21.0)  # the short run does not reach step 20
    assert np.all(low <= mean) and np.all(mean <= high)
