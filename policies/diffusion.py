"""Conditional diffusion policy over action chunks (Diffusion Policy, Chi et al. 2023).

Training: DDPM noise prediction. A diffusers `DDPMScheduler` defines the noise schedule and noises the
clean (normalised) chunk at a random step t; the denoiser predicts the noise.

Sampling: DDPM or DDIM with a configurable number of steps. diffusers is the source of the schedule
(timesteps, alphas_cumprod); its `.step()` costs a few hundred microseconds of Python per call, which
is most of a DDIM-10 chunk at batch 1, so the per-step update is precomputed once per (sampler, steps)
into four coefficient tensors:

    x0   = clip((x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t))
    x_t' = a_t x0 + b_t x_t + c_t eps + sigma_t z

DDPM (fixed_small variance): a = sqrt(abar') beta/(1-abar), b = sqrt(alpha)(1-abar')/(1-abar), c = 0,
sigma^2 = (1-abar')/(1-abar) beta. DDIM (eta 0): a = sqrt(abar'), b = 0, c = sqrt(1-abar'), sigma = 0.
`tests/policies/test_diffusion.py` checks that this loop equals the diffusers `.step()` loop.
`use_diffusers_step=True` runs the reference loop instead (the latency benchmark times both).

DPPO fine-tunes through `denoise_mean_std` / `chain`: the same DDPM step as a Gaussian with a floor
on its std, so every denoising step has a log-probability.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from embodied.errors import ConfigError
from policies.denoisers import make_denoiser
from policies.generative import GenerativeChunkPolicy
from policies.registry import register

SAMPLERS = ("ddpm", "ddim")


def _scheduler_class(sampler: str):
    """diffusers is imported on first use: it takes seconds, and flow-only runs never need it."""
    from diffusers import DDIMScheduler, DDPMScheduler

    return DDPMScheduler if sampler == "ddpm" else DDIMScheduler


@register("diffusion")
class DiffusionPolicy(GenerativeChunkPolicy):
    def __init__(self, obs_dim: int, act_dim: int, obs_horizon: int = 2, pred_horizon: int = 16,
                 execute_horizon: int | None = 8, denoiser: str = "unet", denoiser_kwargs: dict | None = None,
                 num_train_steps: int = 100, beta_schedule: str = "squaredcos_cap_v2", sampler: str = "ddim",
                 num_inference_steps: int = 10, clip_sample: bool = True, use_diffusers_step: bool = False,
                 finetune_last: int = 0):
        super().__init__(obs_dim, act_dim, obs_horizon, pred_horizon, execute_horizon)
        if sampler not in SAMPLERS:
            raise ConfigError(f"sampler={sampler!r} is unknown; valid: {', '.join(SAMPLERS)}")
        self.denoiser_name, self.denoiser_kwargs = denoiser, dict(denoiser_kwargs or {})
        self.num_train_steps, self.beta_schedule = int(num_train_steps), beta_schedule
        self.clip_sample, self.use_diffusers_step = bool(clip_sample), bool(use_diffusers_step)
        self.net = make_denoiser(denoiser, self.pred_horizon, self.act_dim, self.cond_dim, **self.denoiser_kwargs)
        # DPPO: a fine-tuned copy of the denoiser runs the last `finetune_last` steps of the chain, the
        # pretrained one the earlier steps (kept in the checkpoint, so a fine-tuned policy deploys as trained)
        self.finetune_last = int(finetune_last)
        self.net_ft = None
        if self.finetune_last > 0:
            self.net_ft = make_denoiser(denoiser, self.pred_horizon, self.act_dim, self.cond_dim, **self.denoiser_kwargs)
            self.net_ft.load_state_dict(self.net.state_dict())
        self.train_scheduler = _scheduler_class("ddpm")(num_train_timesteps=self.num_train_steps, beta_schedule=beta_schedule,
                                             clip_sample=self.clip_sample, prediction_type="epsilon")
        self.register_buffer("alphas_cumprod", self.train_scheduler.alphas_cumprod.float().clone(), persistent=False)
        self._coef_cache: dict = {}
        self.set_sampler(sampler, num_inference_steps)

    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, act_dim=self.act_dim, obs_horizon=self.obs_horizon,
                    pred_horizon=self.pred_horizon, execute_horizon=self.execute_horizon, denoiser=self.denoiser_name,
                    denoiser_kwargs=self.denoiser_kwargs, num_train_steps=self.num_train_steps,
                    beta_schedule=self.beta_schedule, sampler=self.sampler, num_inference_steps=self.num_inference_steps,
                    clip_sample=self.clip_sample, use_diffusers_step=self.use_diffusers_step,
                    finetune_last=self.finetune_last)

    # -- schedule ---------------------------------------------------------------------------------------
    def set_sampler(self, sampler: str, num_inference_steps: int) -> None:
        if sampler not in SAMPLERS:
            raise ConfigError(f"sampler={sampler!r} is unknown; valid: {', '.join(SAMPLERS)}")
        if not 1 <= int(num_inference_steps) <= self.num_train_steps:
            raise ConfigError(f"num_inference_steps={num_inference_steps} must be in [1, num_train_steps="
                              f"{self.num_train_steps}]")
        self.sampler, self.num_inference_steps = sampler, int(num_inference_steps)

    def make_scheduler(self, sampler: str | None = None):
        cls = _scheduler_class(sampler or self.sampler)
        scheduler = cls(num_train_timesteps=self.num_train_steps, beta_schedule=self.beta_schedule,
                        clip_sample=self.clip_sample, prediction_type="epsilon")
        scheduler.set_timesteps(self.num_inference_steps)
        return scheduler

    def coefficients(self, sampler: str | None = None, steps: int | None = None) -> dict[str, torch.Tensor]:
        """Per-step tensors (timesteps, x0 and update coefficients) for the sampler, from diffusers' schedule."""
        sampler, steps = sampler or self.sampler, int(steps or self.num_inference_steps)
        device = self.alphas_cumprod.device
        key = (sampler, steps, device)
        if key not in self._coef_cache:
            scheduler = _scheduler_class(sampler)(
                num_train_timesteps=self.num_train_steps, beta_schedule=self.beta_schedule,
                clip_sample=self.clip_sample, prediction_type="epsilon")
            scheduler.set_timesteps(steps)
            abar = scheduler.alphas_cumprod.double()
            ts = [int(t) for t in scheduler.timesteps]
            rows = []
            for i, t in enumerate(ts):
                prev = ts[i + 1] if i + 1 < len(ts) else -1
                ab, ab_prev = abar[t], (abar[prev] if prev >= 0 else torch.tensor(1.0, dtype=torch.float64))
                if sampler == "ddpm":
                    alpha, beta = ab / ab_prev, 1 - ab / ab_prev
                    a = ab_prev.sqrt() * beta / (1 - ab)
                    b = alpha.sqrt() * (1 - ab_prev) / (1 - ab)
                    c = torch.zeros((), dtype=torch.float64)
                    var = ((1 - ab_prev) / (1 - ab) * beta).clamp(min=1e-20)
                    sigma = var.sqrt() if t > 0 else torch.zeros((), dtype=torch.float64)
                else:  # DDIM, eta = 0
                    a, b, c, sigma = ab_prev.sqrt(), torch.zeros((), dtype=torch.float64), (1 - ab_prev).sqrt(), torch.zeros((), dtype=torch.float64)
                rows.append([ab.sqrt(), (1 - ab).sqrt(), a, b, c, sigma])
            table = torch.tensor([[float(x) for x in r] for r in rows], dtype=torch.float32, device=device)
            self._coef_cache[key] = {"t": torch.tensor(ts, device=device), "t_unit": torch.tensor(ts, device=device, dtype=torch.float32) / self.num_train_steps,
                                     "sqrt_ab": table[:, 0], "sqrt_1mab": table[:, 1], "a": table[:, 2],
                                     "b": table[:, 3], "c": table[:, 4], "sigma": table[:, 5],
                                     "t_list": ts, "sigma_list": table[:, 5].tolist()}
        return self._coef_cache[key]

    # -- training -------------------------------------------------------------------------------------
    def loss(self, obs_seq: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """DDPM noise-prediction loss on raw [B, To, obs] observations and raw [B, pred_horizon, A] actions."""
        x0 = self.normalize_actions(actions)
        noise = torch.randn_like(x0)
        t = torch.randint(0, self.num_train_steps, (x0.shape[0],), device=x0.device)
        abar = self.alphas_cumprod.to(x0.device)[t][:, None, None]
        x_t = abar.sqrt() * x0 + (1 - abar).sqrt() * noise  # = train_scheduler.add_noise (tested)
        pred = self.net(x_t, t.float() / self.num_train_steps, self.condition(obs_seq))
        err = F.mse_loss(pred, noise, reduction="none").mean(-1)
        if valid is None:
            return err.mean()
        return (err * valid).sum() / valid.sum().clamp(min=1.0)

    # -- sampling ---------------------------------------------------------------------------------------
    def x0_from_eps(self, x_t: torch.Tensor, eps: torch.Tensor, sqrt_ab, sqrt_1mab) -> torch.Tensor:
        x0 = (x_t - sqrt_1mab * eps) / sqrt_ab
        return x0.clamp(-1.0, 1.0) if self.clip_sample else x0

    def generate(self, cond: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        shape = (cond.shape[0], self.pred_horizon, self.act_dim)
        x = torch.randn(shape, generator=generator, device=cond.device, dtype=cond.dtype)
        if self.use_diffusers_step:
            return self._generate_diffusers(x, cond, generator)
        co = self.coefficients()
        t_unit = co["t_unit"]
        ones = torch.ones(cond.shape[0], device=cond.device)
        for i, sigma in enumerate(co["sigma_list"]):
            eps = self.step_net(i)(x, ones * t_unit[i], cond)
            x0 = self.x0_from_eps(x, eps, co["sqrt_ab"][i], co["sqrt_1mab"][i])
            x = co["a"][i] * x0 + co["b"][i] * x + co["c"][i] * eps
            if sigma > 0:
                x = x + sigma * torch.randn(shape, generator=generator, device=cond.device, dtype=cond.dtype)
        return x

    def _generate_diffusers(self, x: torch.Tensor, cond: torch.Tensor, generator) -> torch.Tensor:
        """The reference loop: diffusers' own `.step()` at every denoising step."""
        scheduler = self.make_scheduler()
        ones = torch.ones(cond.shape[0], device=cond.device)
        for i, t in enumerate(scheduler.timesteps):
            eps = self.step_net(i)(x, ones * (float(t) / self.num_train_steps), cond)
            kwargs = {"generator": generator} if self.sampler == "ddpm" else {}
            x = scheduler.step(eps, t, x, **kwargs).prev_sample
        return x

    def step_net(self, step_index: int):
        """The denoiser for chain step `step_index` (0 = noisiest): the fine-tuned copy for the last steps."""
        if self.net_ft is not None and step_index >= self.num_inference_steps - self.finetune_last:
            return self.net_ft
        return self.net

    # -- DPPO: the DDPM chain as a sequence of Gaussians ---------------------------------------------------
    def denoise_mean_std(self, x: torch.Tensor, step_index: int, cond: torch.Tensor, min_std: float = 0.0,
                         net=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std of x_{t'} | x_t at DDPM step `step_index` (0 = the noisiest), std floored at min_std."""
        co = self.coefficients("ddpm", self.num_inference_steps)
        eps = (net or self.step_net(step_index))(x, torch.full((x.shape[0],), float(co["t_unit"][step_index]), device=x.device), cond)
        x0 = self.x0_from_eps(x, eps, co["sqrt_ab"][step_index], co["sqrt_1mab"][step_index])
        mean = co["a"][step_index] * x0 + co["b"][step_index] * x
        std = torch.clamp(co["sigma"][step_index], min=min_std).expand_as(mean)
        return mean, std
