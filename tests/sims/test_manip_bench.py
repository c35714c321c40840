"""benchmarks/sim_speed.py runs end to end on a seconds-long budget (real figures: benchmarks/RESULTS.md)."""
import pytest

pytestmark = pytest.mark.slow  # a benchmark script in a subprocess


def test_sim_speed_quick(tmp_path, run_benchmark):
    result = run_benchmark("sim_speed.py", "--quick", "--out", str(tmp_path), timeout=600)
    for text in ("raw_mj_step", "ogbench_bare", "| ours |", "64x64", "128x128", "| task |", "| play |",
                 "cube-single/task2"):
        assert text in result.stdout
    assert not list(tmp_path.glob("*.json"))  # a smoke run never overwrites real results
