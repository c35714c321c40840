"""The dataset CLI: `python -m embodied.generate env=... quality=... size=...` (Hydra)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from embodied.data.d4rl import load_extras, load_hdf5
from embodied.generate import spec_from_config
from embodied.train import CONF_DIR

pytestmark = pytest.mark.slow  # dataset generation through the CLI

REPO = Path(__file__).resolve().parents[1]


def _cli(*args, tmp_path):
    env = {**os.environ, "EMBODIED_CACHE": str(tmp_path / "cache"), "MUJOCO_GL": "egl"}
    return subprocess.run([sys.executable, "-m", "embodied.generate", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_config_composes_with_every_manip_env():
    for env in ("cube-single", "cube-double", "scene", "puzzle-3x3"):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="generate", overrides=[f"env={env}", "quality=task", "size=100"])
        spec = spec_from_config(cfg)
        assert spec.env == env and spec.size == 100 and spec.episode_steps > 0


def test_cli_writes_a_dataset(tmp_path):
    out = tmp_path / "cs.hdf5"
    result = _cli("env=cube-single", "quality=task", "size=80", "seed=3", f"out={out}", "progress=false",
                  tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrote" in result.stdout
    ds = load_hdf5(out)
    assert len(ds) == 80 and ds.metadata["quality"] == "task" and ds.metadata["seed"] == 3
    assert load_extras(out)["infos/subgoals"].shape == (80, 1)


@pytest.mark.parametrize("args, match", [
    (["env=cube-single", "quality=expert"], "play, noisy, task"),
    (["env=cube-single", "size=-3"], "positive integer"),
    (["env=hopper"], "no oracle datasets"),
    (["env=cube-sngle"], "cube-single"),
])
def test_cli_rejects_impossible_requests_fast(args, match, tmp_path):
    result = _cli(*args, f"out={tmp_path / 'x.hdf5'}", tmp_path=tmp_path)
    assert result.returncode == 2 and match in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x.hdf5").exists()
