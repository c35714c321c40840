"""RunLogger on real files: JSONL always, wandb when it works, nothing lost either way."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from embodied.logging import RunLogger, read_metrics


@pytest.fixture(autouse=True)
def quiet_wandb(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))


@pytest.mark.slow
def test_lines_are_flushed_before_close_and_scalars_become_numbers(tmp_path):
    torch = pytest.importorskip("torch")
    logger = RunLogger(tmp_path, {"lr": 3e-4})
    logger.log({"eval/score": np.float32(1.5), "loss": torch.tensor(0.25), "n": np.int64(3)},
               step=10, phase="offline", kind="eval")
    lines = read_metrics(tmp_path)  # read while the logger is still open
    assert lines == [{"step": 10, "phase": "offline", "kind": "eval", "eval/score": 1.5,
                      "loss": 0.25, "n": 3, "total_step": 10}]
    logger.close()
    assert not (tmp_path / "wandb").exists()


def test_online_lines_count_total_steps_after_offline_ones(tmp_path):
    with RunLogger(tmp_path, {}) as logger:
        logger.log({"eval/score": 1.0}, step=1000, phase="offline", kind="eval")
        logger.log({}, step=0, phase="online", kind="switch")
        logger.log({"eval/score": 2.0}, step=500, phase="online", kind="eval")
    assert [line["total_step"] for line in read_metrics(tmp_path)] == [1000, 1000, 1500]


@pytest.mark.slow
def test_killed_run_keeps_its_lines(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        from embodied.logging import RunLogger
        logger = RunLogger({str(tmp_path)!r}, {{}}, enabled_wandb=False)
        for step in range(3):
            logger.log({{"eval/score": float(step)}}, step=step, phase="online", kind="eval")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert result.returncode != 0
    assert [line["eval/score"] for line in read_metrics(tmp_path)] == [0.0, 1.0, 2.0]


def test_reopening_appends_and_repairs_a_cut_last_line(tmp_path):
    with RunLogger(tmp_path, {}) as logger:
        logger.log({"a": 1}, step=5, phase="offline", kind="train")
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 6, "pha')  # what a kill mid-write leaves behind
    with RunLogger(tmp_path, {}) as logger:
        record = logger.log({"a": 2}, step=1, phase="online", kind="train")
    assert record["total_step"] == 6  # offline steps recovered from the file
    assert [line["a"] for line in read_metrics(tmp_path)] == [1, 2]


def test_truncate_after_drops_later_lines(tmp_path):
    logger = RunLogger(tmp_path, {})
    for step in (100, 200, 300):
        logger.log({"x": step}, step=step, phase="offline", kind="train")
    for step in (50, 100):
        logger.log({"x": step}, step=step, phase="online", kind="train")
    assert logger.truncate_after(350) == 1  # total_step: online 100 -> 400
    assert logger.truncate_after(50, phase="online") == 0
    assert logger.truncate_after(200, phase="offline") == 2  # offline 300 and online 50
    logger.log({"x": 7}, step=10, phase="online", kind="train")
    logger.close()
    lines = read_metrics(tmp_path)
    assert [(line["phase"], line["step"]) for line in lines] == [
        ("offline", 100), ("offline", 200), ("online", 10)]
    assert lines[-1]["total_step"] == 210


def test_summary_written_atomically_as_json(tmp_path):
    with RunLogger(tmp_path, {}) as logger:
        logger.summary({"env": "hopper", "final_score": np.float64(81.25), "episodes": 20})
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "env": "hopper", "final_score": 81.25, "episodes": 20}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_environment_mode_overrides_config(tmp_path, monkeypatch):
    # WANDB_MODE=disabled (fixture) beats wandb_mode="online": no network, no wandb files
    with RunLogger(tmp_path, {}, wandb_mode="online") as logger:
        assert logger.wandb_mode == "disabled"
        logger.log({"a": 1}, step=0, phase="online", kind="train")
    assert not (tmp_path / "wandb").exists()


def test_wandb_init_failure_warns_once_and_keeps_jsonl(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")

    def broken_init(**kwargs):
        raise RuntimeError("no wandb today")

    monkeypatch.setattr(wandb, "init", broken_init)
    with pytest.warns(UserWarning, match="no wandb today") as caught:
        with RunLogger(tmp_path, {}) as logger:
            logger.log({"a": 1}, step=0, phase="online", kind="train")
            logger.summary({"final_score": 1.0})
    assert len([w for w in caught if "wandb" in str(w.message)]) == 1
    assert read_metrics(tmp_path)[0]["a"] == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_offline_wandb_writes_local_run_and_resumes_same_id(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE")
    run_dir = tmp_path / "run"
    for _ in range(2):  # second pass = resume into the same run dir
        with RunLogger(run_dir, {"seed": 0}, wandb_mode="offline", name="t") as logger:
            logger.log({"eval/score": 3.0}, step=1, phase="online", kind="eval")
            logger.summary({"final_score": 3.0})
    run_id = (run_dir / ".wandb_run_id").read_text().strip()
    offline_runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    # both passes log to the same run id (wandb adds "-1" to the folder when both start in one second)
    assert offline_runs and all(f"-{run_id}" in path.name for path in offline_runs)
    assert list(offline_runs[0].glob("*.wandb"))
    assert len(read_metrics(run_dir)) == 2
