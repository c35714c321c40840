"""Undefined names and dead imports fail the fast tier, even in scripts only slow tests reach."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["embodied", "policies", "planners", "sims", "robots", "benchmarks", "tests"]


def test_pyflakes_rules_pass_over_every_package():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    result = subprocess.run([ruff, "check", "--no-cache", "--select", "F821,F811,F401,F823", *PACKAGES],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
