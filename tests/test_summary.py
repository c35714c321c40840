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
    assert "| method | task | score | seeds | episodes/eval | offline → online |" in printed
    assert "| wsrl | hopper | ? | 3 | 20 | 42.5 [" in printed
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


@pytest.mark.slow
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


# -- failed, unfinished and never-started jobs; distinct seeds; approximate scores; the switch ---------------

def write_status(job_dir, status, num, overrides, error=None):
    job_dir.mkdir(parents=True, exist_ok=True)
    record = {"status": status, "job_num": num, "overrides": overrides}
    if error:
        record["error"] = error
    (job_dir / "status.json").write_text(json.dumps(record))


def test_failed_unfinished_and_missing_jobs_are_listed_and_fail_the_exit_status(tmp_path, capsys):
    root = tmp_path / "sweep"
    jobs = [[f"algo.utd={utd}", "seed=0"] for utd in (1, 2, 0, 3)]
    (root).mkdir()
    (root / "jobs.json").write_text(json.dumps({"jobs": [{"num": i, "overrides": o} for i, o in enumerate(jobs)]}))
    write_run(root / "0_a", "hopper", 0, 80.0, algo="sac", overrides=["algo.utd=1"])
    write_status(root / "0_a", "done", 0, jobs[0])
    write_run(root / "1_b", "hopper", 0, 70.0, algo="sac", overrides=["algo.utd=2"])
    write_status(root / "1_b", "running", 1, jobs[1])
    (root / "1_b" / "summary.json").unlink()  # killed before it finished
    write_status(root / "2_c", "failed", 2, jobs[2], error="algo.utd=0 must be an integer >= 1; set algo.utd=1")
    # job 3 never started: only jobs.json knows it
    with pytest.raises(SystemExit) as exit_info:
        main([str(root)])
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert "## Jobs that did not finish: 3 of 4" in captured.out
    assert "| 2_c | algo.utd=0 | failed | algo.utd=0 must be an integer >= 1; set algo.utd=1 |" in captured.out
    assert "| 1_b | algo.utd=2 | not finished (killed, or still running) |" in captured.out
    assert "| 3 (no run dir) | algo.utd=3 | never started |" in captured.out
    assert "| sac | hopper |" in captured.out  # the finished job is still summarised
    assert "3 of 4 jobs did not finish" in captured.err
    assert "Jobs that did not finish" in (root / "summary.md").read_text()


def test_a_sweep_where_every_job_failed_lists_them_without_a_table(tmp_path, capsys):
    root = tmp_path / "sweep"
    write_status(root / "0_a", "failed", 0, ["dataset.path=/x.hdf5"], error="dataset.path=/x.hdf5 does not exist")
    with pytest.raises(SystemExit) as exit_info:
        main([str(root)])
    assert exit_info.value.code == 1
    assert "dataset.path=/x.hdf5 does not exist" in capsys.readouterr().out


def test_seeds_are_counted_once_and_repeats_are_marked(tmp_path, capsys):
    root = tmp_path / "sweep"
    for job, seed in enumerate([0, 0, 1]):
        write_run(root / str(job), "hopper", seed, 80.0 + job, algo="sac")
    row = summarize(root)[0]
    assert (row["seeds"], row["runs"]) == (2, 3)
    main([str(root)])
    printed = capsys.readouterr().out
    assert "| sac | hopper | ? | 2 (3 runs) |" in printed and "repeat a seed" in printed


def test_approximate_scores_are_marked(tmp_path, capsys):
    root = tmp_path / "sweep"
    write_run(root / "0", "hopper", 0, 80.0, algo="sac")
    write_run(root / "1", "pointmaze-umaze", 0, 50.0, algo="sac")
    for job, approx in (("0", True), ("1", False)):
        path = root / job / "summary.json"
        summary = json.loads(path.read_text())
        summary.update(score_kind="d4rl_normalized", approximate_normalization=approx)
        path.write_text(json.dumps(summary))
    main([str(root)])
    printed = capsys.readouterr().out
    assert "| sac | hopper | normalised ≈ |" in printed and "| sac | pointmaze-umaze | normalised |" in printed
    assert "≈: D4RL-normalised on gymnasium v5 physics" in printed


def test_each_methods_switch_is_marked_in_the_curves(tmp_path):
    """Methods that switch at different steps each get their dashed line (the shared-switch-only plot drew none)."""
    from matplotlib.figure import Figure

    from embodied.summary import draw_task_curves, summarize_runs, find_runs

    root = tmp_path / "sweep"
    write_run(root / "0", "hopper", 0, 80.0, preset="wsrl", algo="cql")
    late = write_run(root / "1", "hopper", 0, 60.0, preset="calql", algo="cql")
    for line in late:  # this method pretrains 500 steps longer
        if line["kind"] == "switch" or line["phase"] == "online":
            line["total_step"] += 500
    (root / "1" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in late))
    rows = {row["method"]: row for row in summarize_runs(find_runs(root)[0])}
    assert rows["wsrl"]["switch_steps"] == [OFFLINE_STEPS] and rows["calql"]["switch_steps"] == [OFFLINE_STEPS + 500]
    ax = Figure().add_subplot()
    runs = {m: [[json.loads(x) for x in (root / d / "metrics.jsonl").read_text().splitlines()]]
            for m, d in (("wsrl", "0"), ("calql", "1"))}
    drawn = draw_task_curves(ax, runs, {m: rows[m]["switch_steps"] for m in rows}, {"wsrl": "C0", "calql": "C1"})
    assert drawn == [OFFLINE_STEPS, OFFLINE_STEPS + 500]
    vertical = sorted(line.get_xdata()[0] for line in ax.lines if len(set(line.get_xdata())) == 1)
    assert vertical == [OFFLINE_STEPS, OFFLINE_STEPS + 500]
    assert any("calql" in text.get_text() for text in ax.texts)


def test_a_run_without_pretraining_has_no_switch(tmp_path):
    root = tmp_path / "sweep"
    write_run(root / "0", "hopper", 0, 80.0, algo="sac")
    path = root / "0" / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "offline_algo": None}))
    assert summarize(root)[0]["switch_steps"] == []


def test_the_online_panel_starts_every_method_at_online_step_zero(tmp_path):
    """A from-scratch run and a pretrained one share x = 0 in the online panel; on total steps they do not."""
    from embodied.summary import sweep_curves

    pretrained = write_run(tmp_path / "0", "hopper", 0, 80.0, preset="wsrl", algo="cql")
    scratch = [{**line, "total_step": line["step"]} for line in write_run(tmp_path / "1", "hopper", 0, 60.0)
               if line["phase"] == "online"]
    online = plots.online_view(pretrained)
    assert [line["total_step"] for line in online if line["kind"] == "eval"][:2] == [100, 200]
    assert all(line["phase"] == "online" for line in online)
    xs_pretrained, *_ = plots.mean_band([online])
    xs_scratch, *_ = plots.mean_band([plots.online_view(scratch)])
    assert xs_pretrained[0] == xs_scratch[0] == 100 and xs_pretrained[-1] == xs_scratch[-1] == ONLINE_STEPS
    assert plots.mean_band([pretrained])[0][-1] == OFFLINE_STEPS + ONLINE_STEPS  # the total-step panel is unchanged

    path = sweep_curves({"hopper": {"wsrl": [pretrained], "scratch": [scratch]}},
                        {"hopper": {"wsrl": [OFFLINE_STEPS]}}, tmp_path / "curves.png")
    assert path.stat().st_size > 0
