"""The main job end to end: Hydra composition, every preset on a tiny budget, the CLI, bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

import policies
import sims
from embodied.train import CONF_DIR, GROUPS, group_options, run

REPO = Path(__file__).resolve().parents[1]
# the VLA presets train on a suite: tests/agents/test_vla_bc.py, test_vla_qc.py, test_vla_ppo.py
PRESETS = [p for p in group_options("algo") if not p.startswith("vla_")]


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("embodied_cache")


@pytest.fixture(autouse=True)
def _cache(cache_dir, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(cache_dir))


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS)
def test_every_config_composes_and_resolves(group):
    from omegaconf import OmegaConf

    for option in group_options(group):
        cfg = compose_train([f"{group}={option}"])
        resolved = OmegaConf.to_container(cfg, resolve=True)
        assert resolved["env"]["name"] and resolved["algo"]["name"]


def smoke_overrides(preset: str, env: str = "pointmaze-umaze") -> list[str]:
    return [f"algo={preset}", f"env={env}", "experiment=smoke", "dataset=medium-replay"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_end_to_end(preset, tmp_path):
    cfg = compose_train(smoke_overrides(preset) + ["log_every=20"])  # a train record every 20 gradient steps
    summary = run(cfg, tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["algo"] == preset and written["online_steps"] == 300
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    online_evals = [line for line in lines if line["kind"] == "eval" and line["phase"] == "online"]
    assert online_evals[-1]["step"] == 300 and 0.0 <= online_evals[-1]["eval/success"] <= 1.0
    if cfg.algo.offline_algo:
        assert summary["offline_score"] is not None
        # the offline phase took its whole budget of gradient steps, logging every log_every of them
        offline_train = [line["step"] for line in lines if line["phase"] == "offline" and line["kind"] == "train"]
        assert offline_train == list(range(cfg.log_every, cfg.budget.offline_steps + 1, cfg.log_every))
        assert max(line["step"] for line in lines if line["phase"] == "offline") == cfg.budget.offline_steps
        assert written["offline_steps"] == cfg.budget.offline_steps
        assert "switch/action_distance" in online_evals[-1]
    else:
        assert summary["offline_score"] is None and summary["dip"] is None
    if cfg.algo.online_algo == "sac":
        assert "switch/calibration_gap" in online_evals[-1]


@pytest.mark.slow
def test_dense_locomotion_preset_with_video(tmp_path):
    """CQL pretraining -> WSRL on Hopper from random data, with an mp4 of the final policy."""
    overrides = smoke_overrides("wsrl", env="hopper")
    overrides = [o for o in overrides if not o.startswith("dataset=")] + ["dataset=random", "eval.video_episodes=1",
                                                                            "eval.video_size=64"]
    summary = run(compose_train(overrides), tmp_path)
    assert summary["offline_algo"] == "cql"
    assert summary["score_kind"] == "d4rl_normalized" and summary["approximate_normalization"] is True
    assert Path(summary["video"]).stat().st_size > 1000


@pytest.mark.slow
def test_env_options_reach_the_data_the_online_envs_and_the_evaluation(tmp_path):
    """env=mt10 with task 6 and the success reward: a return above 1 anywhere means an env without the options."""
    overrides = smoke_overrides("qc_fql", env="mt10")
    overrides = [o for o in overrides if not o.startswith("dataset=")] + [
        "dataset=task", "dataset.size=400", "env.options.task_id=6", "env.options.reward=success", "log_every=30"]
    run(compose_train(overrides), tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [line for line in lines if line["kind"] == "eval"]
    episodes = [line["online/episode_return"] for line in lines if "online/episode_return" in line]
    assert evals and all(0.0 <= line["eval/return"] <= 1.0 for line in evals)
    assert episodes and all(r in (0.0, 1.0) for r in episodes)
    assert "task_id: 6" in (tmp_path / "config.yaml").read_text()
    from embodied.agents.runner import Runner, RunnerConfig
    from embodied.errors import ConfigError
    from sims.source import EnvSource

    with pytest.raises(ConfigError, match="same task and options"):
        Runner(RunnerConfig(env="mt10", offline_algo=None, env_options={"task_id": 6}), None, tmp_path / "x", None,
               envs=EnvSource("mt10"))


def cli(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "embodied.train", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_the_main_job_runs_from_the_command_line_at_a_tiny_budget(tmp_path, monkeypatch):
    """`bash run.sh train` is `python -m embodied.train` with the default experiment: InvertedPendulum
    medium-replay generated from the committed experts, CQL, WSRL, and the end-of-offline -> online table."""
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run_dir = tmp_path / "run"
    result = cli("dataset.size=3000", "budget.offline_steps=20", "budget.online_steps=200", "budget.warmup_steps=50",
                 "eval.episodes=2", "eval.every_offline=20", "eval.every_online=100", "eval.video_episodes=0",
                 "checkpoint.every=0", "progress=false", "bf16=false", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == "inverted-pendulum" and summary["algo"] == "wsrl" and summary["offline_algo"] == "cql"
    assert summary["score_kind"] == "d4rl_normalized" and summary["approximate_normalization"] is False
    assert summary["offline_steps"] == 20 and summary["online_steps"] == 200
    assert (tmp_path / "cache" / "datasets" / "inverted-pendulum-medium-replay-3000-s0.hdf5").is_file()
    assert "wsrl on inverted-pendulum (seed 0)" in result.stdout
    assert "| end of offline | end of online |" in result.stdout


@pytest.mark.slow
def test_the_main_job_runs_on_pendulum_from_its_committed_experts(tmp_path, monkeypatch):
    """`env=pendulum`, the smooth-scored task measured against the main job's (benchmarks/RESULTS.md): its
    medium-replay data comes from the committed pendulum snapshots, and the run writes an eval video."""
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run_dir = tmp_path / "run"
    result = cli("env=pendulum", "dataset.size=1000", "budget.offline_steps=20", "budget.online_steps=200",
                 "budget.warmup_steps=50", "eval.episodes=2", "eval.every_offline=20", "eval.every_online=100",
                 "eval.video_episodes=1", "checkpoint.every=0", "progress=false", "bf16=false",
                 f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == "pendulum" and summary["offline_algo"] == "cql" and summary["online_steps"] == 200
    assert -50 < summary["final_score"] < 101  # normalised: 0 = uniform random actions, 100 = return 0
    assert (tmp_path / "cache" / "datasets" / "pendulum-medium-replay-1000-s0.hdf5").is_file()
    assert list((run_dir / "videos").glob("*.mp4")), "no eval video was written"


@pytest.mark.slow
def test_bad_override_lists_valid_choices(tmp_path):
    result = cli("algo=wsrll", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "algo=wsrll" in lines[0] and "wsrl" in lines[0] and "scratch" in lines[0]
    assert "Traceback" not in result.stderr


BAD_DATASETS = {  # what is wrong -> the key the one-line error must name
    "wrong_action_dim": "actions",
    "missing_key": "rewards",
    "mismatched_lengths": "terminals",
    "nan": "observations",
}


@pytest.mark.slow
@pytest.mark.parametrize("defect", sorted(BAD_DATASETS))
def test_bad_dataset_is_one_line_error(defect, tmp_path):
    import h5py

    arrays = {"observations": np.zeros((10, 6), np.float32), "actions": np.zeros((10, 2), np.float32),
              "rewards": np.zeros(10, np.float32), "terminals": np.zeros(10, bool), "timeouts": np.zeros(10, bool)}
    arrays["timeouts"][-1] = True
    if defect == "wrong_action_dim":  # PointMaze has 2-d actions
        arrays["actions"] = np.zeros((10, 3), np.float32)
    elif defect == "missing_key":
        del arrays["rewards"]
    elif defect == "mismatched_lengths":
        arrays["terminals"] = np.zeros(9, bool)
    elif defect == "nan":
        arrays["observations"][4, 2] = np.nan
    path = tmp_path / "bad.hdf5"
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f[key] = value
    result = cli("experiment=smoke", f"dataset.path={path}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and BAD_DATASETS[defect] in error[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_cli_main_job_and_kill_resume(tmp_path, cache_dir):
    """Run the CLI with non-default overrides and checkpoints, kill it hard mid-online, resume it with the README's
    command alone (the run's saved config, not the defaults: smoke's [64, 64] networks against the default
    [256, 256]), and finish with one clean history. Then: an override that would change the run, and a truncated
    replay file, are refused with one line and leave every file of the run as it was."""
    import os
    import signal
    import time

    run_dir = tmp_path / "run"
    args = ["experiment=smoke", "budget.offline_steps=200", "budget.online_steps=600",
            "checkpoint.every=100", "eval.every_offline=100", "eval.every_online=100", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "EMBODIED_CACHE": str(cache_dir)}
    process = subprocess.Popen([sys.executable, "-m", "embodied.train", *args], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    checkpoints = run_dir / "checkpoints"
    # kill once a checkpoint of the online phase exists (total step > offline steps)
    while time.time() < deadline:
        done = sorted(checkpoints.glob("step_*")) if checkpoints.exists() else []
        if any(int(p.name.split("_")[1]) >= 400 for p in done) or process.poll() is not None:
            break
        time.sleep(0.2)
    assert process.poll() is None, "run finished before it could be killed; raise its budget"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (run_dir / "summary.json").exists()
    assert json.loads((run_dir / "status.json").read_text())["status"] == "running"
    started = {name: (run_dir / name).read_bytes()
               for name in ("config.yaml", ".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml")}

    resume = ["resume=true", f"hydra.run.dir={run_dir}"]
    result = subprocess.run([sys.executable, "-m", "embodied.train", *resume], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resumed from" in result.stdout and "phase online" in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["online_steps"] == 600 and summary["offline_steps"] == 200
    assert json.loads((run_dir / "policy" / "config.json").read_text())["config"]["hidden"] == [64, 64]
    assert json.loads((run_dir / "status.json").read_text())["status"] == "done"
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(line["phase"], line["step"]) for line in lines if line["kind"] == "eval"]
    assert len(evals) == len(set(evals)), "resume duplicated eval records"
    assert ("online", 600) in evals and ("offline", 200) in evals
    assert {name: (run_dir / name).read_bytes() for name in started} == started  # the run's config files as they were

    def refused(*extra: str) -> str:
        before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
        result = subprocess.run([sys.executable, "-m", "embodied.train", *resume, *extra], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, result.stderr[-2000:]
        error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
        after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "train.log"}
        assert after == {p: v for p, v in before.items() if p.name != "train.log"}, "a refused resume wrote files"
        return error[0]

    (run_dir / "status.json").write_text(json.dumps({"status": "running"}))  # as if killed again: resume must act
    assert "algo.utd=2 changes it (algo.utd: run 1, given 2)" in refused("algo.utd=2")
    # a truncated replay archive is refused with one line, not a BadZipFile traceback
    latest = sorted(checkpoints.glob("step_*"))[-1]
    replay = latest / "replay_online.npz"
    replay.write_bytes(replay.read_bytes()[:2000])
    error = refused()
    assert "replay_online.npz is corrupt or truncated (BadZipFile" in error and "to resume from step_" in error
    (latest / "model.safetensors").write_bytes(b"not a safetensors file")
    assert "model.safetensors is corrupt" in refused()


@pytest.mark.slow
def test_resume_of_a_finished_run_changes_nothing(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    assert cli("experiment=smoke", "algo=scratch", f"hydra.run.dir={run_dir}", cwd=tmp_path).returncode == 0
    before = (run_dir / "metrics.jsonl").read_bytes()
    result = cli("resume=true", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0 and "already finished" in result.stdout
    assert (run_dir / "metrics.jsonl").read_bytes() == before


FAILING_SWEEP = ["experiment=smoke", "algo=scratch", "algo.utd=1,2,0"]  # job 2 has a bad value


def check_failing_sweep(result: subprocess.CompletedProcess, sweep: Path) -> None:
    """Two jobs finished, the bad one failed alone with its error recorded, the sweep's rc says so, the summary
    lists it."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "WorkerCrashedError" not in result.stderr, result.stderr[-3000:]
    assert "3 jobs, 2 done, 1 failed" in result.stderr
    summaries = sorted(json.loads(p.read_text())["final_score"] is not None for p in sweep.rglob("summary.json"))
    assert summaries == [True, True]
    statuses = {json.loads(p.read_text())["job_num"]: json.loads(p.read_text()) for p in sweep.rglob("status.json")}
    assert {k: v["status"] for k, v in statuses.items()} == {0: "done", 1: "done", 2: "failed"}
    assert statuses[2]["error"].startswith("algo.utd=0 must be an integer >= 1")
    assert "failed: 2_pointmaze-umaze_scratch_s0 [algo.utd=0]: algo.utd=0 must be an integer >= 1" in result.stderr
    summary = subprocess.run([sys.executable, "-m", "embodied.summary", str(sweep)], capture_output=True, text=True,
                             timeout=120)
    assert summary.returncode == 1, summary.stderr
    assert "## Jobs that did not finish: 1 of 3" in summary.stdout
    assert "| algo.utd=0 | failed | algo.utd=0 must be an integer >= 1; set algo.utd=1 |" in summary.stdout
    assert "scratch [algo.utd=1]" in summary.stdout and "scratch [algo.utd=2]" in summary.stdout


