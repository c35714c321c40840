"""Fixtures: a franky-sim server (MuJoCo, libfranka protocol) on a free loopback address."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.fixture(scope="module")
def franky_sim():
    """Start `python -m franky_sim.run_server -s mujoco`; it picks a free 127.x.y.z address itself, so a
    second instance (another test run) does not collide. Always stopped with SIGINT, killed if stuck."""
    pytest.importorskip("franky")
    pytest.importorskip("franky_sim")
    proc = subprocess.Popen([sys.executable, "-m", "franky_sim.run_server", "-s", "mujoco"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    address, lines, t0 = None, [], time.monotonic()
    try:
        while time.monotonic() - t0 < 120:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Connect to the server using" in line:
                address = line.split("'")[1]
                break
        if address is None:
            raise RuntimeError("franky-sim did not start:\n" + "".join(lines[-20:]))
        yield {"address": address, "proc": proc}
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
