"""Symbolic state of a manipulation world: the ground atoms planners and the validator reason over.

Atoms (strings, as `str(Predicate)`): holding(x), on(x,y), in(x,drawer), at(x,place), open(d),
closed(d), locked(d), unlocked(d) (complementary pairs, so every skill's success condition is a set
of true atoms). Where the scene does not evaluate an atom itself, it is computed from object poses and
articulation states with `sims.predicates`, the predicates the sims and the dataset labels use
(OGBench's success tolerances), so a symbolic "true" matches the sim.
"""
from __future__ import annotations

import numpy as np

from planners.base import World
from sims import predicates

GRASPABLE = ("cube",)
ARTICULATED = predicates.SLIDES


def _pos(obj) -> np.ndarray:
    return np.asarray(obj.pos_m, dtype=float)


VOCABULARY = ("holding", "on", "in", "at", "open", "closed", "locked", "unlocked")


def atoms(world: World) -> frozenset[str]:
    """Every true atom in the world (closed world: anything absent is false).

    Atoms the scene itself evaluates (`Scene.truths`, from the simulator's own tests) win; the rest
    (placements at named places, and everything for scenes without truths) come from geometry.
    """
    true = _geometric_atoms(world)
    for key, value in world.scene.truths.items():
        if key.split("(", 1)[0] in VOCABULARY:
            (true.add if value else true.discard)(key)
    return frozenset(true)


def _geometric_atoms(world: World) -> set[str]:
    true: set[str] = set()
    held = world.holding()
    if held:
        true.add(f"holding({held})")
    cubes = [o for o in world.objects if o.kind in GRASPABLE]
    for d in world.objects:
        if d.kind in ARTICULATED:
            is_open = bool(d.state.get("open", False))
            true.add(f"open({d.id})" if is_open else f"closed({d.id})")
            true.add(f"locked({d.id})" if d.state.get("locked", False) else f"unlocked({d.id})")
            if d.state.get("closed") is False and not is_open:
                true.discard(f"closed({d.id})")  # half open: neither
    for c in cubes:
        if c.id == held:
            continue
        p = _pos(c)
        for other in cubes:
            if other.id == c.id or other.id == held:
                continue
            if predicates.on(p, _pos(other)):
                true.add(f"on({c.id},{other.id})")
        for d in world.objects:
            if d.kind == "drawer" and _in_drawer(p, d):
                true.add(f"in({c.id},{d.id})")
        for place in world.places:
            if predicates.at(p, _pos(place)):
                true.add(f"at({c.id},{place.id})")
    return true


def _in_drawer(p: np.ndarray, drawer) -> bool:
    """Inside the drawer box: within its interior footprint and below the drawer rim."""
    center = interior_m(drawer)
    half = np.asarray(drawer.state.get("interior_half_m", (0.12, 0.1)), dtype=float)
    return bool(np.all(np.abs(p[:2] - center[:2]) <= half) and p[2] < center[2] + 0.085)


def interior_m(drawer) -> np.ndarray:
    """Where a cube goes in the drawer: OGBench's drawer box is 0.07-0.27 m behind the handle (-y)."""
    if "interior_pos_m" in drawer.state:
        return np.asarray(drawer.state["interior_pos_m"], dtype=float)
    handle = np.asarray(drawer.pos_m, dtype=float)
    return np.array([0.33, handle[1] - 0.17, 0.066])


def clear(state: frozenset[str], obj_id: str) -> bool:
    """Nothing stacked on obj_id."""
    return not any(a.startswith("on(") and a.endswith(f",{obj_id})") for a in state)


def hand_empty(state: frozenset[str]) -> bool:
    return not any(a.startswith("holding(") for a in state)


def location_atoms(state: frozenset[str], obj_id: str) -> list[str]:
    """on/in/at atoms that say where obj_id rests."""
    return [a for a in state if a.split("(", 1)[0] in ("on", "in", "at") and a.split("(", 1)[1].startswith(f"{obj_id},")]


def occupied(state: frozenset[str], place_id: str) -> bool:
    return any(a.startswith("at(") and a.endswith(f",{place_id})") for a in state)
