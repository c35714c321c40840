"""Simulated tasks by name: `sims.make(name)` gives a gymnasium env with the project's contract.

Observations are `{"observation.state": float32[obs_dim]}`, actions float32 in [-1, 1].
Importing a task module registers its tasks; new suites do the same with `register_task`.
"""
from sims.registry import TaskSpec, make, names, normalized_score, register_task, skip_next_frames, spec
from sims import locomotion, pointmaze  # noqa: F401  (registers the tasks)
from sims import manip  # noqa: F401  (OGBench manipspace tasks)
from sims import mt10  # noqa: F401  (Meta-World MT10; metaworld is imported when a task is built)
from sims.experts import expert

__all__ = ["TaskSpec", "make", "names", "spec", "normalized_score", "register_task", "skip_next_frames", "expert"]
