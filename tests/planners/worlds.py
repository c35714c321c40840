"""Hand-built worlds with the OGBench scene/cube layouts, for tests that need no simulator."""
from __future__ import annotations

from planners.base import World
from sims.scene import Scene, SceneObject


def obj(id, name, kind, color=None, pos=(0.4, 0.0, 0.02), **state):
    return SceneObject(id, name, kind, color, tuple(pos), None, dict(state))


PLACES = (
    obj("left_spot", "left spot", "place", pos=(0.425, -0.15, 0.0)),
    obj("right_spot", "right spot", "place", pos=(0.425, 0.15, 0.0)),
)


def scene_world(drawer_open=False, drawer_locked=True, window_open=False, window_locked=True,
                cube_pos=(0.35, 0.05, 0.02), holding=None, extra=()) -> World:
    objects = (
        obj("cube_0", "red cube", "cube", "red", cube_pos),
        obj("button_0", "drawer button", "button", pos=(0.6, -0.1, 0.0)),
        obj("button_1", "window button", "button", pos=(0.6, 0.1, 0.0)),
        obj("drawer", "drawer", "drawer", pos=(0.33, -0.3, 0.06), open=drawer_open, locked=drawer_locked,
            interior_pos_m=(0.33, -0.24 if drawer_open else -0.356, 0.066)),
        obj("window", "window", "window", pos=(0.2, 0.2, 0.2), open=window_open, locked=window_locked),
    ) + tuple(extra)
    scene = Scene(objects, {"pos_m": (0.4, 0.0, 0.3), "opening": 1.0, "holding": holding}, {})
    return World(scene, places=PLACES, controls={"button_0": "drawer", "button_1": "window"})


def cube_world(n=2, stacked=False) -> World:
    colors = ["red", "blue", "green", "yellow"]
    objects = []
    for i in range(n):
        pos = (0.425, -0.05 + 0.1 * i, 0.02)
        if stacked and i == 1:
            pos = (0.425, -0.05, 0.06)
        objects.append(obj(f"cube_{i}", f"{colors[i]} cube", "cube", colors[i], pos))
    scene = Scene(tuple(objects), {"pos_m": (0.4, 0.0, 0.3), "opening": 1.0, "holding": None}, {})
    return World(scene, places=PLACES)
