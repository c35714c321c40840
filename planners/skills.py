"""Skill registry: what the robot can do, in words a planner can choose from.

A skill has a name, a description, typed arguments (the object kinds each argument accepts), a
sentence template, symbolic preconditions and effects (for the validator, the affordance value and
the rule-based planner), a success detector, and a policy factory that turns a grounded `SubGoal`
into actions. Scripted OGBench oracles (planners/oracle_skills.py) and learned goal- or
language-conditioned checkpoints (planners/learned_skill.py) register the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from embodied.errors import UserError
from planners import symbolic as sym
from planners.base import SubGoal, World
from sims.scene import Predicate


@dataclass(frozen=True)
class Arg:
    name: str
    kinds: tuple[str, ...]  # object kinds this argument accepts


class SkillPolicy(Protocol):
    """Runs one sub-goal on an env: `act(obs, info) -> action`; `done` once it gave up or finished."""

    done: bool

    def reset(self, obs: dict, info: dict) -> None: ...

    def act(self, obs: dict, info: dict) -> np.ndarray: ...


# checker(state, args) -> None when the precondition holds, else a short reason ("the drawer is locked")
Precondition = Callable[[frozenset, tuple], "str | None"]
# effects(state, args) -> (add, delete) atom sets
Effects = Callable[[frozenset, tuple], "tuple[set[str], set[str]]"]
PolicyFactory = Callable[[object, SubGoal], SkillPolicy]


@dataclass
class Skill:
    name: str
    description: str
    args: tuple[Arg, ...]
    template: str  # e.g. "put the {obj} in the {target}"; placeholders are arg names -> object names
    preconditions: tuple[Precondition, ...]
    effects: Effects
    policy: PolicyFactory | None = None  # None: symbolic only (planning tests)
    max_steps: int = 300  # env steps before the executor calls it a timeout
    affordance_fn: Callable[[World, tuple], float] | None = None
    extra: dict = field(default_factory=dict)

    def check(self, state: frozenset, args: tuple) -> str | None:
        """First failed precondition's reason, or None when the skill may run."""
        for pre in self.preconditions:
            reason = pre(state, args)
            if reason:
                return reason
        return None

    def apply(self, state: frozenset, args: tuple) -> frozenset:
        add, delete = self.effects(state, args)
        return frozenset((set(state) - delete) | add)

    def success_atoms(self, state: frozenset, args: tuple) -> tuple[Predicate, ...]:
        """The atoms the success detector requires: the skill's add-effects."""
        add, _ = self.effects(state, args)
        return tuple(Predicate.parse(a) for a in sorted(add))

    def succeeded(self, world: World, subgoal: SubGoal) -> bool:
        """Success detector: every success atom holds in the live world."""
        now = sym.atoms(world)
        return all(str(p) in now for p in subgoal.success)

    def affordance(self, world: World, args: tuple, state: frozenset | None = None) -> float:
        """V(state, skill, args) in [0, 1]: 0 when a precondition fails, else the skill's own estimate."""
        state = sym.atoms(world) if state is None else state
        if self.check(state, args) is not None:
            return 0.0
        return 1.0 if self.affordance_fn is None else float(self.affordance_fn(world, args))

    def describe(self, world: World, args: tuple) -> str:
        names = {a.name: world.object(v).name for a, v in zip(self.args, args)}
        return self.template.format(**names)


