"""Config values checked before any work starts, resume with the run's own config, checkpoint files validated."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from embodied.agents.runner import RunnerConfig
from embodied.checkpoints import (CHECKPOINT_STATE_KEYS, check_checkpoint_config, read_checkpoint,
                                  write_folder as _write_folder)
from embodied.config_check import resume_config
from embodied.errors import CheckpointError, ConfigError
from embodied.train import CONF_DIR, main, prepare_cli


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


# -- the table of bad values: override -> what the one line must say (the key and the fix) ------------------
BAD_VALUES = {
    "algo.num_critics=0": "algo.num_critics=0 must be an integer >= 1; set algo.num_critics=",
    "algo.num_critics=-1": "algo.num_critics=-1 must be an integer >= 1; set algo.num_critics=",
    "budget.online_steps=abc": "budget.online_steps='abc' must be an integer >= 0; set budget.online_steps=",
    "budget.online_steps=1e3": "budget.online_steps=1000.0 must be an integer >= 0",
    "device=foo": "device='foo' must be cpu, cuda or cuda:<index>; set device=cpu",
    "algo.utd=-1": "algo.utd=-1 must be an integer >= 1; set algo.utd=1",
    "algo.utdd=4": "algo.utdd is not a config key (did you mean algo.utd?); fix the name: algo.utd=4",
    "+algo.utdd=4": "algo.utdd is not a config key (did you mean algo.utd?)",
    "buget.online_steps=5": "buget.online_steps is not a config key (did you mean budget.online_steps?)",
    "algo.online_agent.actor_lrr=1e-4": "not an option of the sac agent; did you mean algo.online_agent.actor_lr=0.0001?",
    "+foo=1": "foo is not a config key (nothing reads it); remove it",
    "eval.episodes=0": "eval.episodes=0 must be an integer >= 1; set eval.episodes=",
    "env.gamma=1.5": "env.gamma=1.5 must be a number in (0, 1]; set env.gamma=0.99",
    "policy.hidden=[0,64]": "policy.hidden=[0,64] must be a non-empty list of integers >= 1",
    "algo.num_min=3": "algo.num_min=3 must be <= algo.num_critics=2",
    "algo.offline_agent.critic_lr=-1": "algo.offline_agent.critic_lr=-1 must be a number > 0",
    "algo.switch_temperature=hot": "algo.switch_temperature='hot' must be one of keep, reset, fast, refit",
    "logger.mode=onlin": "logger.mode='onlin' must be one of offline, online, disabled; set logger.mode=online",
    "dataset.quality=expertt": "dataset.quality='expertt' must be one of",
    "dataset.path=/nonexistent/data.hdf5": "dataset.path=/nonexistent/data.hdf5 does not exist",
    "dataset.env=hopper": "dataset.env=hopper has observations/actions of size 11/3, env=pointmaze-umaze 6/2; set",
    "dataset.env=cube-single": "dataset.env=cube-single: pick a state-based env",
    "seed=-1": "seed=-1 must be an integer >= 0; set seed=0",
    "bf16=maybe": "bf16='maybe' must be true, false or auto",
    "resume=yes": "resume='yes' must be true or false",
    "checkpoint.keep=0": "checkpoint.keep=0 must be an integer >= 1",
    "algo.offline_algo=cqll": "algo.offline_algo='cqll' must be one of",
    "seed=[1": "cannot parse the override 'seed=[1'",
    "algo=wsrll": "algo=wsrll is not a valid choice",
    "seed=0,1": "seed=0,1 lists several values; add -m to sweep over them",
    "env.options.task_id=3": "env.options ['task_id']: env=pointmaze-umaze does not take all of them; remove it",
}
FIXES = ("; set ", "did you mean", "; remove it", "; write key=value", "valid algo options", "; point it at",
         "; add -m")


@pytest.mark.parametrize("override", sorted(BAD_VALUES))
def test_a_bad_value_is_one_line_naming_the_key_and_the_fix_before_any_work(override, tmp_path, monkeypatch, capsys):
    """The real entry point (main, then Hydra) with each bad value: rc=2, one line, and no run directory made."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["embodied.train", "experiment=smoke", override])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert BAD_VALUES[override] in lines[0], lines[0]
    assert any(fix in lines[0] for fix in FIXES), lines[0]
    assert not (tmp_path / "runs").exists()  # nothing started: no run dir, no dataset, no env


def test_a_bad_utd_names_only_algo_utd(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["embodied.train", "experiment=smoke", "algo.utd=-1"])
    with pytest.raises(SystemExit):
        main()
    line = capsys.readouterr().err.strip()
    assert "algo.utd" in line and "eval.episodes" not in line


@pytest.mark.slow
@pytest.mark.parametrize("override,expected", [("algo.utdd=4", "did you mean algo.utd?"),
                                               ("budget.online_steps=abc", "budget.online_steps='abc'")])
