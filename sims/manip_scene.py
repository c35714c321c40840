"""What a manipulation env's live MuJoCo state says: the task's sub-goals, their truths, and the scene.

Functions of an OGBench manipspace env (`env.unwrapped`, called `base` here) and its suite kind
("cube" | "scene" | "puzzle"). Every truth comes from `sims.predicates`, the one definition of the
sub-goal predicates, so `build_scene(base, kind).holds(p)` for a sub-goal `p` equals OGBench's own
success test of it, and `task_truths` labels any state (data-collection mode too) for a fixed task.
"""
from __future__ import annotations

import numpy as np

from sims import predicates
from sims.scene import Predicate, Scene, SceneObject

CUBE_COLORS = ("red", "blue", "orange", "green", "purple", "yellow", "magenta", "gray")  # OGBench's order


def cube_count(base) -> int:
    return int(getattr(base, "_num_cubes", 0))


def grid_words(index: int, rows: int, cols: int) -> str:
    """The name of a puzzle button by its place in the grid, as seen from the front camera."""
    r, c = divmod(index, cols)
    if rows == 3 and cols == 3:
        return f"{('back', 'middle', 'front')[r]} {('left', 'center', 'right')[c]}".replace("middle center", "center")
    return f"row {r + 1}, column {c + 1}"


def task_subgoals(base, kind: str) -> list[Predicate]:
    """The current task's sub-goals, in the order of OGBench's `_compute_successes`."""
    if kind == "cube":
        return [Predicate("at", (f"cube_{i}", f"target_{i}")) for i in range(cube_count(base))]
    if kind == "scene":
        buttons = np.asarray(base._target_button_states).reshape(-1)
        preds = [Predicate("at", (f"cube_{i}", f"target_{i}")) for i in range(cube_count(base))]
        preds += [Predicate("unlocked" if buttons[0] else "locked", ("drawer",)),
                  Predicate("unlocked" if buttons[1] else "locked", ("window",))]
        preds.append(Predicate(predicates.target_word("drawer", base._target_drawer_pos), ("drawer",)))
        preds.append(Predicate(predicates.target_word("window", base._target_window_pos), ("window",)))
        return preds
    targets = np.asarray(base._target_button_states).reshape(-1)
    return [Predicate("blue" if t else "red", (f"button_{i}",)) for i, t in enumerate(targets)]


def task_truths(base, kind: str, task_info: dict) -> np.ndarray:
    """Sub-goal truths of a fixed task (one of the env's `task_infos`) in any env mode, in the order of
    `task_subgoals`: OGBench's `relabel_dataset` criteria, i.e. its success tests."""
    data = base._data
    if kind == "cube":
        goals = task_info["goal_xyzs"]
        return np.array([predicates.at(data.joint(f"object_joint_{i}").qpos[:3], goals[i]) for i in range(len(goals))])
    buttons = np.asarray(base._cur_button_states).reshape(-1)
    if kind == "puzzle":
        return predicates.buttons_match(buttons, np.asarray(task_info["goal_button_states"]).reshape(-1))
    goal = task_info["goal"]
    cubes = [predicates.at(data.joint(f"object_joint_{i}").qpos[:3], goal["block_xyzs"][i])
             for i in range(len(goal["block_xyzs"]))]
    return np.array(cubes + list(predicates.buttons_match(buttons, goal["button_states"]))
                    + [predicates.slide_at(data.joint("drawer_slide").qpos[0], goal["drawer_pos"]),
                       predicates.slide_at(data.joint("window_slide").qpos[0], goal["window_pos"])])