class SkillLibrary:
    """The skills one robot has, by name."""

    def __init__(self, skills=()):
        self._skills: dict[str, Skill] = {}
        for s in skills:
            self.register(s)

    def register(self, skill: Skill) -> Skill:
        if skill.name in self._skills:
            raise ValueError(f"skill {skill.name!r} is registered twice")
        self._skills[skill.name] = skill
        return skill

    def get(self, name: str) -> Skill:
        try:
            return self._skills[name]
        except KeyError:
            raise UserError(f"unknown skill {name!r}; registered skills: {', '.join(self._skills)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._skills

    def __iter__(self):
        return iter(self._skills.values())

    def names(self) -> list[str]:
        return list(self._skills)

    def make_subgoal(self, world: World, skill_name: str, args, state: frozenset | None = None) -> SubGoal:
        """A SubGoal with text, success atoms and goal encoding; UserError when args do not type-check."""
        skill = self.get(skill_name)
        args = tuple(args)
        if len(args) != len(skill.args):
            raise UserError(f"skill {skill.name} takes {len(skill.args)} argument(s), got {list(args)}")
        for spec, value in zip(skill.args, args):
            if not world.has(value):
                raise UserError(f"{skill.name}: unknown object {value!r}; the scene has: {', '.join(world.ids())}")
            kind = world.object(value).kind
            if kind not in spec.kinds:
                raise UserError(f"{skill.name}: argument {spec.name}={value} is a {kind}, needs one of {spec.kinds}")
        state = sym.atoms(world) if state is None else state
        text = skill.describe(world, args)
        success = skill.success_atoms(state, args)
        goal = {
            "skill": skill.name,
            "args": list(args),
            "text": text,
            "target_pos_m": [list(map(float, world.object(a).pos_m)) for a in args],
        }
        return SubGoal(skill.name, args, text=text, success=success, goal=goal)


# ---- the manipulation skills' symbolic model -------------------------------------------------


def _needs_empty_hand(state, args):
    return None if sym.hand_empty(state) else "the gripper is already holding something"


def _pick_pre(state, args):
    (obj,) = args
    if f"holding({obj})" in state:
        return f"{obj} is already held"
    if not sym.clear(state, obj):
        return f"something is stacked on {obj}"
    for a in sym.location_atoms(state, obj):
        if a.startswith("in(") and f"open({a[:-1].split(',')[1]})" not in state:
            return f"{obj} is inside a closed drawer"
    return None


def _pick_eff(state, args):
    (obj,) = args
    return {f"holding({obj})"}, set(sym.location_atoms(state, obj))


def _place_pre(state, args):
    obj, target = args
    if f"holding({obj})" not in state:
        return f"the gripper is not holding {obj}"
    if target == obj:
        return f"cannot place {obj} on itself"
    return None


def _place_target_pre_cube(state, args):
    obj, target = args
    if not sym.clear(state, target):
        return f"something is already on {target}"
    if any(a.startswith(f"in({target},") for a in state):
        return f"{target} is inside the drawer"
    return None


def _place_target_pre_drawer(state, args):
    _, target = args
    return None if f"open({target})" in state else f"the {target} is closed"


def _place_target_pre_place(state, args):
    _, target = args
    return f"another object is already at {target}" if sym.occupied(state, target) else None


PLACE_KINDS = ("place", "target")  # named table spots and the task's target markers


def _place_relation(target_kind: str) -> str:
    return {"cube": "on", "drawer": "in", "place": "at", "target": "at"}[target_kind]


def _place_eff_for(kind):
    def eff(state, args):
        obj, target = args
        return {f"{_place_relation(kind)}({obj},{target})"}, {f"holding({obj})"}

    return eff


def _unlocked(state, args):
    return f"the {args[0]} is locked" if f"locked({args[0]})" in state else None


def _open_pre(state, args):
    return f"the {args[0]} is already open" if f"open({args[0]})" in state else None


def _close_pre(state, args):
    return f"the {args[0]} is already closed" if f"closed({args[0]})" in state else None


def _open_eff(state, args):
    return {f"open({args[0]})"}, {f"closed({args[0]})"}


def _close_eff(state, args):
    return {f"closed({args[0]})"}, {f"open({args[0]})"}


def press_effects(controls: dict[str, str]) -> Effects:
    """Pressing a button toggles the lock of the object it controls (OGBench scene: button_0 -> drawer)."""

    def eff(state, args):
        target = controls.get(args[0])
        if target is None:
            return set(), set()
        locked, unlocked = f"locked({target})", f"unlocked({target})"
        return ({unlocked}, {locked}) if locked in state else ({locked}, {unlocked})

    return eff


def manipulation_skills(controls: dict[str, str] | None = None, policies: dict[str, PolicyFactory] | None = None) -> SkillLibrary:
    """pick, place_on/place_in/place_at (one `place` per target kind, so args stay typed), open, close, press."""
    policies = policies or {}
    controls = controls or {}
    lib = SkillLibrary()
    lib.register(Skill("pick", "grasp a cube and lift it", (Arg("obj", ("cube",)),), "pick up the {obj}",
                       (_needs_empty_hand, _pick_pre), _pick_eff, policies.get("pick"), max_steps=200))
    for kind, template in (("cube", "put the {obj} on the {target}"), ("drawer", "put the {obj} in the {target}"),
                           ("place", "put the {obj} on the {target}")):
        pre = {"cube": _place_target_pre_cube, "drawer": _place_target_pre_drawer, "place": _place_target_pre_place}[kind]
        kinds = PLACE_KINDS if kind == "place" else (kind,)
        lib.register(Skill(f"place_{_place_relation(kind)}", f"put a held cube {_place_relation(kind)} a {kind}",
                           (Arg("obj", ("cube",)), Arg("target", kinds)), template, (_place_pre, pre),
                           _place_eff_for(kind), policies.get("place"), max_steps=250))
    lib.register(Skill("open", "slide a drawer or window open", (Arg("obj", sym.ARTICULATED),), "open the {obj}",
                       (_needs_empty_hand, _unlocked, _open_pre), _open_eff, policies.get("open"), max_steps=200))
    lib.register(Skill("close", "slide a drawer or window closed", (Arg("obj", sym.ARTICULATED),), "close the {obj}",
                       (_needs_empty_hand, _unlocked, _close_pre), _close_eff, policies.get("close"), max_steps=200))
    lib.register(Skill("press", "press a button (it toggles a lock)", (Arg("obj", ("button",)),), "press the {obj}",
                       (_needs_empty_hand,), press_effects(controls), policies.get("press"), max_steps=150))
    return lib
