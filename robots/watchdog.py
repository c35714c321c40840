"""Command watchdog: no valid command within the deadline -> the arm holds and needs a new arm().

It runs as a thread of the controller process, next to the robot connection, so a stalled or dead
policy process (or a hung control loop) cannot keep it from firing. It sleeps exactly until the
current deadline, so it fires within the thread wake-up latency of it, not a polling period late.
"""
from __future__ import annotations

import threading
import time

from robots.base import State


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
            remaining = self._last_kick + self.deadline_s - time.monotonic()
            if remaining > 0:
                self._wake.wait(remaining)
                continue
            with self.robot._lock:  # re-check under the lock: a command may have just gone out
                last = self._last_kick
                if time.monotonic() - last < self.deadline_s or self.robot.state is not State.ARMED:
                    continue
                try:
                    self.robot.hold("watchdog")
                except Exception as err:  # noqa: BLE001  the link is broken: make it a fault
                    self.robot.fault(f"watchdog hold failed: {err}")
            t = time.monotonic()
            self.fired.append({"t_s": t, "last_kick_s": last, "late_ms": (t - last - self.deadline_s) * 1e3})
            self.robot.events.append({"t_s": t, "kind": "watchdog", "last_kick_s": last,
                                      "since_last_command_ms": (t - last) * 1e3})
