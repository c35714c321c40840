"""planners.train_skills refuses bad values in one line before it collects any demos."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args,message", [
    (["--envs", "cube-single,bogus"], "error: --envs: unknown suite 'bogus'; choose from cube-single, cube-double, scene"),
    (["--hidden", "5x"], "error: --hidden='5x': give layer widths as integers, e.g. 512,512,512"),
    (["--execute-horizon", "5"], "error: --execute-horizon=5 must be <= --pred-horizon=4"),
    (["--episodes", "0"], "error: --episodes=0 must be >= 1"),
    (["--action-noise", "-0.1"], "error: --action-noise=-0.1 must be >= 0"),
    (["--envs", "scene", "--demos", "/nonexistent"], "error: --demos /nonexistent: no scene/demos.hdf5 and "
     "skills.json there; give the --out of an earlier `python -m planners.train_skills` run"),
])
def test_bad_values_fail_in_one_line_before_any_work(tmp_path, args, message):
    result = subprocess.run([sys.executable, "-m", "planners.train_skills", *args, "--out", str(tmp_path / "skills")],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == message, result.stderr
    assert not (tmp_path / "skills").exists()


def test_the_skill_policy_reads_every_column_but_the_arm_joint_velocities_unless_asked():
    from planners.train_skills import policy_columns

    assert policy_columns(28, 13, joint_velocities=False) == [*range(6), *range(12, 41)]
    assert policy_columns(28, 13, joint_velocities=True) == list(range(41))
