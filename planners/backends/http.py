"""OpenAI-compatible HTTP back end (vLLM, Ollama, llama.cpp server, `transformers serve`, hosted APIs).

Settings come from arguments or the environment: `EMBODIED_LLM_BASE_URL` / `OPENAI_BASE_URL` (e.g.
http://127.0.0.1:8000/v1), `EMBODIED_LLM_API_KEY` / `OPENAI_API_KEY`, and `EMBODIED_LLM_MODEL`, the model
name the server expects (`transformers serve` wants the folder it serves; when unset, the server's only
model in `GET /models` is used).

Why each part is here:
- Every attempt has a wall-clock deadline (`timeout_s`) over connect, send and every byte of the reply,
  not a per-read timeout: a server that drips one byte every 2 s would otherwise hold the call for as
  long as it likes. `deadline_s` optionally bounds a request with all its retries and back-off.
- Timeouts, connection errors, HTTP 5xx/429 and unparsable JSON are retried with exponential back-off.
  Any other HTTP 4xx and a reply with the wrong shape (e.g. `choices` a string, `content` a number)
  are not: they do not heal by themselves. Every failure is one `BackendError` line, never a raw
  TypeError, so the executor records it and replans.
- `api`: free generation goes to `/completions` (the few-shot prompt is continued as written) or to
  `/chat/completions` with the same request written as chat turns; "auto" uses completions and falls
  back to chat when the server has no completions endpoint. Sending a completion-style prompt as one
  chat message does not work: a chat template wraps it, and small models answer the template instead.
- SayCan scoring needs prompt log-probabilities (`echo` + `logprobs` on /completions) and constrained
  mode needs guided choice; vLLM serves both, `transformers serve`, Ollama and hosted chat APIs do not.
  `require()` probes the server once, so a planner fails before its first episode with that message.
"""
from __future__ import annotations

import http.client
import io
import json
import math
import os
import socket
import ssl
import time
import urllib.parse

from embodied.errors import UserError
from planners.base import LLMUsage
from planners.backends.base import BackendError, BackendUnsupported, Completion

APIS = ("auto", "completions", "chat")
MAX_REPLY_BYTES = 8 << 20  # an LLM reply here is a few kB; refuse to buffer a runaway body
SCORE_HELP = ("planner mode 'saycan' needs prompt log-probabilities (POST /completions with echo=true and "
              "logprobs), which vLLM serves and transformers serve, Ollama and hosted chat APIs do not: use mode "
              "'generate' with this server, or the local back end (LocalBackend) for saycan")
CHOOSE_HELP = ("planner mode 'constrained' needs guided choice (vLLM's structured_outputs or guided_choice on "
               "/completions), which transformers serve, Ollama and hosted chat APIs do not have: use mode "
               "'generate' with this server, or the local back end (LocalBackend) for constrained decoding")
FEATURE_HELP = {"score": SCORE_HELP, "choose": CHOOSE_HELP}
GUIDED_FIELDS = ("structured_outputs", "guided_choice")  # vLLM >= 0.10.2, then older vLLM


class _Deadline:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.monotonic()

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class _DeadlineReader(io.RawIOBase):
    """Socket reads that never wait past the deadline: each recv gets only the time that is left."""

    def __init__(self, sock: socket.socket, deadline: _Deadline):
        self.sock, self.deadline, self.received = sock, deadline, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline.left()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.sock.settimeout(left)
        n = self.sock.recv_into(buffer)
        self.received += n
        return n


