"""Breadth-first search over the symbolic model: the shortest skill sequence that reaches a goal."""
from __future__ import annotations

from collections import deque

from planners.base import SubGoal, World
from planners.grounding import candidates
from planners.skills import SkillLibrary

Goal = tuple[str, bool]  # (atom, wanted truth)


def satisfied(state: frozenset, goals: list[Goal]) -> bool:
    return all((atom in state) == want for atom, want in goals)


def shortest_plan(world: World, library: SkillLibrary, goals: list[Goal], state: frozenset,
                  max_depth: int = 8) -> list[SubGoal] | None:
    """None when no plan of at most max_depth sub-goals reaches every goal atom."""
    actions = [(c.skill, c.args) for c in candidates(world, library, state)]
    start = state
    parents: dict[frozenset, tuple[frozenset, tuple] | None] = {start: None}
    frontier = deque([(start, 0)])
    found = start if satisfied(start, goals) else None
    while frontier and found is None:
        s, depth = frontier.popleft()
        if depth >= max_depth:
            continue
        for name, args in actions:
            skill = library.get(name)
            if skill.check(s, args) is not None:
                continue
            nxt = skill.apply(s, args)
            if nxt in parents:
                continue
            parents[nxt] = (s, (name, args))
            if satisfied(nxt, goals):
                found = nxt
                break
            frontier.append((nxt, depth + 1))
    if found is None:
        return None
    steps = []
    s = found
    while parents[s] is not None:
        prev, action = parents[s]
        steps.append((prev, action))
        s = prev
    steps.reverse()
    return [library.make_subgoal(world, name, args, prev) for prev, (name, args) in steps]
