"""Language for the manipulation tasks: sub-goal descriptions, task instructions, play-data targets.

Text comes from the task definition (table regions as seen from the front camera, stacking, the
drawer and window, their locks, puzzle grid positions); an `rng` picks among paraphrases and
`rng=None` gives the canonical wording.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embodied.errors import UserError
from sims import predicates
from sims.manip_scene import CUBE_COLORS, cube_count, grid_words, task_subgoals
from sims.scene import Predicate

@dataclass(frozen=True)
class Wording:
    """One vocabulary of instruction templates. `train` is what datasets are generated with; `heldout`
    shares none of its templates, so evaluating on it measures generalisation to unseen paraphrases."""
    cube: tuple
    at: tuple
    to: tuple
    stack: tuple
    phrases: dict
    buttons: tuple
    all_buttons: tuple
    joins: tuple          # how several sub-goals are joined: "and", "first ..., then", ";" (train)


TRAIN = Wording(
    cube=("put the {obj} {at}", "move the {obj} {to}", "place the {obj} {at}", "bring the {obj} {to}",
          "pick up the {obj} and set it down {at}"),
    at=("at the {r} of the table", "on the {r} spot"),
    to=("to the {r} of the table", "over to the {r} spot"),
    stack=("put the {a} cube on the {b} one", "stack {a} on {b}", "place the {a} cube on top of the {b} cube",
           "stack the {a} cube onto the {b} cube", "pick up the {a} cube and put it on the {b} cube"),
    phrases={
        "open(drawer)": ("open the drawer", "pull the drawer open", "slide the drawer out"),
        "closed(drawer)": ("close the drawer", "push the drawer shut", "slide the drawer closed"),
        "open(window)": ("open the window", "slide the window open", "push the window open"),
        "closed(window)": ("close the window", "slide the window shut", "push the window closed"),
        "locked(drawer)": ("lock the drawer", "press the drawer button so the drawer is locked",
                           "make sure the drawer is locked"),
        "unlocked(drawer)": ("unlock the drawer", "press the drawer button to unlock the drawer",
                             "make sure the drawer is unlocked"),
        "locked(window)": ("lock the window", "press the window button so the window is locked",
                           "make sure the window is locked"),
        "unlocked(window)": ("unlock the window", "press the window button to unlock the window",
                             "make sure the window is unlocked"),
    },
    buttons=("turn the {name} {color}", "make the {name} {color}", "switch the {name} to {color}"),
    all_buttons=("make all the buttons {color}", "turn every button {color}", "set all the buttons to {color}"),
    joins=("and", "first-then", "semicolon"),
)

HELDOUT = Wording(
    cube=("could you get the {obj} {to}", "the {obj} belongs {at}", "carry the {obj} {to}",
          "i want the {obj} {at}"),
    at=("in the {r} area of the table", "at the {r} part of the table"),
    to=("toward the {r} area of the table", "across to the {r} part of the table"),
    stack=("set the {a} cube onto the {b} cube", "the {a} cube goes on top of the {b} cube",
           "balance the {a} cube on the {b} cube"),
    phrases={
        "open(drawer)": ("drag the drawer open", "get the drawer open"),
        "closed(drawer)": ("shut the drawer", "get the drawer closed"),
        "open(window)": ("move the window so it is open", "get the window open"),
        "closed(window)": ("shut the window", "get the window closed"),
        "locked(drawer)": ("engage the drawer lock", "the drawer should end up locked"),
        "unlocked(drawer)": ("release the drawer lock", "the drawer should end up unlocked"),
        "locked(window)": ("engage the window lock", "the window should end up locked"),
        "unlocked(window)": ("release the window lock", "the window should end up unlocked"),
    },
    buttons=("change the {name} to {color}", "have the {name} show {color}"),
    all_buttons=("every button should be {color}", "change all of the buttons to {color}"),
    joins=("after-that", "period-then"),
)

WORDINGS = {"train": TRAIN, "heldout": HELDOUT}
_PRESS_TEMPLATES = ("press the {} button", "push the {} button", "tap the {} button")   # play data only


def wording(name: str) -> Wording:
    if name not in WORDINGS:
        raise UserError(f"wording={name!r}: choose one of {', '.join(WORDINGS)}")
    return WORDINGS[name]


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


def describe_predicate(base, kind: str, pred: Predicate, rng=None, words: str = "train") -> str:
    """Natural-language text of one sub-goal; `rng` picks a paraphrase (None: the canonical one) from
    the `words` vocabulary (train | heldout)."""
    w, key = wording(words), str(pred)
    if key in w.phrases:
        return _pick(w.phrases[key], rng)
    colors = CUBE_COLORS if kind == "cube" else ("red", "blue")
    if pred.name == "at" and len(pred.args) == 2 and pred.args[0].startswith("cube_"):
        i = int(pred.args[0].split("_")[1])
        if not 0 <= i < cube_count(base):
            raise UserError(f"unknown object {pred.args[0]!r} in {key}; cubes: cube_0..cube_{cube_count(base) - 1}")
        target = _cube_target(base, i)
        for j in range(cube_count(base)):  # stacked on another cube's target?
            if j != i and predicates.on(target, _cube_target(base, j)):
                return _pick(w.stack, rng).format(a=colors[i], b=colors[j])
        if kind == "scene" and base._is_in_drawer(target):
            at = to = "in the drawer"
        else:
            region = region_words(target)
            at, to = _pick(w.at, rng).format(r=region), _pick(w.to, rng).format(r=region)
        return _pick(w.cube, rng).format(obj=f"{colors[i]} cube", at=at, to=to)
    if pred.name in ("blue", "red") and kind == "puzzle" and len(pred.args) == 1:
        i = int(pred.args[0].split("_")[1])
        name = f"{grid_words(i, base._num_rows, base._num_cols)} button"
        return _pick(w.buttons, rng).format(name=name, color=pred.name)
    if pred.name == "on" and len(pred.args) == 2:
        a, b = (colors[int(x.split("_")[1])] for x in pred.args)
        return _pick(w.stack, rng).format(a=a, b=b)
    raise UserError(f"no description for predicate {key!r} in a {kind} task; sub-goals look like "
                    f"{', '.join(str(p) for p in task_subgoals(base, kind)[:3])}")


def _join(parts: list[str], rng, joins: tuple) -> str:
    if len(parts) == 1:
        return parts[0]
    style = _pick(joins, rng)
    if style == "and":
        return ", ".join(parts[:-1]) + " and " + parts[-1]
    if style == "first-then":
        return "first " + ", then ".join(parts)
    if style == "semicolon":
        return "; ".join(parts)
    if style == "after-that":
        return ", after that ".join(parts)
    return ". then ".join(parts)    # period-then


def instruction_text(base, kind: str, preds: list[Predicate], rng=None, words: str = "train") -> str:
    """One instruction for a set of sub-goals, with paraphrase variety drawn from `rng` out of the
    `words` vocabulary (train: what datasets use; heldout: none of those templates)."""
    w = wording(words)
    if kind == "puzzle":
        colors = {p.name for p in preds}
        all_preds = task_subgoals(base, kind)
        if len({p.name for p in all_preds}) == 1 and rng is not None and rng.random() < 0.5:
            return _pick(w.all_buttons, rng).format(color=all_preds[0].name)
        if len(colors) == 1 and len(preds) == len(all_preds):
            return _pick(w.all_buttons, rng).format(color=colors.pop())
    return _join([describe_predicate(base, kind, p, rng, words) for p in preds], rng, w.joins)


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
