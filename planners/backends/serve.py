"""A local `transformers serve` process (OpenAI-compatible) for a model folder.

Tests and benchmarks drive `HTTPBackend` against a real server rather than a mock; this starts one on
127.0.0.1, waits until `/health` answers, and always stops it (its whole process group) on exit.

    with TransformersServe(model_dir()) as server:
        backend = HTTPBackend(server.base_url, model=server.model)
"""
from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from embodied.errors import UserError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class TransformersServe:
    def __init__(self, folder, *, host: str = "127.0.0.1", port: int | None = None, threads: int = 1,
                 startup_s: float = 300.0, log_path=None):
        """folder: a saved model (config.json + safetensors); threads: torch threads of the server."""
        self.folder = str(folder)
        if not (Path(self.folder) / "config.json").is_file():
            raise UserError(f"{self.folder} is not a model folder (no config.json): pass a save_pretrained folder, "
                            "e.g. planners.backends.local.model_dir()")
        self.host, self.port = host, port or free_port(host)
        self.threads, self.startup_s = int(threads), float(startup_s)
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"transformers_serve_{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.startup_wall_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def model(self) -> str:
        """The `model` field the server accepts: the folder it serves."""
        return self.folder

    def __enter__(self) -> "TransformersServe":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        exe = Path(sys.executable).with_name("transformers")
        if not exe.exists():
            raise UserError(f"no `transformers` command next to {sys.executable}: pip install 'transformers[serving]'")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(self.threads),
               "MKL_NUM_THREADS": str(self.threads)}
        t0 = time.monotonic()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([str(exe), "serve", "--host", self.host, "--port", str(self.port),
                                          "--device", "cpu", self.folder], stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)
        try:
            while not self._healthy():
                if self.proc.poll() is not None:
                    raise UserError(f"transformers serve exited with {self.proc.returncode}: {self._log_tail()}")
                if time.monotonic() - t0 > self.startup_s:
                    raise UserError(f"transformers serve did not answer /health within {self.startup_s:g} s; "
                                    f"see {self.log_path}")
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        self.startup_wall_s = time.monotonic() - t0

    def _healthy(self) -> bool:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=2.0)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return f"see {self.log_path}"
        return (lines[-1][:200] if lines else "no output") + f" (log: {self.log_path})"

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