class _DeadlineSocket:
    """What http.client needs from a socket (sendall, makefile, close), all bounded by one deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline):
        self.sock, self.deadline = sock, deadline
        self.reader = _DeadlineReader(sock, deadline)

    def sendall(self, data) -> None:
        left = self.deadline.left()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.sock.settimeout(left)
        self.sock.sendall(data)

    def makefile(self, mode="rb", *args, **kwargs):
        return io.BufferedReader(self.reader)

    def close(self) -> None:
        """http.client closes the connection while the response is still reading from it (a real socket
        counts its open files); the owner releases the socket with `release()` once the reply is read."""

    def release(self) -> None:
        self.sock.close()


class _Connection(http.client.HTTPConnection):
    """One HTTP(S) connection whose connect, TLS handshake, send and reads share a deadline."""

    def __init__(self, host: str, port: int, deadline: _Deadline, tls: ssl.SSLContext | None):
        super().__init__(host, port)
        self.deadline, self.tls = deadline, tls
        self.raw: _DeadlineSocket | None = None

    def connect(self) -> None:
        left = self.deadline.left()
        if left <= 0:
            raise TimeoutError("deadline passed")
        sock = socket.create_connection((self.host, self.port), timeout=left)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            sock.settimeout(max(self.deadline.left(), 1e-3))
            sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        self.raw = self.sock = _DeadlineSocket(sock, self.deadline)

    @property
    def received(self) -> int:
        return self.raw.reader.received if self.raw else 0


class _HTTPStatus(Exception):
    """A 4xx answer (not retried): the caller decides what it means for its operation."""

    def __init__(self, code: int, text: str):
        super().__init__(code, text)
        self.code, self.text = code, text


class HTTPBackend:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, model: str | None = None,
                 timeout_s: float = 30.0, max_retries: int = 3, backoff_s: float = 0.5, api: str | None = None,
                 deadline_s: float | None = None):
        """timeout_s: wall-clock limit of one attempt; deadline_s: of one request with its retries (None:
        attempts x timeout_s + back-off); api: auto | completions | chat (EMBODIED_LLM_API, default auto)."""
        base_url = base_url or os.environ.get("EMBODIED_LLM_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise UserError("HTTP planner back end needs a base URL: pass base_url= or set EMBODIED_LLM_BASE_URL "
                            "(e.g. http://127.0.0.1:8000/v1)")
        if not base_url.startswith(("http://", "https://")):
            raise UserError(f"base_url {base_url!r} must start with http:// or https://")
        for name, value in (("timeout_s", timeout_s), ("deadline_s", deadline_s), ("backoff_s", backoff_s)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0 or (value == 0 and name != "backoff_s")):
                raise UserError(f"{name}={value!r} must be a positive number of seconds")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise UserError(f"max_retries={max_retries!r} must be an integer >= 0")
        api = api or os.environ.get("EMBODIED_LLM_API") or "auto"
        if api not in APIS:
            raise UserError(f"api={api!r} (or EMBODIED_LLM_API): choose one of {', '.join(APIS)}")
        self.base_url = base_url.rstrip("/")
        parts = urllib.parse.urlsplit(self.base_url)
        if not parts.hostname:
            raise UserError(f"base_url {base_url!r} has no host name: use e.g. http://127.0.0.1:8000/v1")
        self._host, self._prefix = parts.hostname, parts.path.rstrip("/")
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.api_key = api_key or os.environ.get("EMBODIED_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.model = model or os.environ.get("EMBODIED_LLM_MODEL") or None  # None: ask GET /models once
        self.api = api
        self.api_used: str | None = None if api == "auto" else api  # what generate() settled on
        self.timeout_s, self.max_retries, self.backoff_s = float(timeout_s), max_retries, float(backoff_s)
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        self.name = f"http:{self.model or 'auto'}"
        self.attempts = 0  # requests sent, retries included (for tests and traces)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            self.headers["Authorization"] = f"Bearer {self.api_key}"
        self._features: dict[str, str | None] = {}  # feature -> None (works) or the unsupported message
        self._guided = GUIDED_FIELDS[-1]  # the guided-choice field the server accepted (set by the probe)

    def close(self) -> None:
        """Nothing to release: every attempt opens and closes its own connection."""

    # -- transport ----------------------------------------------------------------------------
    def _attempt(self, method: str, path: str, body: bytes | None, limit: float) -> tuple[int, bytes]:
        deadline = _Deadline(limit)
        conn = _Connection(self._host, self._port, deadline, self._tls)
        try:
            conn.request(method, self._prefix + path, body=body, headers={**self.headers, "Connection": "close"})
            reply = conn.getresponse()
            data = reply.read(MAX_REPLY_BYTES + 1)
        except TimeoutError:
            raise _Retry(f"no complete reply within {limit:.3g} s ({conn.received} bytes received)") from None
        except (http.client.HTTPException, OSError) as err:
            if deadline.left() <= 0:
                raise _Retry(f"no complete reply within {limit:.3g} s ({conn.received} bytes received)") from None
            raise _Retry(f"connection failed ({type(err).__name__})") from None
        finally:
            conn.close()
            if conn.raw is not None:
                conn.raw.release()
        if len(data) > MAX_REPLY_BYTES:
            raise BackendError(f"{self.base_url}{path} sent a reply over {MAX_REPLY_BYTES >> 20} MB: check base_url")
        return reply.status, data

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        """JSON object answered by the server; _HTTPStatus for 4xx; BackendError after the last retry."""
        url = f"{self.base_url}{path}"
        body = None if payload is None else json.dumps(payload).encode()
        call = _Deadline(self.deadline_s if self.deadline_s is not None else math.inf)
        last, tries = "no attempt", 0
        for attempt in range(self.max_retries + 1):
            if attempt:
                pause = self.backoff_s * 2 ** (attempt - 1)
                if call.left() <= pause:
                    break
                time.sleep(pause)
            limit = min(self.timeout_s, call.left())
            if limit <= 0:
                break
            self.attempts += 1
            tries += 1
            try:
                status, data = self._attempt(method, path, body, limit)
            except _Retry as err:
                last = str(err)
                continue
            text = data.decode("utf-8", errors="replace")
            if status >= 500 or status == 429:
                last = f"HTTP {status}"
                continue
            if status >= 400:
                raise _HTTPStatus(status, text[:300])
            if status >= 300:
                raise BackendError(f"{url} answered HTTP {status} (a redirect, not followed): set base_url to the "
                                   "address it points to (often https://)")
            try:
                reply = json.loads(text)
            except ValueError:
                last = f"malformed JSON ({text[:60]!r})"
                continue
            if not isinstance(reply, dict):
                raise BackendError(f"{url} answered a JSON {type(reply).__name__}, not an object: check base_url "
                                   "(it usually ends in /v1)")
            if "error" in reply and "choices" not in reply and "data" not in reply:
                raise BackendError(f"{url} answered an error: {str(reply['error'])[:200]}")
            return reply
        budget = f" (deadline_s={self.deadline_s:g})" if self.deadline_s is not None and tries < self.max_retries + 1 else ""
        raise BackendError(f"LLM server {url} failed {tries} time(s) in {call.elapsed():.1f} s{budget}, last: {last}; "
                           "check that the server is up or raise timeout_s/max_retries")

    def _post(self, path: str, payload: dict) -> dict:
        """POST with the model name filled in; a 4xx becomes a BackendError with advice for its code."""
        try:
            return self._request("POST", path, {"model": self._model_name(), **payload})
        except _HTTPStatus as err:
            raise BackendError(self._status_message(path, err)) from None

    def _status_message(self, path: str, err: _HTTPStatus) -> str:
        url = f"{self.base_url}{path}"
        if err.code in (401, 403):
            fix = "check the API key (EMBODIED_LLM_API_KEY or OPENAI_API_KEY)"
        elif err.code == 404:
            fix = "check base_url (it usually ends in /v1) and the model name (EMBODIED_LLM_MODEL)"
        else:
            fix = (f"check the model name (model={self.model!r}, EMBODIED_LLM_MODEL; transformers serve wants the "
                   "folder it serves, as listed by GET /v1/models)")
        return f"{url} answered HTTP {err.code}: {err.text[:200]!r}; {fix}"

    def _model_name(self) -> str:
        """EMBODIED_LLM_MODEL when set, else the one model the server lists (asked once)."""
        if self.model is None:
            try:
                listing = self._request("GET", "/models")
            except _HTTPStatus:  # no /models here; a server that is down still fails with its own message
                listing = {}
            data = listing.get("data")
            ids = [m.get("id") for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] \
                if isinstance(data, list) else []
            if len(ids) != 1:
                listed = f"it lists {', '.join(ids[:5])}" if ids else "GET /models did not list one"
                raise BackendError(f"set EMBODIED_LLM_MODEL (or pass model=) to the model {self.base_url} serves: {listed}")
            self.model = ids[0]
            self.name = f"http:{self.model}"
        return self.model

    # -- operations ---------------------------------------------------------------------------
    def generate(self, prompt: str, max_new_tokens: int = 64, stop: tuple[str, ...] = (),
                 messages: list[dict] | None = None) -> Completion:
        """Greedy continuation of `prompt` (/completions), or a chat reply to `messages` (the same request
        written as chat turns; default: the prompt as one user turn) on /chat/completions."""
        t0 = time.perf_counter()
        stops = [s for s in stop if s][:4]
        common = {"max_tokens": int(max_new_tokens), "temperature": 0.0, "stream": False}
        if stops:
            common["stop"] = stops
        api = self.api_used or "completions"
        data = None
        if api == "completions":
            try:
                data = self._request("POST", "/completions", {"model": self._model_name(), "prompt": prompt, **common})
                self.api_used = "completions"
            except _HTTPStatus as err:
                if self.api != "auto" or not _no_completions_endpoint(err):
                    raise BackendError(self._status_message("/completions", err)) from None
                api = self.api_used = "chat"  # e.g. a hosted chat-only model: say it once, then use chat
        if api == "chat":
            turns = messages if messages else [{"role": "user", "content": prompt}]
            data = self._post("/chat/completions", {"messages": turns, **common})
            text = self._field(data, ("choices", 0, "message", "content"), (str, type(None)), "/chat/completions") or ""
        else:
            text = self._field(data, ("choices", 0, "text"), str, "/completions")
        for s in stops:  # servers that ignore `stop`, or (transformers serve) keep the stop string
            if s in text:
                text = text[: text.index(s)]
        prompt_tokens, completion_tokens = self._usage(data)
        return Completion(text, LLMUsage(1, prompt_tokens, completion_tokens, time.perf_counter() - t0),
                          chat=api == "chat")

    def require(self, feature: str) -> None:
        """Raise BackendUnsupported now (one probe request per feature) if this server cannot `score`
        or `choose`; planners call it at construction so an unusable mode fails before any episode."""
        if feature not in FEATURE_HELP:
            raise UserError(f"unknown back-end feature {feature!r}: choose score or choose")
        if feature not in self._features:
            self._features[feature] = self._probe(feature)
        if self._features[feature] is not None:
            raise BackendUnsupported(self._features[feature])

    def _probe(self, feature: str) -> str | None:
        where = self.base_url
        if feature == "score":
            try:
                data = self._request("POST", "/completions", {"model": self._model_name(), "prompt": "Plan:", "max_tokens": 1,
                                                              "echo": True, "logprobs": 1, "temperature": 0.0})
            except _HTTPStatus as err:
                return f"{SCORE_HELP} ({where} answered HTTP {err.code}: {err.text[:80]!r})"
            try:
                _echo_logprobs(self._field(data, ("choices", 0), dict, "/completions"), self.base_url)
            except BackendUnsupported as err:
                return str(err)
            return None
        options = ["zq-alpha", "xv-omega"]  # strings no model writes unguided
        for name in GUIDED_FIELDS:
            value = {"choice": options} if name == "structured_outputs" else options
            try:
                data = self._request("POST", "/completions", {"model": self._model_name(), "prompt": "Answer:",
                                                              "max_tokens": 8, "temperature": 0.0, name: value})
            except _HTTPStatus as err:
                last = f"{where} answered HTTP {err.code}: {err.text[:80]!r}"
                continue
            text = self._field(data, ("choices", 0, "text"), str, "/completions")
            if text.strip() in options:
                self._guided = name
                return None
            last = f"{where} ignored {name} (answered {text[:30]!r})"
        return f"{CHOOSE_HELP} ({last})"

    def score(self, prompt: str, continuations: list[str]) -> tuple[list[float], LLMUsage]:
        """Log-likelihood of each continuation from prompt log-probabilities (/completions + echo; vLLM)."""
        self.require("score")
        t0 = time.perf_counter()
        base = self._post("/completions", {"prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1,
                                           "temperature": 0.0})
        n_prompt = len(_echo_logprobs(self._field(base, ("choices", 0), dict, "/completions"), self.base_url)) - 1
        scores, tokens = [], 0
        for cont in continuations:
            data = self._post("/completions", {"prompt": prompt + cont, "max_tokens": 1, "echo": True, "logprobs": 1,
                                               "temperature": 0.0})
            lps = _echo_logprobs(self._field(data, ("choices", 0), dict, "/completions"), self.base_url)
            scores.append(float(sum(lps[n_prompt: len(lps) - 1])))
            tokens += len(lps)
        return scores, LLMUsage(len(continuations) + 1, tokens, 0, time.perf_counter() - t0)

    def choose(self, prompt: str, options: list[str]) -> tuple[int, LLMUsage]:
        """One of `options`, decoded under the server's guided choice (vLLM)."""
        self.require("choose")
        t0 = time.perf_counter()
        value = {"choice": options} if self._guided == "structured_outputs" else options
        data = self._post("/completions", {"prompt": prompt, "max_tokens": 48, "temperature": 0.0,
                                           self._guided: value})
        text = self._field(data, ("choices", 0, "text"), str, "/completions")
        if text not in options:
            raise BackendUnsupported(f"{CHOOSE_HELP} ({self.base_url} ignored {self._guided}: answered {text[:40]!r})")
        prompt_tokens, completion_tokens = self._usage(data)
        return options.index(text), LLMUsage(1, prompt_tokens, completion_tokens, time.perf_counter() - t0)

    # -- reply checking -----------------------------------------------------------------------
    def _field(self, data, path: tuple, want, endpoint: str):
        """data[path[0]][path[1]]..., checked step by step; a wrong shape is one BackendError line."""
        node, where = data, "reply"
        for key in path:
            if isinstance(key, int):
                if not isinstance(node, list):
                    raise self._shape(endpoint, where, node, "a list")
                if len(node) <= key:
                    raise BackendError(f"{self.base_url}{endpoint} replied with an empty {where}: "
                                       "the server produced no choice; check the model and prompt length")
                where += f"[{key}]"
            else:
                if not isinstance(node, dict):
                    raise self._shape(endpoint, where, node, "an object")
                where = key if where == "reply" else f"{where}.{key}"
                if key not in node:
                    raise BackendError(f"{self.base_url}{endpoint} reply has no {where}: the server does not answer "
                                       f"in the OpenAI format for {endpoint}; check base_url and api={self.api}")
            node = node[key]
        if not isinstance(node, want) or isinstance(node, bool):
            names = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in (want if isinstance(want, tuple) else (want,)))
            raise self._shape(endpoint, where, node, names)
        return node

    def _shape(self, endpoint: str, where: str, node, expected: str) -> BackendError:
        return BackendError(f"{self.base_url}{endpoint} replied with {where} of type {_TYPE_NAMES.get(type(node), type(node).__name__)}, "
                            f"expected {expected}: the server does not answer in the OpenAI format; check base_url "
                            f"and api={self.api}")

    def _usage(self, data: dict) -> tuple[int, int]:
        """(prompt, completion) token counts; absent or null counts are 0, any other non-count is an error."""
        usage = data.get("usage")
        if usage is None:
            return 0, 0
        if not isinstance(usage, dict):
            raise self._shape("", "usage", usage, "an object")
        out = []
        for key in ("prompt_tokens", "completion_tokens"):
            value = usage.get(key)
            if value is None:
                out.append(0)
            elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                out.append(value)
            elif isinstance(value, float) and value.is_integer() and value >= 0:
                out.append(int(value))
            else:
                raise BackendError(f"{self.base_url} replied with usage.{key}={value!r}, expected a token count: the "
                                   "server does not answer in the OpenAI format; check base_url")
        return out[0], out[1]


