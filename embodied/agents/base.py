"""The agent base class and its checkpoint format: one flat dict of tensors per agent.

Keys are `<module>.<parameter>` for networks, the scalar's name for 0-d parameters, and
`<optimizer>.<index>.<slot>` for Adam moments; hyper-parameters are not stored (the run config
rebuilds the optimizers), so a checkpoint is plain safetensors and loads without unpickling.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from embodied.agents.nets import tune_allocator
from embodied.errors import CheckpointError


def optimizer_tensors(optimizer: torch.optim.Optimizer, prefix: str) -> dict[str, torch.Tensor]:
    """Adam moments and step counts as flat tensors, for safetensors checkpoints.

    Hyper-parameters are not stored: they come from the run config when the optimizer is rebuilt.
    """
    tensors = {}
    for index, entry in optimizer.state_dict()["state"].items():
        for key, value in entry.items():
            tensors[f"{prefix}.{index}.{key}"] = torch.as_tensor(value).detach().cpu().clone()
    return tensors


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: Mapping[str, torch.Tensor], prefix: str) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith(prefix + "."):
            index, key = name[len(prefix) + 1:].split(".", 1)
            state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


class Agent:
    """What every agent shares: its config and sizes, one device, a local RNG, and flat-tensor checkpoints
    (safetensors-ready) of the networks, 0-d parameters and optimizers it names.

    Subclasses build their networks after `super().__init__` and name them in `_modules()`,
    `_optimizers()` and `scalars` (e.g. SAC's `alpha_param`); nothing else is needed to save and load."""
    scalars: tuple[str, ...] = ()

    def __init__(self, obs_dim: int, act_dim: int, cfg, device: str | torch.device = "cpu", seed: int = 0):
        self.cfg, self.device = cfg, torch.device(device)
        if self.device.type == "cpu":
            tune_allocator()  # large activations stop page-faulting on every update
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def _modules(self) -> dict[str, nn.Module]:
        raise NotImplementedError

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, torch.Tensor]:
        return checkpoint_tensors(self)

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        restore_tensors(self, tensors)


def checkpoint_tensors(agent: Agent) -> dict[str, torch.Tensor]:
    """Networks, the agent's named scalar parameters and optimizer moments."""
    tensors: dict[str, torch.Tensor] = {}
    for name, module in agent._modules().items():
        for key, value in module.state_dict().items():
            tensors[f"{name}.{key}"] = value.detach().cpu().contiguous()
    for name in agent.scalars:
        if getattr(agent, name, None) is not None:
            tensors[name] = getattr(agent, name).detach().cpu().reshape(())
    for name, optimizer in agent._optimizers().items():
        tensors.update(optimizer_tensors(optimizer, name))
    return tensors


def restore_tensors(agent: Agent, tensors: dict[str, torch.Tensor]) -> None:
    for name, module in agent._modules().items():
        prefix = name + "."
        module.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
    for name in agent.scalars:
        if getattr(agent, name, None) is not None and name not in tensors:
            raise CheckpointError(f"the checkpoint has no {name!r}, which this {type(agent).__name__} learns; "
                                  "it was written by another agent or config: load it with the one that wrote it")
        if name in tensors and getattr(agent, name, None) is not None:
            with torch.no_grad():
                getattr(agent, name).copy_(tensors[name])
    for name, optimizer in agent._optimizers().items():
        load_optimizer_tensors(optimizer, tensors, name)
