"""Policies map observations to action chunks; any registered policy loads by directory alone."""
from __future__ import annotations

from policies.base import Policy
from policies.registry import load, make, names, register
from policies import gaussian  # noqa: F401  (registers itself)
from policies import diffusion, flow  # noqa: F401  (generative chunk policies)
from policies import tdmpc2  # noqa: F401  (TD-MPC2's world model + MPPI planner)
from policies import vla  # noqa: F401  (vision-language-action chunk policy: parallel, flow, AR heads)

__all__ = ["Policy", "register", "names", "make", "load"]