def build_scene(base, kind: str) -> Scene:
    """Objects, gripper and every ground predicate's truth from the live MuJoCo state."""
    data = base._data
    info = base.compute_ob_info()
    objects, truths = [], {}
    eff = np.asarray(info["proprio/effector_pos"], float)
    closed_on_something = float(info["proprio/gripper_contact"][0]) > 0.5
    holding = None
    n_cubes = cube_count(base)
    cube_pos = [np.asarray(data.joint(f"object_joint_{i}").qpos[:3], float) for i in range(n_cubes)]
    colors = CUBE_COLORS if kind == "cube" else ("red", "blue")
    for i, pos in enumerate(cube_pos):
        quat = tuple(float(q) for q in data.joint(f"object_joint_{i}").qpos[3:7])
        target = np.asarray(data.mocap_pos[base._cube_target_mocap_ids[i]], float)
        held = predicates.holding(closed_on_something, eff, pos)
        if held:
            holding = f"cube_{i}"
        state = {"at_target": bool(predicates.at(pos, target)), "held": held}
        objects.append(SceneObject(f"cube_{i}", f"{colors[i]} cube", "cube", colors[i], tuple(map(float, pos)), quat, state))
        objects.append(SceneObject(f"target_{i}", f"target of the {colors[i]} cube", "target", colors[i],
                                   tuple(map(float, target)), None, {}))
        truths[f"at(cube_{i},target_{i})"] = state["at_target"]
        truths[f"holding(cube_{i})"] = held
    for i in range(n_cubes):
        for j in range(n_cubes):
            if i != j:
                truths[f"on(cube_{i},cube_{j})"] = predicates.on(cube_pos[i], cube_pos[j])
    if kind == "scene":
        buttons = np.asarray(base._cur_button_states).reshape(-1)
        slides = {what: float(data.joint(f"{what}_slide").qpos[0]) for what in predicates.SLIDES}
        open_pos = {"drawer": predicates.DRAWER_OPEN_M, "window": predicates.WINDOW_OPEN_M}
        sites = {"drawer": base._drawer_site_id, "window": base._window_site_id}
        for i, what in enumerate(predicates.SLIDES):
            is_open, is_closed = predicates.is_open(what, slides[what]), predicates.is_closed(what, slides[what])
            objects.append(SceneObject(what, what, what, None, tuple(map(float, data.site_xpos[sites[what]])), None,
                                       {"open": is_open, "closed": is_closed, "open_frac": slides[what] / open_pos[what],
                                        "locked": bool(buttons[i] == 0)}))
        for i, what in enumerate(predicates.SLIDES):
            color = "red" if buttons[i] == 0 else "white"
            objects.append(SceneObject(f"button_{i}", f"{what} lock button", "button", color,
                                       tuple(map(float, data.site_xpos[base._button_site_ids[i]])), None,
                                       {"unlocks": what, "state": int(buttons[i]), "locked": bool(buttons[i] == 0)}))
            truths[f"locked({what})"] = bool(buttons[i] == 0)
            truths[f"unlocked({what})"] = bool(buttons[i] == 1)
        for what in predicates.SLIDES:
            truths[f"open({what})"] = predicates.is_open(what, slides[what])
            truths[f"closed({what})"] = predicates.is_closed(what, slides[what])
        for i, pos in enumerate(cube_pos):
            truths[f"in(cube_{i},drawer)"] = bool(base._is_in_drawer(pos))
    if kind == "puzzle":
        buttons = np.asarray(base._cur_button_states).reshape(-1)
        rows, cols = base._num_rows, base._num_cols
        for i, state in enumerate(buttons):
            color = "blue" if state else "red"
            objects.append(SceneObject(f"button_{i}", f"{grid_words(i, rows, cols)} button", "button", color,
                                       tuple(map(float, data.site_xpos[base._button_site_ids[i]])), None,
                                       {"state": int(state), "row": i // cols, "col": i % cols}))
            truths[f"blue(button_{i})"] = bool(state == 1)
            truths[f"red(button_{i})"] = bool(state == 0)
    gripper = {"pos_m": tuple(map(float, eff)), "opening": float(info["proprio/gripper_opening"][0]),
               "holding": holding}
    return Scene(objects=tuple(objects), gripper=gripper, truths=truths)
