"""What the runner needs to train and run agents that act with action chunks.

A chunked agent has `chunk_horizon` (actions per training chunk: batches come from
`ReplayBuffer.sample_chunks(B, chunk_horizon)`), `obs_horizon`, `execute_horizon`, and
`act_chunk(obs_seq [B, To, obs], deterministic) -> [B, H, A]` (rows from the current step on).
Chunks run open-loop through `policies.executors.OpenLoopExecutor`, one env step per row, and every
env step is stored as a single transition, so h-step targets can be sampled later with `valid` masks.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

from embodied.evaluation import EvalResult, eval_envs, episode_result
from policies.base import STATE_KEY
from policies.executors import OpenLoopExecutor


def is_chunked(agent) -> bool:
    return hasattr(agent, "act_chunk")


class GenerativeChunkActing:
    """Acting for agents whose `actor` is a generative chunk policy (diffusion or flow)."""

    @torch.no_grad()
    def act_chunk(self, obs_seq: np.ndarray, deterministic: bool = False) -> np.ndarray:
        return self.actor.act(np.asarray(obs_seq, np.float32), deterministic=deterministic)

    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        """First action of a fresh chunk (for step-wise callers; the runner executes whole chunks)."""
        return self.actor.act(obs, deterministic)[..., 0, :]


def obs_sequence(batch: dict, obs_horizon: int) -> torch.Tensor | np.ndarray:
    """[B, To, obs] observation history for a chunk batch whose chunk starts To-1 steps in the past
    (Diffusion Policy's layout): the chunk's first To observations (padded rows repeat the last one)."""
    first = batch["observations"][:, None]
    if obs_horizon == 1:
        return first
    later = batch["next_observations"][:, : obs_horizon - 1]
    cat = torch.cat if isinstance(first, torch.Tensor) else np.concatenate
    return cat([first, later], 1)


def chunk_td_target(rewards: torch.Tensor, valid: torch.Tensor, terminals: torch.Tensor, next_q: torch.Tensor,
                    gamma: float) -> torch.Tensor:
    """sum_i gamma^i r_i + gamma^{sum(valid)} (1 - terminal at the chunk's real end) Q(s_end, a').

    rewards/valid/terminals are [B, H] as `sample_chunks` gives them (padded rewards are 0 and padded
    flags repeat the last valid step), next_q is [B], evaluated at next_observations[:, -1].
    """
    horizon = rewards.shape[1]
    discounts = gamma ** torch.arange(horizon, device=rewards.device, dtype=rewards.dtype)
    steps = valid.sum(1)
    return (rewards * valid * discounts).sum(1) + gamma ** steps * (1.0 - terminals[:, -1]) * next_q


class ChunkActor:
    """One env's acting state: observation history plus an open-loop executor over chunks."""

    def __init__(self, chunk_fn, obs_horizon: int, execute_horizon: int):
        self.chunk_fn, self.obs_horizon = chunk_fn, obs_horizon
        self.executor = OpenLoopExecutor(execute_horizon)
        self.history: deque = deque(maxlen=obs_horizon)
        self.step = 0

    def reset(self) -> None:
        self.executor.reset()
        self.history.clear()
        self.step = 0

    def __call__(self, state: np.ndarray) -> np.ndarray:
        state = np.asarray(state, np.float32)
        if not self.history:
            self.history.extend([state] * self.obs_horizon)
        self.history.append(state)
        if self.executor.wants_chunk(self.step):
            self.executor.push(self.chunk_fn(np.stack(self.history)[None])[0], self.step)
        action = self.executor.next_action(self.step)
        self.step += 1
        return action


def evaluate_chunked(env_name: str, chunk_fn, obs_horizon: int, execute_horizon: int, episodes: int, seed: int,
                     gamma: float = 0.99, reward_transform=lambda r: r, max_envs: int = 5) -> EvalResult:
    """`embodied.evaluation.evaluate` for chunk policies: episodes in lock-step, a batched chunk call
    whenever any env's executor wants one, each env executing its chunk open-loop. At most `max_envs`
    envs exist at once (episodes run in waves): a manipulation env holds ~100 MB."""
    width = max(1, min(episodes, max_envs))
    envs = eval_envs(env_name, width)
    returns, lengths, successes = np.zeros(episodes), np.zeros(episodes, int), np.zeros(episodes, bool)
    traj = [([], [], []) for _ in range(episodes)]
    for first in range(0, episodes, width):
        wave = list(range(first, min(first + width, episodes)))
        actors = [ChunkActor(None, obs_horizon, execute_horizon) for _ in wave]
        states = [envs[j].reset(seed=seed + i)[0][STATE_KEY] for j, i in enumerate(wave)]
        alive = np.ones(len(wave), bool)
        while alive.any():
            index = np.flatnonzero(alive)
            for j in index:  # histories first, so one batched call serves every env that needs a chunk
                actor = actors[j]
                if not actor.history:
                    actor.history.extend([states[j]] * obs_horizon)
                actor.history.append(np.asarray(states[j], np.float32))
            need = [j for j in index if actors[j].executor.wants_chunk(actors[j].step)]
            if need:
                chunks = chunk_fn(np.stack([np.stack(actors[j].history) for j in need]))
                for row, j in enumerate(need):
                    actors[j].executor.push(chunks[row], actors[j].step)
            for j in index:
                i = wave[j]
                action = actors[j].executor.next_action(actors[j].step)
                actors[j].step += 1
                obs, reward, terminated, truncated, info = envs[j].step(action)
                traj[i][0].append(np.asarray(states[j], np.float32).copy())
                traj[i][1].append(action)
                traj[i][2].append(reward)
                returns[i] += reward
                lengths[i] += 1
                successes[i] |= bool(info.get("success", False))
                states[j] = obs[STATE_KEY]
                if terminated or truncated:
                    alive[j] = False
    ep_states, ep_actions, ep_rewards = zip(*traj)
    return episode_result(env_name, returns, lengths, successes, ep_states, ep_actions, ep_rewards, gamma,
                          reward_transform)
