"""HTTPBackend against misbehaving servers on 127.0.0.1 (a byte-dripping server, replies of the wrong
shape, a chat-only server, a vLLM-style server) and against a real `transformers serve` process serving
the bundled SmolLM2, driven through the planner pipeline in generate mode. Every server always stops."""
import collections
import http.server
import json
import threading
import time

import pytest

import sims
from planners.backends.base import BackendError, BackendUnsupported
from planners.backends.http import HTTPBackend
from planners.executor import Executor, ExecutorConfig
from planners.llm_planner import LLMPlanner, LLMPlannerConfig
from planners.sim import oracle_skills, world_from_env
from planners.skills import manipulation_skills
from worlds import scene_world

STALL_S = 8.0  # the injected 'timeout' answers this late; the client gives up after 4 s
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM"


# ------------------------------------------------------------------------------------------ fake servers
class FakeServer:
    """An HTTP server on 127.0.0.1 whose answers come from `route(method, path, body) -> reply`.

    A reply is (status, JSON-able body); ("drip", head, tail, seconds per byte) for a server that sends
    `head` at once and then `tail` one byte at a time; or ("proxy", url) to forward the request to a real
    server. Every request is recorded.
    """

    def __init__(self, route):
        self.route, self.requests = route, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self, method):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                body = json.loads(raw) if raw else None
                server.requests.append((method, self.path, body))
                reply = server.route(method, self.path, body)
                try:
                    if reply[0] == "drip":
                        _, head, tail, every = reply
                        self.wfile.write(head)
                        for i in range(len(tail)):
                            self.wfile.write(tail[i:i + 1])
                            self.wfile.flush()
                            time.sleep(every)
                        return
                    if reply[0] == "proxy":
                        import httpx

                        up = httpx.request(method, reply[1] + self.path.replace("/v1", "", 1), content=raw,
                                           headers={"Content-Type": "application/json"}, timeout=120)
                        return self._send(up.status_code, up.content)
                    status, obj = reply
                    if status == "stall":
                        time.sleep(STALL_S)
                        status, obj = 504, {"error": "late"}
                    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                    self._send(status, data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first

            def _send(self, status, data):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                self._handle("POST")

            def do_GET(self):
                self._handle("GET")

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

    def posts(self, path):
        return [body for method, p, body in self.requests if method == "POST" and p.endswith(path)]


def completion(text, prompt_tokens=5, completion_tokens=3):
    return {"choices": [{"index": 0, "text": text}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}


def chat(content):
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3}}


def always(reply):
    return lambda method, path, body: reply


HEADER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n"


# ------------------------------------------------------------------------------------------ deadlines
@pytest.mark.slow
@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_dripping_server_cannot_hold_a_call_past_its_deadline(where):
    """One byte every 2 s: a per-read timeout of 5 s never fires; the call's own deadline does."""
    body = b'{"choices": [{"text": " open the drawer"}]}' + b" " * 20
    drip = ("drip", HEADER, body, 2.0) if where == "body" else ("drip", b"", HEADER + body, 2.0)
    with FakeServer(always(drip)) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0, api="completions")
        t0 = time.monotonic()
        with pytest.raises(BackendError) as err:
            backend.generate("Plan:\n1.")
        elapsed = time.monotonic() - t0
    assert 4.9 <= elapsed < 6.5, elapsed
    message = str(err.value)
    assert "\n" not in message and "no complete reply within 5 s" in message and "bytes received" in message
    reported = float(message.split(" in ", 1)[1].split(" s,", 1)[0])  # "failed 1 time(s) in 5.0 s, last: ..."
    assert abs(reported - elapsed) < 0.5  # the elapsed time it reports is the real one


@pytest.mark.slow
def test_deadline_s_bounds_the_whole_call_with_its_retries():
    with FakeServer(always(("drip", b"", HEADER, 2.0))) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=5, backoff_s=0.1,
                              deadline_s=7, api="completions")
        t0 = time.monotonic()
        with pytest.raises(BackendError, match=r"failed 2 time\(s\) in 7\.\d s \(deadline_s=7\)"):
            backend.generate("Plan:\n1.")
        assert time.monotonic() - t0 < 7.6
        assert backend.attempts == 2  # 5 s, a 0.1 s pause, then only the 1.9 s that were left


