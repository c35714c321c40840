"""Test-wide defaults: headless MuJoCo rendering and no wandb network traffic; the benchmark runner."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("WANDB_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def run_benchmark():
    """Run `benchmarks/<name> *args` in a subprocess from the repo root; assert it exits 0."""
    def run(name: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, str(REPO / "benchmarks" / name), *args], cwd=REPO,
                                capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        return result
    return run


@pytest.fixture
def one_thread():
    """Tiny networks: one thread is fastest, and two threads on a busy 2-core machine stall for ~100x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
