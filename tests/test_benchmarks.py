"""Every benchmark script runs end to end on a seconds-long budget (the real runs are documented in
benchmarks/RESULTS.md); peers that are not installed are skipped by the scripts themselves."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import policies
from embodied.data.d4rl import save_hdf5
from embodied.data.dataset import Dataset

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # every test here runs a script in a subprocess


def test_update_speed_quick(tmp_path, run_benchmark):
    result = run_benchmark("update_speed.py", "--quick", "--threads", "1", "--out", str(tmp_path))
    assert "ours SAC 2 critics fp32" in result.stdout and "goals" in result.stdout
    assert "matmuls only, SAC 2 critics fp32" in result.stdout
    # the SB3 row and its ceiling line exactly when stable-baselines3 (extra `bench`) is installed, else a skip note
    sb3 = importlib.util.find_spec("stable_baselines3") is not None
    assert ("\nSB3 SAC " in result.stdout) == sb3
    assert ("ceiling: our matmuls alone / SB3 SAC" in result.stdout) == sb3
    assert ("skipping SB3 SAC: " in result.stderr) == (not sb3)
    assert not list(tmp_path.glob("update_speed-*.json"))  # a smoke run never overwrites real results


def test_update_speed_layernorm_path_quick(tmp_path, run_benchmark):
    result = run_benchmark("update_speed.py", "--quick", "--layernorm-path", "--threads", "1", "--out", str(tmp_path))
    for size in ("CQL+LN Hopper sizes", "main job CQL"):
        assert f"{size}, ours" in result.stdout and f"{size}, torch-native" in result.stdout
        assert f"  {size}: ours / torch-native = " in result.stdout
    assert not list(tmp_path.glob("update_speed-*.json"))


def test_bf16_check_quick(tmp_path, run_benchmark):
    run_benchmark("bf16_check.py", "--steps", "300", "--random-steps", "200", "--seeds", "1", "--batch-size", "32",
           "--eval-episodes", "1", "--threads", "1", "--out", str(tmp_path))
    (out,) = tmp_path.glob("bf16_check-*.json")
    result = json.loads(out.read_text())
    assert sorted(r["precision"] for r in result["runs"]) == ["bf16", "fp32"]
    assert all(math.isfinite(r["eval_return"]) and r["episodes"] > 0 for r in result["runs"])
    summary = result["summary"]
    assert summary["paired_bf16_minus_fp32"] == pytest.approx(summary["bf16"]["mean"] - summary["fp32"]["mean"])


def test_o2o_compare_quick_shares_one_pretraining(tmp_path, run_benchmark):
    run_benchmark("o2o_compare.py", "--quick", "--seeds", "1", "--tasks", "pointmaze", "--presets", "wsrl,naive,scratch",
                  "--out", str(tmp_path / "raw"), "--summary", str(tmp_path / "summary"), timeout=600)
    table = (tmp_path / "summary" / "pointmaze" / "summary.md").read_text()
    assert "| wsrl | pointmaze-umaze |" in table and "| scratch | pointmaze-umaze |" in table
    naive = json.loads((tmp_path / "raw" / "pointmaze" / "naive_s0" / "summary.json").read_text())
    wsrl = json.loads((tmp_path / "raw" / "pointmaze" / "wsrl_s0" / "summary.json").read_text())
    assert naive["pretrained"] == str(tmp_path / "raw" / "pointmaze" / "wsrl_s0")  # no second pretraining
    assert naive["offline_score"] == wsrl["offline_score"]
    invocations = (tmp_path / "summary" / "pointmaze" / "invocations.jsonl").read_text().splitlines()
    assert [json.loads(line)["presets"] for line in invocations] == ["wsrl,naive,scratch"]
    # in pieces: naive alone, with --resume, starts from the wsrl pretraining an earlier piece left
    shutil.rmtree(tmp_path / "raw" / "pointmaze" / "naive_s0")
    args = ["--quick", "--seeds", "1", "--tasks", "pointmaze", "--out", str(tmp_path / "raw"), "--summary",
            str(tmp_path / "summary"), "--resume"]
    run_benchmark("o2o_compare.py", *args, "--presets", "naive", timeout=600)
    again = json.loads((tmp_path / "raw" / "pointmaze" / "naive_s0" / "summary.json").read_text())
    assert again["pretrained"] == str(tmp_path / "raw" / "pointmaze" / "wsrl_s0")
    # finished runs with the same config are not rerun; another config is
    out = run_benchmark("o2o_compare.py", *args, "--presets", "wsrl,naive", timeout=600).stdout
    assert "wsrl_s0: finished earlier with this config, reused" in out and "naive_s0: finished earlier" in out
    out = run_benchmark("o2o_compare.py", *args, "--presets", "scratch", "eval.episodes=1", timeout=600).stdout
    assert "reused" not in out


def test_switch_ablation_quick(tmp_path, run_benchmark):
    out = run_benchmark("switch_ablation.py", "--quick", "--out", str(tmp_path / "raw"), "--summary",
                        str(tmp_path / "summary"), timeout=900).stdout
    assert "| wsrl (faithful) | 1 |" in out and "| actor on mean of critics | 1 |" in out
    assert "skipped (the warmup would fill" in out  # the 5,000-step warmup does not fit the quick budget
    rows = json.loads((tmp_path / "summary" / "quick.json").read_text())
    assert {r["rc"] for r in rows} == {0}
    shared = [r for r in rows if "own pretraining" not in r["variant"]]
    own_variants = {r["variant"] for r in rows} - {r["variant"] for r in shared}
    assert len(own_variants) == 4  # 10 critics, exp temperature, PyTorch's init, all four optimiser details off
    assert len(shared) == len(rows) - len(own_variants) and len({r["offline_score"] for r in shared}) == 1
    exp = tmp_path / "raw" / "quick" / "pretrain_temperature_as_exp_p___not_softplus__own_pretraining_s0"
    assert "multiplier_param: exp" in (exp / "config.yaml").read_text()
    own = tmp_path / "raw" / "quick" / "pretrain_10_critics__the_paper_s_count__own_pretraining_s0"
    assert "num_critics: 10" in (own / "config.yaml").read_text()
    ten = json.loads((tmp_path / "raw" / "quick" / "10_critics__the_paper_s_count__own_pretraining_s0" /
                      "summary.json").read_text())
    assert ten["pretrained"] == str(own)
    # a partial rerun replaces its variant's rows and keeps the others'
    again = run_benchmark("switch_ablation.py", "--quick", "--variants", "wsrl (faithful)", "--out",
                          str(tmp_path / "raw"), "--summary", str(tmp_path / "summary"), timeout=900).stdout
    merged = json.loads((tmp_path / "summary" / "quick.json").read_text())
    assert sorted(r["variant"] for r in merged) == sorted(r["variant"] for r in rows) and "| wsrl (faithful) | 1 |" in again
    # --pretrained-from: o2o_compare's wsrl run of the seed is the shared pretraining; none is made again
    (tmp_path / "o2o").mkdir()
    (tmp_path / "o2o" / "wsrl_s0").symlink_to(tmp_path / "raw" / "quick" / "pretrain_s0")
    run_benchmark("switch_ablation.py", "--quick", "--variants", "entropy in the backup", "--pretrained-from",
                  str(tmp_path / "o2o"), "--out", str(tmp_path / "reuse"), "--summary", str(tmp_path / "summary"),
                  timeout=900)
    assert sorted(p.name for p in (tmp_path / "reuse" / "quick").iterdir()) == ["entropy_in_the_backup_s0"]
    reused = json.loads((tmp_path / "reuse" / "quick" / "entropy_in_the_backup_s0" / "summary.json").read_text())
    assert reused["pretrained"] == str(tmp_path / "o2o" / "wsrl_s0")


def test_training_episodes_reports_first_and_last_share(tmp_path, run_benchmark):
    run = tmp_path / "sweep" / "0_run"
    run.mkdir(parents=True)
    rows = [{"step": i, "online/episode_return": float(i), "online/success": float(i >= 10)} for i in range(20)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [{"kind": "eval"}, *rows]) + "\n")
    out = run_benchmark("training_episodes.py", str(tmp_path), "--fraction", "0.25").stdout
    assert "| sweep/0_run | 20 | 0.000 -> 1.000 | 2.0 -> 17.0 |" in out


def test_training_episodes_rejects_a_directory_without_runs(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "training_episodes.py"), str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "no metrics.jsonl under" in result.stderr and "Traceback" not in result.stderr


def test_eval_noise_runs_both_noise_modes_on_a_saved_policy(tmp_path, run_benchmark):
    import policies
    import sims

    spec = sims.spec("cube-single")
    obs_dim, act_dim = spec.obs_dim, spec.act_dim
    policies.make("flow", obs_dim=obs_dim, act_dim=act_dim, pred_horizon=5, execute_horizon=5,
                  denoiser_kwargs={"hidden": (16,)}).save(tmp_path / "policy")
    out = run_benchmark("eval_noise.py", "--policy", str(tmp_path / "policy"), "--episodes", "2", "--widths", "1", "2",
                        "--out", str(tmp_path)).stdout
    record = json.loads(next(tmp_path.glob("eval_noise-*.json")).read_text())
    assert [(r["noise"], r["width"]) for r in record["rows"]] == [("fixed", 1), ("fixed", 2), ("fresh", 1), ("fresh", 2)]
    assert all(0.0 <= r["success"] <= 1.0 for r in record["rows"]) and "spread across widths" in out



@pytest.mark.slow
def test_vla_eval_sets_writes_each_set_and_adds_later_sets_to_the_same_file(tmp_path, run_benchmark):
    import policies
    from policies.vla import hash_text_encoder

    policies.make("vla", obs_dim=28, act_dim=5, cameras=["front"], image_size=32, head="parallel",
                  text_encoder=hash_text_encoder(), dim=32, depth=1, num_heads=2, channels=[8, 16], pool=2
                  ).save(tmp_path / "policy")
    out = tmp_path / "sets.json"
    common = ["--policy", str(tmp_path / "policy"), "--tasks", "1", "--episodes", "1", "--out", str(out)]
    run_benchmark("vla_eval_sets.py", *common, "--sets", "none", "distractor", timeout=600)
    run_benchmark("vla_eval_sets.py", *common, "--sets", "paraphrase", timeout=600)
    record = json.loads(out.read_text())
    assert list(record["sets"]) == ["none", "distractor", "paraphrase"] and record["head"] == "parallel"
    for row in record["sets"].values():
        assert set(row["task_success"]) == {"1"} and 0.0 <= row["mean_success"] <= 1.0
        assert 0.0 <= row["ci95"][0] <= row["mean_success"] <= row["ci95"][1] <= 1.0


def test_vla_throughput_times_every_head_and_their_training_step(tmp_path, run_benchmark):
    out = tmp_path / "vla.json"
    printed = run_benchmark("vla_throughput.py", "--quick", "--rounds", "1", "--batches", "1", "--text", "hash",
                            "--dim", "32", "--depth", "1", "--cameras", "front", "--train-batch", "4",
                            "--train-rounds", "1", "--out", str(out)).stdout
    record = json.loads(out.read_text())
    assert {(r["head"], r["batch"]) for r in record["rows"]} == {(h, 1) for h in ("parallel", "flow", "ar", "prefix")}
    assert set(record["train_s_per_1k_steps"]) == {"parallel", "flow", "ar"}
    assert all(v > 0 for v in record["train_s_per_1k_steps"].values()) and "parallel/AR" in printed
    # multi-threaded latency depends on OpenMP's wait policy, so the record says which one was in effect
    assert record["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")


def test_vla_finetune_job_lock_waits_for_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    """Two vla_finetune invocations on one --out ran the same seed twice (the second then overwrote the first's
    run directory); the per-job lock makes the second wait and reuse the record."""
    import os
    import threading
    import time

    from benchmarks.vla_finetune import JobLock

    lock = tmp_path / "task8_s4.lock"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(str(dead.pid))               # left by an invocation that was killed
    with JobLock(lock, poll_s=0.01):
        assert lock.read_text() == str(os.getpid())
    assert not lock.exists()

    acquired = []

    def second_invocation():
        with JobLock(lock, poll_s=0.01):
            acquired.append(time.monotonic())

    with JobLock(lock, poll_s=0.01):             # a live holder: the other waits until it is released
        waiter = threading.Thread(target=second_invocation)
        waiter.start()
        time.sleep(0.2)
        assert not acquired
        released = time.monotonic()
    waiter.join(timeout=5.0)
    assert acquired and acquired[0] >= released


def test_critic_probe_reads_an_online_runs_checkpoints_and_its_pretrained_critic(tmp_path, run_benchmark):
    """Two-stage as a user runs it: a pretraining, an online run from it with checkpoints, then the probe."""
    env = {**os.environ, "EMBODIED_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    tiny = ["dataset.size=3000", "budget.offline_steps=20", "eval.episodes=1", "eval.video_episodes=0",
            "progress=false", "bf16=false"]

    def train(*args):
        result = subprocess.run([sys.executable, "-m", "embodied.train", *tiny, *args], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]

    train("budget.online_steps=0", "checkpoint.every=0", f"hydra.run.dir={tmp_path / 'pre'}")
    train(f"pretrained={tmp_path / 'pre'}", "budget.online_steps=150", "budget.warmup_steps=50",
          "eval.every_online=150", "checkpoint.every=50", "checkpoint.keep=5", f"hydra.run.dir={tmp_path / 'online'}")
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "critic_probe.py"), str(tmp_path / "online"),
                             "--states", "64"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines() if line.startswith("| s")]
    assert [r[0].strip() for r in rows] == ["switch (pretrained critic)", "switch, dataset states", "step_000000050",
                                            "step_000000100", "step_000000150"], result.stdout
    for row in rows:
        beats = [float(x) for x in row[2:5]]
        assert all(0.0 <= b <= 1.0 for b in beats)
    drift = [float(r[-1]) for r in rows]
    assert drift[0] == drift[1] == drift[2] == 0.0 and drift[-1] > 0.0   # online step 30 is in the warmup: no actor step yet
    climbed = subprocess.run([sys.executable, str(REPO / "benchmarks" / "critic_probe.py"), str(tmp_path / "online"),
                              "--states", "64", "--every", "100", "--climb", "30", "--climb-temperatures", "switch,0"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert climbed.returncode == 0, climbed.stderr[-2000:]
    climb_rows = [line.split("|")[1:-1] for line in climbed.stdout.splitlines() if line.startswith("| temperature")]
    assert [r[0].strip().split()[1] != "0" for r in climb_rows] == [True, False], climbed.stdout  # switch's, then 0
    assert "(switch)" in climb_rows[0][0]
    for row in climb_rows:
        drift, score = float(row[-2]), float(row[-1])
        assert drift > 0.0 and 0.0 <= score <= 100.0   # 30 Adam steps move the actor; the eval ran
    empty = subprocess.run([sys.executable, str(REPO / "benchmarks" / "critic_probe.py"), str(tmp_path / "pre")],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert empty.returncode != 0 and "checkpoint.every=N" in empty.stderr
    not_a_run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "critic_probe.py"), str(tmp_path)],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert not_a_run.returncode != 0 and not_a_run.stderr.strip().splitlines() == [
        f"critic_probe: {tmp_path} has no .hydra/config.yaml: pass the directory of a run written by embodied.train"]
    no_switch = subprocess.run([sys.executable, str(REPO / "benchmarks" / "critic_probe.py"), str(tmp_path / "pre"),
                                "--climb", "5"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert no_switch.returncode != 0 and "--climb needs a run started with pretrained=" in no_switch.stderr
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "critic_probe.py"), str(tmp_path / "online"),
                          "--climb", "5", "--climb-temperatures", "switch,hot"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        "critic_probe: --climb-temperatures: 'hot' is neither 'switch' nor a number >= 0; pass e.g. switch,0.1,0"]


def test_rollout_trace_shows_a_constant_push_driving_the_cart_and_tipping_the_pole(tmp_path, run_benchmark):
    """A policy that always pushes right (mean action tanh(0.5)): the cart moves right and the pole tips back."""
    policy = policies.make("gaussian", obs_dim=4, act_dim=1, hidden=[8])
    torch.nn.init.zeros_(policy.net[-1].weight)
    torch.nn.init.zeros_(policy.net[-1].bias)
    policy.net[-1].bias.data[0] = 0.5   # the pre-tanh mean; the second output is the log-std
    policy.save(tmp_path / "push")
    out = run_benchmark("rollout_trace.py", str(tmp_path / "push"), "--env", "inverted-pendulum", "--episodes", "2",
                        "--json", str(tmp_path / "trace.json")).stdout
    assert out.strip().splitlines()[-1] == "inverted-pendulum, mean actions: 2 of 2 episodes terminated; mean length 4"
    episodes = json.loads((tmp_path / "trace.json").read_text())["episodes"]
    assert [e["seed"] for e in episodes] == [1000, 1001]
    for episode in episodes:
        assert episode["terminated"] and episode["mean_action"] == pytest.approx([np.tanh(0.5)], abs=1e-6)
        cart, pole = episode["dims"]["0"], episode["dims"]["1"]
        assert cart["end"] > cart["start"] + 0.1 and cart["max"] == cart["end"]
        assert pole["end"] < -0.2 and pole["min"] == pole["end"]   # past the env's 0.2 rad limit: terminated
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rollout_trace.py"), str(tmp_path / "push"),
                          "--env", "inverted-pendulum", "--dims", "0,7"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --dims '0,7': the state has 4 dimensions; pass indices in 0..3"]


def test_rollout_trace_reads_where_a_datasets_episodes_end(tmp_path, run_benchmark):
    """--dataset: the traced dimensions of the terminal transitions' next states, and the count beyond a bound."""
    n = 6
    next_obs = np.zeros((n, 2), np.float32)
    next_obs[[2, 5], 0] = [-0.95, 0.5]   # two episodes end: one with dim 0 past 0.9, one inside it
    terminals = np.zeros(n, bool)
    terminals[[2, 5]] = True
    save_hdf5(Dataset(observations=np.zeros((n, 2), np.float32), actions=np.zeros((n, 1), np.float32),
                      rewards=np.ones(n, np.float32), next_observations=next_obs, terminals=terminals,
                      timeouts=np.zeros(n, bool)), tmp_path / "data.hdf5")
    out = run_benchmark("rollout_trace.py", "--dataset", str(tmp_path / "data.hdf5"), "--dims", "0", "--beyond", "0.9",
                        "--json", str(tmp_path / "ends.json")).stdout
    assert out.strip() == (f"{tmp_path / 'data.hdf5'}: 2 terminal transitions of 6; dim 0: [-0.950, +0.500], "
                           f"|value| >= 0.9 in 1")
    record = json.loads((tmp_path / "ends.json").read_text())
    assert record["terminals"] == 2 and record["dims"]["0"] == {"min": pytest.approx(-0.95), "max": 0.5,
                                                                 "at_or_beyond": 1}
    both = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rollout_trace.py"), str(tmp_path),
                           "--dataset", str(tmp_path / "data.hdf5")], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert both.returncode == 2 and "pass a policy directory or --dataset, not both" in both.stderr


