"""The policy registry: name -> class, so any saved policy loads by its directory alone.

Policy modules register their classes here (`@register("gaussian")`); `policies/__init__.py` imports
the built-in ones, so every name is known once `policies` is imported.
"""
from __future__ import annotations

import json
from pathlib import Path

from embodied.errors import CheckpointError, UserError
from policies.base import Policy

_REGISTRY: dict[str, type[Policy]] = {}


def register(name: str):
    """Class decorator: `@policies.register("gaussian")`."""

    def decorator(cls: type[Policy]) -> type[Policy]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"policy name {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def names() -> list[str]:
    return sorted(_REGISTRY)


def make(name: str, **config) -> Policy:
    if name not in _REGISTRY:
        raise UserError(f"policy {name!r} is unknown; valid names: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**config)


def load(directory: str | Path, device: str = "cpu") -> Policy:
    """Load any saved policy: config.json names the class, model.safetensors holds the weights."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{config_path} not found; pass a directory written by Policy.save()")
    try:
        meta = json.loads(config_path.read_text())
        name, config = meta["name"], meta["config"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CheckpointError(f"{config_path} is corrupt ({err}); re-save the policy") from None
    if name not in _REGISTRY:
        raise CheckpointError(f"{config_path}: policy {name!r} is unknown; valid: {', '.join(sorted(_REGISTRY))}")
    policy = _REGISTRY[name](**config)
    policy.load_weights(directory / "model.safetensors")
    return policy.to(device)