# ------------------------------------------------------------------------------------------ wrong shapes
WRONG = {  # reply -> the field the one-line error must name
    "choices a string": ({"choices": "1. open the drawer"}, "choices of type a string, expected a list"),
    "choices empty": ({"choices": []}, "empty choices"),
    "choice null": ({"choices": [None]}, "choices[0] of type null, expected an object"),
    "text missing": ({"choices": [{"index": 0}]}, "no choices[0].text"),
    "text a list": ({"choices": [{"text": ["1. open"]}]}, "choices[0].text of type a list, expected a string"),
    "text an int": ({"choices": [{"text": 7}]}, "choices[0].text of type an integer"),
    "text a bool": ({"choices": [{"text": True}]}, "choices[0].text of type a boolean"),
    "usage a string": ({**completion(" open"), "usage": "lots"}, "usage of type a string"),
    "usage count a string": ({**completion(" open"), "usage": {"prompt_tokens": "12"}}, "usage.prompt_tokens='12'"),
    "usage count negative": ({**completion(" open"), "usage": {"completion_tokens": -1}}, "usage.completion_tokens=-1"),
    "a JSON list": ([completion(" open")], "JSON list, not an object"),
    "a JSON string": ("1. open the drawer", "JSON str, not an object"),
}
WRONG_CHAT = {
    "content an int": (chat(5), "choices[0].message.content of type an integer"),
    "content a list": (chat([{"type": "text", "text": "1. open"}]), "choices[0].message.content of type a list"),
    "message a string": ({"choices": [{"message": "1. open"}]}, "choices[0].message of type a string"),
    "message missing": ({"choices": [{"index": 0}]}, "no choices[0].message"),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_wrong_types_in_a_completion_are_one_clear_backend_error(case):
    reply, field = WRONG[case]
    with FakeServer(always((200, reply))) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=3, api="completions")
        with pytest.raises(BackendError) as err:
            backend.generate("Plan:\n1.")
        assert len(server.requests) == 1  # a wrong shape does not heal on a retry
    message = str(err.value)
    assert field in message and "\n" not in message, message


@pytest.mark.parametrize("case", sorted(WRONG_CHAT))
def test_wrong_types_in_a_chat_reply_are_one_clear_backend_error(case):
    reply, field = WRONG_CHAT[case]
    with FakeServer(always((200, reply))) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=3, api="chat")
        with pytest.raises(BackendError, match=__import__("re").escape(field)):
            backend.generate("Plan:\n1.")


@pytest.mark.parametrize("logprobs, kind, field", [
    ({"token_logprobs": "abc"}, BackendError, "token_logprobs that is not a list of numbers"),
    ({"token_logprobs": [-1.0, "x"]}, BackendError, "token_logprobs that is not a list of numbers"),
    ([-1.0, -2.0], BackendError, "choices[0].logprobs of type list"),
    (None, BackendUnsupported, "vLLM"),
    ({"token_logprobs": []}, BackendUnsupported, "empty log-probabilities"),
])
def test_wrong_logprobs_are_backend_errors_and_missing_ones_say_who_has_them(logprobs, kind, field):
    reply = {"choices": [{"text": "Plan: x", "logprobs": logprobs}]}
    with FakeServer(always((200, reply))) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0)
        with pytest.raises(kind) as err:
            backend.score("Plan:", [" open the drawer\n"])
    assert field in str(err.value) and type(err.value) is kind


EXECUTOR_VARIANTS = ["choices a string", "choice null", "text an int", "text a list", "usage a string",
                     "usage count a string", "a JSON list"]


def scene_env():
    env = sims.make("scene", task_id=4, seed=0)
    obs, info = env.reset(seed=0)
    return env, obs, info


@pytest.fixture(scope="module")
def scene():
    env, obs, info = scene_env()
    yield env, obs, info, oracle_skills(env)
    env.close()


@pytest.mark.parametrize("case", EXECUTOR_VARIANTS)
def test_the_executor_records_a_wrong_shaped_reply_and_does_not_crash(case, scene, grounder):
    env, obs, info, lib = scene
    with FakeServer(always((200, WRONG[case][0]))) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0, api="completions")
        planner = LLMPlanner(backend, lib, LLMPlannerConfig(mode="generate"), grounder=grounder)
        executor = Executor(planner, lib, world_from_env, ExecutorConfig(max_replans=1))
        res = executor.run(env, "open the window", obs, info)
    assert res.failures["backend_error"] == 2 and res.subgoals_executable == 0 and not res.success
    errors = [e["error"] for e in executor.trace.events if e["event"] == "backend_error"]
    assert len(errors) == 2 and all(WRONG[case][1] in e for e in errors)


