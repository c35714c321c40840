"""Goal mode (LLM+P-style): the instruction becomes goal atoms, breadth-first search plans the skills.

Parsing, clause by clause (`planners.backends.rule.SPLIT`):
1. Mentions: the scene's object names first, then "<adjective> <noun>" phrases: nouns by kind ("block"
   is a cube), colours by the scene's `color` attributes, colour words the scene lacks ("crimson",
   "navy") by MiniLM similarity of "a <word> cube" to the scene's colours. A named object the scene
   lacks ("the green cube" with only a red one, "the floor") refuses the instruction.
2. Verb class by meaning: the clause with its objects replaced by "the object" is compared (MiniLM) with
   prototypes of what the skills reach (put / pick / open / close / lock / unlock / press) and of things
   they cannot do; the class restricts the predicates, an infeasible class refuses.
3. Candidate atoms: the scene's grounded atoms (`symbolic.VOCABULARY` over its objects and places) of
   those predicates that name every mentioned object, in mention order ("stack the blue cube on it"
   gives on(cube_1, cube_0)). "it" refers to the previous clause's objects.
4. Choice: each candidate's goal sentence is scored by the LLM's mean token log-likelihood after a
   few-shot prompt (the k nearest bank examples, `planners.examples`), plus the MiniLM similarity of the
   clause to the atom's imperative wording. Decoding is thus restricted to the scene's vocabulary.
5. Ambiguity (a mention matching several objects): `ask(question, readings) -> index` if given, else
   a refusal listing the candidate readings; both are recorded in the plan's `scores` / the trace.

`shortest_plan` then finds the sub-goals. The parsed goal is kept per instruction, so a replan after
a skill failure searches again from the observed state without asking the LLM again.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np

from planners import symbolic as sym
from planners.backends.rule import COLORS, NOUNS, POLITE, SPLIT, goals_conflict, drop_superseded
from planners.base import LLMUsage, PlanRefusal, PlanResult, World
from planners.grounding import candidates, embed_cached, load_embedder
from planners.search import Goal, satisfied, shortest_plan
from planners.skills import SkillLibrary

SYSTEM = "You turn instructions for a robot arm into goal facts about the scene."
FUNCTION_WORDS = {"the", "a", "an", "that", "this", "other", "same", "every", "each", "all", "both", "any",
                  "its", "their", "first", "second", "little", "big", "small", "large", "one", "two"}
PRONOUNS = re.compile(r"\b(?:it|them)\b")
# what the skills can reach, and things they cannot do, said with a neutral object
VERB_PROTOTYPES = {
    "place": ("put the object on the object", "move the object to the place", "place the object in the object",
              "stack the object on the object", "set the object down at the place", "the object goes at the place"),
    "pick": ("pick up the object", "grab the object", "lift the object", "hold the object"),
    "open": ("open the object", "pull the object open"),
    "close": ("close the object", "shut the object", "push the object shut"),
    "lock": ("lock the object",),
    "unlock": ("unlock the object",),
    "press": ("press the object", "push the button"),
    "infeasible": ("break the object", "destroy the object", "fly away", "drink the object", "cut the object",
                   "wash the object", "kick the object", "send torques to the motors", "say something",
                   # added after the first adversarial run (so the adversarial set is not held out for these)
                   "eat the object", "throw the object"),
}
CLASS_PREDICATES = {"place": ("at", "on", "in"), "pick": ("holding",), "open": ("open",), "close": ("closed",),
                    "lock": ("locked",), "unlock": ("unlocked",)}


@dataclass
class GoalConfig:
    k_examples: int = 3  # retrieved bank examples in the prompt (0: none)
    w_llm: float = 1.0  # weight of the mean token log-likelihood
    w_embed: float = 4.0  # weight of MiniLM cosine(clause, atom wording)
    w_place: float = 4.0  # at(x, place): MiniLM cosine(the clause after its last object mention, place name)
    color_min_sim: float = 0.55  # "a <word> cube" vs "a <scene colour> cube"
    max_depth: int = 8


@dataclass
class Parse:
    goals: list[Goal]
    records: list[dict] = field(default_factory=list)
    prompt: str = ""
    usage: LLMUsage = field(default_factory=LLMUsage)


def _display(world: World, obj_id: str) -> str:
    o = world.object(obj_id)
    if o.kind in ("place", "target"):
        aliases = o.state.get("aliases") or ()
        return aliases[0] if aliases else o.name
    return o.name


def goal_sentence(world: World, atom: str) -> str:
    pred, args = atom[:-1].split("(", 1)
    a = [_display(world, x) for x in args.split(",")]
    if pred == "holding":
        return f"the gripper is holding the {a[0]}"
    if pred in ("on", "in", "at"):
        return f"the {a[0]} is {pred} the {a[1]}"
    return f"the {a[0]} is {pred}"


def imperative(world: World, atom: str) -> str:
    pred, args = atom[:-1].split("(", 1)
    a = [_display(world, x) for x in args.split(",")]
    return {"holding": f"pick up the {a[0]}", "on": f"stack the {a[0]} on the {a[-1]}",
            "in": f"put the {a[0]} in the {a[-1]}", "at": f"put the {a[0]} at the {a[-1]}",
            "open": f"open the {a[0]}", "closed": f"close the {a[0]}", "locked": f"lock the {a[0]}",
            "unlocked": f"unlock the {a[0]}"}[pred]


def goal_atoms(world: World) -> list[str]:
    """Every grounded atom a goal may name in this world (the decoding vocabulary)."""
    out = []
    cubes = [o.id for o in world.objects if o.kind in sym.GRASPABLE]
    slides = [o.id for o in world.objects if o.kind in sym.ARTICULATED]
    places = [o.id for o in world.places]
    drawers = [o.id for o in world.objects if o.kind == "drawer"]
    for c in cubes:
        out.append(f"holding({c})")
        out += [f"at({c},{p})" for p in places]
        out += [f"on({c},{o})" for o in cubes if o != c]
        out += [f"in({c},{d})" for d in drawers]
    for d in slides:
        out += [f"open({d})", f"closed({d})"]
        if d in {v for v in world.controls.values()}:
            out += [f"locked({d})", f"unlocked({d})"]
    return out


def expand(atom: str) -> list[Goal]:
    """A goal atom as search goals: a lock state also rules out its complement."""
    pred, rest = atom.split("(", 1)
    if pred == "locked":
        return [(atom, True), (f"unlocked({rest}", False)]
    if pred == "unlocked":
        return [(atom, True), (f"locked({rest}", False)]
    return [(atom, True)]


_EMBED_CACHE: dict[str, np.ndarray] = {}


class Ambiguous(PlanRefusal):
    def __init__(self, message: str, readings: list[str]):
        super().__init__(message)
        self.readings = readings


class GoalParser:
    """instruction -> goal atoms over the scene's vocabulary (see the module docstring)."""

    def __init__(self, backend, config: GoalConfig | None = None, retriever=None, ask=None):
        self.backend = backend
        self.config = config or GoalConfig()
        self.embedder = load_embedder()
        self.retriever = retriever
        if self.retriever is None and self.config.k_examples > 0:
            from planners.examples import Retriever

            self.retriever = Retriever(embedder=self.embedder)
        self.ask = ask
        self._cache = _EMBED_CACHE  # shared by every parser in the process (one per task in the suite)
        self._protos = {k: self._embed(list(v)) for k, v in VERB_PROTOTYPES.items()}

    def _embed(self, texts: list[str]) -> np.ndarray:
        return embed_cached(self.embedder, self._cache, texts)

    # ---- mentions --------------------------------------------------------------------------
    def _colour(self, word: str, pool: list) -> list:
        colours = sorted({o.color for o in pool if o.color})
        if word in colours:
            return [o for o in pool if o.color == word]
        if word in COLORS:
            return []  # a plain colour the scene lacks
        if not colours:
            return []
        sims = self._embed([f"a {c} cube" for c in colours]) @ self._embed([f"a {word} cube"])[0]
        best = int(np.argmax(sims))
        if float(sims[best]) < self.config.color_min_sim:
            return []
        return [o for o in pool if o.color == colours[best]]

    def mentions(self, text: str, world: World) -> list[tuple[int, int, list[str], str]]:
        """(start, end, object ids, phrase) for each object mention; PlanRefusal for objects the scene lacks."""
        seen = ", ".join(o.name for o in world.scene.objects)
        out, taken = [], [False] * len(text)
        names = sorted({(n.lower(), o.id) for o in world.scene.objects
                        for n in (o.name, *o.state.get("aliases", ()))}, key=lambda t: -len(t[0]))
        for phrase, obj in names:
            for m in re.finditer(rf"\b{re.escape(phrase)}\b", text):
                if not any(taken[m.start():m.end()]):
                    out.append((m.start(), m.end(), [obj], phrase))
                    taken[m.start():m.end()] = [True] * (m.end() - m.start())
        nouns = "|".join(sorted(list(NOUNS) + ["one", "ones"], key=len, reverse=True))
        for m in re.finditer(rf"\b(?:([a-z][a-z-]*)\s+)?({nouns})\b", text):
            if any(taken[m.start(2):m.end(2)]):
                continue
            adj, noun = m.group(1), m.group(2)
            kind = "cube" if noun in ("one", "ones") else NOUNS[noun]
            said = noun if not adj or adj in FUNCTION_WORDS else m.group(0)
            if kind is None:
                raise PlanRefusal(f"there is no {said} in the scene; I can see: {seen}")
            pool = [o for o in world.scene.objects if o.kind == kind]
            if not pool:
                raise PlanRefusal(f"there is no {said} in the scene; I can see: {seen}")
            start = m.start(2)
            if adj and adj not in FUNCTION_WORDS and not any(taken[m.start(1):m.end(1)]):
                named = [o for o in pool if adj in o.name.lower().split()]  # "lock button": a word of its name
                pool = named or self._colour(adj, pool)
                start = m.start(1)
                if not pool:
                    raise PlanRefusal(f"there is no {m.group(0)} in the scene; I can see: {seen}")
            out.append((start, m.end(2), [o.id for o in pool], text[start:m.end(2)]))
            taken[start:m.end(2)] = [True] * (m.end(2) - start)
        for m in PRONOUNS.finditer(text):
            out.append((m.start(), m.end(), ["__it__"], m.group(0)))
        return sorted(out)

    def verb_class(self, neutral: str) -> tuple[str, dict]:
        q = self._embed([neutral])[0]
        sims = {k: float((v @ q).max()) for k, v in self._protos.items()}
        return max(sims, key=sims.get), {k: round(v, 3) for k, v in sims.items()}

    # ---- the whole instruction ---------------------------------------------------------------
    def parse(self, instruction: str, world: World) -> Parse:
        text = " ".join(instruction.lower().split())
        text = POLITE.sub(" ", text).strip()
        if not text:
            raise PlanRefusal("the instruction is empty; say what the robot should do")
        clauses = [c.strip(" .!?") for c in SPLIT.split(text) if c and c.strip(" .!?")]
        state = sym.atoms(world)
        vocab = goal_atoms(world)
        examples = self.retriever.prompt(instruction, self.config.k_examples) if self.retriever else ""
        objects = ", ".join(o.name for o in world.scene.objects)
        places = ", ".join(_display(world, p.id) for p in world.places)
        head = f"{SYSTEM}\n\n{examples}\nObjects: {objects}.\nPlaces: {places}.\nInstruction: {instruction.strip()}\nGoal:"
        parse = Parse([], prompt=head)
        chosen: list[str] = []
        prev_ids: list[str] = []
        prev_verb_text = ""
        for clause in clauses:
            if re.search(r"\b(?:itself|themselves)\b", clause):
                raise PlanRefusal(f"{clause!r}: an object cannot be put on or in itself")
            ments = self.mentions(clause, world)
            if not ments:
                parse.records.append({"clause": clause, "ignored": "names no object in the scene"})
                continue
            lead = re.sub(r"^(?:the|a|an)\b", "", clause[: ments[0][0]].strip()).strip()
            if not lead and prev_verb_text and not re.search(r"\b(?:is|are|be|belongs?|goes|go)\b", clause):
                clause = f"{prev_verb_text} {clause}"  # ellipsis: "open the drawer and the window"
                ments = self.mentions(clause, world)
                lead = prev_verb_text
            prev_verb_text = lead
            record = {"clause": clause}
            groups = []
            for _, _, ids, phrase in ments:
                if ids == ["__it__"]:
                    if not prev_ids:
                        raise PlanRefusal(f"{clause!r}: '{phrase}' does not refer to any object mentioned before")
                    groups.append(("it", list(prev_ids), phrase))
                else:
                    groups.append(("obj", ids, phrase))
            # ambiguity: a mention (not a pronoun) that fits several objects
            for g, (tag, ids, phrase) in enumerate(groups):
                if tag == "obj" and len(ids) > 1:
                    pick = self._disambiguate(instruction, clause, phrase, ids, world, record, parse)
                    groups[g] = ("obj", [pick], phrase)
            neutral = clause
            for s, e, _, _ in sorted(ments, reverse=True):
                neutral = neutral[:s] + "the object" + neutral[e:]
            neutral = neutral.replace("the the object", "the object")
            verb, verb_sims = self.verb_class(neutral)
            record["verb_class"], record["verb_sims"] = verb, verb_sims
            if verb == "infeasible":
                raise PlanRefusal(f"{clause!r} asks for something this robot's skills cannot do "
                                  f"({', '.join(self.backend_skills(world))})")
            cands = self._candidates(vocab, groups, verb, world, state)
            if not cands:
                names = " and ".join(world.object(ids[0]).name if tag == "obj" else phrase for tag, ids, phrase in groups)
                raise PlanRefusal(f"{clause!r}: no goal this robot can reach does that with the {names}")
            self._last_mentions = ments
            best, scores = self._choose(head, chosen, clause, groups, cands, world, parse.usage)
            record["candidates"] = scores
            record["goal"] = best
            parse.records.append(record)
            chosen.append(best)
            args = best[:-1].split("(", 1)[1].split(",")
            prev_ids = [a for a in args if world.object(a).kind not in ("place", "target")]
            if best.startswith(("in(",)) and len(args) > 1:
                prev_ids = [args[1], args[0]]
        if not chosen:
            raise PlanRefusal("the instruction names no object in the scene; I can see: " + objects)
        kept: dict[str, bool] = {}
        for atom in chosen:
            new = expand(atom)
            for a, _ in new:  # a later wish replaces an earlier one about the same thing
                for other in [k for k in kept if k not in dict(new) and goals_conflict(a, k)]:
                    del kept[other]
            kept.update(new)
        parse.goals = drop_superseded(list(kept.items()))
        return parse

    def backend_skills(self, world: World) -> list[str]:
        return ["pick", "place", "open", "close", "press (lock/unlock)"]

    def _candidates(self, vocab, groups, verb, world, state) -> list[str]:
        preds = CLASS_PREDICATES.get(verb)
        if verb == "press":  # a lock button: toggles what it controls
            preds = ("locked", "unlocked")
        out = []
        for atom in vocab:
            pred, rest = atom[:-1].split("(", 1)
            if preds and pred not in preds:
                continue
            args = [a for a in rest.split(",") if world.object(a).kind not in ("place", "target")]
            # every mention names an argument, in mention order; a button names what it controls
            need = []
            for tag, ids, _ in groups:
                ids = [world.controls.get(i, i) for i in ids]
                hit = [a for a in args if a in ids]
                if not hit:
                    break
                need.append(args.index(hit[0]))
            else:
                if need != sorted(need) and len(set(need)) == len(need):
                    continue
                if verb == "press":
                    target = rest
                    want = "unlocked" if f"locked({target})" in state else "locked"
                    if pred != want:
                        continue
                out.append(atom)
        return out

    def _choose(self, head, chosen, clause, groups, cands, world, usage) -> tuple[str, dict]:
        sentences = [goal_sentence(world, a) for a in cands]
        prompt = head + "".join(f" {goal_sentence(world, a)};" for a in chosen)
        if len(cands) == 1:
            return cands[0], {cands[0]: {"only": True}}
        logliks, u = self.backend.score(prompt, [f" {s}" for s in sentences])
        usage.add(u)
        lens = [max(1, len(self.backend._ids(f" {s}"))) if hasattr(self.backend, "_ids") else max(1, len(s.split()))
                for s in sentences]
        it_names = {}
        for tag, ids, phrase in groups:
            if tag == "it":
                it_names[phrase] = ids
        texts = []
        for a in cands:
            c = clause
            args = a[:-1].split("(", 1)[1].split(",")
            for phrase, ids in it_names.items():
                ref = next((x for x in args if x in ids), ids[0])
                c = re.sub(rf"\b{phrase}\b", f"the {world.object(ref).name}", c)
            texts.append(c)
        wordings = [imperative(world, a) for a in cands]
        emb = self._embed(wordings)
        cos = [float(emb[i] @ self._embed([texts[i]])[0]) for i in range(len(cands))]
        last_end = max(e for s_, e, _, _ in self._last_mentions) if self._last_mentions else 0
        tail = clause[last_end:].strip() or clause
        place = []
        for a in cands:
            if a.startswith("at("):
                pid = a[:-1].split(",")[1]
                place.append(float(self._embed([_display(world, pid)])[0] @ self._embed([tail])[0]))
            else:
                place.append(0.0)
        total = [self.config.w_llm * (l / n) + self.config.w_embed * c + self.config.w_place * p
                 for l, n, c, p in zip(logliks, lens, cos, place)]
        best = int(np.argmax(total))
        scores = {a: {"loglik_mean": round(l / n, 3), "cos": round(c, 3), "place_cos": round(p, 3), "score": round(t, 3)}
                  for a, l, n, c, p, t in zip(cands, logliks, lens, cos, place, total)}
        return cands[best], scores

    def _disambiguate(self, instruction, clause, phrase, ids, world, record, parse) -> str:
        names = [world.object(i).name for i in ids]
        readings = [re.sub(rf"\b{re.escape(phrase)}\b", f"the {n}", clause).replace("the the ", "the ") for n in names]
        question = f"In {instruction!r}, which object do you mean by '{phrase}'?"
        record["ambiguity"] = {"phrase": phrase, "readings": readings, "objects": ids}
        if self.ask is not None:
            answer = self.ask(question, readings)
            record["ambiguity"]["asked"] = question
            record["ambiguity"]["answer"] = answer
            if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(ids):
                return ids[answer]
            if isinstance(answer, str):
                for i, (n, r) in enumerate(zip(names, readings)):
                    if answer.strip().lower() in (n.lower(), r.lower(), ids[i]):
                        return ids[i]
        parse.records.append(record)
        raise Ambiguous(f"the instruction is ambiguous: '{phrase}' could be {' or '.join(names)}; "
                        f"candidate readings: {' | '.join(readings)}", readings)


