"""Every benchmark script runs end to end on a seconds-long budget (the real runs are documented in
benchmarks/RESULTS.md); peers that are not installed are skipped by the scripts themselves."""
from __future__ import annotations


def test_update_speed_quick(tmp_path, run_benchmark):
    result = run_benchmark("update_speed.py", "--quick", "--threads", "1", "--out", str(tmp_path))
    assert "ours SAC 2 critics fp32" in result.stdout and "goals" in result.stdout
    assert "matmuls only, SAC 2 critics fp32" in result.stdout
    if "\nSB3 SAC " in result.stdout:  # its table row: stable-baselines3 installed (extra `bench`)
        assert "ceiling: our matmuls alone / SB3 SAC" in result.stdout
    assert not list(tmp_path.glob("update_speed-*.json"))  # a smoke run never overwrites real results


def test_bf16_check_quick(tmp_path, run_benchmark):
    run_benchmark("bf16_check.py", "--steps", "300", "--random-steps", "200", "--seeds", "1", "--batch-size", "32",
           "--eval-episodes", "1", "--threads", "1", "--out", str(tmp_path))
    assert list(tmp_path.glob("bf16_check-*.json"))


def test_o2o_compare_quick(tmp_path, monkeypatch, run_benchmark):
    run_benchmark("o2o_compare.py", "--quick", "--seeds", "1", "--presets", "wsrl,scratch", "--out", str(tmp_path),
                    timeout=600)
    report = (tmp_path / "REPORT.md").read_text()
    assert "| wsrl | hopper |" in report and "| scratch | pointmaze-umaze |" in report
