"""The OpenAI-compatible back end against a real `transformers serve` process on 127.0.0.1, through a
small fault proxy that injects timeouts, HTTP 5xx and malformed JSON. Both processes always stop."""
import collections
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import sims
from planners.backends.base import BackendError, BackendUnsupported
from planners.backends.http import HTTPBackend
from planners.backends.local import model_dir
from planners.executor import Executor, ExecutorConfig
from planners.grounding import candidates
from planners.llm_planner import LLMPlanner, LLMPlannerConfig
from planners.sim import oracle_skills, world_from_env

STARTUP_S = 300  # a loaded 2-core machine; ~15-25 s when quiet
STALL_S = 8.0  # the injected 'timeout' answers this late; the client gives up after 4 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """(base_url, model) of a real `transformers serve` with the bundled SmolLM2."""
    folder = str(model_dir())
    port = free_port()
    exe = Path(sys.executable).with_name("transformers")
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"transformers_serve_{port}.log", "w")
    proc = subprocess.Popen([str(exe), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                             folder], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not answer within {STARTUP_S} s; see {log.name}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", folder
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


class FaultProxy:
    """Forwards POSTs to the server, except for queued faults: 'timeout' (answers after the client gave
    up), '500' / '503', 'malformed' (200 with broken JSON), '404'. Empty queue: forward."""

    def __init__(self, upstream: str, always: str | None = None):
        self.upstream, self.always = upstream.rstrip("/"), always
        self.faults: collections.deque = collections.deque()
        self.requests = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                proxy.requests += 1
                fault = proxy.faults.popleft() if proxy.faults else proxy.always
                if fault == "timeout":
                    time.sleep(STALL_S)
                    return self._reply(504, b'{"error": "late"}')
                if fault in ("500", "503", "404"):
                    return self._reply(int(fault), b'{"error": "injected"}')
                if fault == "malformed":
                    return self._reply(200, b'{"choices": [{"message": {"content": "1. open the dr')
                reply = httpx.post(proxy.upstream + self.path.replace("/v1", "", 1), content=body,
                                   headers={"Content-Type": "application/json"}, timeout=120)
                self._reply(reply.status_code, reply.content)

            def _reply(self, code, data):
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out first

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def test_generate_against_real_server(server):
    url, model = server
    backend = HTTPBackend(url, model=model, timeout_s=60, max_retries=0)
    out = backend.generate("Say hello.", max_new_tokens=6)
    assert out.text.strip() and out.usage.prompt_tokens > 0 and out.usage.completion_tokens > 0


def test_timeouts_5xx_and_malformed_json_are_retried(server):
    url, model = server
    with FaultProxy(url) as proxy:
        proxy.faults.extend(["500", "malformed", "timeout", "503"])
        backend = HTTPBackend(proxy.url, model=model, timeout_s=4.0, max_retries=6, backoff_s=0.05)
        t0 = time.monotonic()
        out = backend.generate("Say hello.", max_new_tokens=2)
        assert time.monotonic() - t0 >= 4.0  # it did wait out the stalled attempt
        assert out.text.strip()
        # four injected faults, then the real answer (one more try is allowed for a slow, loaded server)
        assert 5 <= backend.attempts <= 6 and proxy.requests == backend.attempts


def test_persistent_failure_gives_one_clear_error(server):
    url, model = server
    with FaultProxy(url, always="500") as proxy:
        backend = HTTPBackend(proxy.url, model=model, timeout_s=5, max_retries=2, backoff_s=0.01)
        with pytest.raises(BackendError, match=r"failed 3 time\(s\), last: HTTP 500"):
            backend.generate("hi", max_new_tokens=2)
        assert proxy.requests == 3
    with FaultProxy(url, always="404") as proxy:  # a config error is not retried
        backend = HTTPBackend(proxy.url, model=model, timeout_s=5, max_retries=3)
        with pytest.raises(BackendError, match="HTTP 404"):
            backend.generate("hi", max_new_tokens=2)
        assert proxy.requests == 1


def test_scoring_without_logprobs_is_reported_not_guessed(server):
    url, model = server
    backend = HTTPBackend(url, model=model, timeout_s=60, max_retries=0)
    with pytest.raises(BackendUnsupported, match="log-probabilities"):
        backend.score("Plan:\n1.", [" open the drawer\n"])


def test_planner_over_http_stays_grounded_and_executor_survives_faults(server):
    url, model = server
    env = sims.make("scene", task_id=4, seed=0)
    obs, info = env.reset(seed=0)
    lib = oracle_skills(env)
    world = world_from_env(env)
    keys = {c.key for c in candidates(world, lib)}
    backend = HTTPBackend(url, model=model, timeout_s=60, max_retries=1)
    planner = LLMPlanner(backend, lib, LLMPlannerConfig(mode="generate", max_new_tokens=12))
    result = planner.plan("open the window", world)
    assert result.usage.completion_tokens > 0
    assert all(g.key in keys for g in result.subgoals)  # whatever the model wrote, only candidates survive
    with FaultProxy(url, always="500") as proxy:
        planner.backend = HTTPBackend(proxy.url, model=model, timeout_s=5, max_retries=1, backoff_s=0.01)
        res = Executor(planner, lib, world_from_env, ExecutorConfig(max_replans=1)).run(env, "open the window", obs, info)
    assert res.failures["backend_error"] == 2 and res.subgoals_executable == 0 and not res.success


def test_base_url_and_key_come_from_config_or_environment(monkeypatch):
    from embodied.errors import UserError

    monkeypatch.delenv("EMBODIED_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(UserError, match="EMBODIED_LLM_BASE_URL"):
        HTTPBackend()
    monkeypatch.setenv("EMBODIED_LLM_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("EMBODIED_LLM_API_KEY", "sk-test")
    backend = HTTPBackend(timeout_s=0.5, max_retries=1, backoff_s=0.01)
    assert backend.base_url == "http://127.0.0.1:9/v1" and backend._client.headers["Authorization"] == "Bearer sk-test"
    with pytest.raises(BackendError, match="connection failed"):  # nothing listens on port 9
        backend.generate("hi")
    assert backend.attempts == 2
    with pytest.raises(UserError, match="http"):
        HTTPBackend("ftp://x")
