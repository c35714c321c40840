"""Diffusion policy: schedules from diffusers, oracle round trips, the fast loop equals diffusers' .step()."""
import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler
from torch import nn

from embodied.errors import UserError
from policies.diffusion import DiffusionPolicy


class OracleDenoiser(nn.Module):
    """Knows the clean chunk x0: returns exactly the noise that turns x0 into x_t at step t."""

    def __init__(self, x0: torch.Tensor, alphas_cumprod: torch.Tensor, num_train_steps: int):
        super().__init__()
        self.x0, self.abar, self.T = x0, alphas_cumprod, num_train_steps

    def forward(self, x, t_unit, cond):
        t = torch.round(t_unit * self.T).long()
        ab = self.abar[t][:, None, None]
        return (x - ab.sqrt() * self.x0) / (1 - ab).sqrt()


def small(**kw):
    base = dict(obs_dim=3, act_dim=2, obs_horizon=2, pred_horizon=8, execute_horizon=4, denoiser="mlp",
                denoiser_kwargs={"hidden": [32, 32]}, num_train_steps=100)
    return DiffusionPolicy(**{**base, **kw})


def test_noise_added_at_step_t_is_predicted_back_by_an_oracle():
    torch.manual_seed(0)
    policy = small()
    x0 = torch.rand(4, 8, 2) * 2 - 1
    oracle = OracleDenoiser(x0, policy.alphas_cumprod, 100)
    scheduler = DDPMScheduler(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2")
    for t in (0, 1, 37, 99):
        noise = torch.randn_like(x0)
        steps = torch.full((4,), t)
        x_t = scheduler.add_noise(x0, noise, steps)
        torch.testing.assert_close(oracle(x_t, steps.float() / 100, None), noise, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("sampler,steps", [("ddpm", 100), ("ddpm", 10), ("ddim", 10), ("ddim", 5)])
def test_sampling_with_an_oracle_recovers_the_clean_chunk(sampler, steps):
    torch.manual_seed(1)
    policy = small(sampler=sampler, num_inference_steps=steps)
    x0 = torch.rand(3, 8, 2) * 1.8 - 0.9
    policy.net = OracleDenoiser(x0, policy.alphas_cumprod, 100)
    out = policy.generate(torch.zeros(3, 6))
    torch.testing.assert_close(out, x0, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("sampler,steps", [("ddpm", 100), ("ddpm", 10), ("ddim", 10), ("ddim", 5)])
def test_precomputed_loop_equals_diffusers_step_loop(sampler, steps):
    torch.manual_seed(2)
    policy = small(sampler=sampler, num_inference_steps=steps).eval()
    cond = torch.randn(5, policy.cond_dim)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    fast = policy.generate(cond, g1)
    policy.use_diffusers_step = True
    reference = policy.generate(cond, g2)
    torch.testing.assert_close(fast, reference, atol=1e-4, rtol=1e-4)


def test_loss_noises_like_diffusers_add_noise():
    policy = small()
    scheduler = policy.train_scheduler
    x0, noise, t = torch.randn(6, 8, 2), torch.randn(6, 8, 2), torch.randint(0, 100, (6,))
    ab = policy.alphas_cumprod[t][:, None, None]
    torch.testing.assert_close(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, scheduler.add_noise(x0, noise, t))


@pytest.mark.parametrize("denoiser", ["mlp", "unet", "transformer"])
def test_denoisers_shapes_and_horizons(denoiser):
    policy = DiffusionPolicy(obs_dim=4, act_dim=3, obs_horizon=2, pred_horizon=16, execute_horizon=8,
                             denoiser=denoiser, num_inference_steps=2)
    obs = np.random.default_rng(0).normal(size=4).astype(np.float32)
    assert policy.act(obs).shape == (15, 3)              # rows from the current step on
    assert policy.act(np.zeros((5, 4), np.float32)).shape == (5, 15, 3)
    assert policy.act(np.zeros((5, 2, 4), np.float32)).shape == (5, 15, 3)
    assert policy.sample(obs, 6).shape == (6, 15, 3)
    loss = policy.loss(torch.randn(7, 2, 4), torch.rand(7, 16, 3) * 2 - 1)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in policy.net.parameters() if p.requires_grad)


def test_unet_pads_odd_horizons():
    policy = DiffusionPolicy(obs_dim=4, act_dim=2, obs_horizon=1, pred_horizon=5, execute_horizon=5, denoiser="unet",
                             num_inference_steps=2)
    assert policy.act(np.zeros(4, np.float32)).shape == (5, 2)


def test_observation_history_pads_then_slides():
    policy = small()
    policy.reset()
    a, b = np.full(3, 1.0, np.float32), np.full(3, 2.0, np.float32)
    policy.act(a)
    assert [h[0] for h in policy._history] == [1.0, 1.0]
    policy.act(b)
    assert [h[0] for h in policy._history] == [1.0, 2.0]
    policy.sample(a, 2)  # sampling does not advance the history
    assert [h[0] for h in policy._history] == [1.0, 2.0]


def test_bad_config_and_inputs_are_user_errors():
    with pytest.raises(UserError, match="sampler"):
        small(sampler="euler")
    with pytest.raises(UserError, match="num_inference_steps"):
        small(num_inference_steps=0)
    with pytest.raises(UserError, match="execute_horizon"):
        small(execute_horizon=20)
    with pytest.raises(UserError, match="denoiser"):
        small(denoiser="resnet")
    with pytest.raises(UserError, match="reads 3 values per state"):
        small().act(np.zeros(5, np.float32))
