"""GenerativeBC acts with Diffusion Policy's EMA of its trained weights (what is saved and fine-tuned)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied.agents.bc_generative import GenerativeBC, GenerativeBCConfig
from embodied.data.replay import ReplayBuffer
from embodied.errors import ConfigError

OBS, ACT = 4, 2


def make(**kw) -> GenerativeBC:
    cfg = GenerativeBCConfig(policy="flow", obs_horizon=1, pred_horizon=2, execute_horizon=1, denoiser="mlp",
                             denoiser_kwargs={"hidden": (16, 16)}, policy_kwargs={"onestep_head": False},
                             distill_weight=0.0, lr=1e-2, **kw)
    return GenerativeBC(OBS, ACT, cfg, seed=0)


def chunks(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(OBS, ACT, capacity=64, seed=seed)
    for t in range(64):
        buf.add(rng.normal(size=OBS).astype(np.float32), rng.uniform(-1, 1, ACT).astype(np.float32), 0.0,
                rng.normal(size=OBS).astype(np.float32), terminal=False, timeout=t % 16 == 15)
    return buf.sample_chunks(32, 2)


def flat(module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_the_actor_is_the_moving_average_of_the_trained_weights_on_diffusion_policys_schedule():
    agent = make()
    assert agent.actor is not agent.model and not any(p.requires_grad for p in agent.actor.parameters())
    decays, previous = [], flat(agent.actor)
    for step in range(1, 6):
        agent.update(chunks(step))
        decay = agent.ema.cur_decay_value
        decays.append(decay)
        # actor_t = decay * actor_{t-1} + (1 - decay) * model_t
        torch.testing.assert_close(flat(agent.actor), decay * previous + (1 - decay) * flat(agent.model))
        previous = flat(agent.actor)
    # 1 - (1 + step)^-0.75 from 0, one step behind the optimizer (diffusers' EMAModel counting)
    np.testing.assert_allclose(decays, [0.0, *(1 - (1 + np.arange(1, 5)) ** -0.75)], rtol=1e-6)
    assert not torch.equal(flat(agent.actor), flat(agent.model))


def test_without_ema_the_trained_network_acts():
    agent = make(ema=False)
    assert agent.actor is agent.model and agent.ema is None
    agent.update(chunks())
    assert set(k.split(".")[0] for k in agent.state_dict()) >= {"actor"}
    assert not any(k.startswith("model.") for k in agent.state_dict())


def test_a_checkpoint_written_without_ema_loads_into_an_ema_agent():
    plain = make(ema=False)
    plain.update(chunks())
    agent = make()
    agent.load_state_dict(plain.state_dict())
    torch.testing.assert_close(flat(agent.model), flat(plain.model))
    torch.testing.assert_close(flat(agent.actor), flat(plain.model))


def test_bad_ema_settings_name_the_field():
    with pytest.raises(ConfigError, match="ema_max_decay"):
        make(ema_max_decay=1.0)


def test_the_actor_gets_the_normalisation_statistics_the_trained_network_was_fitted_with():
    agent = make()
    rng = np.random.default_rng(0)
    agent.fit_normalization(rng.normal(3.0, 2.0, (100, OBS)), rng.uniform(-0.5, 0.5, (100, ACT)))
    for name in ("obs_mean", "obs_std", "act_low", "act_high"):
        torch.testing.assert_close(getattr(agent.actor, name), getattr(agent.model, name))
    assert float(agent.actor.obs_mean.mean()) > 2.0
