"""Headless rendering gives small uint8 HWC frames (MUJOCO_GL=egl, set in tests/conftest.py)."""
import numpy as np
import pytest

import sims

pytestmark = pytest.mark.slow  # software-GL rendering


@pytest.mark.parametrize("name", ["hopper", "pointmaze-umaze"])
def test_render_64x64_uint8_frame(name):
    env = sims.make(name, seed=0, render=True, render_size=64)
    env.reset()
    env.step(env.action_space.sample())
    frame = env.render()
    env.close()
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
    assert frame.std() > 0  # not a blank image
    assert env.unwrapped.model.vis.quality.shadowsize == 0
