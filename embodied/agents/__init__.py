"""Learning algorithms, one file each: config dataclass, networks, `update(batch) -> metrics`.

`make(name, ...)` builds any of them from a plain dict of overrides (what Hydra gives us).
"""
from __future__ import annotations

import dataclasses
import importlib

from embodied.errors import ConfigError

# name -> (module, agent class, config class, fixed config values)
_AGENTS = {
    "sac": ("embodied.agents.sac", "SAC", "SACConfig", {}),
    "cql": ("embodied.agents.cql", "CQL", "CQLConfig", {"calql": False}),
    "calql": ("embodied.agents.cql", "CQL", "CQLConfig", {"calql": True}),
    "iql": ("embodied.agents.iql", "IQL", "IQLConfig", {}),
    "bc": ("embodied.agents.bc", "BC", "BCConfig", {}),
    # generative chunk policies (policies/diffusion.py, policies/flow.py) and their RL fine-tuning
    "bc_diffusion": ("embodied.agents.bc_generative", "GenerativeBC", "GenerativeBCConfig", {"policy": "diffusion"}),
    "bc_flow": ("embodied.agents.bc_generative", "GenerativeBC", "GenerativeBCConfig", {"policy": "flow"}),
    "fql": ("embodied.agents.fql", "FQL", "FQLConfig", {"horizon": 1, "extraction": "distill"}),
    "qc": ("embodied.agents.qchunk", "QChunking", "QCConfig", {"extraction": "best_of_n"}),
    "qc_fql": ("embodied.agents.qchunk", "QChunking", "QCConfig", {"extraction": "distill"}),
    "dppo": ("embodied.agents.dppo", "DPPO", "DPPOConfig", {}),   # online phase of dppo.DPPORunner
}


def names() -> list[str]:
    return sorted(_AGENTS)


def config_class(name: str):
    module, _, config_name, _ = _lookup(name)
    return getattr(importlib.import_module(module), config_name)


def make_config(name: str, overrides: dict | None = None):
    """A config dataclass from overrides; unknown keys are an error that lists the valid ones."""
    module, _, config_name, fixed = _lookup(name)
    cls = getattr(importlib.import_module(module), config_name)
    valid = {f.name for f in dataclasses.fields(cls)}
    values = {**(overrides or {}), **fixed}
    unknown = sorted(set(values) - valid)
    if unknown:
        raise ConfigError(f"algo option(s) {unknown} are not {name} options; valid: {', '.join(sorted(valid))}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**values)


def make(name: str, obs_dim: int, act_dim: int, overrides: dict | None = None, device: str = "cpu", seed: int = 0):
    module, class_name, _, _ = _lookup(name)
    cls = getattr(importlib.import_module(module), class_name)
    return cls(obs_dim, act_dim, make_config(name, overrides), device=device, seed=seed)


def _lookup(name: str):
    if name not in _AGENTS:
        raise ConfigError(f"agent {name!r} is unknown; valid: {', '.join(names())}")
    return _AGENTS[name]
