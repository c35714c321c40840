"""Command watchdog: no valid command within the deadline -> the arm holds and needs a new arm().

It runs as a thread of the controller process, next to the robot connection, so a stalled or dead
policy process cannot keep it from firing. It sleeps exactly until the current deadline, so it fires
within the thread wake-up latency of it, not a polling period late. A control loop stuck while holding
the robot's lock does not block it either: after one control period of waiting for the lock it stops
the backend directly and the state change follows when the lock is free.

What a thread cannot survive is its whole process stalling (descheduled, SIGSTOPped, the GIL held by a
C call). The arm's own command deadline covers that, outside this process: the sim arm server holds by
itself when no command arrives within `watchdog_deadline_ms` (as UR's RTDE watchdog and libfranka's
communication limits do on real arms), and the robot records that hold as a watchdog event with
`source: arm`.
"""
from __future__ import annotations

import threading
import time

from robots.types import State


class Watchdog:
    def __init__(self, robot, deadline_ms: float = 500.0):
        self.robot = robot
        self.deadline_s = float(deadline_ms) / 1000.0
        self._last_kick = time.monotonic()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: list[dict] = []   # {"t_s", "last_kick_s", "late_ms"} per hold it caused

    def kick(self) -> None:
        """A valid command went out: push the deadline back."""
        self._last_kick = time.monotonic()

    @property
    def last_kick_s(self) -> float:
        return self._last_kick

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="robot-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stopped.is_set():
            if self.robot.state is not State.ARMED:
                self._wake.wait(min(self.deadline_s, 0.005))
                continue
            if self.robot._stalled_hold.is_set():  # held already; the state follows when the loop is back
                self._wake.wait(self.robot.config.period_s)
                continue
            remaining = self._last_kick + self.deadline_s - time.monotonic()
            if remaining > 0:
                self._wake.wait(remaining)
                continue
            robot = self.robot
            got_lock = robot._lock.acquire(timeout=robot.config.period_s)
            try:
                last = self._last_kick
                if time.monotonic() - last < self.deadline_s or robot.state is not State.ARMED:
                    continue
                try:
                    if got_lock:  # re-checked under the lock: a command may have just gone out
                        robot.hold("watchdog")
                    else:
                        robot._watchdog_hold_unlocked("watchdog")
                except Exception as err:  # noqa: BLE001  the link is broken: make it a fault
                    robot.fault(f"watchdog hold failed: {err}")
            finally:
                if got_lock:
                    robot._lock.release()
            t = time.monotonic()
            source = "controller" if got_lock else "controller (loop stalled holding the lock)"
            self.fired.append({"t_s": t, "last_kick_s": last, "late_ms": (t - last - self.deadline_s) * 1e3,
                               "source": source})
            robot.events.append({"t_s": t, "kind": "watchdog", "last_kick_s": last, "source": source,
                                 "since_last_command_ms": (t - last) * 1e3})