def test_cli_subprocess_bad_value(override, expected, tmp_path):
    result = subprocess.run([sys.executable, "-m", "embodied.train", override], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_every_shipped_preset_passes_the_checks():
    """No false alarms: each preset under the smoke and default experiments is a valid config."""
    from embodied.config_check import check_config
    from embodied.train import group_options

    presets = group_options("algo")
    assert len(presets) >= 10, presets   # an empty or broken glob would check nothing
    for experiment in ("smoke", "default"):
        for preset in presets:
            vla = preset.startswith("vla_")   # vla_bc, vla_qc, vla_ppo, vla_ppo_manip: suites only
            suite = ["env=cube-single-suite", "dataset=task", "checkpoint.every=0"] if vla else []
            check_config(compose_train([f"algo={preset}", f"experiment={experiment}", *suite]))
    for env in ("hopper", "cube-single"):
        check_config(compose_train([f"env={env}", "dataset=" + ("task" if env == "cube-single" else "medium")]))


# -- resume: the run's own config --------------------------------------------------------------------------
STARTED_WITH = ["experiment=smoke", "policy.hidden=[32,32]", "budget.online_steps=600"]


def saved_run(tmp_path: Path, overrides=STARTED_WITH) -> Path:
    """A run dir as Hydra leaves it at a job's start (.hydra/config.yaml + overrides.yaml)."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(compose_train(overrides)))
    (run / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
    return run


def composer():
    def fn(overrides):
        return compose_train(overrides)
    return fn


@pytest.mark.slow
def test_resume_continues_with_the_runs_saved_config(tmp_path):
    run = saved_run(tmp_path)
    cfg = resume_config(run, ["resume=true"], composer())
    assert list(cfg.policy.hidden) == [32, 32] and cfg.budget.online_steps == 600 and cfg.resume is True
    cfg = resume_config(run, ["policy.hidden=[32,32]", "threads=1", "progress=false"], composer())
    assert cfg.threads == 1 and cfg.progress is False and list(cfg.policy.hidden) == [32, 32]


def test_the_saved_config_wins_over_todays_defaults(tmp_path):
    run = saved_run(tmp_path)
    saved = OmegaConf.load(run / ".hydra" / "config.yaml")
    saved.eval.episodes = 7  # as if the code's default changed since the run started
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    assert resume_config(run, [], composer()).eval.episodes == 7


@pytest.mark.parametrize("override,names", [("algo.utd=2", "algo.utd: run 1, given 2"),
                                            ("policy.hidden=[64,64]", "policy.hidden: run [32,32], given [64,64]"),
                                            ("algo=rlpd", "algo.name: run 'wsrl', given 'rlpd'")])
def test_an_override_that_changes_a_resumed_run_is_an_error_naming_it(override, names, tmp_path):
    run = saved_run(tmp_path)
    with pytest.raises(ConfigError, match="but " + re.escape(override) + " changes it") as info:
        resume_config(run, [override], composer())
    assert names in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_resume_command_line_keeps_hydra_off_the_runs_files(tmp_path):
    run = saved_run(tmp_path)
    args = prepare_cli(["resume=true", f"hydra.run.dir={run}"])
    assert args[:len(STARTED_WITH)] == STARTED_WITH  # the job composes the run's own overrides
    assert "resume=true" in args and args[-1] == "hydra.output_subdir=null"
    with pytest.raises(ConfigError, match="add hydra.run.dir"):
        prepare_cli(["resume=true"])
    with pytest.raises(ConfigError, match="does not exist"):
        prepare_cli(["resume=true", f"hydra.run.dir={tmp_path / 'nope'}"])
    (run / ".hydra" / "config.yaml").unlink()
    with pytest.raises(ConfigError, match="has no saved config"):
        prepare_cli(["resume=true", f"hydra.run.dir={run}"])


# -- checkpoint files --------------------------------------------------------------------------------------

def write_checkpoint(run: Path, step: int, config: dict | None = None) -> Path:
    state = {key: None for key in CHECKPOINT_STATE_KEYS}
    state.update(phase="online", offline_step=0, online_step=step, episodes_done=0, eval_history=[],
                 config=config or {"env": "hopper", "utd": 1})
    tensors = {"torch_rng": torch.get_rng_state(), "agent.w": torch.zeros(3)}
    replay = {"observations": np.arange(4000, dtype=np.float32).reshape(1000, 4)}
    return _write_folder(run / "checkpoints" / f"step_{step:09d}", tensors, state, replay_online=replay)


def _truncate(path: Path, keep: int = 300) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DEFECTS = {  # what is done to the newest checkpoint -> what the one-line error must say
    "truncated_replay": (lambda c: _truncate(c / "replay_online.npz"), "replay_online.npz is corrupt or truncated (BadZipFile"),
    "bitflip_replay": (lambda c: _flip_middle_byte(c / "replay_online.npz"), "replay_online.npz is corrupt or truncated"),
    "missing_replay": (lambda c: (c / "replay_online.npz").unlink(), "has no replay_online.npz"),
    "truncated_model": (lambda c: _truncate(c / "model.safetensors", 40), "model.safetensors is corrupt or truncated"),
    "bad_state_json": (lambda c: (c / "state.json").write_text('{"phase": "onl'), "state.json is corrupt or truncated"),
    "state_without_rng": (lambda c: (c / "state.json").write_text(json.dumps({"phase": "online"})),
                          "state.json is corrupt or truncated (KeyError"),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_every_checkpoint_file_is_validated_with_one_line(defect, tmp_path):
    write_checkpoint(tmp_path, 100)
    latest = write_checkpoint(tmp_path, 200)
    damage, expected = DEFECTS[defect]
    damage(latest)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(latest)
    message = str(info.value)
    assert expected in message and "\n" not in message, message
    assert "move" in message and "to resume from step_000000100" in message  # the fix keeps the user's data
    assert read_checkpoint(tmp_path / "checkpoints" / "step_000000100").state["online_step"] == 100


def test_a_checkpoint_of_another_config_is_named_not_a_size_mismatch(tmp_path):
    cfg = RunnerConfig(env="hopper", online_agent={"hidden": [256, 256]})
    saved = json.loads(json.dumps(RunnerConfig(env="hopper", online_agent={"hidden": [64, 64]}).__dict__))
    ckpt = read_checkpoint(write_checkpoint(tmp_path, 100, config=saved))
    with pytest.raises(CheckpointError, match=r"online_agent.hidden \(checkpoint \[64, 64\], this run \[256, 256\]\)"):
        check_checkpoint_config(ckpt, dataclasses.asdict(cfg))
    check_checkpoint_config(ckpt, dataclasses.asdict(RunnerConfig(env="hopper", online_agent={"hidden": [64, 64]})))


def test_an_agent_option_the_preset_does_not_list_takes_effect():
    """`algo=iql algo.offline_agent.expectile=0.9`: the iql preset lists no options, and Hydra refused the key
    with an error that suggested a nonsense fix; any field of the agent's config is an option."""
    args = prepare_cli(["algo=iql", "algo.offline_agent.expectile=0.9", "algo.offline_agent.beta=10.0"])
    assert "+algo.offline_agent.expectile=0.9" in args and "+algo.offline_agent.beta=10.0" in args
    from hydra import compose, initialize_config_dir

    from embodied.run_config import runner_config

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=args)
    assert runner_config(cfg).offline_agent["expectile"] == 0.9
    # a switch knob the preset leaves at the runner's default (README documents it for wsrl)
    args = prepare_cli(["algo=wsrl", "algo.switch_temperature=reset", "algo.switch_temperature_value=0.01"])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=args)
    assert runner_config(cfg).switch_temperature_value == 0.01
    with pytest.raises(ConfigError, match=r"not an option of the iql agent; did you mean "
                                          r"algo\.offline_agent\.expectile=0\.9\?"):
        prepare_cli(["algo=iql", "algo.offline_agent.expectil=0.9"])


