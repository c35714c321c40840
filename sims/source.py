"""Where a training loop's envs come from: one task's builders, handed to the loop by its caller.

The runner and other learning code take an `EnvSource` instead of building envs themselves, so one
place (the train entry point, or a test) decides how envs are made: `sims.make` for one env,
`sims.vector.make_vec` for N of them.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import gymnasium


@dataclass(frozen=True)
class EnvSource:
    name: str
    options: Mapping = field(default_factory=dict)   # the task's own keyword arguments (task_id, reward, ...)

    def make(self, seed: int | None = None, **kwargs) -> gymnasium.Env:
        from sims.registry import make

        return make(self.name, seed=seed, **{**self.options, **kwargs})

    def make_vec(self, num_envs: int, **kwargs) -> gymnasium.vector.VectorEnv:
        from sims.vector import make_vec

        return make_vec(self.name, num_envs, **{**self.options, **kwargs})
