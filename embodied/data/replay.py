"""Ring-buffer replay with single-step, n-step and action-chunk sampling, and offline/online mixing.

Every slot records the id of the episode it belongs to, so a chunk can tell whether the next slot
continues it: it does only when the step did not end its episode (terminal or timeout), the next
slot holds the same episode, and the next slot is not the write head (the newest episode is still
open, and in a full ring the head holds the oldest data). Batches are float32 numpy arrays, ready
for `torch.as_tensor`.
"""
from __future__ import annotations

import numpy as np

from embodied.data.dataset import Dataset
from embodied.errors import CheckpointError, ConfigError

TRANSITION_KEYS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
STORED_KEYS = TRANSITION_KEYS + ("mc_returns", "episode_ids")


class ReplayBuffer:
    def __init__(self, obs_dim: int, act_dim: int, capacity: int, seed: int = 0):
        if capacity < 1:
            raise ConfigError(f"replay capacity={capacity} must be a positive number of transitions")
        self.obs_dim, self.act_dim, self.capacity = int(obs_dim), int(act_dim), int(capacity)
        self.observations = np.zeros((capacity, obs_dim), np.float32)
        self.actions = np.zeros((capacity, act_dim), np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.next_observations = np.zeros((capacity, obs_dim), np.float32)
        self.terminals = np.zeros(capacity, bool)
        self.timeouts = np.zeros(capacity, bool)
        # Monte-Carlo return of the step (Cal-QL); NaN where the caller gave none, e.g. online steps.
        self.mc_returns = np.full(capacity, np.nan, np.float32)
        self.episode_ids = np.zeros(capacity, np.int64)
        self.ptr = 0  # next slot to write
        self.size = 0
        self.next_episode = 0  # id of the episode the next added step belongs to
        self.episode_open = False  # some step of `next_episode` is already written
        self.has_mc_returns = False
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    # ----------------------------------------------------------------------------- writing
    def add(self, obs, action, reward, next_obs, terminal, timeout, mc_return: float | None = None) -> None:
        i = self.ptr
        self.observations[i] = np.asarray(obs, np.float32).reshape(self.obs_dim)
        self.actions[i] = np.asarray(action, np.float32).reshape(self.act_dim)
        self.rewards[i] = reward
        self.next_observations[i] = np.asarray(next_obs, np.float32).reshape(self.obs_dim)
        self.terminals[i] = bool(terminal)
        self.timeouts[i] = bool(timeout)
        self.mc_returns[i] = np.nan if mc_return is None else mc_return
        self.has_mc_returns |= mc_return is not None
        self.episode_ids[i] = self.next_episode
        self.ptr = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        if terminal or timeout:
            self.next_episode += 1
            self.episode_open = False
        else:
            self.episode_open = True

    def cut_open_episode(self) -> None:
        """Mark the newest step as a timeout: its episode was cut short (e.g. a run resumed from a
        checkpoint starts a fresh episode), so nothing may chain past it."""
        if self.episode_open and self.size:
            self.timeouts[(self.ptr - 1) % self.capacity] = True
            self.next_episode += 1
            self.episode_open = False

    def add_dataset(self, ds: Dataset, mc_returns: np.ndarray | None = None) -> None:
        """Append a whole dataset in one vectorised write (same result as adding row by row; a
        dataset longer than the capacity keeps its newest rows). Its episodes never join an open
        online episode, and its last row always ends an episode."""
        n = len(ds)
        if n == 0:
            return
        if ds.obs_dim != self.obs_dim or ds.act_dim != self.act_dim:
            raise ConfigError(
                f"dataset has obs_dim={ds.obs_dim}, act_dim={ds.act_dim} but the replay buffer was built for "
                f"obs_dim={self.obs_dim}, act_dim={self.act_dim}: use a dataset of the same env"
            )
        if self.episode_open:
            self.next_episode += 1
            self.episode_open = False
        ends = ds.episode_ends()
        ids = self.next_episode + np.concatenate([[0], np.cumsum(ends[:-1])])
        columns = {
            "observations": ds.observations, "actions": ds.actions, "rewards": ds.rewards,
            "next_observations": ds.next_observations, "terminals": ds.terminals, "timeouts": ds.timeouts,
            "episode_ids": ids,
            "mc_returns": np.full(n, np.nan, np.float32) if mc_returns is None else np.asarray(mc_returns, np.float32),
        }
        if len(columns["mc_returns"]) != n:
            raise ConfigError(
                f"add_dataset got {len(columns['mc_returns'])} mc_returns for {n} transitions: pass one per transition"
            )
        keep = min(n, self.capacity)
        slots = (self.ptr + (n - keep) + np.arange(keep)) % self.capacity
        for key, values in columns.items():
            getattr(self, key)[slots] = values[n - keep:]
        self.has_mc_returns |= mc_returns is not None
        self.ptr = int((self.ptr + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        self.next_episode = int(ids[-1]) + 1

    # ----------------------------------------------------------------------------- sampling
    def _start_indices(self, batch_size: int, rng: np.random.Generator | None = None) -> np.ndarray:
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer: add transitions or a dataset first")
        return (self.rng if rng is None else rng).integers(0, self.size, size=batch_size)

    def sample(self, batch_size: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """Uniform transitions: observations [B,obs], actions [B,A], rewards/terminals/timeouts [B]
        (and mc_returns [B] when any were stored). `rng`: a diagnostic's own stream, so that reading the
        replay leaves the training sampler's draws as they were."""
        idx = self._start_indices(batch_size, rng)
        batch = {key: getattr(self, key)[idx].astype(np.float32) for key in TRANSITION_KEYS}
        if self.has_mc_returns:
            batch["mc_returns"] = self.mc_returns[idx]
        return batch

    def continues(self, idx: np.ndarray) -> np.ndarray:
        """Bool mask, same shape as idx: whether slot idx+1 is the next step of idx's episode."""
        nxt = (idx + 1) % self.capacity
        ended = self.terminals[idx] | self.timeouts[idx]
        return ~ended & (self.episode_ids[nxt] == self.episode_ids[idx]) & (nxt != self.ptr)

    def sample_chunks(self, batch_size: int, horizon: int) -> dict[str, np.ndarray]:
        """Chunks of `horizon` consecutive steps from uniform starts.

        observations [B,obs] (chunk start), actions [B,H,A], rewards [B,H], next_observations
        [B,H,obs], terminals [B,H], timeouts [B,H], valid [B,H], (mc_returns [B] of the start).
        valid[:, 0] is 1; valid[:, i] is 0 once an earlier step ended its episode or has no written
        successor. Padded steps (valid 0) have reward 0 and repeat the last valid step's action,
        next observation and flags, so `[:, -1]` always describes where the chunk really ended:
            target = sum_i gamma^i r_i
                     + gamma^{sum(valid)} (1 - terminals[:, -1]) Q(next_observations[:, -1])
        n-step sampling is sample_chunks(B, n).
        """
        return self.chunks_at(self._start_indices(batch_size), horizon)

    def chunks_at(self, start: np.ndarray, horizon: int) -> dict[str, np.ndarray]:
        """The chunk batch for given start slots (sample_chunks with the randomness taken out)."""
        if horizon < 1:
            raise ConfigError(f"chunk horizon={horizon} must be >= 1")
        start = np.asarray(start, np.int64)
        batch_size = len(start)
        offsets = np.arange(horizon)
        idx = (start[:, None] + offsets) % self.capacity  # [B, H]
        steps_continue = self.continues(idx[:, :-1])  # [B, H-1]
        first = np.ones((batch_size, 1), bool)
        valid = np.concatenate([first, np.cumprod(steps_continue, axis=1, dtype=bool)], axis=1)
        last_valid = valid.sum(axis=1, keepdims=True) - 1
        src = np.take_along_axis(idx, np.minimum(offsets[None], last_valid), axis=1)  # pad = last valid step
        batch = {
            "observations": self.observations[start],
            "actions": self.actions[src],
            "rewards": self.rewards[src] * valid,
            "next_observations": self.next_observations[src],
            "terminals": self.terminals[src].astype(np.float32),
            "timeouts": self.timeouts[src].astype(np.float32),
            "valid": valid.astype(np.float32),
        }
        if self.has_mc_returns:
            batch["mc_returns"] = self.mc_returns[start]
        return batch

    # ----------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, np.ndarray]:
        """Plain arrays only (np.savez with allow_pickle=False); just the written slots."""
        state = {key: getattr(self, key)[: self.size].copy() for key in STORED_KEYS}
        for key in ("obs_dim", "act_dim", "capacity", "ptr", "size", "next_episode"):
            state[key] = np.asarray(getattr(self, key), np.int64)
        state["episode_open"] = np.asarray(self.episode_open)
        state["has_mc_returns"] = np.asarray(self.has_mc_returns)
        state["rng_state"] = encode_rng(self.rng)
        return state

    def load_state_dict(self, state: dict) -> None:
        shape = tuple(int(state[k]) for k in ("obs_dim", "act_dim", "capacity"))
        if shape != (self.obs_dim, self.act_dim, self.capacity):
            raise CheckpointError(
                f"replay checkpoint has (obs_dim, act_dim, capacity)={shape} but this buffer has "
                f"{(self.obs_dim, self.act_dim, self.capacity)}: resume with the same env and replay size"
            )
        size = int(state["size"])
        for key in STORED_KEYS:
            getattr(self, key)[:size] = state[key]
        self.ptr, self.size, self.next_episode = int(state["ptr"]), size, int(state["next_episode"])
        self.episode_open = bool(state["episode_open"])
        self.has_mc_returns = bool(state["has_mc_returns"])
        self.rng = decode_rng(state["rng_state"])


class MixedReplay:
    """Batches with round(B * offline_ratio) rows from `offline` and the rest from `online`,
    concatenated offline first (RLPD / Cal-QL style symmetric sampling). New steps go online."""

    def __init__(self, offline: ReplayBuffer | None, online: ReplayBuffer, offline_ratio: float,
                 seed: int | None = None):
        if not 0.0 <= offline_ratio <= 1.0:
            raise ConfigError(f"offline_ratio={offline_ratio} must be within [0, 1]")
        if offline is None and offline_ratio > 0:
            raise ConfigError(
                f"offline_ratio={offline_ratio} needs offline data: load a dataset or set offline_ratio=0"
            )
        self.offline, self.online, self.offline_ratio = offline, online, float(offline_ratio)
        if seed is not None:  # reproducible mixed batches: independent streams for both buffers
            streams = np.random.SeedSequence(seed).spawn(2)
            online.rng = np.random.default_rng(streams[1])
            if offline is not None:
                offline.rng = np.random.default_rng(streams[0])

    def __len__(self) -> int:
        return len(self.online) + (len(self.offline) if self.offline is not None else 0)

    def add(self, *args, **kwargs) -> None:
        self.online.add(*args, **kwargs)

    def _sizes(self, batch_size: int) -> tuple[int, int]:
        n_offline = int(np.floor(batch_size * self.offline_ratio + 0.5))
        n_online = batch_size - n_offline
        if n_offline and (self.offline is None or len(self.offline) == 0):
            raise ValueError(
                f"offline_ratio={self.offline_ratio} needs offline samples but the offline buffer is empty"
            )
        if n_online and len(self.online) == 0:
            raise ValueError(
                f"offline_ratio={self.offline_ratio} needs online samples but the online buffer is empty: "
                "collect environment steps before sampling"
            )
        return n_offline, n_online

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        n_offline, n_online = self._sizes(batch_size)
        parts = []
        if n_offline:
            parts.append(self.offline.sample(n_offline))
        if n_online:
            parts.append(self.online.sample(n_online))
        return _concat_batches(parts)

    def sample_chunks(self, batch_size: int, horizon: int) -> dict[str, np.ndarray]:
        n_offline, n_online = self._sizes(batch_size)
        parts = []
        if n_offline:
            parts.append(self.offline.sample_chunks(n_offline, horizon))
        if n_online:
            parts.append(self.online.sample_chunks(n_online, horizon))
        return _concat_batches(parts)

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {f"online/{k}": v for k, v in self.online.state_dict().items()}
        if self.offline is not None:
            state.update({f"offline/{k}": v for k, v in self.offline.state_dict().items()})
        state["offline_ratio"] = np.asarray(self.offline_ratio)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.online.load_state_dict({k[len("online/"):]: v for k, v in state.items() if k.startswith("online/")})
        offline = {k[len("offline/"):]: v for k, v in state.items() if k.startswith("offline/")}
        if offline and self.offline is None:
            raise CheckpointError(
                "checkpoint holds offline replay data but this MixedReplay has no offline buffer: pass one"
            )
        if self.offline is not None and offline:
            self.offline.load_state_dict(offline)
        self.offline_ratio = float(state["offline_ratio"])


def _concat_batches(parts: list[dict]) -> dict[str, np.ndarray]:
    """Row-wise concat; a key only one side has (mc_returns) is NaN-filled on the other."""
    if len(parts) == 1:
        return parts[0]
    keys = dict.fromkeys(k for p in parts for k in p)
    out = {}
    for key in keys:
        template = next(p[key] for p in parts if key in p)
        out[key] = np.concatenate([part[key] if key in part else _nan_rows(template, len(part["rewards"]))
                                   for part in parts])
    return out


def _nan_rows(template: np.ndarray, rows: int) -> np.ndarray:
    return np.full((rows, *template.shape[1:]), np.nan, template.dtype)


_MASK64 = (1 << 64) - 1


def encode_rng(rng: np.random.Generator) -> np.ndarray:
    """PCG64 state as uint64 words (its 128-bit ints do not fit an int64 array)."""
    state = rng.bit_generator.state
    if state["bit_generator"] != "PCG64":
        raise CheckpointError(f"cannot checkpoint a {state['bit_generator']} generator: use np.random.default_rng")
    s, inc = state["state"]["state"], state["state"]["inc"]
    words = [s >> 64, s & _MASK64, inc >> 64, inc & _MASK64, state["has_uint32"], state["uinteger"]]
    return np.asarray(words, dtype=np.uint64)


def decode_rng(words: np.ndarray) -> np.random.Generator:
    w = [int(x) for x in words]
    bit_generator = np.random.PCG64()
    bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
        "has_uint32": w[4],
        "uinteger": w[5],
    }
    return np.random.Generator(bit_generator)
