"""Flat transition dataset in D4RL layout, and the per-episode view used to build one.

Episodes are stored back to back. `terminals` marks a true task end (the target does not
bootstrap); `timeouts` marks a trajectory that was cut (the target does bootstrap). They are kept
apart on purpose: folding a time limit into `terminals` teaches the critic that the world ends at
step 1000.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from embodied.errors import DatasetError

FLOAT_KEYS = ("observations", "actions", "rewards", "next_observations")
FLAG_KEYS = ("terminals", "timeouts")
ARRAY_KEYS = FLOAT_KEYS + FLAG_KEYS
NDIM = {"observations": 2, "actions": 2, "rewards": 1, "next_observations": 2, "terminals": 1, "timeouts": 1}


@dataclass
class Episode:
    """One trajectory: T actions and the T+1 observations around them."""

    observations: np.ndarray  # [T+1, obs_dim]
    actions: np.ndarray  # [T, act_dim]
    rewards: np.ndarray  # [T]
    terminated: bool = False
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.actions)

    @classmethod
    def coerce(cls, episode: Episode | dict) -> Episode:
        """Accept an Episode or a dict with the same keys (what rollout code tends to build)."""
        if isinstance(episode, Episode):
            return episode
        missing = [k for k in ("observations", "actions", "rewards") if k not in episode]
        if missing:
            raise DatasetError(
                f"episode dict is missing {missing}: give observations [T+1,obs], actions [T,A], rewards [T]"
            )
        return cls(
            observations=np.asarray(episode["observations"]),
            actions=np.asarray(episode["actions"]),
            rewards=np.asarray(episode["rewards"]),
            terminated=bool(episode.get("terminated", False)),
            truncated=bool(episode.get("truncated", False)),
        )

    def to_transitions(self) -> dict[str, np.ndarray]:
        """D4RL rows for this episode. An episode that neither terminated nor was truncated is
        still cut where the recording stopped, so its last step is marked as a timeout."""
        steps = len(self.actions)
        if len(self.observations) != steps + 1 or len(self.rewards) != steps:
            raise DatasetError(
                f"episode has {len(self.observations)} observations, {steps} actions and {len(self.rewards)} rewards: "
                "observations need exactly one more row than actions and rewards"
            )
        obs = np.asarray(self.observations, dtype=np.float32)
        terminals = np.zeros(steps, dtype=bool)
        timeouts = np.zeros(steps, dtype=bool)
        if steps:
            terminals[-1] = self.terminated
            timeouts[-1] = not self.terminated  # truncated, or cut by the end of recording
        return {
            "observations": obs[:-1],
            "actions": np.asarray(self.actions, dtype=np.float32).reshape(steps, -1),
            "rewards": np.asarray(self.rewards, dtype=np.float32).reshape(steps),
            "next_observations": obs[1:],
            "terminals": terminals,
            "timeouts": timeouts,
        }


@dataclass
class Dataset:
    """Flat transitions in D4RL layout, episodes contiguous."""

    observations: np.ndarray  # [N, obs_dim] float32
    actions: np.ndarray  # [N, act_dim] float32
    rewards: np.ndarray  # [N] float32
    next_observations: np.ndarray  # [N, obs_dim] float32
    terminals: np.ndarray  # [N] bool: true task end, do not bootstrap
    timeouts: np.ndarray  # [N] bool: trajectory cut, do bootstrap
    metadata: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def obs_dim(self) -> int:
        return int(self.observations.shape[1])

    @property
    def act_dim(self) -> int:
        return int(self.actions.shape[1])

    def arrays(self) -> dict[str, np.ndarray]:
        return {key: getattr(self, key) for key in ARRAY_KEYS}

    # ----------------------------------------------------------------------------- building
    @classmethod
    def from_episodes(cls, episodes, metadata: dict | None = None) -> Dataset:
        rows = [Episode.coerce(ep).to_transitions() for ep in episodes]
        rows = [r for r in rows if len(r["rewards"])]
        if not rows:
            raise DatasetError("from_episodes got no steps: pass at least one episode with one action")
        return cls(**{k: np.concatenate([r[k] for r in rows]) for k in ARRAY_KEYS}, metadata=dict(metadata or {}))

    # ----------------------------------------------------------------------------- checks
    def validate(self, obs_dim: int | None = None, act_dim: int | None = None, *, env: str | None = None) -> None:
        """Raise DatasetError with one line naming the key and the fix; return None when usable."""
        where = f"env '{env}'" if env else "the env"
        for key in ARRAY_KEYS:
            value = getattr(self, key, None)
            if value is None:
                raise DatasetError(f"dataset is missing '{key}': every dataset needs {', '.join(ARRAY_KEYS)}")
            if not isinstance(value, np.ndarray):
                raise DatasetError(f"'{key}' is a {type(value).__name__}, not a numpy array: wrap it with np.asarray")
            if value.ndim != NDIM[key]:
                raise DatasetError(
                    f"'{key}' has shape {value.shape} ({value.ndim}-d) but must be {NDIM[key]}-d: reshape it"
                )
            want = np.dtype(np.float32 if key in FLOAT_KEYS else bool)
            if value.dtype != want:
                raise DatasetError(
                    f"'{key}' has dtype {value.dtype} but must be {want}: convert it with .astype(np.{want})"
                )
        n = len(self.observations)
        if n == 0:
            raise DatasetError("dataset is empty ('observations' has 0 rows): generate or load some data")
        for key in ARRAY_KEYS[1:]:
            if len(getattr(self, key)) != n:
                raise DatasetError(
                    f"length mismatch: '{key}' has {len(getattr(self, key))} rows but 'observations' has {n}: "
                    "every key needs one row per transition"
                )
        if self.next_observations.shape[1] != self.observations.shape[1]:
            raise DatasetError(
                f"'next_observations' has dim {self.next_observations.shape[1]} but 'observations' has dim "
                f"{self.observations.shape[1]}: both must be the same state vector"
            )
        if obs_dim is not None and self.obs_dim != obs_dim:
            raise DatasetError(
                f"'observations' have dim {self.obs_dim} but {where} expects obs_dim={obs_dim}: "
                "use a dataset made for this env or change the env"
            )
        if act_dim is not None and self.act_dim != act_dim:
            raise DatasetError(
                f"'actions' have dim {self.act_dim} but {where} expects act_dim={act_dim}: "
                "use a dataset made for this env or change the env"
            )
        for key in FLOAT_KEYS:
            value = getattr(self, key)
            finite = np.isfinite(value).reshape(n, -1).all(axis=1)
            if not finite.all():
                row = int(np.argmin(finite))
                raise DatasetError(f"'{key}' has NaN/Inf at row {row}: drop or repair those transitions")

    # ----------------------------------------------------------------------------- episodes
    def episode_ends(self) -> np.ndarray:
        """Bool mask [N]: terminals | timeouts, with the last row always an end."""
        ends = np.asarray(self.terminals, bool) | np.asarray(self.timeouts, bool)
        if len(ends):
            ends[-1] = True
        return ends

    def episode_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, stops) so that episode k is rows starts[k]:stops[k]."""
        stops = np.flatnonzero(self.episode_ends()) + 1
        starts = np.concatenate([[0], stops[:-1]]).astype(np.int64)
        return starts, stops

    @property
    def num_episodes(self) -> int:
        return int(self.episode_ends().sum())

    def episode_returns(self) -> np.ndarray:
        """Undiscounted return of each episode, float64 [num_episodes]."""
        starts, _ = self.episode_bounds()
        if len(starts) == 0:
            return np.zeros(0)
        return np.add.reduceat(self.rewards.astype(np.float64), starts)

    def episodes(self) -> list[Episode]:
        """Per-episode view; assumes next_observations chain (row t+1 starts where row t ended)."""
        out = []
        for start, stop in zip(*self.episode_bounds()):
            obs = np.concatenate([self.observations[start:stop], self.next_observations[stop - 1 : stop]])
            out.append(
                Episode(obs, self.actions[start:stop], self.rewards[start:stop],
                        terminated=bool(self.terminals[stop - 1]), truncated=bool(self.timeouts[stop - 1]))
            )
        return out

    def mc_returns(self, gamma: float, rewards: np.ndarray | None = None,
                   sparse_failure_reward: float | None = None) -> np.ndarray:
        """Discounted return-to-go of every transition, within its episode (float32 [N]).

        Terminal and cut episodes both sum to their last recorded step (a cut episode's return is
        truncated, nothing is bootstrapped here). Cal-QL convention: a cut episode whose rewards all
        equal `sparse_failure_reward` never succeeded, so each step gets r_fail / (1 - gamma), the
        value of failing forever, instead of a return that depends on where the cut fell.
        """
        rewards = self.rewards if rewards is None else np.asarray(rewards)
        if len(rewards) != len(self):
            raise DatasetError(
                f"mc_returns got {len(rewards)} rewards for {len(self)} transitions: pass one per transition"
            )
        out = np.empty(len(self), dtype=np.float32)
        for start, stop in zip(*self.episode_bounds()):
            start, stop = int(start), int(stop)
            cut = not bool(self.terminals[stop - 1])
            if cut and sparse_failure_reward is not None and np.all(rewards[start:stop] == sparse_failure_reward):
                out[start:stop] = sparse_failure_reward / (1.0 - gamma)
            else:
                out[start:stop] = discounted_return_to_go(rewards[start:stop], gamma)
        return out

    # ----------------------------------------------------------------------------- slicing
    def select_episodes(self, indices) -> Dataset:
        """A new dataset holding the given episodes, in the given order."""
        starts, stops = self.episode_bounds()
        rows = [np.arange(starts[i], stops[i]) for i in indices]
        rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        return Dataset(**{k: v[rows] for k, v in self.arrays().items()}, metadata=dict(self.metadata))

    def split(self, fraction: float, seed: int = 0) -> tuple[Dataset, Dataset]:
        """Split whole episodes at random into (fraction, 1 - fraction), e.g. for a validation set."""
        if not 0.0 < fraction < 1.0:
            raise DatasetError(f"split fraction={fraction} must be strictly between 0 and 1")
        order = np.random.default_rng(seed).permutation(self.num_episodes)
        cut = min(max(int(round(fraction * len(order))), 1), len(order) - 1) if len(order) > 1 else len(order)
        return self.select_episodes(np.sort(order[:cut])), self.select_episodes(np.sort(order[cut:]))

    @staticmethod
    def concat(datasets, metadata: dict | None = None) -> Dataset:
        return concat(datasets, metadata)


def concat(datasets, metadata: dict | None = None) -> Dataset:
    """Join datasets end to end. Each part's last row becomes an episode end (a timeout if it
    carried no flag) so episodes of different parts never merge."""
    datasets = list(datasets)
    if not datasets:
        raise DatasetError("concat got no datasets: pass at least one")
    parts = []
    for ds in datasets:
        arrays = dict(ds.arrays())
        if len(ds) and not (ds.terminals[-1] or ds.timeouts[-1]):
            arrays["timeouts"] = arrays["timeouts"].copy()
            arrays["timeouts"][-1] = True
        parts.append(arrays)
    merged = {k: np.concatenate([p[k] for p in parts]) for k in ARRAY_KEYS}
    return Dataset(**merged, metadata=dict(metadata if metadata is not None else datasets[0].metadata))


def discounted_return_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """sum_k gamma^k r_{t+k} for every t of one episode (float64 accumulation, float32 out)."""
    out = np.empty(len(rewards), dtype=np.float64)
    running = 0.0
    for t, reward in zip(range(len(rewards) - 1, -1, -1), np.asarray(rewards, np.float64)[::-1].tolist()):
        running = reward + gamma * running
        out[t] = running
    return out.astype(np.float32)
