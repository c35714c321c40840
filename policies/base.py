"""The policy contract (DESIGN.md §3): act -> [H, A], sample -> [n, H, A], save/load."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from embodied.constants import STATE_KEY
from embodied.errors import CheckpointError, UserError


def state_of(obs: Any, obs_dim: int | None = None) -> np.ndarray:
    """Accept the observation dict or a bare state vector; with `obs_dim`, one of another width is refused
    (a [2 * obs_dim] vector would otherwise be read as a batch of two)."""
    if isinstance(obs, dict):
        obs = obs[STATE_KEY]
    state = np.asarray(obs, dtype=np.float32)
    if obs_dim is not None and (state.ndim == 0 or state.shape[-1] != obs_dim):
        raise UserError(f"{STATE_KEY} has shape {tuple(state.shape)} but this policy reads {obs_dim} values per "
                        f"state; pass [{obs_dim}] or [B, {obs_dim}] (or [B, T, {obs_dim}] for a history)")
    return state


class Policy(torch.nn.Module):
    name: ClassVar[str] = "base"

    def config(self) -> dict:
        """Constructor kwargs, JSON-serialisable: enough to rebuild the network before loading weights."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def act(self, obs, deterministic: bool = True, generator: torch.Generator | None = None) -> np.ndarray:
        """[H, A] for one observation, [B, H, A] for a batch. A policy that draws noise even when acting
        deterministically (diffusion, flow, MPPI) takes it from `generator` when one is given, fresh at
        every call; without one, deterministic acting is a function of the observation."""
        raise NotImplementedError

    def sample(self, obs, n: int) -> np.ndarray:
        raise NotImplementedError

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        tmp = directory / "model.safetensors.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, directory / "model.safetensors")
        (directory / "config.json").write_text(json.dumps({"name": self.name, "config": self.config()}, indent=2))

    def load_weights(self, path: Path) -> None:
        if not path.is_file():
            raise CheckpointError(f"{path} not found; the checkpoint is incomplete, re-save it")
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{path} is corrupt ({err}); re-save or retrain the policy") from None
        missing, unexpected = self.load_state_dict(tensors, strict=False)
        if missing or unexpected:
            raise CheckpointError(
                f"{path} does not match {type(self).__name__} (missing {missing[:3]}, unexpected {unexpected[:3]}); "
                "check the policy config"
            )