_TYPE_NAMES = {str: "a string", dict: "an object", list: "a list", int: "an integer", float: "a number",
               type(None): "null", bool: "a boolean"}


class _Retry(Exception):
    """A transient failure of one attempt (timeout, connection), with its one-line description."""


def _no_completions_endpoint(err: _HTTPStatus) -> bool:
    """The server has no /completions for this model (a chat-only server or model), so chat is the way."""
    return err.code in (404, 405, 501) or (err.code == 400 and "chat" in err.text.lower())


def _echo_logprobs(choice: dict, where: str) -> list[float]:
    """Per-token log-probabilities of an echoed prompt; BackendUnsupported when the server sends none."""
    logprobs = choice.get("logprobs")
    if logprobs is None or (isinstance(logprobs, dict) and logprobs.get("token_logprobs") is None):
        raise BackendUnsupported(f"{SCORE_HELP} ({where} returned no prompt log-probabilities)")
    if not isinstance(logprobs, dict):
        raise BackendError(f"{where} replied with choices[0].logprobs of type {type(logprobs).__name__}, expected an "
                           "object with token_logprobs: the server does not answer in the OpenAI format")
    lps = logprobs["token_logprobs"]
    if not isinstance(lps, list) or not all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))
                                            for x in lps):
        raise BackendError(f"{where} replied with choices[0].logprobs.token_logprobs that is not a list of numbers: "
                           "the server does not answer in the OpenAI format")
    if not lps:
        raise BackendUnsupported(f"{SCORE_HELP} ({where} returned empty log-probabilities)")
    return [0.0 if x is None else float(x) for x in lps]
