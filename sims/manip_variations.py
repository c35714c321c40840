"""Evaluation variations of the manipulation tasks, away from the distribution datasets are drawn from.

`sims.make(name, variation=...)`, one of:
- `none`: the training distribution (OGBench's task starts: each cube within +-1 cm of its init pose);
- `paraphrase`: instructions from the held-out wording (`sims.manip_language.HELDOUT`), which
  shares no template with the training wording;
- `positions`: every cube still to be moved starts 3-5 cm from its init pose, outside the
  +-1 cm box every training start comes from;
- `camera`: the cameras moved by `CAMERA_SHIFT_M`;
- `lighting`: dimmer, warmer lights (`LIGHT_DIFFUSE_SCALE`, `HEADLIGHT_DIFFUSE`);
- `distractor`: a yellow cube-sized box on the table in every camera frame. It is drawn into the
  rendered scene only (no collisions), so the physics, the state and the task are unchanged.

Image variations change only what the cameras see; `positions` changes the start state.
"""
from __future__ import annotations

import numpy as np

from embodied.errors import UserError

VARIATIONS = ("none", "paraphrase", "positions", "camera", "lighting", "distractor")
IMAGE_VARIATIONS = ("camera", "lighting", "distractor")

TRAIN_INIT_NOISE_M = 0.01            # OGBench's task mode: uniform +-1 cm per axis around init_xyzs
POSITION_OFFSET_M = (0.03, 0.05)     # the `positions` offset's length (any direction), outside that box
CAMERA_SHIFT_M = (0.03, -0.03, 0.02)
LIGHT_DIFFUSE_SCALE = (0.9, 0.7, 0.45)
HEADLIGHT_DIFFUSE = (0.45, 0.38, 0.3)   # OGBench's is 0.6 grey
DISTRACTOR_HALF_SIZE_M = 0.02
DISTRACTOR_RGBA = (0.95, 0.85, 0.1, 1.0)
MIN_CLEARANCE_M = 0.07               # from every cube and cube target (distractor), between cubes (positions)


def check_variation(variation: str) -> str:
    if variation not in VARIATIONS:
        raise UserError(f"variation={variation!r}: choose one of {', '.join(VARIATIONS)}")
    return variation


def _cube_xy(base, i: int) -> np.ndarray:
    return np.array(base._data.joint(f"object_joint_{i}").qpos[:2])


def _target_xy(base, i: int) -> np.ndarray:
    return np.array(base._data.mocap_pos[base._cube_target_mocap_ids[i]][:2])


def shift_start_positions(base, cubes: list[int], rng: np.random.Generator, tries: int = 50) -> None:
    """Move each cube in `cubes` 3-5 cm (a random direction) from where the reset put it, keeping it in
    OGBench's object bounds, clear of the other cubes and not onto its own target; then recompute."""
    import mujoco

    lo, hi = base._object_sampling_bounds
    num = len(base._cube_target_mocap_ids)
    for i in cubes:
        start = _cube_xy(base, i)
        for _ in range(tries):
            angle, length = rng.uniform(0, 2 * np.pi), rng.uniform(*POSITION_OFFSET_M)
            xy = start + length * np.array([np.cos(angle), np.sin(angle)])
            others = [_cube_xy(base, j) for j in range(num) if j != i]
            if (np.all(xy >= lo) and np.all(xy <= hi) and np.linalg.norm(xy - _target_xy(base, i)) > 0.04
                    and all(np.linalg.norm(xy - o) > MIN_CLEARANCE_M for o in others)):
                break
        else:
            raise UserError(f"variation=positions found no free start 3-5 cm from cube {i} in {tries} tries; "
                            "use variation=none for this task")
        base._data.joint(f"object_joint_{i}").qpos[:2] = xy
        base._data.joint(f"object_joint_{i}").qvel[:] = 0.0
    mujoco.mj_forward(base._model, base._data)


def apply_image_variation(model, variation: str) -> None:
    """Change the env's own MjModel for the camera and lighting variations (rendering only)."""
    if variation == "camera":
        model.cam_pos[:] += np.asarray(CAMERA_SHIFT_M)
    elif variation == "lighting":
        model.light_diffuse[:] *= np.asarray(LIGHT_DIFFUSE_SCALE)
        model.vis.headlight.diffuse[:] = HEADLIGHT_DIFFUSE


def distractor_position(base, rng: np.random.Generator, tries: int = 100) -> np.ndarray:
    """A table position clear of every cube and cube target, inside OGBench's object bounds."""
    lo, hi = base._object_sampling_bounds
    num = len(base._cube_target_mocap_ids)
    taken = [_cube_xy(base, i) for i in range(num)] + [_target_xy(base, i) for i in range(num)]
    for _ in range(tries):
        xy = rng.uniform(lo, hi)
        if all(np.linalg.norm(xy - t) > MIN_CLEARANCE_M for t in taken):
            return np.array([xy[0], xy[1], DISTRACTOR_HALF_SIZE_M])
    return np.array([lo[0], hi[1], DISTRACTOR_HALF_SIZE_M])   # a back corner when the table is crowded


def draw_distractor(scene, pos: np.ndarray) -> None:
    """Append one box to a rendered scene (after `update_scene`, before `render`)."""
    import mujoco

    if scene.ngeom >= scene.maxgeom:
        return
    mujoco.mjv_initGeom(scene.geoms[scene.ngeom], type=mujoco.mjtGeom.mjGEOM_BOX,
                        size=np.full(3, DISTRACTOR_HALF_SIZE_M), pos=np.asarray(pos, float),
                        mat=np.eye(3).flatten(), rgba=np.asarray(DISTRACTOR_RGBA, np.float32))
    scene.ngeom += 1
