"""Symbolic plan check before anything moves: objects exist, skills exist, preconditions hold.

The plan is simulated on the symbolic state (planners/symbolic.py): each sub-goal's preconditions are
checked in the state the earlier sub-goals leave behind (the gripper is free before a pick, the
drawer is open before placing into it, the drawer is unlocked before opening it).
"""
from __future__ import annotations

from dataclasses import dataclass

from planners import symbolic as sym
from planners.base import SubGoal, World
from planners.grounding import candidates
from planners.skills import SkillLibrary

UNGROUNDED = "ungrounded"
PRECONDITION = "invalid_precondition"


@dataclass
class Verdict:
    ok: bool
    index: int = -1  # first bad sub-goal
    category: str = ""  # UNGROUNDED | PRECONDITION
    reason: str = ""
    final_state: frozenset = frozenset()

    def message(self, plan: list[SubGoal]) -> str:
        if self.ok:
            return "ok"
        return f"step {self.index + 1} ({plan[self.index].text or plan[self.index].key}) is invalid: {self.reason}"


def validate(world: World, plan: list[SubGoal], library: SkillLibrary, state: frozenset | None = None) -> Verdict:
    state = sym.atoms(world) if state is None else state
    grounded = {c.key for c in candidates(world, library, state)}
    for i, goal in enumerate(plan):
        if goal.skill not in library:
            return Verdict(False, i, UNGROUNDED, f"there is no skill named {goal.skill!r}", state)
        missing = [a for a in goal.args if not world.has(a)]
        if missing:
            return Verdict(False, i, UNGROUNDED, f"no object {missing[0]!r} in the scene", state)
        if goal.key not in grounded:
            return Verdict(False, i, UNGROUNDED, f"{goal.key} does not fit the skill's argument types", state)
        skill = library.get(goal.skill)
        reason = skill.check(state, goal.args)
        if reason:
            return Verdict(False, i, PRECONDITION, reason, state)
        state = skill.apply(state, goal.args)
    return Verdict(True, final_state=state)
