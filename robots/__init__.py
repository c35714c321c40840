"""Robot arms behind one interface (DESIGN.md §3): simulated and real, safety-filtered.

    robot = robots.make("sim_ur5e")            # a config name under robots/conf/robot/, or a dict
    with robot:                                 # always leaves the arm stopped and disconnected
        robot.arm()
        obs = robot.observe()
        sent = robot.send_action(action)        # what actually went out after the safety chain

Backends register by type name; `robots.make(cfg, dry_run=True)` runs any robot config on the sim arm.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from embodied.errors import ConfigError, UserError
from robots.base import Robot
from robots.types import Command, ControlMode, RobotConfig, RobotFault, RobotStateError, State

CONF_DIR = Path(__file__).parent / "conf"
_BACKENDS: dict[str, str] = {  # type -> "module:Class", imported on use (SDKs are optional extras)
    "sim": "robots.sim_arm:SimArm",
    "ur": "robots.drivers.ur:URRobot",
    "xarm": "robots.drivers.xarm:XArmRobot",
    "franka": "robots.drivers.franka:FrankaRobot",
}


def register(type_name: str, target: str) -> None:
    """Add a backend: `robots.register("mybot", "mypkg.mybot:MyRobot")`."""
    _BACKENDS[type_name] = target


def names() -> list[str]:
    """Robot config names shipped under robots/conf/robot/."""
    return sorted(p.stem for p in (CONF_DIR / "robot").glob("*.yaml"))


def load_config(name: str) -> dict:
    import yaml

    path = CONF_DIR / "robot" / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"robot {name!r} is unknown; valid names: {', '.join(names())}")
    return yaml.safe_load(path.read_text())


def make(config, dry_run: bool = False, **kwargs) -> Robot:
    """Build a robot from a config name, a dict (e.g. a Hydra node) or a RobotConfig."""
    if isinstance(config, str):
        config = load_config(config)
    if hasattr(config, "items") and not isinstance(config, dict):  # OmegaConf DictConfig
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(config, resolve=True)
    if isinstance(config, RobotConfig):
        type_name, cfg = "sim", config
    else:
        config = dict(config)
        type_name = config.pop("type", None)
        if type_name is None:
            raise ConfigError("robot config has no 'type'; use one of " + ", ".join(sorted(_BACKENDS)))
        cfg = RobotConfig.from_dict(config)
    if dry_run:
        type_name = "sim"
    if type_name not in _BACKENDS:
        raise ConfigError(f"robot type {type_name!r} is unknown; valid: {', '.join(sorted(_BACKENDS))}")
    module, cls = _BACKENDS[type_name].split(":")
    try:
        backend = getattr(importlib.import_module(module), cls)
    except ImportError as err:
        raise UserError(f"robot type {type_name!r} needs an optional SDK ({err.name}); "
                        "install the matching extra, e.g. pip install 'embodied[robots]'") from None
    return backend(cfg, **kwargs)


__all__ = ["Robot", "RobotConfig", "Command", "ControlMode", "State", "RobotFault", "RobotStateError",
           "make", "names", "register", "load_config"]
