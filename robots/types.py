"""The robot contract's plain types: lifecycle states and their legal edges, control modes, limits
(`RobotConfig`) and the command the safety chain hands a backend (`Command`), with its errors.

No behaviour lives here: `robots.base.Robot` runs the lifecycle, `robots.safety` limits commands,
`robots.watchdog` holds a silent arm; each imports these types from this module.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from embodied.errors import ConfigError, UserError


class RobotStateError(UserError):
    """An operation was asked of the robot in a lifecycle state that does not allow it."""


class RobotFault(RuntimeError):
    """The backend reported an error (SDK exception, protective stop, lost connection)."""


class State(str, enum.Enum):
    DISCONNECTED = "disconnected"
    CONNECTED = "connected"
    ARMED = "armed"
    FAULT = "fault"


class ControlMode(str, enum.Enum):
    JOINT_POSITION = "joint_position"
    JOINT_VELOCITY = "joint_velocity"
    EE_DELTA = "ee_delta"


# The only legal edges. `fault` is reachable from any connected state (errors, e-stop); leaving it
# needs an explicit `recover()`; leaving `armed` for `connected` is a hold (watchdog, stop, disarm).
TRANSITIONS: dict[State, frozenset[State]] = {
    State.DISCONNECTED: frozenset({State.CONNECTED}),
    State.CONNECTED: frozenset({State.ARMED, State.FAULT, State.DISCONNECTED}),
    State.ARMED: frozenset({State.CONNECTED, State.FAULT, State.DISCONNECTED}),
    State.FAULT: frozenset({State.CONNECTED, State.DISCONNECTED}),
}


@dataclass
class RobotConfig:
    """Limits and rates of one arm. Lists are per joint. Units are in the names."""

    name: str = "robot"
    dof: int = 6
    control_rate_hz: float = 100.0
    control_mode: str = "joint_position"
    joint_pos_min_rad: list = field(default_factory=lambda: [-6.28] * 6)
    joint_pos_max_rad: list = field(default_factory=lambda: [6.28] * 6)
    joint_vel_max_rad_s: list = field(default_factory=lambda: [1.0] * 6)
    joint_acc_max_rad_s2: list = field(default_factory=lambda: [8.0] * 6)
    max_relative_target_rad: float = 0.05          # per control step, joint position mode
    ee_step_max_m: float = 0.01                    # per control step, ee_delta mode
    ee_rot_step_max_rad: float = 0.05
    # ee_delta: steps add to the last commanded target ("commanded", like joint targets) or to the measured
    # end effector ("measured": an arm whose own Cartesian controller takes deltas from where it is)
    ee_delta_base: str = "commanded"
    workspace_min_m: list = field(default_factory=lambda: [-0.8, -0.8, 0.02])
    workspace_max_m: list = field(default_factory=lambda: [0.8, 0.8, 1.0])
    gripper_width_max_m: float = 0.085
    gripper_force_max_n: float = 40.0
    gripper_force_n: float = 20.0                  # the force every grasp command asks for
    home_joint_pos_rad: list = field(default_factory=lambda: [0.0] * 6)
    watchdog_deadline_ms: float = 500.0
    workspace_plan_margin_m: float = 0.002         # joint modes: stopping paths are planned this far inside
    monitor_workspace_tol_m: float = 0.02          # measured ee outside the box by more: hold
    monitor_speed_tol: float = 0.10                # measured joint speed over limit x (1 + this): hold
    # what each safety event does: clip (fix the command and send it), reject (send a hold
    # instead), fault (stop the arm and enter `fault`). Keys are event kinds, see robots.safety.
    on_violation: dict = field(default_factory=dict)
    default_violation: str = "clip"
    driver: dict = field(default_factory=dict)     # backend options (host, ports, SDK factors)
    sim: dict = field(default_factory=dict)        # sim-arm options (model, latency, noise)

    def __post_init__(self):
        self.dof = int(self.dof)
        for key in ("joint_pos_min_rad", "joint_pos_max_rad", "joint_vel_max_rad_s", "joint_acc_max_rad_s2",
                    "home_joint_pos_rad"):
            value = list(getattr(self, key))
            if len(value) != self.dof:
                raise ConfigError(f"robot.{key} has {len(value)} entries; give one per joint (dof={self.dof})")
            setattr(self, key, [float(v) for v in value])
        for key in ("workspace_min_m", "workspace_max_m"):
            value = [float(v) for v in getattr(self, key)]
            if len(value) != 3:
                raise ConfigError(f"robot.{key} has {len(value)} entries; give x, y, z in metres")
            setattr(self, key, value)
        if any(lo >= hi for lo, hi in zip(self.joint_pos_min_rad, self.joint_pos_max_rad)):
            raise ConfigError("robot.joint_pos_min_rad must be below joint_pos_max_rad for every joint")
        if any(lo >= hi for lo, hi in zip(self.workspace_min_m, self.workspace_max_m)):
            raise ConfigError("robot.workspace_min_m must be below workspace_max_m on every axis")
        if self.control_rate_hz <= 0:
            raise ConfigError(f"robot.control_rate_hz={self.control_rate_hz} must be positive")
        if self.control_mode not in {m.value for m in ControlMode}:
            raise ConfigError(f"robot.control_mode={self.control_mode!r}; use one of "
                              f"{', '.join(m.value for m in ControlMode)}")
        if self.ee_delta_base not in ("commanded", "measured"):
            raise ConfigError(f"robot.ee_delta_base={self.ee_delta_base!r}; use commanded or measured")
        if self.watchdog_deadline_ms <= 0:
            raise ConfigError("robot.watchdog_deadline_ms must be positive")
        if self.workspace_plan_margin_m < 0:
            raise ConfigError("robot.workspace_plan_margin_m must be >= 0")
        if self.monitor_workspace_tol_m < 0 or self.monitor_speed_tol < 0:
            raise ConfigError("robot.monitor_workspace_tol_m and robot.monitor_speed_tol must be >= 0")
        self.on_violation = dict(self.on_violation or {})
        for kind, policy in {**self.on_violation, "default": self.default_violation}.items():
            if policy not in ("clip", "reject", "fault"):
                raise ConfigError(f"robot.on_violation.{kind}={policy!r}; use clip, reject or fault")
        self.driver, self.sim = dict(self.driver or {}), dict(self.sim or {})

    @classmethod
    def from_dict(cls, data: dict) -> "RobotConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"type"})
        if unknown:
            raise ConfigError(f"robot config has unknown keys {unknown}; valid: {sorted(known)}")
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def period_s(self) -> float:
        return 1.0 / self.control_rate_hz

    @property
    def mode(self) -> ControlMode:
        return ControlMode(self.control_mode)

    def action_dim(self, mode: ControlMode | None = None) -> int:
        mode = mode or self.mode
        return (6 if mode is ControlMode.EE_DELTA else self.dof) + 1


@dataclass
class Command:
    """What the safety chain hands to a backend: one mode, limited values, a limited gripper."""

    mode: ControlMode
    values: np.ndarray          # float64: joint targets (rad), velocities (rad/s) or an ee delta
    gripper_width_m: float
    gripper_force_n: float
    ee_target_m: np.ndarray | None = None   # ee_delta mode: the absolute position the delta aims at
    # joint modes: the velocity the chain planned for this command's period (rad/s), towards the target
    # in position mode; a backend that interpolates may feed it forward (the sim arm does)
    velocity_rad_s: np.ndarray | None = None
    # the robot clock (s) the chain timed this command at: its period starts then, and the next command's
    # `elapsed_s` is counted from it; a backend that simulates the arm executes it from then on
    t_s: float | None = None

    def as_action(self) -> np.ndarray:
        return np.append(self.values, self.gripper_width_m).astype(np.float64)