class GoalPlanner:
    """LLM+P-style planner: `GoalParser` for the goal, `shortest_plan` for the sub-goals."""

    def __init__(self, backend, library: SkillLibrary, config: GoalConfig | None = None, ask=None,
                 retriever=None, screen: bool = True):
        self.library = library
        self.config = config or GoalConfig()
        self.parser = GoalParser(backend, self.config, retriever=retriever, ask=ask)
        self.name = f"{backend.name}/goal" + ("+ret" if self.config.k_examples else "")
        self._parsed: dict[str, Parse] = {}

    def plan(self, instruction: str, world: World, feedback: str | None = None) -> PlanResult:
        state = sym.atoms(world)
        fresh = instruction not in self._parsed
        if fresh:
            t0 = time.perf_counter()
            try:
                self._parsed[instruction] = self.parser.parse(instruction, world)
            except PlanRefusal:
                raise
            self._parsed[instruction].records.append({"parse_s": round(time.perf_counter() - t0, 3)})
        parse = self._parsed[instruction]
        goals = parse.goals
        result = PlanResult([], prompt=parse.prompt, candidates=[c.key for c in candidates(world, self.library, state)],
                            scores=list(parse.records) + [{"goals": [a if w else f"not {a}" for a, w in goals],
                                                           "replan_from_observed_state": not fresh}])
        if fresh:
            result.usage.add(parse.usage)
        if satisfied(state, goals):
            result.raw_output = "goal already holds"
            result.refusal = None
            return result
        steps = shortest_plan(world, self.library, goals, state, self.config.max_depth)
        if steps is None:
            raise PlanRefusal("no sequence of the robot's skills reaches: "
                              + ", ".join(a if w else f"not {a}" for a, w in goals))
        result.subgoals = steps
        result.raw_output = "; ".join(g.key for g in steps)
        return result
