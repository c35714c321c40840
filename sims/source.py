"""Where a training loop's envs come from: one task's builders, handed to the loop by its caller.

The runner and other learning code take an `EnvSource` instead of building envs themselves, so one
place (the train entry point, or a test) decides how envs are made: `sims.make` for one env,
`sims.vector.make_vec` for N of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium


@dataclass(frozen=True)
class EnvSource:
    name: str

    def make(self, seed: int | None = None, **kwargs) -> gymnasium.Env:
        from sims.registry import make

        return make(self.name, seed=seed, **kwargs)

    def make_vec(self, num_envs: int, **kwargs) -> gymnasium.vector.VectorEnv:
        from sims.vector import make_vec

        return make_vec(self.name, num_envs, **kwargs)