def test_a_reward_option_that_the_data_would_not_get_is_an_error():
    from embodied.config_check import check_config

    with pytest.raises(ConfigError, match="env.options.reward=success relabels the generated demos"):
        check_config(compose_train(["env=mt10", "env.options.reward=success", "dataset.path=/tmp/mt10.hdf5"]))
    check_config(compose_train(["env=mt10", "env.options.reward=success", "dataset=task"]))   # generated: relabelled


def test_dataset_env_records_the_data_on_the_named_sibling_and_the_run_keeps_its_own_env(tmp_path, monkeypatch):
    """An any-start maze pretrained on its fixed-start sibling's data: the file is the sibling's, the env is not."""
    from embodied.config_check import check_config
    from embodied.data.cache import dataset_path
    from embodied.train import load_dataset

    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path))
    cfg = compose_train(["env=pointmaze-medium-anystart", "dataset.env=pointmaze-medium", "dataset.size=300",
                         "progress=false"])
    check_config(cfg)
    ds = load_dataset(cfg)
    assert len(ds) == 300
    assert dataset_path("pointmaze-medium", "medium-replay", 300, 0).is_file()
    assert not dataset_path("pointmaze-medium-anystart", "medium-replay", 300, 0).exists()
    assert cfg.env.name == "pointmaze-medium-anystart"
    with pytest.raises(ConfigError, match="dataset.env=pointmaze-medium names the env to generate data on, but "
                                          "dataset.path loads one; set dataset.env=null"):
        check_config(compose_train(["env=pointmaze-medium-anystart", "dataset.env=pointmaze-medium",
                                    f"dataset.path={tmp_path / 'x.hdf5'}"]))
