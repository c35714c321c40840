"""Evaluation variations of the manipulation tasks: held-out wording, unseen start positions, and the
image perturbations, on real OGBench MuJoCo envs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import sims
from embodied.errors import UserError
from sims.manip_language import HELDOUT, TRAIN
from sims.manip_variations import POSITION_OFFSET_M, TRAIN_INIT_NOISE_M

IMAGE = "observation.images.front"


def _templates(wording) -> set[str]:
    out = set()
    for field in dataclasses.fields(wording):
        value = getattr(wording, field.name)
        values = [v for vs in value.values() for v in vs] if isinstance(value, dict) else list(value)
        out |= {f"{field.name}:{v}" for v in values}
    return out


def test_the_heldout_wording_shares_no_template_with_the_training_wording():
    assert not _templates(TRAIN) & _templates(HELDOUT)
    assert set(TRAIN.phrases) == set(HELDOUT.phrases)     # every sub-goal can be said both ways


@pytest.mark.parametrize("suite", ["cube-single", "cube-double", "scene"])
@pytest.mark.slow  # a few seconds on 2 cores
def test_paraphrase_instructions_never_repeat_a_training_instruction(suite):
    seen = {}
    for variation in ("none", "paraphrase"):
        env = sims.make(f"{suite}-goal", language=True, variation=variation)   # one env, every task
        seen[variation] = {env.reset(seed=seed, options={"task_id": task})[0]["task"]
                           for task in range(1, 6) for seed in range(6)}
        env.close()
    assert len(seen["paraphrase"]) > 5 and not seen["none"] & seen["paraphrase"]


def _cube_xy(env, i=0):
    return np.array(env.unwrapped._data.joint(f"object_joint_{i}").qpos[:2])


@pytest.mark.slow  # a few seconds on 2 cores
def test_positions_start_the_cube_outside_every_training_start():
    plain = sims.make("cube-single", task_id=1)
    shifted = sims.make("cube-single", task_id=1, variation="positions")
    for seed in range(4):
        obs_plain, _ = plain.reset(seed=seed)
        obs_shifted, info = shifted.reset(seed=seed)
        init = np.asarray(shifted.unwrapped.cur_task_info["init_xyzs"][0][:2])
        moved = np.linalg.norm(_cube_xy(shifted) - _cube_xy(plain))
        assert POSITION_OFFSET_M[0] - 1e-6 <= moved <= POSITION_OFFSET_M[1] + 1e-6
        assert np.abs(_cube_xy(shifted) - init).max() > TRAIN_INIT_NOISE_M     # outside the +-1 cm box
        assert not info["success"]
        # the observation is the shifted state (the cube position is in it), not the pre-shift one
        assert not np.allclose(obs_plain["observation.state"], obs_shifted["observation.state"])
    plain.close(), shifted.close()


@pytest.mark.slow  # a few seconds on 2 cores
def test_image_variations_change_only_the_camera_frames():
    def first_obs(variation):
        env = sims.make("cube-single", task_id=2, images=("front",), image_size=64, language=True,
                        variation=variation)
        obs, _ = env.reset(seed=3)
        env.close()
        return obs

    plain = first_obs("none")
    yellow = lambda im: int(((im[..., 0] > 180) & (im[..., 1] > 150) & (im[..., 2] < 90)).sum())
    assert yellow(plain[IMAGE]) == 0
    for variation in ("camera", "lighting", "distractor"):
        obs = first_obs(variation)
        assert np.array_equal(obs["observation.state"], plain["observation.state"]) and obs["task"] == plain["task"]
        diff = np.abs(obs[IMAGE].astype(int) - plain[IMAGE].astype(int))
        assert diff.mean() > 0.2, variation
    assert yellow(first_obs("distractor")[IMAGE]) > 4


@pytest.mark.slow  # a few seconds on 2 cores
def test_bad_variations_say_what_to_use():
    with pytest.raises(UserError, match="variation='fog': choose one of none, paraphrase"):
        sims.make("cube-single", variation="fog")
    with pytest.raises(UserError, match="variation=lighting changes camera frames: pass images"):
        sims.make("cube-single", variation="lighting")
