"""Deterministic rule-based planner: parse the instruction into goal atoms, then search.

The baseline and the test oracle. Each clause ("put the red cube in the drawer", "close it") maps to
goal atoms through a small verb grammar; object mentions resolve against the scene's names, colours
and kinds ("it" is the last object mentioned). A mention that matches nothing in the scene, a clause
with no known verb, or goals no skill sequence can reach give a PlanRefusal, never a guess.
"""
from __future__ import annotations

import re

from planners import symbolic as sym
from planners.base import PlanRefusal, PlanResult, World
from planners.grounding import candidates
from planners.search import Goal, satisfied, shortest_plan
from planners.skills import SkillLibrary

COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "pink", "white", "black", "gray", "grey", "cyan", "magenta", "brown")
NOUNS = {
    "cube": "cube", "cubes": "cube", "block": "cube", "blocks": "cube", "box": "cube",
    "drawer": "drawer", "window": "window", "button": "button", "switch": "button",
    "sphere": None, "ball": None, "cup": None, "mug": None, "bottle": None, "bowl": None, "plate": None,
    "floor": None, "shelf": None, "door": None, "cylinder": None, "spheres": None, "balls": None,
}
PLURAL = {"cubes", "blocks", "boxes", "buttons"}
VERBS = [
    (r"(?:put|place|move|set|stack|drop|bring|transfer|carry|relocate|slide)\b", "place"),
    (r"(?:pick up|pick|grab|grasp|lift|take|hold)\b", "pick"),
    (r"(?:open|pull open|slide open)\b", "open"),
    (r"(?:close|shut|push closed|slide shut)\b", "close"),
    (r"(?:unlock)\b", "unlock"),
    (r"(?:lock)\b", "lock"),
    (r"(?:press|push|hit|toggle|tap)\b", "press"),
]
PREPS = r"\b(?:on top of|on to|onto|on|into|inside|in|to|at|over|next to|toward|towards)\b"
POLITE = re.compile(r"\b(?:please|could you|can you|would you|kindly|thanks|thank you)\b[?!.,]*", re.I)
SPLIT = re.compile(r"\s*(?:,\s*and then|,\s*then|\band then\b|\bthen\b|\bafter that\b|\band\b|,|;|\.\s+|\bfinally\b)\s*", re.I)