def test_a_plan_written_as_json_with_wrong_types_is_ungrounded_text_not_a_crash(scene, grounder):
    env, obs, info, lib = scene
    plan = '{"plan": [1, null, {"skill": 3, "args": "window"}], "done": "yes"}'
    with FakeServer(always((200, completion(plan)))) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0, api="completions")
        planner = LLMPlanner(backend, lib, LLMPlannerConfig(mode="generate"), grounder=grounder)
        res = Executor(planner, lib, world_from_env, ExecutorConfig(max_replans=1)).run(env, "open the window", obs, info)
    assert res.failures["backend_error"] == 0 and res.failures["ungrounded_output"] >= 1
    assert res.subgoals_executable == 0 and res.ungrounded_reached_skill == 0 and res.refused


# ------------------------------------------------------------------------------------------ api and model
def test_auto_falls_back_to_chat_turns_when_the_server_has_no_completions(grounder):
    def route(method, path, body):
        if path.endswith("/completions") and not path.endswith("/chat/completions"):
            return 404, {"error": "This is a chat model and not supported in the v1/completions endpoint"}
        return 200, chat("1. press the window button\n2. open the window\n3. done")

    world = scene_world()
    lib = manipulation_skills(world.controls)
    with FakeServer(route) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0)
        planner = LLMPlanner(backend, lib, LLMPlannerConfig(mode="generate"), grounder=grounder)
        result = planner.plan("open the window", world)
        planner.plan("open the window", world)
        assert backend.api_used == "chat"
        assert len(server.posts("/v1/completions")) == 1  # asked once, then chat only
        turns = server.posts("/chat/completions")[0]["messages"]
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert turns[2]["content"].startswith("1. press the drawer lock button") and turns[2]["content"].endswith("done")
    assert "Instruction: open the window" in turns[-1]["content"]
    assert [g.key for g in result.subgoals] == ["press(button_1)", "open(window)"]
    assert result.raw_output.startswith("1. press")  # a chat reply is the whole plan: no "1." prepended
    assert "[system]" in result.prompt  # the trace shows what was sent


def test_completions_api_continues_the_prompt_and_the_chat_setting_is_honoured():
    with FakeServer(always((200, completion(" open the drawer\n2. done")))) as server:
        out = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0).generate("Plan:\n1.", stop=("done",))
        body = server.posts("/completions")[0]
        assert body["prompt"] == "Plan:\n1." and body["model"] == "m" and body["stop"] == ["done"]
    assert out.text == " open the drawer\n2. " and not out.chat and out.usage.completion_tokens == 3
    with FakeServer(always((404, {"error": "no such route"}))) as server:
        with pytest.raises(BackendError, match="HTTP 404.*check base_url"):
            HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0, api="completions").generate("x")
        assert len(server.requests) == 1  # api=completions never switches on its own
    with pytest.raises(Exception, match="api='text'.*auto, completions, chat"):
        HTTPBackend("http://127.0.0.1:9/v1", api="text")


def test_the_model_name_comes_from_the_environment_or_the_servers_only_model(monkeypatch):
    monkeypatch.delenv("EMBODIED_LLM_MODEL", raising=False)

    def route(method, path, body):
        if method == "GET":
            return 200, {"object": "list", "data": [{"id": "/models/smol", "object": "model"}]}
        return 200, completion(" ok")

    with FakeServer(route) as server:
        backend = HTTPBackend(server.url, timeout_s=5, max_retries=0)
        backend.generate("hi")
        backend.generate("hi")
        assert [b["model"] for b in server.posts("/completions")] == ["/models/smol"] * 2
        assert [m for m, _, _ in server.requests].count("GET") == 1
        monkeypatch.setenv("EMBODIED_LLM_MODEL", "from-env")
        HTTPBackend(server.url, timeout_s=5, max_retries=0).generate("hi")
        assert server.posts("/completions")[-1]["model"] == "from-env"
    monkeypatch.delenv("EMBODIED_LLM_MODEL")
    two = {"data": [{"id": "a"}, {"id": "b"}]}
    with FakeServer(lambda m, p, b: (200, two) if m == "GET" else (200, completion(" ok"))) as server:
        with pytest.raises(BackendError, match="set EMBODIED_LLM_MODEL .* it lists a, b"):
            HTTPBackend(server.url, timeout_s=5, max_retries=0).generate("hi")


