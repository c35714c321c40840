"""Flow policy (Euler, one-step head), normalisation, and save/load through the policies registry."""
import numpy as np
import pytest
import torch

import policies
from embodied.errors import UserError


@pytest.mark.slow
def test_flow_learns_a_bimodal_target_and_distills():
    """Two modes (+0.8, -0.8): the Euler sampler must produce both; the one-step head must match it."""
    torch.manual_seed(0)
    policy = policies.make("flow", obs_dim=2, act_dim=1, pred_horizon=2, denoiser_kwargs={"hidden": [64, 64]},
                           onestep_kwargs={"hidden": [64, 64]}, num_steps=10)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    obs = torch.zeros(256, 2)
    for _ in range(300):
        target = torch.where(torch.rand(256, 1, 1) < 0.5, 0.8, -0.8).expand(256, 2, 1)
        loss = policy.loss(obs, target) + policy.distill_loss(obs)
        opt.zero_grad()
        loss.backward()
        opt.step()
    samples = policy.sample(np.zeros(2, np.float32), 200)[:, 0, 0]
    assert (np.abs(samples - 0.8) < 0.25).mean() > 0.3 and (np.abs(samples + 0.8) < 0.25).mean() > 0.3
    cond = policy.condition(obs[:64])
    z = torch.randn(64, 2, 1)
    with torch.no_grad():
        gap = (policy.onestep_from(cond, z).clamp(-1, 1) - policy.euler(cond, z)).abs().mean()
    assert gap < 0.15


def test_normalization_round_trip_and_flat_dims():
    policy = policies.make("flow", obs_dim=3, act_dim=2, pred_horizon=1)
    obs = np.random.default_rng(0).normal(5.0, 2.0, size=(500, 3)).astype(np.float32)
    act = np.stack([np.linspace(-0.5, 0.3, 500), np.full(500, 0.2)], 1).astype(np.float32)
    policy.fit_normalization(obs, act)
    normed = policy.normalize_obs(torch.as_tensor(obs))
    assert normed.mean(0).abs().max() < 1e-4 and (normed.std(0) - 1).abs().max() < 1e-2
    a = policy.normalize_actions(torch.as_tensor(act))
    assert a[:, 0].min() == pytest.approx(-1) and a[:, 0].max() == pytest.approx(1)
    assert a[:, 1].abs().max() < 1e-6  # a constant dimension maps to 0, not to NaN
    torch.testing.assert_close(policy.unnormalize_actions(a), torch.as_tensor(act))
    with pytest.raises(UserError):
        policy.fit_normalization(np.zeros((0, 3)), np.zeros((0, 2)))


@pytest.mark.parametrize("name,kw", [
    ("diffusion", dict(denoiser="unet", sampler="ddpm", num_inference_steps=5)),
    ("diffusion", dict(denoiser="transformer", sampler="ddim", num_inference_steps=3)),
    ("flow", dict(obs_horizon=1, pred_horizon=5, sampler="onestep")),
    ("flow", dict(obs_horizon=2, pred_horizon=6, denoiser="unet", num_steps=3)),
])
def test_save_load_gives_identical_actions(tmp_path, name, kw):
    torch.manual_seed(0)
    policy = policies.make(name, obs_dim=4, act_dim=2, **kw)
    rng = np.random.default_rng(1)
    policy.fit_normalization(rng.normal(3, 2, (100, 4)), rng.uniform(-0.5, 0.7, (100, 2)))
    policy.save(tmp_path / "ckpt")
    loaded = policies.load(tmp_path / "ckpt")
    assert type(loaded) is type(policy) and loaded.config() == policy.config()
    torch.testing.assert_close(loaded.act_high, policy.act_high)  # normalisation travels with the weights
    obs = rng.normal(3, 2, (3, 4)).astype(np.float32)
    torch.manual_seed(7)
    a = policy.act(obs, deterministic=False)
    torch.manual_seed(7)
    b = loaded.act(obs, deterministic=False)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(policy.act(obs[0]), loaded.act(obs[0]))  # deterministic: fixed noise
    assert a.min() >= policy.act_low.min().item() - 1e-6  # actions come back in the data's range
    assert not np.array_equal(policy.act(obs, deterministic=False), policy.act(obs, deterministic=False))


def test_onestep_sampler_needs_the_head():
    with pytest.raises(UserError, match="onestep_head"):
        policies.make("flow", obs_dim=2, act_dim=1, onestep_head=False, sampler="onestep")
