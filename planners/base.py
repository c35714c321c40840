"""The planner contract: `plan(instruction, world) -> list[SubGoal]`.

A `SubGoal` names a registered skill, its arguments (ids of objects that exist in the scene), the
success condition its detector checks, and the goal encoding the skill's policy consumes. Planners
produce sub-goals only; skills turn them into actions, so a planner can never move the robot itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from embodied.errors import UserError
from sims.scene import Predicate, Scene, SceneObject


class PlanRefusal(UserError):
    """The planner declines: the instruction names something the scene lacks, or cannot be done."""


@dataclass(frozen=True)
class SubGoal:
    skill: str
    args: tuple[str, ...]
    text: str = ""  # natural-language form, e.g. "pick up the red cube"
    success: tuple[Predicate, ...] = ()  # all must hold after the skill ran
    goal: dict = field(default_factory=dict, compare=False, hash=False)  # the skill policy's input

    def __post_init__(self):
        if not isinstance(self.args, tuple):
            object.__setattr__(self, "args", tuple(self.args))

    @property
    def key(self) -> str:
        """Canonical symbolic form, `place(cube_0,drawer)`; two sub-goals are the same iff keys match."""
        return f"{self.skill}({','.join(self.args)})"

    def __str__(self) -> str:
        return self.key

    def to_json(self) -> dict:
        return {
            "skill": self.skill,
            "args": list(self.args),
            "text": self.text,
            "success": [str(p) for p in self.success],
            "goal": self.goal,
        }


@dataclass
class World:
    """What a planner may see: the scene from the sim (or a robot) plus named table places.

    Places are table locations the place skill can put objects at ("the left side of the table"); they
    are scene objects of kind "place" so they ground like any other object.
    """

    scene: Scene
    places: tuple[SceneObject, ...] = ()
    controls: dict[str, str] = field(default_factory=dict)  # button id -> the object it locks/unlocks

    @property
    def objects(self) -> tuple[SceneObject, ...]:
        return tuple(self.scene.objects) + tuple(self.places)

    def ids(self) -> list[str]:
        return [o.id for o in self.objects]

    def object(self, obj_id: str) -> SceneObject:
        for obj in self.objects:
            if obj.id == obj_id:
                return obj
        raise UserError(f"unknown object id {obj_id!r}; the scene has: {', '.join(self.ids())}")

    def has(self, obj_id: str) -> bool:
        return any(o.id == obj_id for o in self.objects)

    def holding(self) -> str | None:
        return self.scene.gripper.get("holding")

    def describe(self) -> str:
        """The scene as text, one object per line: id, name, kind, colour, position and state."""
        lines = []
        for o in self.objects:
            pos = ", ".join(f"{v:.3f}" for v in o.pos_m)
            state = {k: v for k, v in o.state.items() if k != "aliases" and not isinstance(v, (list, tuple, dict))}
            extra = "".join(f", {k}={v}" for k, v in sorted(state.items()))
            lines.append(f"{o.id}: {o.name} ({o.kind}{', ' + o.color if o.color else ''}) at ({pos}) m{extra}")
        held = self.holding()
        lines.append(f"gripper: holding {held}" if held else "gripper: empty")
        return "\n".join(lines)


@dataclass
class LLMUsage:
    """Cost of LLM calls made for one plan (summed over calls)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0

    def add(self, other: "LLMUsage") -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.latency_s += other.latency_s

    def to_json(self) -> dict:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_s": round(self.latency_s, 4),
        }


@dataclass
class PlanResult:
    """A plan plus everything the trace records about how it was made."""

    subgoals: list[SubGoal]
    prompt: str = ""
    raw_output: str = ""
    candidates: list[str] = field(default_factory=list)
    scores: list[dict] = field(default_factory=list)  # per step: {candidate key: score}
    ungrounded: list[str] = field(default_factory=list)  # free-text steps the grounder rejected
    usage: LLMUsage = field(default_factory=LLMUsage)
    refusal: str | None = None

    def to_json(self) -> dict:
        return {
            "subgoals": [g.to_json() for g in self.subgoals],
            "prompt": self.prompt,
            "raw_output": self.raw_output,
            "candidates": self.candidates,
            "scores": self.scores,
            "ungrounded": self.ungrounded,
            "usage": self.usage.to_json(),
            "refusal": self.refusal,
        }


class Planner(Protocol):
    name: str

    def plan(self, instruction: str, world: World, feedback: str | None = None) -> PlanResult:
        """Sub-goals for `instruction` from the current world; `feedback` says why the last plan failed.

        Raises PlanRefusal when nothing grounded can satisfy the instruction.
        """
        ...
