import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the planner benchmark in a subprocess

REPO = Path(__file__).resolve().parents[2]


def test_planner_eval_script_end_to_end(tmp_path):
    """Rule planner on two real tasks + the adversarial set: result JSON, JSONL trace and table."""
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "planner_eval.py"), "--planners", "rule",
                             "--tasks", "cs1-left,sc1-open-both", "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    res = json.loads((tmp_path / "rule.json").read_text())
    s = res["summary"]
    assert s["tasks"] == 2 and s["success_rate"] == 1.0 and s["ungrounded_reached_skill"] == 0
    assert s["adversarial_refused"] == s["adversarial_total"] >= 9
    events = [json.loads(line) for line in (tmp_path / "trace_rule.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "subgoal" and e["success"] for e in events) == 4
    assert "| rule | 2/2 (100%) |" in (tmp_path / "planner_eval.md").read_text()
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "planner_eval.py"), "--planners", "gpt9"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --planners: unknown 'gpt9'")
