"""The safety chain: composable filters that every command passes before a backend sees it.

Each filter takes a `Command` and a `Context` (where the arm is, what was last sent) and returns the
adjusted command plus `SafetyEvent`s. A per-kind policy decides what an event does:

- `clip`: keep the adjusted command (the filter already moved it inside the limit);
- `reject`: send a hold command instead (decelerate at the acceleration limit towards rest);
- `fault`: send nothing, the robot stops and enters `fault`.

The guard (NaN/Inf, shape, dtype) cannot repair a command, so its `clip` means `reject`.
After the filters, `final_check` re-verifies every hard limit on the command that will be sent; a
failure there is a bug in a filter and faults the robot instead of reaching the backend.

Joint velocity limits include a braking bound: near a position limit the allowed speed towards it is
the largest speed from which braking by `joint_acc_max_rad_s2 * dt` per step still stops at or before
the limit, counted in whole control steps (`braking_speed`), so velocity, acceleration and position
limits never contradict each other in joint modes. The workspace box is met the same way: a command is
kept only if the arm can still brake to a stop inside the box from it (`WorkspaceFilter`).

Limits are per unit of time because `Robot.send_action` sends at most one command per control period
(a faster caller waits), and `elapsed_s` (the time since the last command sent) ages the reference
along the stop the backend made meanwhile (`BACKEND_CONTRACT`), so a late command resumes from where
and how fast the arm really is instead of jumping back to the old speed.

In `ee_delta` mode a robot with inverse kinematics (`Robot.ik_joint_targets`) turns the limited
end-effector target into joint targets, and those pass every joint check (relative target, velocity,
acceleration, joint limits, the workspace on their forward kinematics) as a joint command would: what
the backend executes is checked, not only what was asked.

A joint_velocity command carries no position, so its reference would drift from the arm by whatever the
arm executed differently; it is re-anchored to the measured joints whenever both are at rest.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

import numpy as np

from robots.geometry import box_distance_m as _box_distance
from robots.types import Command, ControlMode, RobotConfig

TOL = 1e-9
OUTSIDE_CREEP_M = 1e-12  # FK rounding: a step from outside the box may add no more than this to its distance
REST_FRACTION = 0.01   # a joint slower than this share of its speed limit counts as stopped (`_anchor_at_rest`)
BACKEND_CONTRACT = """A joint command's velocity (position mode: towards its target) holds for one control
period; if no command follows by then, the backend brakes every joint at its acceleration limit. The
sim arm does exactly this; the chain checks each command together with that stopping path."""
GUARD_KINDS = ("dtype", "shape", "non_finite", "ik")  # cannot be repaired: clip means reject
MONITOR_KINDS = ("measured_workspace", "measured_speed")  # the measured state: clip means hold


@dataclass
class SafetyEvent:
    kind: str           # dtype, shape, non_finite, relative_target, joint_limit, velocity, acceleration,
    filter: str         # workspace, ee_step, gripper_width, gripper_force, final_check, not_armed, estopped
    detail: str
    outcome: str = ""   # clip | reject | fault, filled in by the chain's policy

    def to_dict(self) -> dict:
        return {"kind": self.kind, "filter": self.filter, "detail": self.detail, "outcome": self.outcome}


@dataclass
class Context:
    """What the filters know: the limits, the measured state, and the last command sent."""

    config: RobotConfig
    mode: ControlMode
    dt_s: float
    q_rad: np.ndarray                  # measured joint positions
    ee_pos_m: np.ndarray | None        # measured end-effector position
    ref_pos_rad: np.ndarray            # joint modes: the position the last command led to
    ref_vel_rad_s: np.ndarray          # joint modes: the velocity the last command asked for
    ref_ee_m: np.ndarray | None = None  # ee_delta: the last commanded end-effector position
    gripper_width_m: float | None = None  # measured
    fk: Callable[[np.ndarray], np.ndarray | None] | None = None
    lo: np.ndarray = field(init=False)
    hi: np.ndarray = field(init=False)
    vmax: np.ndarray = field(init=False)
    amax: np.ndarray = field(init=False)

    def __post_init__(self):
        c = self.config
        self.lo, self.hi = np.asarray(c.joint_pos_min_rad), np.asarray(c.joint_pos_max_rad)
        self.vmax, self.amax = np.asarray(c.joint_vel_max_rad_s), np.asarray(c.joint_acc_max_rad_s2)

    def ee_base(self) -> np.ndarray | None:
        """ee_delta steps add to the last commanded position (like joint targets), else (or with
        `ee_delta_base: measured`) to the measured one."""
        if self.config.ee_delta_base == "measured" and self.ee_pos_m is not None:
            return self.ee_pos_m
        return self.ref_ee_m if self.ref_ee_m is not None else self.ee_pos_m

    def position_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The joint limits, widened to the reference where the arm starts outside them (no jump back)."""
        return np.minimum(self.lo, self.ref_pos_rad), np.maximum(self.hi, self.ref_pos_rad)

    def velocity_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per joint (min, max) velocity: the speed limit, narrowed by the discrete braking bound."""
        room_up = np.maximum(self.hi - self.ref_pos_rad, 0.0)
        room_down = np.maximum(self.ref_pos_rad - self.lo, 0.0)
        return (-np.minimum(self.vmax, braking_speed(room_down, self.amax, self.dt_s)),
                np.minimum(self.vmax, braking_speed(room_up, self.amax, self.dt_s)))


def braking_speed(room, acc, dt):
    """The largest speed v whose braking steps v dt, v dt - u, v dt - 2u, ... (u = acc dt^2, one speed
    decrement of acc dt per control step) add up to at most `room`: exact for discrete steps, so a joint
    at this bound can always brake within the acceleration limit and never needs a clip at the limit.

    With n positive steps the distance is n x - u n (n - 1) / 2 for a first step x; n is the fewest
    steps whose full-speed distance u n (n + 1) / 2 covers the room."""
    room, u = np.asarray(room, np.float64), np.asarray(acc, np.float64) * dt * dt
    n = np.maximum(np.ceil((np.sqrt(1.0 + 8.0 * room / u) - 1.0) / 2.0), 1.0)
    return (room + u * n * (n - 1) / 2.0) / n / dt


def braking_stop_after(pos, vel, late_s: float, acc, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """The reference `late_s` after the command's period ended with no next command (BACKEND_CONTRACT:
    the arm brakes at `acc`): the speed a continuous stop has reached, at the position from which the
    stop that `_brakes_inside` models (the speed held for one period, then `acc * dt` less per period)
    ends where the one that was checked does. Ageing the position along the continuous stop itself put
    the reference past the checked stopping path (its modelled stop up to half a period's travel
    further), so a late command near a wall found even braking leaving the box."""
    pos, vel = np.asarray(pos, np.float64), np.asarray(vel, np.float64)
    acc = np.asarray(acc, np.float64)
    t = np.minimum(late_s, np.abs(vel) / acc)
    sign = np.sign(vel)
    return (pos + vel * t - sign * acc * t * (t + dt) / 2.0,
            sign * np.maximum(np.abs(vel) - acc * late_s, 0.0))


class Filter(Protocol):
    name: str

    def __call__(self, cmd: Command, ctx: Context) -> tuple[Command, list[SafetyEvent]]: ...


def _clip(x: np.ndarray, lo, hi) -> tuple[np.ndarray, bool]:
    y = np.clip(x, lo, hi)
    return y, bool(np.any(np.abs(y - x) > TOL))


# ---------------------------------------------------------------------- filters
class RelativeTargetFilter:
    """Joint position mode: each target is at most `max_relative_target_rad` from the last one."""

    name = "relative_target"

    def __call__(self, cmd, ctx):
        if cmd.mode is not ControlMode.JOINT_POSITION:
            return cmd, []
        step = ctx.config.max_relative_target_rad
        delta, hit = _clip(cmd.values - ctx.ref_pos_rad, -step, step)
        if not hit:
            return cmd, []
        cmd.values = ctx.ref_pos_rad + delta
        return cmd, [SafetyEvent("relative_target", self.name, f"step clipped to {step} rad")]


class JointVelocityFilter:
    """Joint modes: speed within the limit and within what can still brake before a joint limit."""

    name = "joint_velocity"

    def __call__(self, cmd, ctx):
        if cmd.mode is ControlMode.EE_DELTA:
            return cmd, []
        vel = _velocity_of(cmd, ctx)
        lo, hi = ctx.velocity_bounds()
        clipped, hit = _clip(vel, lo, hi)
        if not hit:
            return cmd, []
        _set_velocity(cmd, ctx, clipped)
        return cmd, [SafetyEvent("velocity", self.name, f"max |v| {np.abs(vel).max():.3g} rad/s over limit")]


class JointAccelerationFilter:
    """Joint modes: velocity changes by at most `joint_acc_max_rad_s2 * dt` per step."""

    name = "joint_acceleration"

    def __call__(self, cmd, ctx):
        if cmd.mode is ControlMode.EE_DELTA:
            return cmd, []
        vel = _velocity_of(cmd, ctx)
        dv = ctx.amax * ctx.dt_s
        clipped, hit = _clip(vel, ctx.ref_vel_rad_s - dv, ctx.ref_vel_rad_s + dv)
        if not hit:
            return cmd, []
        _set_velocity(cmd, ctx, clipped)
        return cmd, [SafetyEvent("acceleration", self.name, "velocity change clipped to the acceleration limit")]


class JointLimitFilter:
    """Joint modes: the position the command leads to stays inside the joint limits."""

    name = "joint_limit"

    def __call__(self, cmd, ctx):
        if cmd.mode is ControlMode.EE_DELTA:
            return cmd, []
        target = _target_of(cmd, ctx)
        lo, hi = ctx.position_bounds()
        clipped, hit = _clip(target, lo, hi)
        if not hit:
            return cmd, []
        _set_velocity(cmd, ctx, (clipped - ctx.ref_pos_rad) / ctx.dt_s)
        return cmd, [SafetyEvent("joint_limit", self.name, "target clipped to the joint limits")]


class EEStepFilter:
    """ee_delta mode: translation and rotation per step within `ee_step_max_m` / `ee_rot_step_max_rad`."""

    name = "ee_step"

    def __call__(self, cmd, ctx):
        if cmd.mode is not ControlMode.EE_DELTA:
            return cmd, []
        events = []
        for sl, limit, unit in ((slice(0, 3), ctx.config.ee_step_max_m, "m"),
                                (slice(3, 6), ctx.config.ee_rot_step_max_rad, "rad")):
            part = cmd.values[sl]
            peak = float(np.max(np.abs(part)))
            norm = peak * float(np.linalg.norm(part / peak)) if peak > 0 else 0.0  # no overflow at 1e300
            if norm > limit + TOL:
                cmd.values[sl] *= limit / norm
                events.append(SafetyEvent("ee_step", self.name, f"step norm {norm:.3g} {unit} over {limit}"))
        return cmd, events


class WorkspaceFilter:
    """The end effector stays inside an axis-aligned box (metres, base frame).

    ee_delta: the target is clipped into the box. Joint modes (when the backend has forward
    kinematics): a command is kept only if the arm can still stop inside the box from it, braking every
    joint at its acceleration limit (`_brakes_inside`, the whole stopping path checked through FK).
    Otherwise its velocity is blended towards the pure braking command (the previous one's stopping
    path, inside by induction) by bisection, so the wall is met within the acceleration limit. If even
    braking leaves the box (the arm was moved into a corner from outside the chain, or re-armed on a
    measured state), the arm brakes: an arm cannot stop harder than its acceleration limit, so a step
    cut at the wall would only tell the chain it had stopped where it has not. Only where the wall
    lies inside the braking step itself is that step cut short (`workspace_wall`, which may stop
    harder). From outside the box only steps that take the end effector no further out are allowed.
    """

    name = "workspace"

    def __call__(self, cmd, ctx):
        lo, hi = np.asarray(ctx.config.workspace_min_m), np.asarray(ctx.config.workspace_max_m)
        if cmd.mode is ControlMode.EE_DELTA:
            base = ctx.ee_base()
            if base is None:
                return cmd, []
            target = base + cmd.values[:3]
            clipped = np.clip(target, lo, hi)
            if _box_distance(base, lo, hi) > 0:  # outside: only a step straight towards the box
                towards = np.clip(base, lo, hi) - base
                norm = np.linalg.norm(towards)
                clipped = base + towards * min(1.0, ctx.config.ee_step_max_m / norm)
            cmd.ee_target_m = clipped
            if np.any(np.abs(clipped - target) > TOL):
                cmd.values[:3] = clipped - base
                return cmd, [SafetyEvent("workspace", self.name, "ee target clipped into the workspace box")]
            return cmd, []
        if ctx.fk is None:
            return cmd, []
        start, vel = ctx.ref_pos_rad, _velocity_of(cmd, ctx)
        p_start = ctx.fk(start)
        if p_start is None:
            return cmd, []
        d_start = _box_distance(p_start, lo, hi)
        if d_start > 0:  # already outside: allow only steps that take it no further out
            # (a step along the wall, or a wrist turn that leaves the end effector where it is, is not
            # a step away: stopping it froze an arm a hair below the floor for good, issue 14)
            p_new = ctx.fk(start + vel * ctx.dt_s)
            if _box_distance(p_new, lo, hi) <= d_start + OUTSIDE_CREEP_M:
                return cmd, []
            _set_velocity(cmd, ctx, np.zeros_like(vel))
            return cmd, [SafetyEvent("workspace_wall", self.name, "outside the box: step away from it stopped")]
        # stopping paths are planned inside a box `workspace_plan_margin_m` smaller (and, where the arm
        # already is in that margin, no deeper into it, axis by axis): a plan that touches its wall leaves
        # that much room for what no model of the arm gets exactly (a late command's ageing, rounding), so
        # such a deviation is absorbed by the margin instead of finding even braking outside the box. The
        # allowance is per axis because one Euclidean depth let a step from a corner of the margin spend it
        # all on one axis, past the box's wall (a final_check fault, issue 14)
        margin = np.minimum(ctx.config.workspace_plan_margin_m, 0.25 * (hi - lo))
        lo_in, hi_in = lo + margin, hi - margin

        def plan_box(p):  # the inner box, widened on each axis to where the arm already is
            return np.minimum(lo_in, p), np.maximum(hi_in, p)

        starts = [(start, plan_box(p_start))]
        if ctx.mode is ControlMode.JOINT_VELOCITY:
            # velocities carry no position, so nothing ties the reference to where the arm is: every late
            # command's ageing (`braking_stop_after`, which keeps the checked stop and so sits up to half
            # a period's travel behind the arm's own stop) leaves the arm a little ahead of it, and that
            # adds up under load (22.5 mm outside the box in a loaded fuzz, issue 14). The same stop is
            # checked from the measured joints too.
            p_meas = ctx.fk(ctx.q_rad)
            if p_meas is not None:
                starts.append((ctx.q_rad, plan_box(p_meas)))

        def stops_inside(v: np.ndarray) -> bool:
            return all(_brakes_inside(v, ctx, box_lo, box_hi, q0) for q0, (box_lo, box_hi) in starts)

        if stops_inside(vel):
            return cmd, []
        brake = np.sign(ctx.ref_vel_rad_s) * np.maximum(np.abs(ctx.ref_vel_rad_s) - ctx.amax * ctx.dt_s, 0.0)
        brake = np.clip(brake, *ctx.velocity_bounds())  # an aged reference may sit just past the braking bound
        if stops_inside(brake):
            good, bad = 0.0, 1.0
            for _ in range(12):
                mid = 0.5 * (good + bad)
                if stops_inside(brake + mid * (vel - brake)):
                    good = mid
                else:
                    bad = mid
            _set_velocity(cmd, ctx, brake + good * (vel - brake))
            return cmd, [SafetyEvent("workspace", self.name, f"slowed ({good:.2f} of the step) to stop inside the box")]
        # braking alone leaves the box: brake (never the requested step, which may even speed up towards
        # the wall), and cut the braking step short only where the wall is inside it
        good, bad = 1.0, 1.0
        if _box_distance(ctx.fk(start + brake * ctx.dt_s), lo, hi) > 0:
            good = 0.0
            for _ in range(20):
                mid = 0.5 * (good + bad)
                if _box_distance(ctx.fk(start + mid * brake * ctx.dt_s), lo, hi) <= 0:
                    good = mid
                else:
                    bad = mid
        _set_velocity(cmd, ctx, good * brake)
        if good >= 1.0:
            return cmd, [SafetyEvent("workspace", self.name, "braked: even braking does not stop inside the box")]
        return cmd, [SafetyEvent("workspace_wall", self.name, f"braking cut to {good:.2f} of its step at the workspace box")]


def _brakes_inside(vel: np.ndarray, ctx: Context, lo, hi, start=None) -> bool:
    """Does the end effector stay in the box on this step and on the stop that follows it, every joint
    braking by `amax * dt` per control step? From `start` (default: the reference)."""
    start = ctx.ref_pos_rad if start is None else start
    pos, v, dv = start + vel * ctx.dt_s, np.asarray(vel, np.float64), ctx.amax * ctx.dt_s
    for _ in range(10_000):
        p = ctx.fk(pos)
        if p is None or _box_distance(p, lo, hi) > 0.0:
            return p is None
        v = np.sign(v) * np.maximum(np.abs(v) - dv, 0.0)
        if not np.any(v):
            return True
        pos = pos + v * ctx.dt_s
    return False


class GripperFilter:
    """Gripper width in [0, gripper_width_max_m], force in [0, gripper_force_max_n]."""

    name = "gripper"

    def __call__(self, cmd, ctx):
        events = []
        width = float(np.clip(cmd.gripper_width_m, 0.0, ctx.config.gripper_width_max_m))
        if abs(width - cmd.gripper_width_m) > TOL:
            events.append(SafetyEvent("gripper_width", self.name, f"width {cmd.gripper_width_m:.3g} m clipped"))
        force = float(np.clip(cmd.gripper_force_n, 0.0, ctx.config.gripper_force_max_n))
        if abs(force - cmd.gripper_force_n) > TOL:
            events.append(SafetyEvent("gripper_force", self.name, f"force {cmd.gripper_force_n:.3g} N clipped"))
        cmd.gripper_width_m, cmd.gripper_force_n = width, force
        return cmd, events


def _uniform_scale(step: np.ndarray, ctx: Context) -> float:
    """The largest s in [0, 1] for which s * step keeps every joint's speed, braking bound, relative
    target and acceleration limit: scaling all joints alike keeps the end effector on its path, where
    clipping joints one by one would bend it. 1 when no s fits (the joint filters then clip per joint)."""
    lo_s, hi_s = 0.0, 1.0
    vel = step / ctx.dt_s
    v_lo, v_hi = ctx.velocity_bounds()
    dv = ctx.amax * ctx.dt_s
    rel = ctx.config.max_relative_target_rad / ctx.dt_s
    lows = np.maximum.reduce([v_lo, ctx.ref_vel_rad_s - dv, np.full_like(vel, -rel)])
    highs = np.minimum.reduce([v_hi, ctx.ref_vel_rad_s + dv, np.full_like(vel, rel)])
    for v, low, high in zip(vel, lows, highs):  # low <= s v <= high
        if abs(v) < 1e-12:
            if low > TOL or high < -TOL:
                return 1.0
            continue
        a, b = sorted((low / v, high / v))
        lo_s, hi_s = max(lo_s, a), min(hi_s, b)
    return hi_s if hi_s >= lo_s else 1.0


def _velocity_of(cmd: Command, ctx: Context) -> np.ndarray:
    if cmd.mode is ControlMode.JOINT_VELOCITY:
        return cmd.values.copy()
    return (cmd.values - ctx.ref_pos_rad) / ctx.dt_s


def _target_of(cmd: Command, ctx: Context) -> np.ndarray:
    if cmd.mode is ControlMode.JOINT_VELOCITY:
        return ctx.ref_pos_rad + cmd.values * ctx.dt_s
    return cmd.values.copy()


def _set_velocity(cmd: Command, ctx: Context, vel: np.ndarray) -> None:
    cmd.values = vel.copy() if cmd.mode is ControlMode.JOINT_VELOCITY else ctx.ref_pos_rad + vel * ctx.dt_s


DEFAULT_FILTERS = (RelativeTargetFilter, JointVelocityFilter, JointAccelerationFilter, JointLimitFilter,
                   EEStepFilter, WorkspaceFilter, GripperFilter)


@dataclass
class FilterResult:
    command: Command | None         # what will be sent (the hold command when rejected)
    events: list[SafetyEvent]
    accepted: bool                  # the caller's command (possibly clipped) is what is sent
    fault: str | None = None


class SafetyChain:
    """Guard + filters + policy + final check. Counts every event by (kind, outcome)."""

    def __init__(self, config: RobotConfig, filters=None, max_log: int = 10_000):
        self.config = config
        self.filters: list = [f() for f in DEFAULT_FILTERS] if filters is None else list(filters)
        self.counts: Counter = Counter()
        self.log: list[dict] = []
        self.max_log = max_log
        self.commands = 0
        self.reset()

    @classmethod
    def from_config(cls, config: RobotConfig) -> "SafetyChain":
        return cls(config)

    def reset(self, obs: dict | None = None) -> None:
        """Start from the measured state (on arm): where the arm is, as fast as it still moves."""
        q = None if obs is None else np.asarray(obs["joint_pos_rad"], np.float64)
        self.ref_pos = q if q is not None else np.asarray(self.config.home_joint_pos_rad, np.float64)
        qd = None if obs is None else obs.get("joint_vel_rad_s")  # re-armed while still braking: from there
        vmax = np.asarray(self.config.joint_vel_max_rad_s)
        self.ref_vel = np.zeros(self.config.dof) if qd is None else np.clip(np.asarray(qd, np.float64), -vmax, vmax)
        self._last_width: float | None = None
        ee = None if obs is None else obs.get("ee_pos_m")
        self.ref_ee = None if ee is None else np.asarray(ee, np.float64)

    def policy(self, kind: str) -> str:
        policy = self.config.on_violation.get(kind, self.config.default_violation)
        return "reject" if kind in GUARD_KINDS and policy == "clip" else policy

    def count_refused(self, kind: str) -> None:
        self._record([SafetyEvent(kind, "lifecycle", "command refused", "reject")])

    def _record(self, events: list[SafetyEvent]) -> None:
        for ev in events:
            self.counts[(ev.kind, ev.outcome)] += 1
            if len(self.log) < self.max_log:
                self.log.append(ev.to_dict())

    def summary(self) -> dict:
        by_outcome = Counter()
        for (_, outcome), n in self.counts.items():
            by_outcome[outcome] += n
        return {"commands": self.commands, "by_outcome": dict(by_outcome),
                "by_kind": {f"{k}/{o}": n for (k, o), n in sorted(self.counts.items())}}

    # ------------------------------------------------------------------ the data path
    def guard(self, action, mode: ControlMode) -> tuple[np.ndarray | None, list[SafetyEvent]]:
        """Raw input -> float64 vector of the mode's length, or None with the reason."""
        try:
            arr = np.asarray(action)
        except Exception as err:  # noqa: BLE001  ragged lists, odd objects
            return None, [SafetyEvent("dtype", "guard", f"not an array ({type(err).__name__})")]
        if arr.dtype.kind not in "iuf":
            return None, [SafetyEvent("dtype", "guard", f"dtype {arr.dtype} is not a real number type")]
        want = self.config.action_dim(mode)
        if arr.shape != (want,):
            return None, [SafetyEvent("shape", "guard", f"shape {arr.shape}, want ({want},)")]
        with np.errstate(over="ignore", invalid="ignore"):
            arr = arr.astype(np.float64)
        if not np.all(np.isfinite(arr)):
            return None, [SafetyEvent("non_finite", "guard", "NaN or Inf in the command")]
        return arr, []

    def context(self, obs: dict, mode: ControlMode, fk=None, elapsed_s: float | None = None,
                age_joints: bool | None = None) -> Context:
        """The filters' view. `elapsed_s` > one period ages the joint reference (see the module
        docstring): in joint modes, and in ee_delta through IK (`age_joints`), whose commands are joint
        targets as well."""
        ee = obs.get("ee_pos_m")
        ref_pos, ref_vel = self.ref_pos.copy(), self.ref_vel.copy()
        late_s = 0.0 if elapsed_s is None else max(0.0, float(elapsed_s) - self.config.period_s)
        if age_joints is None:
            age_joints = mode is not ControlMode.EE_DELTA
        if late_s > 0 and age_joints:  # see BACKEND_CONTRACT: it braked meanwhile
            ref_pos, ref_vel = braking_stop_after(ref_pos, ref_vel, late_s, self.config.joint_acc_max_rad_s2,
                                                  self.config.period_s)
        return Context(self.config, mode, self.config.period_s, np.asarray(obs["joint_pos_rad"], np.float64),
                       None if ee is None else np.asarray(ee, np.float64), ref_pos, ref_vel,
                       None if self.ref_ee is None else self.ref_ee.copy(),
                       None if obs.get("gripper_width_m") is None else float(obs["gripper_width_m"]), fk=fk)

    def filter(self, action, obs: dict, mode: ControlMode, fk=None, ik=None,
               elapsed_s: float | None = None) -> FilterResult:
        """`ik(q_ref_rad, ee_target_m, rot_delta_rad) -> q_rad | None`: in ee_delta mode the command that
        is checked and sent becomes the joint-position command it solves to."""
        self.commands += 1
        via_ik = mode is ControlMode.EE_DELTA and ik is not None
        ctx = self.context(obs, mode, fk, elapsed_s, age_joints=mode is not ControlMode.EE_DELTA or via_ik)
        if mode is ControlMode.JOINT_VELOCITY:
            ctx = self._anchor_at_rest(ctx, obs)
        values, events = self.guard(action, mode)
        cmd = None
        if values is not None:
            cmd = Command(mode, values[:-1].copy(), float(values[-1]), float(self.config.gripper_force_n))
            for f in self.filters:
                cmd, new = f(cmd, ctx)
                events += new
        if via_ik:
            ctx = replace(ctx, mode=ControlMode.JOINT_POSITION)  # from here on a joint command
            if cmd is not None:
                cmd, new = self._solve_ik(cmd, ctx, ik)
                events += new
        outcome = "clip"
        for ev in events:
            ev.outcome = self.policy(ev.kind)
            if ev.outcome == "fault" or (ev.outcome == "reject" and outcome == "clip"):
                outcome = ev.outcome
        if outcome == "fault":
            self._record(events)
            return FilterResult(None, events, False, fault=", ".join(sorted({e.kind for e in events})))
        accepted = outcome == "clip" and cmd is not None
        if not accepted:
            cmd, wall = self.hold_command(ctx)
            events += wall
        problem = self.final_check(cmd, ctx)
        if problem:
            events.append(SafetyEvent("final_check", "final_check", problem, "fault"))
            self._record(events)
            return FilterResult(None, events, False, fault=f"final_check: {problem}")
        if cmd.mode is not ControlMode.EE_DELTA:
            cmd.velocity_rad_s = _velocity_of(cmd, ctx)  # the planned velocity, as `commit` will take it
        self._record(events)
        return FilterResult(cmd, events, accepted)

    def _anchor_at_rest(self, ctx: Context, obs: dict) -> Context:
        """joint_velocity: once the reference (aged, `ctx`) and the measured arm have both stopped, the
        reference is where the arm is, at rest. A velocity carries no position, so whatever the arm executed
        differently from the chain's plan (a command met late runs after a little extra braking) stays between
        them and adds up: in a loaded fuzz the arm rested 13.6 mrad from the reference, and a push that stopped
        the reference at a wall of the box left the arm 10-22 mm outside it (issue 14). Joint-position
        targets re-anchor by themselves."""
        qd = obs.get("joint_vel_rad_s")
        if qd is None or np.any(ctx.ref_vel_rad_s) or np.any(np.abs(np.asarray(qd, np.float64)) > REST_FRACTION * ctx.vmax):
            return ctx
        # the velocity too: ageing the anchored position along the old one would put it a stop past the arm
        self.ref_pos, self.ref_vel = ctx.q_rad.copy(), np.zeros_like(self.ref_vel)
        return replace(ctx, ref_pos_rad=ctx.q_rad.copy(), ref_vel_rad_s=np.zeros_like(ctx.ref_vel_rad_s))

    def _solve_ik(self, cmd: Command, ctx: Context, ik) -> tuple[Command | None, list[SafetyEvent]]:
        """The limited ee target -> joint targets from the joint reference, then every joint filter."""
        base = ctx.ee_base()
        goal = cmd.ee_target_m if cmd.ee_target_m is not None else (None if base is None else base + cmd.values[:3])
        q = None if goal is None else ik(ctx.ref_pos_rad.copy(), np.asarray(goal, np.float64), cmd.values[3:6].copy())
        if q is None or np.shape(q) != (self.config.dof,) or not np.all(np.isfinite(q)):
            return None, [SafetyEvent("ik", "ik", "no joint solution for the end-effector target")]
        step = np.asarray(q, np.float64) - ctx.ref_pos_rad
        scale = _uniform_scale(step, ctx)
        joint = Command(ControlMode.JOINT_POSITION, ctx.ref_pos_rad + scale * step, cmd.gripper_width_m,
                        cmd.gripper_force_n)
        events = [] if scale >= 1.0 - TOL else [
            SafetyEvent("ik_step", "ik", f"joint step scaled by {scale:.2f} to the joint limits")]
        for f in self.filters:
            joint, new = f(joint, ctx)
            events += new
        return joint, events

    def hold_command(self, ctx: Context) -> tuple[Command, list[SafetyEvent]]:
        """Decelerate towards rest at the acceleration limit (a jump to zero would break it); at the
        workspace wall, stop where the arm is (the wall wins over the acceleration limit)."""
        keep = self._last_width if self._last_width is not None else ctx.gripper_width_m  # never let go
        width = float(np.clip(ctx.config.gripper_width_max_m if keep is None else keep, 0.0,
                              ctx.config.gripper_width_max_m))
        force = float(np.clip(ctx.config.gripper_force_n, 0.0, ctx.config.gripper_force_max_n))
        if ctx.mode is ControlMode.EE_DELTA:
            base = ctx.ee_base()
            return Command(ctx.mode, np.zeros(6), width, force,
                           ee_target_m=None if base is None else base.copy()), []
        dv = ctx.amax * ctx.dt_s
        vel = np.sign(ctx.ref_vel_rad_s) * np.maximum(np.abs(ctx.ref_vel_rad_s) - dv, 0.0)
        lo, hi = ctx.velocity_bounds()
        vel = np.clip(vel, lo, hi)
        cmd = Command(ctx.mode, np.zeros(ctx.config.dof), width, force)
        _set_velocity(cmd, ctx, vel)
        if ctx.mode is ControlMode.JOINT_POSITION:
            cmd.values = np.clip(cmd.values, *ctx.position_bounds())
        if ctx.fk is not None and ctx.mode is not ControlMode.EE_DELTA:
            p = ctx.fk(_target_of(cmd, ctx))
            lo_b, hi_b = np.asarray(ctx.config.workspace_min_m), np.asarray(ctx.config.workspace_max_m)
            if p is not None and _box_distance(p, lo_b, hi_b) > _box_distance(ctx.fk(ctx.ref_pos_rad), lo_b, hi_b):
                _set_velocity(cmd, ctx, np.zeros(ctx.config.dof))  # a wall: stop where we are
                return cmd, [SafetyEvent("workspace_wall", "hold", "hold stopped at the workspace wall", "reject")]
        return cmd, []

    def final_check(self, cmd: Command, ctx: Context) -> str | None:
        """Every hard limit, re-verified on the exact command to be sent. Returns the first violation."""
        c = ctx.config
        if cmd.values.dtype != np.float64 or not np.all(np.isfinite(cmd.values)):
            return "non-finite values"
        if not (0.0 <= cmd.gripper_width_m <= c.gripper_width_max_m + TOL):
            return "gripper width out of range"
        if not (0.0 <= cmd.gripper_force_n <= c.gripper_force_max_n + TOL):
            return "gripper force out of range"
        if cmd.mode is ControlMode.EE_DELTA:
            if cmd.values.shape != (6,):
                return "ee delta shape"
            if np.linalg.norm(cmd.values[:3]) > c.ee_step_max_m + 1e-7:
                return "ee step over limit"
            if np.linalg.norm(cmd.values[3:]) > c.ee_rot_step_max_rad + 1e-7:
                return "ee rotation step over limit"
            if cmd.ee_target_m is not None and ctx.ee_base() is not None:
                lo, hi = np.asarray(c.workspace_min_m), np.asarray(c.workspace_max_m)
                if np.linalg.norm(cmd.ee_target_m - ctx.ee_base()) > c.ee_step_max_m + 1e-7:
                    return "ee target step over limit"
                allowed = max(0.0, _box_distance(ctx.ee_base(), lo, hi) - 1e-12)  # outside: never further out
                if _box_distance(cmd.ee_target_m, lo, hi) > allowed + 1e-7:
                    return "ee target outside the workspace"
            return None
        if cmd.values.shape != (c.dof,):
            return "joint command shape"
        vel, target = _velocity_of(cmd, ctx), _target_of(cmd, ctx)
        lo, hi = ctx.position_bounds()
        if np.any(target < lo - 1e-7) or np.any(target > hi + 1e-7):
            return "joint target outside the joint limits"
        if np.any(np.abs(vel) > ctx.vmax * (1 + 1e-7) + 1e-9):
            return "joint velocity over limit"
        if cmd.mode is ControlMode.JOINT_POSITION and np.any(
                np.abs(cmd.values - ctx.ref_pos_rad) > c.max_relative_target_rad + 1e-7):
            return "relative target over limit"
        if ctx.fk is not None:
            p_new, p_ref = ctx.fk(target), ctx.fk(ctx.ref_pos_rad)
            if p_new is not None and p_ref is not None:
                lo, hi = np.asarray(c.workspace_min_m), np.asarray(c.workspace_max_m)
                allowed = max(0.0, _box_distance(p_ref, lo, hi))  # outside: never further out
                if _box_distance(p_new, lo, hi) > allowed + 1e-7:
                    return "end effector would leave the workspace"
        return None

    def commit(self, cmd: Command, elapsed_s: float | None = None, fk=None) -> None:
        """The command was sent: it becomes the reference for the next one (aged as in `context`)."""
        if cmd.mode is ControlMode.EE_DELTA and cmd.ee_target_m is not None:
            self.ref_ee = np.asarray(cmd.ee_target_m, np.float64).copy()
        if cmd.mode is not ControlMode.EE_DELTA:
            dt = self.config.period_s
            aged = self.context({"joint_pos_rad": self.ref_pos}, cmd.mode, elapsed_s=elapsed_s)
            if cmd.mode is ControlMode.JOINT_VELOCITY:
                self.ref_vel = cmd.values.copy()
                self.ref_pos = aged.ref_pos_rad + cmd.values * dt
            else:
                self.ref_vel = (cmd.values - aged.ref_pos_rad) / dt
                self.ref_pos = cmd.values.copy()
            if self.config.control_mode == ControlMode.EE_DELTA.value and fk is not None:
                p = fk(self.ref_pos)  # ee_delta through IK: the next step starts where this target leads
                self.ref_ee = None if p is None else np.asarray(p, np.float64).copy()
        self._last_width = cmd.gripper_width_m
