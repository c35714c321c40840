"""One interface for every language-model back end a planner can use.

`generate` is free text (planner mode a). `score` returns the log-likelihood of each continuation
given a prompt (mode b, SayCan). `choose` decodes one of a fixed set of options token by token with
every other token masked out (mode c, constrained decoding). A back end that cannot do one of these
(an HTTP server without log-probabilities) raises `BackendUnsupported`; network and server faults raise
`BackendError`. Both are UserErrors: one line, no traceback, and the executor records them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from embodied.errors import UserError
from planners.base import LLMUsage


class BackendError(UserError):
    """The model server failed (timeout, HTTP 5xx, malformed reply) after every retry."""


class BackendUnsupported(UserError):
    """The back end cannot do this operation (e.g. log-likelihood scoring over plain chat HTTP)."""


@dataclass
class Completion:
    text: str
    usage: LLMUsage
    chat: bool = False  # True: a chat reply (the whole answer), not a continuation of the prompt


class LLMBackend(Protocol):
    name: str

    def generate(self, prompt: str, max_new_tokens: int = 64, stop: tuple[str, ...] = (),
                 messages: list[dict] | None = None) -> Completion: ...
    # `messages`: the same request as chat turns, for back ends that can only chat (optional to accept)

    def score(self, prompt: str, continuations: list[str]) -> tuple[list[float], LLMUsage]: ...

    def choose(self, prompt: str, options: list[str]) -> tuple[int, LLMUsage]: ...


def log_softmax_row(row: list[float]) -> list[float]:
    """Numerically stable log-softmax of one logit row (plain Python, for hand-checkable tests)."""
    top = max(row)
    lse = top + math.log(sum(math.exp(x - top) for x in row))
    return [x - lse for x in row]
