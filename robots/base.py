"""The robot contract (DESIGN.md §3): one interface for simulated and real arms.

A `Robot` owns a backend (a MuJoCo process, an SDK connection) and wraps it in three guarantees:

- a lifecycle `disconnected -> connected -> armed -> fault` where only legal transitions happen
  (anything else raises `RobotStateError`);
- every command passes the safety chain before the backend sees it: backends implement the private
  `_command(cmd)`, and the only caller is `Robot.send_action`, after `SafetyChain.filter`;
- `with robot:` always leaves the arm stopped and disconnected, whatever happened inside.

Limits hold per unit of time: `send_action` sends at most one command per control period on the
robot's clock (`clock()`); a caller that calls faster waits inside `send_action` for the rest of the
period, so a tight loop cannot multiply the per-step limits. The measured state is watched too: on
every reading while armed, an end effector more than `monitor_workspace_tol_m` outside the workspace
box, or a joint faster than its limit by more than `monitor_speed_tol` (a fraction), holds the arm and
is counted as a `measured_workspace` / `measured_speed` safety event.

Action layout (flat float vector, one per control mode; the gripper width is always last):
    joint_position: [q_target_rad x dof, gripper_width_m]
    joint_velocity: [qd_target_rad_s x dof, gripper_width_m]
    ee_delta:       [dx_m, dy_m, dz_m, drx_rad, dry_rad, drz_rad, gripper_width_m]  (base frame)
Observation keys shared by every driver: `observation.state` (joint positions then gripper width,
float32), `joint_pos_rad`, `joint_vel_rad_s`, `ee_pos_m`, `ee_quat_wxyz`, `gripper_width_m`,
`timestamp_s` (time.monotonic() of the reading on the controller's clock).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from robots.geometry import box_distance_m
from robots.safety import SafetyChain, SafetyEvent
from robots.types import (TRANSITIONS, Command, ControlMode, RobotConfig, RobotFault, RobotStateError,  # noqa: F401
                          State)
from robots.watchdog import Watchdog


class Robot:
    """Lifecycle, locking, safety and watchdog around a backend. Subclasses implement the `_` hooks."""

    def __init__(self, config: RobotConfig, *, start_watchdog: bool = True):
        self.config = config
        self.mode = config.mode
        self.chain = SafetyChain.from_config(config)
        self._state = State.DISCONNECTED
        self._lock = threading.RLock()
        self._estop = threading.Event()
        self.fault_reason: str | None = None
        self.events: list[dict] = []        # every state change and watchdog/e-stop event, in order
        self._last_obs: dict | None = None
        self._start_watchdog = start_watchdog
        self.watchdog = None
        self.watchdog_fired: list[dict] = []  # every watchdog hold of this robot, across connections
        self._last_send_s: float | None = None  # robot clock of the last command sent (pacing)
        self._last_obs_s = float("-inf")
        self._armed_box_excess_m = 0.0        # where the arm stood when armed (monitor baseline)
        self._stalled_hold = threading.Event()  # the watchdog held without the lock (loop stalled in it)
        self.paced_s = 0.0                    # total time send_action made callers wait

    # ------------------------------------------------------------------ backend hooks
    def _connect(self) -> None: raise NotImplementedError
    def _disconnect(self) -> None: raise NotImplementedError
    def _read(self) -> dict: raise NotImplementedError            # raw obs, keys as in the docstring
    def _command(self, cmd: Command) -> None: raise NotImplementedError
    def _hold(self) -> None: raise NotImplementedError            # stop moving, keep position
    def _estop_backend(self) -> None: self._hold()               # hardware stop where the SDK has one
    def _recover(self) -> None: pass                              # clear SDK errors
    def _arm(self) -> None: pass                                  # enable motion (SDK modes, servo on)
    def fk_ee_pos_m(self, q_rad: np.ndarray) -> np.ndarray | None:
        """End-effector position for joint positions (for the workspace filter); None if unknown."""
        return None

    ik_joint_targets = None
    """Optional `(q_ref_rad, ee_target_m, rot_delta_rad) -> q_rad | None`. Where a backend has it,
    ee_delta commands go out as the joint targets it solves to, after the joint checks."""

    def clock(self) -> float:
        """The robot's clock (seconds) for pacing and time-based limits."""
        return time.monotonic()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    # ------------------------------------------------------------------ lifecycle
    @property
    def state(self) -> State:
        return self._state

    def _transition(self, new: State, reason: str = "") -> None:
        with self._lock:
            old = self._state
            if new not in TRANSITIONS[old]:
                raise RobotStateError(f"robot {self.config.name}: cannot go from {old.value} to {new.value}; "
                                      f"legal next states: {sorted(s.value for s in TRANSITIONS[old])}")
            self._state = new
            self.events.append({"t_s": time.monotonic(), "kind": "state", "from": old.value, "to": new.value,
                                "reason": reason})

    def connect(self) -> "Robot":
        with self._lock:
            if self._state is not State.DISCONNECTED:
                raise RobotStateError(f"robot {self.config.name} is {self._state.value}; connect() needs disconnected")
            self._connect()
            self._estop.clear()
            self._transition(State.CONNECTED, "connect")
            self.chain.reset()
        if self._start_watchdog:
            self.watchdog = Watchdog(self, self.config.watchdog_deadline_ms)
            self.watchdog.fired = self.watchdog_fired
            self.watchdog.start()
        return self

    def arm(self) -> None:
        """Enable commands. Needed after connect, after every watchdog hold and after recover()."""
        with self._lock:
            if self._estop.is_set():
                raise RobotStateError(f"robot {self.config.name} is e-stopped; call recover() first")
            if self._state is not State.CONNECTED:
                raise RobotStateError(f"robot {self.config.name} is {self._state.value}; arm() needs connected")
            try:
                self._arm()
            except RobotFault as err:  # e.g. the arm is in a protective stop: recover() first
                self.fault(f"arm failed: {err}")
                raise
            obs = self.observe()
            self.chain.reset(obs)
            self._armed_box_excess_m = self._box_excess(obs)
            self._stalled_hold.clear()
            self._last_send_s = None
            self._transition(State.ARMED, "arm")
            if self.watchdog is not None:
                self.watchdog.kick()

    def disarm(self, reason: str = "disarm") -> None:
        self.hold(reason)

    def hold(self, reason: str = "hold") -> None:
        """Stop moving and keep position; commands need a new arm()."""
        with self._lock:
            if self._state is State.ARMED:
                try:
                    self._hold()
                except Exception as err:  # noqa: BLE001  a hold the backend cannot do: the link is broken
                    self.fault(f"{reason}: hold failed: {err}")
                    raise RobotFault(f"{reason}: hold failed: {err}") from None
                self._transition(State.CONNECTED, reason)

    def stop(self) -> None:
        """Stop the arm now in any connected state (hold if armed, backend stop otherwise)."""
        with self._lock:
            if self._state is State.ARMED:
                self.hold("stop")
            elif self._state in (State.CONNECTED, State.FAULT):
                try:
                    self._hold()
                except Exception as err:  # noqa: BLE001  a stop must not raise on a broken link
                    self.events.append({"t_s": time.monotonic(), "kind": "stop_error", "reason": str(err)})

    def estop(self, reason: str = "estop") -> None:
        """Emergency stop. Safe from any thread; does not need the policy (or anything else) alive."""
        self._estop.set()  # first: any command racing with us is refused
        with self._lock:
            t = time.monotonic()
            try:
                if self._state is not State.DISCONNECTED:
                    self._estop_backend()
            finally:
                self.events.append({"t_s": t, "kind": "estop", "reason": reason})
                if self._state in (State.CONNECTED, State.ARMED):
                    self._transition(State.FAULT, reason)
                    self.fault_reason = reason

    def fault(self, reason: str) -> None:
        with self._lock:
            try:
                if self._state is not State.DISCONNECTED:
                    self._hold()
            except Exception:  # noqa: BLE001
                pass
            if self._state in (State.CONNECTED, State.ARMED):
                self._transition(State.FAULT, reason)
            self.fault_reason = reason

    def recover(self) -> None:
        """Leave `fault` (clear SDK errors, release the e-stop latch); arm() is still needed."""
        with self._lock:
            if self._state is not State.FAULT:
                raise RobotStateError(f"robot {self.config.name} is {self._state.value}; recover() needs fault")
            self._recover()
            self._estop.clear()
            self.fault_reason = None
            self._transition(State.CONNECTED, "recover")

    def disconnect(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        with self._lock:
            if self._state is State.DISCONNECTED:
                return
            try:
                self._hold()
            except Exception:  # noqa: BLE001  the link may already be gone
                pass
            try:
                self._disconnect()
            finally:
                self._transition(State.DISCONNECTED, "disconnect")

    def __enter__(self) -> "Robot":
        if self._state is State.DISCONNECTED:
            self.connect()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self.disconnect()

    # ------------------------------------------------------------------ data path
    def observe(self) -> dict:
        with self._lock:
            if self._state is State.DISCONNECTED:
                raise RobotStateError(f"robot {self.config.name} is disconnected; call connect() first")
            try:
                obs = self._read()
            except RobotFault as err:
                self.fault(f"read failed: {err}")
                raise
            self._last_obs, self._last_obs_s = obs, self.clock()
            if self._state is State.ARMED:
                self._monitor(obs)
            return obs

    def _box_excess(self, obs: dict) -> float:
        ee = obs.get("ee_pos_m")
        return 0.0 if ee is None else box_distance_m(ee, self.config.workspace_min_m, self.config.workspace_max_m)

    def _monitor(self, obs: dict) -> None:
        """Hold (or fault, per on_violation) when the measured motion breaks a limit beyond tolerance."""
        c, events = self.config, []
        excess = self._box_excess(obs)
        # armed outside the box: any further outward motion holds (a baseline that grew with every re-arm
        # would let repeated holds ratchet the arm outwards); 2 mm of margin for sensor noise
        if excess > max(c.monitor_workspace_tol_m, self._armed_box_excess_m + 0.002):
            events.append(SafetyEvent("measured_workspace", "monitor",
                                      f"measured end effector {excess:.3f} m outside the workspace box"))
        qd = obs.get("joint_vel_rad_s")
        if qd is not None:
            ratio = np.abs(np.asarray(qd, np.float64)) / np.asarray(c.joint_vel_max_rad_s)
            if ratio.max() > 1.0 + c.monitor_speed_tol:
                j = int(ratio.argmax())
                events.append(SafetyEvent("measured_speed", "monitor",
                                          f"joint {j} measured at {ratio[j]:.2f}x its speed limit"))
        if not events:
            return
        outcome = "fault" if any(self.chain.policy(e.kind) == "fault" for e in events) else "reject"
        for e in events:
            e.outcome = outcome
        self.chain._record(events)
        reason = "monitor: " + "; ".join(e.detail for e in events)
        self.events.append({"t_s": time.monotonic(), "kind": "monitor", "reason": reason})
        if outcome == "fault":
            self.fault(reason)
        else:
            self.hold(reason)

    def _watchdog_hold_unlocked(self, reason: str) -> None:
        """The watchdog could not take the lock (the control loop is stuck holding it): stop the backend
        now; the state change happens when the lock is free (the next send_action refuses and does it)."""
        self._stalled_hold.set()
        self._hold()

    def _backend_held(self, reason: str, t_s: float, last_command_s: float | None) -> None:
        """The arm held by itself (its own command deadline): mirror it here, as a watchdog hold."""
        with self._lock:
            if self._state is not State.ARMED:
                return
            self._transition(State.CONNECTED, reason)
        late = None if last_command_s is None else (t_s - last_command_s - self.config.watchdog_deadline_ms / 1e3) * 1e3
        self.watchdog_fired.append({"t_s": t_s, "last_kick_s": last_command_s, "late_ms": late, "source": "arm"})
        self.events.append({"t_s": t_s, "kind": "watchdog", "source": "arm", "reason": reason})

    def send_action(self, action) -> np.ndarray | None:
        """Filter `action` through the safety chain and send the result, at most once per period.

        Returns the action actually sent (the filtered command, or the hold command sent instead of
        a rejected one), or None when nothing could be sent (not armed, e-stopped, faulted, or held by
        the measured-state monitor).
        """
        if self._estop.is_set():
            self.chain.count_refused("estopped")
            return None
        if self._last_send_s is not None:  # pace: one command per control period on the robot's clock
            wait = self._last_send_s + self.config.period_s - self.clock()
            if wait > 0:
                self._sleep(wait)
                self.paced_s += wait
        with self._lock:
            if self._stalled_hold.is_set():
                self._stalled_hold.clear()
                if self._state is State.ARMED:
                    self._transition(State.CONNECTED, "watchdog")
            if self._state is not State.ARMED or self._estop.is_set():
                self.chain.count_refused("not_armed")
                return None
            obs = self._last_obs
            if obs is None or self.clock() - self._last_obs_s > self.config.period_s / 2:
                try:
                    obs = self.observe()  # fresh: the monitor sees the state this command starts from
                except RobotFault:  # observe() already faulted the robot
                    return None
                if self._state is not State.ARMED:
                    self.chain.count_refused("not_armed")
                    return None
            now = self.clock()
            elapsed = None if self._last_send_s is None else now - self._last_send_s
            result = self.chain.filter(action, obs, self.mode, fk=self.fk_ee_pos_m, ik=self.ik_joint_targets,
                                       elapsed_s=elapsed)
            if result.fault:
                self.fault(f"safety: {result.fault}")
                return None
            result.command.t_s = now
            try:
                self._command(result.command)
            except RobotFault as err:
                self.fault(f"command failed: {err}")
                return None
            self._last_send_s = now
            self.chain.commit(result.command, elapsed_s=elapsed, fk=self.fk_ee_pos_m)
            if result.accepted and self.watchdog is not None:
                self.watchdog.kick()  # only a valid command resets the deadline
            return result.command.as_action()
