"""algo=vla_bc: multi-task VLA pretraining on a suite's image demos, through the main entry point."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

import policies
import sims
from embodied.config_check import check_config
from embodied.constants import STATE_KEY, TASK_KEY, image_key
from embodied.data.suite import SuiteDemos, episode_last_index
from embodied.errors import ConfigError
from embodied.train import CONF_DIR, run

TINY = ["algo.offline_agent.vla_kwargs.dim=32", "algo.offline_agent.vla_kwargs.depth=1",
        "algo.offline_agent.vla_kwargs.channels=[8,16]", "algo.offline_agent.text_encoder=hash"]


def compose_train(overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def test_suite_chunks_stop_at_the_episode_end_and_pad_with_its_last_action():
    ends = np.array([0, 0, 1, 0, 1], bool)                 # episodes [0, 1, 2] and [3, 4]
    np.testing.assert_array_equal(episode_last_index(ends), [2, 2, 2, 4, 4])
    actions = np.arange(5, dtype=np.float32)[:, None]
    demos = SuiteDemos(states=np.zeros((5, 3), np.float32), actions=actions,
                       images={"front": np.arange(5, dtype=np.uint8)[:, None, None, None].repeat(2, 1).repeat(2, 2)
                               .repeat(3, 3)},
                       instructions=["a", "a", "a", "b", "b"], task_ids=np.array([1, 1, 1, 2, 2]),
                       last=episode_last_index(ends), metadata={})
    demos.seed(0)
    batch = demos.sample_chunks(64, 3)
    starts = batch[image_key("front")][:, 0, 0, 0].astype(int)  # the frame says which step the chunk starts at
    for start, chunk, valid, task in zip(starts, batch["actions"][..., 0], batch["valid"], batch[TASK_KEY]):
        last = 2 if start <= 2 else 4
        expected = [min(start + k, last) for k in range(3)]
        np.testing.assert_array_equal(chunk, expected)
        np.testing.assert_array_equal(valid, [start + k <= last for k in range(3)])
        assert task == ("a" if start <= 2 else "b")
    assert set(starts) == {0, 1, 2, 3, 4} and batch[STATE_KEY].shape == (64, 3)


def test_a_suite_is_only_for_vla_bc_and_vla_bc_needs_a_suite():
    with pytest.raises(ConfigError, match="env.tasks=.*only algo=vla_bc"):
        check_config(compose_train(["algo=wsrl", "env=cube-single-suite", "dataset=task"]))
    with pytest.raises(ConfigError, match="algo=vla_bc needs a multi-task suite"):
        check_config(compose_train(["algo=vla_bc", "env=cube-single", "dataset=task"]))
    with pytest.raises(ConfigError, match=r"env.tasks in 1..5"):
        check_config(compose_train(["algo=vla_bc", "env=cube-single-suite", "dataset=task", "env.tasks=[1,9]"]))
    check_config(compose_train(["algo=vla_bc", "env=scene-suite", "dataset=task"]))
    with pytest.raises(ConfigError, match="env.variations=.*each one of none, paraphrase"):
        check_config(compose_train(["algo=vla_bc", "env=cube-single-suite", "dataset=task", "env.variations=[fog]"]))
    check_config(compose_train(["algo=vla_bc", "env=cube-single-suite", "dataset=task",
                                "env.variations=[none,paraphrase,positions,camera,lighting,distractor]"]))


@pytest.mark.slow
@pytest.mark.parametrize("head", ["flow"])   # the heads themselves: tests/policies/test_vla.py
def test_vla_bc_pretrains_on_two_tasks_and_saves_a_deployable_policy(head, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    cfg = compose_train(["algo=vla_bc", "env=cube-single-suite", "env.tasks=[1,2]", "dataset=task",
                         "dataset.size=300", "budget.offline_steps=6", "budget.online_steps=0", "budget.batch_size=8",
                         "eval.episodes=1", "eval.every_offline=6", "logger=jsonl", "progress=false", "threads=1",
                         "checkpoint.every=0", "eval.video_episodes=1", "eval.video_size=64",
                         "env.variations=[none,lighting]", f"policy.head={head}", *TINY])  # the spelling
    summary = run(cfg, tmp_path / "run")
    assert summary["tasks"] == [1, 2] and set(summary["task_success"]) == {1, 2}
    assert all(0.0 <= s <= 1.0 for s in summary["task_success"].values())
    for task in (1, 2):                                   # one rollout video per task, driven by the VLA
        assert (tmp_path / "run" / "videos" / f"task{task}.mp4").stat().st_size > 1000
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [line for line in lines if line["kind"] == "eval"]
    periodic = [e for e in evals if "eval/success" in e]
    assert [e["step"] for e in periodic if e["phase"] == "offline"] == [0, 6]
    assert not [e for e in periodic if e["phase"] == "online"]   # offline only: step 6's eval is not run twice
    assert {"eval/task1/success", "eval/task2/success", "eval/success"} <= set(periodic[-1])
    # the final eval's extra set: the same tasks and start seeds under changed lighting
    assert set(summary["variation_success"]) == {"none", "lighting"}
    assert set(summary["variation_success"]["lighting"]) == {1, 2}
    assert {"final/lighting/task1/success", "final/lighting/success"} <= set(evals[-1]) and evals[-1]["total_step"] == 6
    # the saved policy reads what the env renders: frames, state and the instruction
    policy = policies.load(tmp_path / "run" / "policy")
    assert policy.head == head and policy.cameras == ["front"] and policy.chunk == 8
    policy.set_text_encoder(policies.vla.hash_text_encoder())
    env = sims.make("cube-single", task_id=2, images=("front",), image_size=64, language=True)
    obs, _ = env.reset(seed=0)
    chunk = policy.act(obs)
    env.close()
    assert chunk.shape == (8, 5) and np.isfinite(chunk).all()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_vla_bc_pretrains_on_meta_world_mt10_tasks(tmp_path, monkeypatch):
    """The same entry point on the Meta-World suite: scripted-policy demos with frames, per-task evaluation,
    and a saved policy that acts on a Meta-World observation (4-d actions)."""
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    cfg = compose_train(["algo=vla_bc", "env=mt10-suite", "env.tasks=[1,9]", "dataset=task", "dataset.size=150",
                         "budget.offline_steps=4", "budget.online_steps=0", "budget.batch_size=8", "eval.episodes=1",
                         "eval.every_offline=4", "logger=jsonl", "progress=false", "threads=1", "checkpoint.every=0",
                         "eval.video_episodes=0", "env.variations=[none,paraphrase]", *TINY])
    summary = run(cfg, tmp_path / "run")
    assert summary["tasks"] == [1, 9] and set(summary["task_success"]) == {1, 9}
    assert set(summary["variation_success"]) == {"none", "paraphrase"}
    policy = policies.load(tmp_path / "run" / "policy")
    policy.set_text_encoder(policies.vla.hash_text_encoder())
    env = sims.make("mt10", task_id=9, images=("front",), image_size=64, language=True)
    obs, _ = env.reset(seed=0)
    chunk = policy.act(obs)
    env.close()
    assert chunk.shape == (8, 4) and np.isfinite(chunk).all()


def test_mt10_suite_config_composes_and_rejects_an_ogbench_only_variation():
    check_config(compose_train(["algo=vla_bc", "env=mt10-suite", "dataset=task"]))
    with pytest.raises(ConfigError, match="env.variations"):
        check_config(compose_train(["algo=vla_bc", "env=mt10-suite", "dataset=task", "env.variations=[lighting]"]))
    with pytest.raises(ConfigError, match="1..10"):
        check_config(compose_train(["algo=vla_bc", "env=mt10-suite", "dataset=task", "env.tasks=[11]"]))
