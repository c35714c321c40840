"""Language for the manipulation tasks: sub-goal descriptions, task instructions, play-data targets.

Text comes from the task definition (table regions as seen from the front camera, stacking, the
drawer and window, their locks, puzzle grid positions); an `rng` picks among paraphrases and
`rng=None` gives the canonical wording.
"""
from __future__ import annotations

import numpy as np

from embodied.errors import UserError
from sims import predicates
from sims.manip_scene import CUBE_COLORS, cube_count, grid_words, task_subgoals
from sims.scene import Predicate

_CUBE_TEMPLATES = ("put the {obj} {at}", "move the {obj} {to}", "place the {obj} {at}",
                   "bring the {obj} {to}", "pick up the {obj} and set it down {at}")
_STACK_TEMPLATES = ("put the {a} cube on the {b} one", "stack {a} on {b}", "place the {a} cube on top of the {b} cube",
                    "stack the {a} cube onto the {b} cube", "pick up the {a} cube and put it on the {b} cube")
_PHRASES = {
    "open(drawer)": ("open the drawer", "pull the drawer open", "slide the drawer out"),
    "closed(drawer)": ("close the drawer", "push the drawer shut", "slide the drawer closed"),
    "open(window)": ("open the window", "slide the window open", "push the window open"),
    "closed(window)": ("close the window", "slide the window shut", "push the window closed"),
    "locked(drawer)": ("lock the drawer", "press the drawer button so the drawer is locked", "make sure the drawer is locked"),
    "unlocked(drawer)": ("unlock the drawer", "press the drawer button to unlock the drawer", "make sure the drawer is unlocked"),
    "locked(window)": ("lock the window", "press the window button so the window is locked", "make sure the window is locked"),
    "unlocked(window)": ("unlock the window", "press the window button to unlock the window", "make sure the window is unlocked"),
}
_BUTTON_TEMPLATES = ("turn the {name} {color}", "make the {name} {color}", "switch the {name} to {color}")
_ALL_BUTTONS = ("make all the buttons {color}", "turn every button {color}", "set all the buttons to {color}")
_PRESS_TEMPLATES = ("press the {} button", "push the {} button", "tap the {} button")


def region_words(pos) -> str:
    """Where on the table, as seen from the front camera (+x toward the camera, +y to the right)."""
    x, y = float(pos[0]), float(pos[1])
    depth = "back" if x < 0.39 else ("front" if x > 0.46 else "")
    side = "left" if y < -0.06 else ("right" if y > 0.06 else "")
    if depth and side:
        return f"{depth} {side}"
    return depth or side or "center"


def _pick(options, rng) -> str:
    return options[0] if rng is None else options[int(rng.integers(len(options)))]


def _cube_target(base, i: int) -> np.ndarray:
    return np.asarray(base._data.mocap_pos[base._cube_target_mocap_ids[i]], float)


def describe_predicate(base, kind: str, pred: Predicate, rng=None) -> str:
    """Natural-language text of one sub-goal; `rng` picks a paraphrase (None: the canonical one)."""
    key = str(pred)
    if key in _PHRASES:
        return _pick(_PHRASES[key], rng)
    colors = CUBE_COLORS if kind == "cube" else ("red", "blue")
    if pred.name == "at" and len(pred.args) == 2 and pred.args[0].startswith("cube_"):
        i = int(pred.args[0].split("_")[1])
        if not 0 <= i < cube_count(base):
            raise UserError(f"unknown object {pred.args[0]!r} in {key}; cubes: cube_0..cube_{cube_count(base) - 1}")
        target = _cube_target(base, i)
        for j in range(cube_count(base)):  # stacked on another cube's target?
            if j != i and predicates.on(target, _cube_target(base, j)):
                return _pick(_STACK_TEMPLATES, rng).format(a=colors[i], b=colors[j])
        if kind == "scene" and base._is_in_drawer(target):
            at = to = "in the drawer"
        else:
            region = region_words(target)
            at = _pick(("at the {r} of the table", "on the {r} spot"), rng).format(r=region)
            to = _pick(("to the {r} of the table", "over to the {r} spot"), rng).format(r=region)
        return _pick(_CUBE_TEMPLATES, rng).format(obj=f"{colors[i]} cube", at=at, to=to)
    if pred.name in ("blue", "red") and kind == "puzzle" and len(pred.args) == 1:
        i = int(pred.args[0].split("_")[1])
        name = f"{grid_words(i, base._num_rows, base._num_cols)} button"
        return _pick(_BUTTON_TEMPLATES, rng).format(name=name, color=pred.name)
    if pred.name == "on" and len(pred.args) == 2:
        a, b = (colors[int(x.split("_")[1])] for x in pred.args)
        return _pick(_STACK_TEMPLATES, rng).format(a=a, b=b)
    raise UserError(f"no description for predicate {key!r} in a {kind} task; sub-goals look like "
                    f"{', '.join(str(p) for p in task_subgoals(base, kind)[:3])}")


def _join(parts: list[str], rng) -> str:
    if len(parts) == 1:
        return parts[0]
    style = 0 if rng is None else int(rng.integers(3))
    if style == 0:
        return ", ".join(parts[:-1]) + " and " + parts[-1]
    if style == 1:
        return "first " + ", then ".join(parts)
    return "; ".join(parts)


def instruction_text(base, kind: str, preds: list[Predicate], rng=None) -> str:
    """One instruction for a set of sub-goals, with paraphrase variety drawn from `rng`."""
    if kind == "puzzle":
        colors = {p.name for p in preds}
        all_preds = task_subgoals(base, kind)
        if len({p.name for p in all_preds}) == 1 and rng is not None and rng.random() < 0.5:
            return _pick(_ALL_BUTTONS, rng).format(color=all_preds[0].name)
        if len(colors) == 1 and len(preds) == len(all_preds):
            return _pick(_ALL_BUTTONS, rng).format(color=colors.pop())
    return _join([describe_predicate(base, kind, p, rng) for p in preds], rng)


def play_target_text(base, kind: str, info: dict, rng) -> str:
    """Language for the random target OGBench's data-collection mode just set (its `privileged/*` info)."""
    task = info["privileged/target_task"]
    if task == "cube":
        block = int(info["privileged/target_block"])
        return describe_predicate(base, "scene" if kind == "scene" else "cube",
                                  Predicate("at", (f"cube_{block}", f"target_{block}")), rng)
    if task == "button":
        i = int(info["privileged/target_button"])
        if kind == "puzzle":
            return _PRESS_TEMPLATES[int(rng.integers(3))].format(grid_words(i, base._num_rows, base._num_cols))
        what = predicates.SLIDES[i]
        word = "unlocked" if int(info["privileged/target_button_state"]) == 1 else "locked"
        return describe_predicate(base, kind, Predicate(word, (what,)), rng)
    target = float(np.asarray(info[f"privileged/target_{task}_pos"]).reshape(-1)[0])
    return describe_predicate(base, kind, Predicate(predicates.target_word(task, target), (task,)), rng)