# ------------------------------------------------------------------------------------------ features
def vllm_like(method, path, body):
    """echo + logprobs and guided choice, as vLLM serves them: one token per character, log p = -1 each."""
    if "structured_outputs" in body:
        return 200, completion(body["structured_outputs"]["choice"][-1])
    text = body["prompt"]
    return 200, {"choices": [{"text": text + "!", "logprobs": {"token_logprobs": [None] + [-1.0] * len(text)}}]}


def test_saycan_and_constrained_work_where_the_server_has_the_features():
    with FakeServer(vllm_like) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0)
        scores, usage = backend.score("Plan:", [" ab", " abcd"])
        assert scores == [-3.0, -5.0] and usage.calls == 3  # the continuation's own tokens only
        index, _ = backend.choose("Plan:", ["zz", " open the drawer\n"])
        assert index == 1
        assert len(server.posts("/completions")) == (1 + 3) + (1 + 1)  # one probe per feature, then the calls


def test_a_feature_the_server_lacks_fails_at_planner_construction_and_stops_the_executor(scene):
    env, obs, info, lib = scene
    ignoring = always((200, completion("whatever")))  # answers, but with no logprobs and no guided choice
    with FakeServer(ignoring) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0)
        for mode in ("saycan", "constrained"):
            with pytest.raises(BackendUnsupported) as err:
                LLMPlanner(backend, lib, LLMPlannerConfig(mode=mode))
            message = str(err.value)
            assert "vLLM" in message and "transformers serve" in message and "generate" in message
            assert "check the model name" not in message
        sent = len(server.requests)
        with pytest.raises(BackendUnsupported):
            LLMPlanner(backend, lib, LLMPlannerConfig(mode="saycan"))
        assert len(server.requests) == sent  # the verdict is kept: no second probe

    replies = collections.deque([vllm_like("POST", "", {"prompt": "Plan:"})])  # the probe passes, then no logprobs
    with FakeServer(lambda m, p, b: replies.popleft() if replies else (200, completion("x"))) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=0)
        planner = LLMPlanner(backend, lib, LLMPlannerConfig(mode="saycan"))
        res = Executor(planner, lib, world_from_env, ExecutorConfig(max_replans=3)).run(env, "open the window", obs, info)
    assert res.failures["backend_error"] == 1 and res.replans == 0  # a missing feature is not retried


# ------------------------------------------------------------------------------------------ retries
@pytest.mark.slow
def test_timeouts_5xx_and_malformed_json_are_retried_and_4xx_is_not():
    faults = collections.deque([(500, {"e": 1}), (200, b'{"choices": [{"text": " open the dr'), ("stall", None),
                                (503, {"e": 1})])
    with FakeServer(lambda m, p, b: faults.popleft() if faults else (200, completion(" open the drawer"))) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=4.0, max_retries=6, backoff_s=0.05)
        t0 = time.monotonic()
        out = backend.generate("Plan:\n1.")
        assert time.monotonic() - t0 >= 4.0 and out.text == " open the drawer"
        assert backend.attempts == 5 and len(server.requests) == 5
    with FakeServer(always((500, {"e": 1}))) as server:
        backend = HTTPBackend(server.url, model="m", timeout_s=5, max_retries=2, backoff_s=0.01)
        with pytest.raises(BackendError, match=r"failed 3 time\(s\) in [\d.]+ s, last: HTTP 500"):
            backend.generate("hi")
        assert len(server.requests) == 3
    with FakeServer(always((401, {"error": "bad key"}))) as server:
        with pytest.raises(BackendError, match="HTTP 401.*EMBODIED_LLM_API_KEY"):
            HTTPBackend(server.url, model="m", timeout_s=5, max_retries=3).generate("hi")
        assert len(server.requests) == 1


