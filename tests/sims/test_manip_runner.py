"""The offline->online runner on cube-single: oracle task data -> Cal-QL -> WSRL switch -> SAC,
with the sparse {-1, 0} reward used as is (recorded in the run config)."""
import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from embodied.train import CONF_DIR, run

pytestmark = [pytest.mark.slow,  # an offline -> online run on cube-single
              pytest.mark.filterwarnings("ignore:.*precision lowered"),
              pytest.mark.filterwarnings("ignore:.*Box observation space m")]


def test_wsrl_runs_on_cube_single(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    overrides = ["env=cube-single", "dataset=task", "algo=wsrl", "experiment=smoke", "dataset.size=600",
                 "budget.online_steps=220", "budget.warmup_steps=100", "eval.every_online=110", "eval.episodes=1"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    for name in OmegaConf.to_container(cfg.env):
        assert name in ("name", "gamma", "reward_scale", "reward_bias", "sparse_failure_reward", "pretrain_algo", "recipe",
                        "options")
    summary = run(cfg, tmp_path / "run")
    assert summary["offline_algo"] == "calql" and summary["env"] == "cube-single"
    assert 0.0 <= summary["online_success"] <= 1.0 and 0.0 <= summary["offline_success"] <= 1.0
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "reward_bias: 0.0" in config and "sparse_failure_reward: -1" in config
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(x["kind"] == "eval" and x["phase"] == "online" for x in lines)
