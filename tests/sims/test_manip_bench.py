"""benchmarks/sim_speed.py runs end to end on a seconds-long budget (real figures: benchmarks/RESULTS.md)."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sim_speed_quick(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sim_speed.py"), "--quick", "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for text in ("raw_mj_step", "ogbench_bare", "| ours |", "64x64", "128x128", "| task |", "| play |",
                 "cube-single/task2"):
        assert text in result.stdout
    assert not list(tmp_path.glob("*.json"))  # a smoke run never overwrites real results