def test_base_url_and_key_come_from_config_or_environment(monkeypatch):
    from embodied.errors import UserError

    monkeypatch.delenv("EMBODIED_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(UserError, match="EMBODIED_LLM_BASE_URL"):
        HTTPBackend()
    monkeypatch.setenv("EMBODIED_LLM_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("EMBODIED_LLM_API_KEY", "sk-test")
    backend = HTTPBackend(model="m", timeout_s=0.5, max_retries=1, backoff_s=0.01)
    assert backend.base_url == "http://127.0.0.1:9/v1" and backend.headers["Authorization"] == "Bearer sk-test"
    with pytest.raises(BackendError, match="connection failed"):  # nothing listens on port 9
        backend.generate("hi")
    assert backend.attempts == 2
    with pytest.raises(UserError, match="http"):
        HTTPBackend("ftp://x")
    with pytest.raises(UserError, match="timeout_s=0 must be a positive"):
        HTTPBackend("http://127.0.0.1:9/v1", timeout_s=0)


# ------------------------------------------------------------------------------------------ real server
@pytest.fixture(scope="module")
def server():
    """A real `transformers serve` with the wheel's SmolLM2 (converted once into the cache)."""
    from planners.backends.local import model_dir
    from planners.backends.serve import TransformersServe

    with TransformersServe(model_dir(), threads=1) as srv:
        yield srv


@pytest.mark.slow
def test_real_server_generate_mode_through_the_planner_pipeline(server):
    """The suite's first tasks over HTTP: api=auto continues the few-shot prompt on /completions, the
    plans are real plans (not the chat template's default system prompt), and nothing ungrounded runs."""
    from planners.evaluate import run_suite
    from planners.tasks import TASKS

    backend = HTTPBackend(server.base_url, model=server.model, timeout_s=120, max_retries=1)
    tasks = [t for t in TASKS if t.id in ("sc1-open-both", "sc3-shut-window")]
    res = run_suite("http-generate", tasks, (), None, max_replans=1, backend=backend, log=lambda m: None)
    assert backend.api_used == "completions"
    rows = res["tasks"]
    assert all(r["usage"]["completion_tokens"] > 0 for r in rows)
    assert res["summary"]["ungrounded_reached_skill"] == 0
    assert res["summary"]["success_rate"] > 0  # greedy SmolLM2 opens both (measured: 2/2 here)


@pytest.mark.slow
def test_real_server_chat_api_and_features_it_lacks(server, monkeypatch):
    monkeypatch.setenv("EMBODIED_LLM_MODEL", server.model)
    backend = HTTPBackend(server.base_url, timeout_s=120, max_retries=0, api="chat")
    world = scene_world()
    lib = manipulation_skills(world.controls)
    planner = LLMPlanner(backend, lib, LLMPlannerConfig(mode="generate", max_new_tokens=24))
    result = planner.plan("open the window", world)
    assert result.usage.completion_tokens > 0 and DEFAULT_SYSTEM_PROMPT not in result.raw_output
    assert "[system] You control a robot arm" in result.prompt
    for mode in ("saycan", "constrained"):
        with pytest.raises(BackendUnsupported, match="vLLM"):
            LLMPlanner(backend, lib, LLMPlannerConfig(mode=mode))
    monkeypatch.setenv("EMBODIED_LLM_MODEL", "not-the-served-folder")
    with pytest.raises(BackendError, match="HTTP 400.*EMBODIED_LLM_MODEL"):
        HTTPBackend(server.base_url, timeout_s=30, max_retries=0).generate("hi", max_new_tokens=2)


@pytest.mark.slow
def test_real_server_behind_a_fault_proxy_executor_survives(server, scene):
    env, obs, info, lib = scene
    with FakeServer(always((500, {"e": 1}))) as proxy:
        backend = HTTPBackend(proxy.url, model=server.model, timeout_s=5, max_retries=1, backoff_s=0.01)
        planner = LLMPlanner(backend, lib, LLMPlannerConfig(mode="generate", max_new_tokens=12))
        res = Executor(planner, lib, world_from_env, ExecutorConfig(max_replans=1)).run(env, "open the window", obs, info)
    assert res.failures["backend_error"] == 2 and res.subgoals_executable == 0 and not res.success
    faults = collections.deque([(503, {"e": 1}), ("stall", None)])
    with FakeServer(lambda m, p, b: faults.popleft() if faults else ("proxy", server.base_url)) as proxy:
        backend = HTTPBackend(proxy.url, model=server.model, timeout_s=4, max_retries=3, backoff_s=0.05)
        out = backend.generate("Say hello.", max_new_tokens=3)
    assert out.text.strip() and backend.attempts == 3
