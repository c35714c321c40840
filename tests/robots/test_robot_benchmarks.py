"""The robots benchmarks run end to end on a seconds-long budget (real runs: benchmarks/results/)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # every test here runs a benchmark script in a subprocess

def test_control_loop_quick(tmp_path, run_benchmark):
    result = run_benchmark("control_loop.py", "--quick", "--out", str(tmp_path))
    assert "| 100 Hz, sleep + 0.5 ms spin |" in result.stdout and '"fired": 1' in result.stdout
    assert "| 20 Hz sim_ur5e_cube, VLA, 64 px camera + instruction |" in result.stdout  # images on
    assert not list(tmp_path.glob("control_loop-*.json"))   # a smoke run never overwrites real results


def test_policy_server_load_quick(tmp_path, run_benchmark):
    result = run_benchmark("policy_server_load.py", "--quick", "--out", str(tmp_path))
    assert "wrong token refused: True" in result.stdout and "alive after: True" in result.stdout
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("| infer")]
    n, p50, p90, p99, worst = (float(cell) for cell in row.strip("|").split("|")[1:])
    assert n > 0 and 0 < p50 <= p90 <= p99 <= worst, row   # a quick run writes no JSON (never overwrites results)


def test_robot_safety_fuzz_quick(run_benchmark):
    result = run_benchmark("robot_safety_fuzz.py", "--commands", "60", "--modes", "joint_position", "--no-write")
    assert "joint_position " in result.stdout and "peak speed" in result.stdout
    assert "process stall" in result.stdout and "reason watchdog" in result.stdout
    assert "wrote" not in result.stdout                      # a smoke run never overwrites real results


def test_server_fuzz_quick(run_benchmark):
    result = run_benchmark("server_fuzz.py", "--quick")
    assert "300 malformed requests" in result.stdout and "300 answered, 0 failed checks" in result.stdout
    assert "wrote" not in result.stdout
