"""The robots benchmarks run end to end on a seconds-long budget (real runs: benchmarks/results/)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def script(name: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / name), *args], cwd=REPO, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def test_control_loop_quick(tmp_path):
    result = script("control_loop.py", "--quick", "--out", str(tmp_path))
    assert "| 100 Hz, sleep + 0.5 ms spin |" in result.stdout and '"fired": 1' in result.stdout
    assert not list(tmp_path.glob("control_loop-*.json"))   # a smoke run never overwrites real results


def test_policy_server_load_quick(tmp_path):
    result = script("policy_server_load.py", "--quick", "--out", str(tmp_path))
    assert "wrong token refused: True" in result.stdout and "alive after: True" in result.stdout