@pytest.mark.slow
def test_multirun_sweep_and_summary(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = cli("-m", "experiment=smoke", "algo=naive,scratch", "seed=0,1",
                 f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list(sweep.rglob("summary.json"))) == 4
    summary = subprocess.run([sys.executable, "-m", "embodied.summary", str(sweep)], capture_output=True, text=True,
                             timeout=120)
    assert summary.returncode == 0, summary.stderr
    assert "naive" in summary.stdout and "scratch" in summary.stdout
    assert (sweep / "summary.md").exists() and (sweep / "summary.csv").exists()
    assert "| naive | pointmaze-umaze | normalised | 2 |" in summary.stdout  # seeds 0 and 1


@pytest.mark.slow
def test_a_failing_job_fails_alone_with_the_basic_launcher(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = cli("-m", *FAILING_SWEEP, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    check_failing_sweep(result, sweep)


@pytest.mark.slow
def test_a_typo_in_a_sweep_key_stops_it_before_any_job(tmp_path):
    result = cli("-m", "experiment=smoke", "algo=naive,scratch", "algo.utdd=4", f"hydra.sweep.dir={tmp_path / 's'}",
                 cwd=tmp_path)
    assert result.returncode == 2 and "did you mean algo.utd?" in result.stderr and not (tmp_path / "s").exists()


@pytest.mark.slow
def test_resumed_sweep_skips_finished_jobs_and_runs_the_rest(tmp_path, cache_dir):
    """Re-running a sweep's command with resume=true: a finished job is left as it was, a job that never started
    runs now (and gets the .hydra/ files Hydra, told not to touch the existing jobs' ones, did not write)."""
    import shutil

    sweep = tmp_path / "sweep"
    command = ["-m", "experiment=smoke", "algo=scratch", "seed=0,1", f"hydra.sweep.dir={sweep}"]
    assert cli(*command, cwd=tmp_path, timeout=600).returncode == 0
    first, second = sorted(p for p in sweep.iterdir() if p.is_dir())
    kept = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    shutil.rmtree(second)
    result = cli(*command, "resume=true", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "already finished" in result.stdout
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == kept
    assert json.loads((second / "status.json").read_text())["status"] == "done"
    assert "seed=1" in (second / ".hydra" / "overrides.yaml").read_text()
    assert "seed: 1" in (second / ".hydra" / "config.yaml").read_text()


@pytest.mark.slow
def test_multirun_on_a_local_ray_instance(tmp_path, cache_dir):
    """The path to a cluster: the same failing sweep through hydra-ray-launcher on a Ray instance it starts. The bad
    job returns its error instead of exiting, so Ray has no crashed worker to retry (it retried 3 times, then
    ended the sweep with a WorkerCrashedError traceback)."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    sweep = tmp_path / "sweep"
    result = cli("-m", "hydra/launcher=ray_local", "hydra.launcher.ray.init.num_cpus=2", *FAILING_SWEEP,
                 f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    check_failing_sweep(result, sweep)
    assert result.stderr.count("error: algo.utd=0") + result.stdout.count("error: algo.utd=0") <= 1  # not retried


def test_bf16_setting():
    from embodied.errors import ConfigError
    from embodied.run_config import resolve_bf16

    assert resolve_bf16(True, "cpu") is True and resolve_bf16(False, "cuda") is False
    assert resolve_bf16("auto", "cuda:0") is False  # launch-bound at these sizes: measured slower on an H200
    assert resolve_bf16(True, "cuda:0") is True
    assert isinstance(resolve_bf16("auto", "cpu"), bool)
    with pytest.raises(ConfigError, match="bf16=maybe"):
        resolve_bf16("maybe", "cpu")


# -- CUDA: the same presets on a GPU. Skipped without one; benchmarks/gpu_check.sh runs them on a lent GPU
# machine. EMBODIED_TEST_DEVICE=cpu runs the identical checks on the CPU (how they are checked without a GPU).
TEST_DEVICE = os.environ.get("EMBODIED_TEST_DEVICE", "cuda")
needs_device = pytest.mark.skipif(TEST_DEVICE.startswith("cuda") and not torch.cuda.is_available(),
                                  reason="needs a CUDA device (benchmarks/gpu_check.sh runs these on a GPU machine)")


@pytest.mark.slow
@needs_device
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_on_cuda(preset, tmp_path):
    """Hopper (MuJoCo only, no extra sim packages) at the smoke budget, every network on the device; the
    saved policy loads on the CPU and acts like the trained one did on the device."""
    cfg = compose_train(smoke_overrides(preset, env="hopper") + [f"device={TEST_DEVICE}"])
    summary = run(cfg, tmp_path)
    assert np.isfinite(summary["online_score"]), summary
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [line for line in lines if line["kind"] == "train"]
    assert train and all(np.isfinite(v) for line in train for k, v in line.items() if isinstance(v, float))
    env = sims.make("hopper")
    obs = env.reset(seed=0)[0]
    env.close()
    actions = {}
    for device in (TEST_DEVICE, "cpu"):
        policy = policies.load(tmp_path / "policy", device=device)
        actions[device] = policy.act(obs, deterministic=True)
        assert actions[device].shape[-1] == 3 and np.all(np.abs(actions[device]) <= 1.0 + 1e-6), actions[device]
    if policy.name == "gaussian":  # generative policies draw their noise from the device's own generator
        np.testing.assert_allclose(actions[TEST_DEVICE], actions["cpu"], atol=1e-3)