def test_expert_returns_rolls_out_a_committed_snapshot(run_benchmark):
    out = run_benchmark("expert_returns.py", "--env", "inverted-pendulum", "--episodes", "2").stdout
    assert out.count("episode ") == 2 and "inverted-pendulum expert: mean " in out


def test_o2o_curve_stats_reads_the_online_evals_of_each_run(tmp_path, run_benchmark):
    run = tmp_path / "wsrl_s0"
    run.mkdir()
    evals = [(0, "offline", 20.0), (0, "online", 20.0), (100, "online", 10.0), (500, "online", 60.0),
             (1000, "online", 100.0), (1500, "online", 80.0), (2000, "online", 100.0)]
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "phase": phase, "kind": "eval", "eval/score": score,
                    "total_step": step + (1000 if phase == "online" else 0)}) + "\n" for step, phase, score in evals))
    out = run_benchmark("o2o_curve_stats.py", str(tmp_path)).stdout
    # grid 0, 500, ..., 2000 (the step-100 eval is off it): area (20+60+100+80+100)/5; late: steps 1000-2000;
    # after the first 100 (step 1000) the grid has 80 and 100: one fall below 90
    assert out.strip().splitlines() == [
        "wsrl_s0: area 72.0, first at 100: 1000, late mean 93.3, final 100.0, falls 1 of 2",
        "wsrl (1 runs): final 100.0 [100.0, 100.0], late mean 93.3 [93.3, 93.3]; falls 1 of 2 evals after the first "
        "at 100, in 1 of 1 runs"]
    out = run_benchmark("o2o_curve_stats.py", str(tmp_path), "--late-from", "1500", "--fall-below", "70").stdout
    assert out.strip().splitlines()[0] == ("wsrl_s0: area 72.0, first at 100: 1000, late mean 90.0, final 100.0, "
                                           "falls 0 of 2")
    # runs that log the critic's calibration gap (Q minus the Monte-Carlo return) get it at the falls and after
    gaps = {1500: 30.0, 2000: -2.0, 500: 99.0}   # step 500 comes before the first 100: not counted
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "phase": phase, "kind": "eval", "eval/score": score,
                    "total_step": step + (1000 if phase == "online" else 0),
                    **({"switch/calibration_gap": gaps[step]} if phase == "online" and step in gaps else {})}) + "\n"
        for step, phase, score in evals))
    out = run_benchmark("o2o_curve_stats.py", str(tmp_path)).stdout
    assert out.strip().splitlines()[1].endswith(
        "in 1 of 1 runs; calibration gap at the falls +30.0 (n 1), at the other evals after it -2.0 (n 1)")
