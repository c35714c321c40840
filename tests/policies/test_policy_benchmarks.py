"""benchmarks/policy_latency.py and benchmarks/qc_compare.py run end to end on seconds-long budgets
(the real figures are in benchmarks/RESULTS.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here runs a benchmark script in a subprocess


def test_policy_latency_quick(run_benchmark):
    out = run_benchmark("policy_latency.py", "--quick", "--denoisers", "mlp").stdout
    for row in ("mlp/diffusion DDPM-100", "mlp/diffusion DDIM-10", "mlp/diffusion DDIM-5", "mlp/flow Euler-10",
                "mlp/flow one-step"):
        assert f"| {row} |" in out
    assert "one-step flow is" in out and "DDIM-10" in out


def test_qc_compare_quick(tmp_path, run_benchmark):
    run_benchmark("qc_compare.py", "--quick", "--env", "cube-single", "--algos", "qc_fql,fql", "--seeds", "1",
           "--out", str(tmp_path))
    report = (tmp_path / "REPORT.md").read_text()
    assert "| qc_fql | cube-single |" in report and "| fql | cube-single |" in report and "FAILED" not in report
    summaries = {p.parts[-3]: json.loads(p.read_text()) for p in tmp_path.glob("*/*/summary.json")}
    assert set(summaries) == {"qc_fql", "fql"}, sorted(tmp_path.rglob("summary.json"))
    assert all(0.0 <= s["online_success"] <= 1.0 for s in summaries.values())


def test_policy_latency_rejects_an_unknown_denoiser():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "policy_latency.py"
    result = subprocess.run([sys.executable, str(script), "--quick", "--denoisers", "mlp,resnet"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--denoisers: unknown resnet; valid: unet, unet-small, mlp" in result.stderr
    assert "Traceback" not in result.stderr
