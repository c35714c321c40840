"""Scene introspection: what a planner or a success detector may know about a manipulation scene.

Plain dataclasses and predicate helpers, no simulator code: envs build a `Scene` from their live
state (see sims/manip_scene.py); planners read it. Predicates are ground atoms such as `on(cube_0,cube_1)`
or `open(drawer)`; `Scene.truths` maps `str(pred)` to its truth for every atom the env can evaluate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from embodied.errors import UserError

_PRED_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(\s*(.*?)\s*\)\s*$")
_ARG_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class SceneObject:
    """One object: stable id, human words, and its pose and articulation state."""

    id: str  # stable and unique in the scene: "cube_0", "drawer", "window", "button_0"
    name: str  # human words: "red cube", "drawer", "window", "blue button"
    kind: str  # "cube" | "drawer" | "window" | "button" | "lock" ...
    color: str | None
    pos_m: tuple[float, float, float]
    quat_wxyz: tuple[float, float, float, float] | None
    state: dict = field(default_factory=dict)  # e.g. {"open": True, "open_frac": 0.93}


@dataclass(frozen=True)
class Predicate:
    """A ground atom: `name(arg, ...)`; `str()` and `parse()` are inverses."""

    name: str  # "on", "at", "open", "closed", "pressed", "holding", "in" ...
    args: tuple[str, ...]

    def __post_init__(self):
        # Accept a list for args but store a tuple so predicates stay hashable.
        if not isinstance(self.args, tuple):
            object.__setattr__(self, "args", tuple(self.args))

    def __str__(self) -> str:
        return f"{self.name}({','.join(self.args)})"

    @classmethod
    def parse(cls, text: str) -> "Predicate":
        """`"on(cube_0, cube_1)"` -> Predicate("on", ("cube_0", "cube_1")); UserError on bad text."""
        if not isinstance(text, str):
            raise UserError(f"predicate must be a string like 'on(cube_0,cube_1)', got {text!r}")
        match = _PRED_RE.match(text)
        if match is None:
            raise UserError(f"bad predicate {text!r}: write name(arg,...), e.g. 'open(drawer)'")
        name, body = match.groups()
        args = tuple(a.strip() for a in body.split(",")) if body else ()
        bad = [a for a in args if not _ARG_RE.match(a)]
        if bad:
            raise UserError(f"bad predicate {text!r}: argument(s) {bad} must be ids like cube_0")
        return cls(name, args)


@dataclass
class Scene:
    """A snapshot of a scene: objects, the gripper, and the truth of every ground predicate."""

    objects: tuple[SceneObject, ...]
    gripper: dict  # {"pos_m": (x, y, z), "opening": 0..1, "holding": object id or None}
    truths: dict[str, bool]  # str(Predicate) -> truth

    def object(self, obj_id: str) -> SceneObject:
        for obj in self.objects:
            if obj.id == obj_id:
                return obj
        raise UserError(f"unknown object id {obj_id!r}; the scene has: {', '.join(self.ids())}")

    def ids(self) -> list[str]:
        return [obj.id for obj in self.objects]

    def holds(self, pred: Predicate | str) -> bool:
        """Truth of a ground predicate; UserError (listing what is known) when it is not known."""
        key = str(pred) if isinstance(pred, Predicate) else str(Predicate.parse(pred))
        try:
            return bool(self.truths[key])
        except KeyError:
            known = ", ".join(sorted(self.truths)[:40])
            raise UserError(f"unknown predicate {key!r}; this scene knows: {known}") from None

    def true_predicates(self) -> list[Predicate]:
        """Every ground predicate that holds now, parsed (handy for prompts)."""
        return [Predicate.parse(k) for k, v in sorted(self.truths.items()) if v]