class RulePlanner:
    name = "rule"

    def __init__(self, library: SkillLibrary, max_depth: int = 8):
        self.library = library
        self.max_depth = max_depth

    # ---- mentions -------------------------------------------------------------------------
    def _aliases(self, world: World) -> list[tuple[str, str]]:
        """(lowercase phrase, object id), longest first."""
        out = []
        for o in world.objects:
            phrases = {o.id.lower(), o.id.lower().replace("_", " "), o.name.lower()}
            phrases |= {a.lower() for a in o.state.get("aliases", ())}
            if o.kind not in ("place", "target"):
                words = o.name.lower().split()
                if o.color:
                    phrases |= {f"{o.color} {syn}" for syn, k in NOUNS.items() if k == o.kind}
                    phrases.add(f"{o.color} one")
                if len([p for p in world.objects if p.kind == o.kind]) == 1:
                    phrases |= {syn for syn, k in NOUNS.items() if k == o.kind}
                    phrases.add(words[-1])
            out.extend((p, o.id) for p in phrases if p)
        return sorted(out, key=lambda t: -len(t[0]))

    def screen(self, instruction: str, world: World) -> None:
        """PlanRefusal when the instruction names an object the scene lacks or asks for something no
        skill can do with the objects it names; verbs this grammar does not know are let through (an
        LLM planner may understand them)."""
        try:
            self.clause_goals(instruction, world, sym.atoms(world))
        except PlanRefusal as err:
            if getattr(err, "kind", "") != "unknown_verb":
                raise
        # ... but an instruction that names nothing in the scene ("fly to the moon", "ignore all
        # previous instructions") gets a refusal, not whatever skill the model happens to score best
        text = " ".join(instruction.lower().split())
        kinds = {o.kind for o in world.objects}
        plural = any(re.search(rf"\b{word}\b", text) and NOUNS.get(word.rstrip("s")) in kinds for word in PLURAL)
        if not self._mentions(text, world) and not plural:
            raise PlanRefusal("the instruction names no object in the scene; I can see: "
                              + ", ".join(o.name for o in world.objects))

    def _mentions(self, text: str, world: World) -> list[tuple[int, str]]:
        """Object ids mentioned in text with their positions; PlanRefusal for unknown objects."""
        aliases = self._aliases(world)
        known = {phrase for phrase, _ in aliases}
        # anything that looks like an object ("purple sphere", "green cube") must be one of the scene's
        for m in re.finditer(rf"\b((?:{'|'.join(COLORS)})\s+)?({'|'.join(NOUNS)})\b", text):
            what, kind = m.group(0), NOUNS[m.group(2)]
            if what in known:
                continue
            count = sum(o.kind == kind for o in world.objects)
            if m.group(2) in PLURAL and not m.group(1) and count >= 1:
                continue  # "the cubes": several objects, resolved by the planner, not an unknown object
            if kind is None or m.group(1) or count != 1:
                raise PlanRefusal(f"there is no {what} in the scene; I can see: "
                                  + ", ".join(o.name for o in world.objects))
        found = []
        taken = [False] * len(text)
        for phrase, obj in aliases:
            for m in re.finditer(rf"\b{re.escape(phrase)}\b", text):
                if not any(taken[m.start():m.end()]):
                    found.append((m.start(), obj))
                    for i in range(m.start(), m.end()):
                        taken[i] = True
        for m in re.finditer(r"\bit\b|\bthem\b", text):
            found.append((m.start(), "__it__"))
        return sorted(found)

    # ---- clauses -> goal atoms --------------------------------------------------------------
    def goals(self, instruction: str, world: World, state: frozenset) -> list[Goal]:
        return [g for clause in self.clause_goals(instruction, world, state) for g in clause]

    def clause_goals(self, instruction: str, world: World, state: frozenset) -> list[list[Goal]]:
        text = " ".join(instruction.lower().split())
        text = POLITE.sub(" ", text).strip()
        if not text:
            raise PlanRefusal("the instruction is empty; say what the robot should do")
        goals: list[list[Goal]] = []
        last: str | None = None
        prev_verb: str | None = None
        for clause in [c for c in SPLIT.split(text) if c and c.strip(" .!")]:
            clause = clause.strip(" .!")
            verb = next((v for pat, v in VERBS if re.search(rf"\b{pat}", clause)), None)
            if verb is None and prev_verb is not None and self._mentions(clause, world):
                verb = prev_verb  # ellipsis: "... and the blue cube to the right spot"
            if verb is None:
                err = PlanRefusal(f"I do not know how to do {clause!r}; I can: " + ", ".join(self.library.names()))
                err.kind = "unknown_verb"
                raise err
            ids = []
            for _, obj in self._mentions(clause, world):
                obj = last if obj == "__it__" else obj
                if obj is None:
                    raise PlanRefusal(f"{clause!r}: 'it' does not refer to any object mentioned before")
                ids.append(obj)
            if not ids and last is not None:
                ids = [last]
            if not ids:
                raise PlanRefusal(f"{clause!r} names no object in the scene")
            goals.append(self._clause_goals(verb, clause, ids, world, state))
            prev_verb = verb
            last = ids[-1] if verb != "place" else ids[0]
            if verb == "place" and len(ids) > 1:
                last = ids[-1] if world.object(ids[-1]).kind in sym.ARTICULATED else ids[0]
        return goals

    def _clause_goals(self, verb, clause, ids, world, state) -> list[Goal]:
        kind = world.object(ids[0]).kind
        if verb == "place":
            if len(ids) < 2:
                if re.search(r"\bstack\b", clause):
                    raise PlanRefusal(f"{clause!r}: say what to stack it on")
                raise PlanRefusal(f"{clause!r}: say where to put it")
            obj, target = ids[0], ids[-1]
            if kind not in sym.GRASPABLE:
                raise PlanRefusal(f"the {world.object(obj).name} cannot be picked up; only cubes can be moved")
            if obj == target:
                raise PlanRefusal(f"cannot put the {world.object(obj).name} on itself")
            tkind = world.object(target).kind
            rel = {"cube": "on", "drawer": "in", "place": "at", "target": "at"}.get(tkind)
            if rel is None:
                raise PlanRefusal(f"cannot put anything on or in the {world.object(target).name}")
            return [(f"{rel}({obj},{target})", True)]
        if len(ids) > 1:  # "open the drawer and the window": the verb applies to each object
            return [g for obj in dict.fromkeys(ids) for g in self._clause_goals(verb, clause, [obj], world, state)]
        if verb == "pick":
            if kind not in sym.GRASPABLE:
                raise PlanRefusal(f"the {world.object(ids[0]).name} cannot be picked up")
            return [(f"holding({ids[0]})", True)]
        if verb in ("open", "close"):
            if kind not in sym.ARTICULATED:
                raise PlanRefusal(f"the {world.object(ids[0]).name} cannot be {verb}d".replace("opend", "opened"))
            return [(f"{'open' if verb == 'open' else 'closed'}({ids[0]})", True)]
        if verb in ("lock", "unlock"):
            if kind not in sym.ARTICULATED:
                raise PlanRefusal(f"the {world.object(ids[0]).name} has no lock")
            if ids[0] not in world.controls.values():
                raise PlanRefusal(f"no button locks the {world.object(ids[0]).name}")
            return [(f"locked({ids[0]})", verb == "lock"), (f"unlocked({ids[0]})", verb == "unlock")]
        if verb == "press":
            if kind != "button":
                raise PlanRefusal(f"the {world.object(ids[0]).name} is not a button")
            target = world.controls.get(ids[0])
            if target is None:
                raise PlanRefusal(f"pressing the {world.object(ids[0]).name} changes nothing this planner tracks")
            locked = f"locked({target})" in state
            return [(f"locked({target})", not locked), (f"unlocked({target})", locked)]
        raise AssertionError(verb)

    def plan(self, instruction: str, world: World, feedback: str | None = None) -> PlanResult:
        """Clause by clause: each clause's goals join the goals kept so far (a later clause overrides an
        earlier wish about the same thing: "open the drawer ... then shut it"), and the search extends
        the plan from the state the earlier sub-goals leave behind."""
        state = sym.atoms(world)
        clauses = self.clause_goals(instruction, world, state)
        kept: dict[str, bool] = {}
        plan, trace = [], []
        for goals in clauses:
            for atom, want in goals:
                for other in [k for k in kept if k != atom and goals_conflict(atom, k)]:
                    del kept[other]
                kept[atom] = want
            wanted = drop_superseded(list(kept.items()))
            if not satisfied(state, wanted):
                steps = shortest_plan(world, self.library, wanted, state, self.max_depth)
                if steps is None:
                    raise PlanRefusal("no sequence of the robot's skills reaches: "
                                      + ", ".join(a if w else f"not {a}" for a, w in wanted))
                for g in steps:
                    state = self.library.get(g.skill).apply(state, g.args)
                plan.extend(steps)
            trace.append({"goals": [a if w else f"not {a}" for a, w in wanted]})
        return PlanResult(plan, prompt=instruction, raw_output="; ".join(g.key for g in plan) or "already satisfied",
                          candidates=[c.key for c in candidates(world, self.library)], scores=trace)


def goals_conflict(new: str, old: str) -> bool:
    """A later wish replaces an earlier one about the same thing: open/closed, lock state, where x is."""
    pa, ra = new[:-1].split("(", 1)
    pb, rb = old[:-1].split("(", 1)
    pairs = {"open": "closed", "closed": "open", "locked": "unlocked", "unlocked": "locked"}
    if pairs.get(pa) == pb and ra == rb:
        return True
    where = ("on", "in", "at", "holding")
    return pa in where and pb in where and ra.split(",")[0] == rb.split(",")[0]


def drop_superseded(goals: list[Goal]) -> list[Goal]:
    """holding(x) followed by a placement of x: the placement wins."""
    placed = {a.split("(", 1)[1].split(",")[0] for a, w in goals if w and a.split("(")[0] in ("on", "in", "at")}
    return [(a, w) for a, w in goals if not (a.startswith("holding(") and a[8:-1] in placed)]
