"""A small bank of instruction -> goal examples, and retrieval of the k nearest (LLM-Planner-style).

Goals are written over object names, as the goal mode's prompt shows them ("the red cube is in the
drawer"), so an example transfers to any scene with such objects. `Retriever.nearest(instruction, k)`
ranks the bank by cosine similarity of all-MiniLM-L6-v2 sentence embeddings. None of these
instructions is in the held-out set (`planners.heldout`), which is kept out of the bank by a test.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Example:
    instruction: str
    goals: tuple[str, ...]  # goal sentences, one per atom, e.g. "the red cube is at the left of the table"

    def prompt(self) -> str:
        return f"Instruction: {self.instruction}\nGoal: {'; '.join(self.goals)}\n"


def E(instruction: str, *goals: str) -> Example:
    return Example(instruction, tuple(goals))


BANK: tuple[Example, ...] = (
    E("put the green cube at the back of the table", "the green cube is at the back of the table"),
    E("move the yellow block to the front of the table", "the yellow cube is at the front of the table"),
    E("pick up the blue cube", "the gripper is holding the blue cube"),
    E("grab the green block and hold it", "the gripper is holding the green cube"),
    E("put the blue cube on top of the green cube", "the blue cube is on the green cube"),
    E("stack the yellow cube on the red cube", "the yellow cube is on the red cube"),
    E("place the green cube inside the drawer", "the green cube is in the drawer"),
    E("open the window", "the window is open"),
    E("pull the drawer open", "the drawer is open"),
    E("close the drawer", "the drawer is closed"),
    E("push the window shut", "the window is closed"),
    E("lock the window", "the window is locked"),
    E("unlock the drawer", "the drawer is unlocked"),
    E("move the blue cube to the staging area", "the blue cube is at the staging area"),
    E("put the green cube at the left of the table and the yellow cube at the right of the table",
      "the green cube is at the left of the table", "the yellow cube is at the right of the table"),
    E("open the drawer and put the blue cube in it", "the drawer is open", "the blue cube is in the drawer"),
    E("close the window, then lock it", "the window is closed", "the window is locked"),
    E("unlock the window and open it", "the window is unlocked", "the window is open"),
    E("put the blue cube in the center of the table", "the blue cube is at the center of the table"),
    E("take the green cube to the back left of the table", "the green cube is at the back left of the table"),
)


class Retriever:
    """k nearest bank examples to an instruction by MiniLM cosine similarity."""

    def __init__(self, bank: tuple[Example, ...] = BANK, embedder=None):
        from planners.grounding import load_embedder

        self.bank = tuple(bank)
        self.model = embedder or load_embedder()
        self._keys = self._embed([e.instruction for e in self.bank])

    def _embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.model.encode(list(texts), convert_to_numpy=True, normalize_embeddings=True))

    def nearest(self, instruction: str, k: int = 3) -> list[tuple[Example, float]]:
        if k <= 0 or not self.bank:
            return []
        sims = self._keys @ self._embed([instruction])[0]
        order = np.argsort(-sims, kind="stable")[:k]
        return [(self.bank[i], float(sims[i])) for i in order]

    def prompt(self, instruction: str, k: int = 3) -> str:
        return "".join(e.prompt() for e, _ in self.nearest(instruction, k))
