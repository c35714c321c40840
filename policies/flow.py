"""Flow-matching policy over action chunks, with an optional one-step distilled head.

Flow matching (rectified flow): x_s = (1 - s) z + s a for noise z, normalised action chunk a and
s ~ U[0, 1]; the network regresses the velocity a - z. Sampling integrates dx/ds = v(x, s) from
s = 0 to 1 with `num_steps` Euler steps.

The one-step head mu(z, obs) maps the same noise straight to a chunk. It is trained by distillation
(`distill_loss`: match the Euler sampler's output from the same z), which is how FQL builds its
one-step policy; FQL/Q-chunking then add a Q term to the same loss. `sampler="onestep"` makes
`act`/`sample` use it: one network call per chunk.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from embodied.errors import ConfigError
from policies.denoisers import make_denoiser
from policies.generative import GenerativeChunkPolicy
from policies.registry import register

SAMPLERS = ("euler", "onestep")



def euler_integrate(velocity, z: torch.Tensor, steps: int) -> torch.Tensor:
    """x_1 from x_0 = z by `steps` Euler steps of dx/ds = velocity(x, s), s from 0 to 1; clipped to [-1, 1]."""
    x, dt = z, 1.0 / steps
    s = torch.zeros(z.shape[0], device=z.device)
    for i in range(steps):
        x = x + dt * velocity(x, s + i * dt)
    return x.clamp(-1.0, 1.0)

@register("flow")
class FlowPolicy(GenerativeChunkPolicy):
    def __init__(self, obs_dim: int, act_dim: int, obs_horizon: int = 1, pred_horizon: int = 1,
                 execute_horizon: int | None = None, denoiser: str = "mlp", denoiser_kwargs: dict | None = None,
                 num_steps: int = 10, sampler: str = "euler", onestep_head: bool = True,
                 onestep_kwargs: dict | None = None):
        super().__init__(obs_dim, act_dim, obs_horizon, pred_horizon, execute_horizon)
        self.denoiser_name, self.denoiser_kwargs = denoiser, dict(denoiser_kwargs or {})
        self.onestep_head, self.onestep_kwargs = bool(onestep_head), dict(onestep_kwargs or {})
        self.net = make_denoiser(denoiser, self.pred_horizon, self.act_dim, self.cond_dim, **self.denoiser_kwargs)
        # the one-step head is an MLP over (noise, obs): its "time" input is unused (always 0)
        self.onestep = (make_denoiser("mlp", self.pred_horizon, self.act_dim, self.cond_dim, **self.onestep_kwargs)
                        if self.onestep_head else None)
        self.set_sampler(sampler, num_steps)

    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, act_dim=self.act_dim, obs_horizon=self.obs_horizon,
                    pred_horizon=self.pred_horizon, execute_horizon=self.execute_horizon, denoiser=self.denoiser_name,
                    denoiser_kwargs=self.denoiser_kwargs, num_steps=self.num_steps, sampler=self.sampler,
                    onestep_head=self.onestep_head, onestep_kwargs=self.onestep_kwargs)

    def set_sampler(self, sampler: str, num_steps: int | None = None) -> None:
        if sampler not in SAMPLERS:
            raise ConfigError(f"sampler={sampler!r} is unknown; valid: {', '.join(SAMPLERS)}")
        if sampler == "onestep" and self.onestep is None:
            raise ConfigError("sampler=onestep needs onestep_head=true")
        num_steps = self.num_steps if num_steps is None else int(num_steps)
        if num_steps < 1:
            raise ConfigError(f"num_steps={num_steps} must be >= 1")
        self.sampler, self.num_steps = sampler, num_steps

    # -- training -------------------------------------------------------------------------------------
    def loss(self, obs_seq: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Flow-matching loss on raw observations and raw [B, pred_horizon, A] actions (masked by valid)."""
        return self.flow_loss(self.condition(obs_seq), self.normalize_actions(actions), valid)

    def flow_loss(self, cond: torch.Tensor, x1: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        z = torch.randn_like(x1)
        s = torch.rand(x1.shape[0], device=x1.device)
        x_s = (1 - s)[:, None, None] * z + s[:, None, None] * x1
        err = F.mse_loss(self.net(x_s, s, cond), x1 - z, reduction="none").mean(-1)
        if valid is None:
            return err.mean()
        return (err * valid).sum() / valid.sum().clamp(min=1.0)

    def distill_loss(self, obs_seq: torch.Tensor) -> torch.Tensor:
        """Train the one-step head to reproduce the Euler sampler from the same noise."""
        cond = self.condition(obs_seq)
        z = torch.randn(cond.shape[0], self.pred_horizon, self.act_dim, device=cond.device)
        with torch.no_grad():
            target = self.euler(cond, z)
        return F.mse_loss(self.onestep_from(cond, z), target)

    # -- sampling ---------------------------------------------------------------------------------------
    def euler(self, cond: torch.Tensor, z: torch.Tensor, num_steps: int | None = None) -> torch.Tensor:
        return euler_integrate(lambda x, s: self.net(x, s, cond), z, num_steps or self.num_steps)

    def onestep_from(self, cond: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Unclipped (the distillation loss needs the gradient everywhere); samplers clip."""
        return self.onestep(z, torch.zeros(cond.shape[0], device=cond.device), cond)

    def generate(self, cond: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        z = torch.randn((cond.shape[0], self.pred_horizon, self.act_dim), generator=generator, device=cond.device,
                        dtype=cond.dtype)
        return self.onestep_from(cond, z).clamp(-1.0, 1.0) if self.sampler == "onestep" else self.euler(cond, z)
