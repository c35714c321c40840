"""What the runner needs to train and run agents that act with action chunks.

A chunked agent has `chunk_horizon` (actions per training chunk: batches come from
`ReplayBuffer.sample_chunks(B, chunk_horizon)`), `obs_horizon`, `execute_horizon`, and
`act_chunk(obs_seq [B, To, obs], deterministic, generator=None) -> [B, H, A]` (rows from the current
step on; a given `generator` supplies fresh noise per call, which is how the runner evaluates).
Chunks run open-loop (`embodied.evaluation.ChunkActor`), one env step per row, and every
env step is stored as a single transition, so h-step targets can be sampled later with `valid` masks.
"""
from __future__ import annotations

import numpy as np
import torch


def is_chunked(agent) -> bool:
    return hasattr(agent, "act_chunk")


class GenerativeChunkActing:
    """Acting for agents whose `actor` is a generative chunk policy (diffusion or flow)."""

    @torch.no_grad()
    def act_chunk(self, obs_seq: np.ndarray, deterministic: bool = False,
                  generator: torch.Generator | None = None) -> np.ndarray:
        return self.actor.act(np.asarray(obs_seq, np.float32), deterministic=deterministic, generator=generator)

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
