"""OpenAI-compatible HTTP back end (vLLM, Ollama, llama.cpp server, `transformers serve`, hosted APIs).

Base URL and key come from arguments or the environment (`EMBODIED_LLM_BASE_URL` / `OPENAI_BASE_URL`,
`EMBODIED_LLM_API_KEY` / `OPENAI_API_KEY`). Every request has a timeout; timeouts, connection errors,
HTTP 5xx/429 and malformed JSON are retried with exponential back-off, then raised as one-line
`BackendError`s (the executor records them and replans; nothing crashes mid-execution). HTTP 4xx
other than 429 is a configuration error and is not retried.
"""
from __future__ import annotations

import json
import os
import time

import httpx

from embodied.errors import UserError
from planners.base import LLMUsage
from planners.backends.base import BackendError, BackendUnsupported, Completion


class HTTPBackend:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, model: str | None = None,
                 timeout_s: float = 30.0, max_retries: int = 3, backoff_s: float = 0.5):
        base_url = base_url or os.environ.get("EMBODIED_LLM_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise UserError("HTTP planner back end needs a base URL: pass base_url= or set EMBODIED_LLM_BASE_URL "
                            "(e.g. http://127.0.0.1:8000/v1)")
        if not base_url.startswith(("http://", "https://")):
            raise UserError(f"base_url {base_url!r} must start with http:// or https://")
        if timeout_s <= 0 or max_retries < 0:
            raise UserError(f"timeout_s must be > 0 and max_retries >= 0 (got {timeout_s}, {max_retries})")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key or os.environ.get("EMBODIED_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.model = model or os.environ.get("EMBODIED_LLM_MODEL") or "default"
        self.timeout_s, self.max_retries, self.backoff_s = float(timeout_s), int(max_retries), float(backoff_s)
        self.name = f"http:{self.model}"
        self.attempts = 0  # requests sent, retries included (for tests and traces)
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(self.timeout_s))

    def close(self) -> None:
        self._client.close()

    def _post(self, path: str, payload: dict) -> dict:
        url = f"{self.base_url}{path}"
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            self.attempts += 1
            try:
                reply = self._client.post(url, json=payload)
            except httpx.TimeoutException:
                last = f"timed out after {self.timeout_s:g} s"
                continue
            except httpx.HTTPError as err:
                last = f"connection failed ({type(err).__name__})"
                continue
            if reply.status_code >= 500 or reply.status_code == 429:
                last = f"HTTP {reply.status_code}"
                continue
            if reply.status_code >= 400:
                raise BackendError(f"{url} answered HTTP {reply.status_code}: {reply.text[:200]!r}; check the model "
                                   "name, key and base_url")
            try:
                data = reply.json()
            except (json.JSONDecodeError, ValueError):
                last = f"malformed JSON ({reply.text[:60]!r})"
                continue
            if not isinstance(data, dict) or not data.get("choices"):
                last = f"reply without choices ({str(data)[:60]!r})"
                continue
            return data
        raise BackendError(f"LLM server {url} failed {self.max_retries + 1} time(s), last: {last}; "
                           "check that the server is up or raise timeout_s/max_retries")

    def generate(self, prompt: str, max_new_tokens: int = 64, stop: tuple[str, ...] = ()) -> Completion:
        t0 = time.perf_counter()
        payload = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                   "max_tokens": int(max_new_tokens), "temperature": 0.0, "stream": False}
        stops = [s for s in stop if s][:4]
        if stops:
            payload["stop"] = stops
        data = self._post("/chat/completions", payload)
        try:
            text = data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{self.base_url}/chat/completions reply has no choices[0].message.content") from None
        for s in stops:  # servers that ignore `stop`
            if s in text:
                text = text[: text.index(s)]
        usage = data.get("usage") or {}
        return Completion(text, LLMUsage(1, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
                                         time.perf_counter() - t0))

    def score(self, prompt: str, continuations: list[str]) -> tuple[list[float], LLMUsage]:
        """Prompt log-probabilities via /completions with echo (vLLM); BackendUnsupported elsewhere."""
        t0 = time.perf_counter()
        base = self._post("/completions", {"model": self.model, "prompt": prompt, "max_tokens": 1, "echo": True,
                                           "logprobs": 1, "temperature": 0.0})
        n_prompt = _echo_token_count(base)
        scores, tokens = [], 0
        for cont in continuations:
            data = self._post("/completions", {"model": self.model, "prompt": prompt + cont, "max_tokens": 1,
                                               "echo": True, "logprobs": 1, "temperature": 0.0})
            lps = _echo_logprobs(data)
            scores.append(float(sum(lps[n_prompt: len(lps) - 1])))
            tokens += len(lps)
        return scores, LLMUsage(len(continuations) + 1, tokens, 0, time.perf_counter() - t0)

    def choose(self, prompt: str, options: list[str]) -> tuple[int, LLMUsage]:
        """Constrained choice via vLLM's `guided_choice`; BackendUnsupported when the server ignores it."""
        t0 = time.perf_counter()
        data = self._post("/completions", {"model": self.model, "prompt": prompt, "max_tokens": 48,
                                           "temperature": 0.0, "guided_choice": options})
        text = (data["choices"][0].get("text") or "")
        if text not in options:
            raise BackendUnsupported(f"{self.base_url} ignored guided_choice (answered {text[:40]!r}); use "
                                     "planner mode 'generate' with this server, or vLLM")
        usage = data.get("usage") or {}
        return options.index(text), LLMUsage(1, int(usage.get("prompt_tokens", 0)),
                                             int(usage.get("completion_tokens", 0)), time.perf_counter() - t0)


def _echo_logprobs(data: dict) -> list[float]:
    try:
        lps = data["choices"][0]["logprobs"]["token_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise BackendUnsupported("the server returns no prompt log-probabilities (echo+logprobs); SayCan scoring "
                                 "needs vLLM or the local back end") from None
    if not lps:
        raise BackendUnsupported("the server returned empty log-probabilities; SayCan scoring needs echo support")
    return [0.0 if x is None else float(x) for x in lps]


def _echo_token_count(data: dict) -> int:
    return len(_echo_logprobs(data)) - 1
