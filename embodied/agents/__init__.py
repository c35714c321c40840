"""Learning algorithms, one file each: config dataclass, networks, `update(batch) -> metrics`.

`make(name, ...)` builds any of them from a plain dict of overrides (what Hydra gives us).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib

from embodied.errors import ConfigError

# name -> (agent class, config class, preset values: the preset's defaults, below the user's options)
_AGENTS = {
    "sac": ("embodied.agents.sac:SAC", "embodied.agents.sac:SACConfig", {}),
    "cql": ("embodied.agents.cql:CQL", "embodied.agents.cql:CQLConfig", {"calql": False}),
    "calql": ("embodied.agents.cql:CQL", "embodied.agents.cql:CQLConfig", {"calql": True}),
    "iql": ("embodied.agents.iql:IQL", "embodied.agents.iql:IQLConfig", {}),
    "bc": ("embodied.agents.bc:BC", "embodied.agents.bc:BCConfig", {}),
    # generative chunk policies (policies/diffusion.py, policies/flow.py) and their RL fine-tuning
    "bc_diffusion": ("embodied.agents.bc_generative:GenerativeBC", "embodied.agents.bc_generative:GenerativeBCConfig",
                     {"policy": "diffusion"}),
    "bc_flow": ("embodied.agents.bc_generative:GenerativeBC", "embodied.agents.bc_generative:GenerativeBCConfig",
                {"policy": "flow"}),
    "fql": ("embodied.agents.fql:FQL", "embodied.agents.fql:FQLConfig", {"horizon": 1, "extraction": "distill"}),
    # Q-chunking is FQL's learner with Q-chunking's defaults (qchunk.QCConfig)
    "qc": ("embodied.agents.fql:FQL", "embodied.agents.qchunk:QCConfig", {"extraction": "best_of_n"}),
    "qc_fql": ("embodied.agents.fql:FQL", "embodied.agents.qchunk:QCConfig", {"extraction": "distill"}),
    "dppo": ("embodied.agents.dppo:DPPO", "embodied.agents.dppo:DPPOConfig", {}),   # online phase of dppo.DPPORunner
    "tdmpc2": ("embodied.agents.tdmpc2:TDMPC2", "embodied.agents.tdmpc2:TDMPC2Config", {}),  # world model + MPPI
    "vla_bc": ("embodied.agents.vla_bc:VLABC", "embodied.agents.vla_bc:VLABCConfig", {}),  # images + language
    "vla_qc": ("embodied.agents.vla_qc:VLAQC", "embodied.agents.vla_qc:VLAQCConfig", {}),  # online, from vla_bc
    "vla_ppo": ("embodied.agents.vla_ppo:VLAPPO", "embodied.agents.vla_ppo:VLAPPOConfig", {}),  # online, from vla_bc
}


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def names() -> list[str]:
    return sorted(_AGENTS)


def config_class(name: str):
    return _load(_lookup(name)[1])


# How the online phase continues from the offline agent (the switch). "same" keeps the offline agent and its
# loss; "sac" swaps the loss to SAC on the pretrained networks (WSRL, naive, Cal-QL -> SAC); "dppo" runs
# PPO through a pretrained diffusion policy's denoising chain; "vla_qc" learns a chunk critic over a
# pretrained VLA and acts best-of-N over its samples; "vla_ppo" runs PPO through the VLA's noisy flow chain. Without pretraining any agent may learn online.
SWITCHES = {
    "same": {"cql", "calql", "iql", "bc", "bc_diffusion", "bc_flow", "fql", "qc", "qc_fql", "tdmpc2", "vla_bc"},
    "sac": {"cql", "calql", "iql", "bc", "sac"},
    "dppo": {"bc_diffusion"},
    "vla_qc": {"vla_bc"},   # a chunk critic and best-of-N over the pretrained VLA's samples
    "vla_ppo": {"vla_bc"},  # ReinFlow: PPO through the flow head's chain with a learned noise
}


def check_switch(offline_algo: str | None, online_algo: str) -> None:
    """Reject an offline -> online pair the runner cannot continue, before any work starts."""
    if offline_algo is None:
        if online_algo == "same":
            raise ConfigError("algo.online_algo=same needs an offline_algo to continue; set algo.online_algo=sac")
        _lookup(online_algo)
        return
    _lookup(offline_algo)
    if online_algo not in SWITCHES:
        raise ConfigError(f"algo.online_algo={online_algo} cannot continue a pretrained {offline_algo}; valid: "
                          f"{', '.join(sorted(k for k, v in SWITCHES.items() if offline_algo in v))} "
                          "(same keeps the offline loss online)")
    if offline_algo not in SWITCHES[online_algo]:
        valid = sorted(k for k, v in SWITCHES.items() if offline_algo in v)
        raise ConfigError(f"algo.online_algo={online_algo} cannot continue offline_algo={offline_algo}; "
                          f"valid for {offline_algo}: {', '.join(valid)}")


def make_config(name: str, overrides: dict | None = None):
    """A config dataclass: its defaults, then the registry's preset values, then `overrides`.

    Unknown keys and values of the wrong type are errors that name the key."""
    _, config_path, preset = _lookup(name)
    cls = _load(config_path)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {**preset, **(overrides or {})}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        hints = [f"{key} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(key, fields, 1)) else key
                 for key in unknown]
        raise ConfigError(f"algo option(s) {', '.join(hints)} are not {name} options; valid: {', '.join(sorted(fields))}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    defaults = cls()
    for key, value in values.items():
        _check_type(name, key, value, getattr(defaults, key))
    return cls(**values)


def _check_type(agent: str, key: str, value, default) -> None:
    """A value of another kind than the field's default (a string for a number, ...) is a one-line error."""
    if value is None or default is None:
        return
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,), tuple: (tuple,), dict: (dict,)}
    expected = kinds.get(type(default))
    ok = expected is None or (isinstance(value, expected) and not (isinstance(value, bool) and bool not in expected))
    if not ok:
        raise ConfigError(f"{agent} option {key}={value!r} should be a {type(default).__name__}")


# Agents that exist only on top of a pretrained one (name -> the offline agent they continue): built with
# `continue_from`, never from scratch.
CONTINUATIONS = {"vla_qc": "vla_bc", "vla_ppo": "vla_bc"}


def make(name: str, obs_dim: int, act_dim: int, overrides: dict | None = None, device: str = "cpu", seed: int = 0):
    if name in CONTINUATIONS:
        raise ConfigError(f"agent {name} fine-tunes a pretrained {CONTINUATIONS[name]} and cannot start from scratch; "
                          f"pretrain one (offline_algo={CONTINUATIONS[name]}) or pass pretrained=<its run>")
    return _load(_lookup(name)[0])(obs_dim, act_dim, make_config(name, overrides), device=device, seed=seed)


def continue_from(name: str, pretrained, overrides: dict | None = None, seed: int = 0):
    """The online agent `name` built on a pretrained agent of the kind it continues (CONTINUATIONS)."""
    if CONTINUATIONS.get(name) is None:
        raise ConfigError(f"agent {name} does not continue a pretrained agent; build it with agents.make")
    return _load(_lookup(name)[0]).from_agent(pretrained, make_config(name, overrides), seed=seed)


def _lookup(name: str):
    if name not in _AGENTS:
        raise ConfigError(f"agent {name!r} is unknown; valid: {', '.join(names())}")
    return _AGENTS[name]
