"""The manipulation tasks' sub-goal predicates, defined once: tolerances and tests on plain numbers.

Every user evaluates them from here: `sims.manip_scene` on the live MuJoCo state (`Scene.truths`, the
task's sub-goal truths), `embodied.data` when it labels datasets (`sims.manip_scene.task_truths`,
`embodied.data.ogbench_npz`), and `planners.symbolic` when it computes atoms from object poses.

The success tests are OGBench's own (`_compute_successes` of its manipspace envs and
`ogbench.relabel_utils.relabel_dataset`), so a sub-goal holds here exactly when it holds in OGBench:
a cube is at its target within 4 cm (Euclidean, in 3-D, inclusive), a drawer or window is at its
target slide position within 4 cm, a button is in its target state. OGBench has no stacking test:
its stack tasks put the upper cube's target one cube size (4 cm) above the lower one's, and
`on(x, y)` here is x's centre within 2 cm of y's in the table plane and 3-5 cm above it.

`at`, `slide_at` and `buttons_match` accept one position (`[3]`, a scalar slide position) or a batch
(`[..., 3]`, arrays) and compute exactly what OGBench computes for one.
"""
from __future__ import annotations

import numpy as np

AT_TOL_M = 0.04  # a cube is at its target within 4 cm (OGBench)
SLIDE_TOL_M = 0.04  # a drawer / window slide is at its target position within 4 cm (OGBench)
CUBE_SIZE_M = 0.04  # OGBench's cubes are 4 cm
STACK_XY_TOL_M = 0.02  # on(x, y): x's centre within 2 cm of y's in the table plane ...
STACK_DZ_MIN_M, STACK_DZ_MAX_M = 0.03, 0.05  # ... and 3-5 cm above it (one cube size, +- 1 cm)
HOLD_DIST_M = 0.03  # holding(x): the gripper closed on something within 3 cm of x's centre

DRAWER_OPEN_M, DRAWER_CLOSED_M = -0.16, 0.0  # drawer slide positions, open / closed (OGBench)
WINDOW_OPEN_M, WINDOW_CLOSED_M = 0.2, 0.0  # window slide positions, open / closed (OGBench)
# A task's target slide position past these means the task wants it open (OGBench's targets are
# the open or the closed position)
DRAWER_OPEN_BELOW_M, WINDOW_OPEN_ABOVE_M = -0.08, 0.1
SLIDES = ("drawer", "window")


def _norm(d: np.ndarray):
    return np.linalg.norm(d) if d.ndim == 1 else np.linalg.norm(d, axis=-1)


def at(pos, target):
    """at(cube, target): within AT_TOL_M in 3-D (OGBench's cube success test)."""
    return _norm(np.asarray(pos, dtype=float) - np.asarray(target, dtype=float)) <= AT_TOL_M


def on(top, bottom) -> bool:
    """on(top, bottom): `top` rests on `bottom` (centres within STACK_XY_TOL_M in xy, one cube size up)."""
    top, bottom = np.asarray(top, dtype=float), np.asarray(bottom, dtype=float)
    dz = top[2] - bottom[2]
    return bool(np.linalg.norm(top[:2] - bottom[:2]) <= STACK_XY_TOL_M and STACK_DZ_MIN_M <= dz <= STACK_DZ_MAX_M)


def holding(gripper_closed_on_something: bool, effector_pos, cube_pos) -> bool:
    """holding(cube): the gripper is closed on something and its effector is within HOLD_DIST_M."""
    return bool(gripper_closed_on_something
                and np.linalg.norm(np.asarray(cube_pos, dtype=float) - np.asarray(effector_pos, dtype=float)) <= HOLD_DIST_M)


def slide_at(pos, target):
    """A drawer or window slide at its target position within SLIDE_TOL_M (OGBench's success test)."""
    return np.abs(np.asarray(pos) - target) <= SLIDE_TOL_M


def is_open(what: str, pos) -> bool:
    """open(drawer|window): the slide within SLIDE_TOL_M of (or past) its open position."""
    if what == "drawer":
        return bool(pos <= DRAWER_OPEN_M + SLIDE_TOL_M)
    return bool(pos >= WINDOW_OPEN_M - SLIDE_TOL_M)


def is_closed(what: str, pos) -> bool:
    """closed(drawer|window): the slide within SLIDE_TOL_M of (or past) its closed position."""
    if what == "drawer":
        return bool(pos >= DRAWER_CLOSED_M - SLIDE_TOL_M)
    return bool(pos <= WINDOW_CLOSED_M + SLIDE_TOL_M)


def target_word(what: str, target_pos) -> str:
    """"open" or "closed": the predicate name a task's target slide position asks for."""
    target_pos = float(target_pos)
    wants_open = target_pos < DRAWER_OPEN_BELOW_M if what == "drawer" else target_pos > WINDOW_OPEN_ABOVE_M
    return "open" if wants_open else "closed"


def buttons_match(current, target):
    """Each button in its target state (OGBench's button success test); arrays broadcast."""
    return np.asarray(current) == np.asarray(target)
