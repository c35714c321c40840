"""The policy contract, for every name in `policies.names()` (docs/ARCHITECTURE.md, `policies/`):
built from obs_dim and act_dim (and whichever `SMALL` size options its constructor takes), a policy acts
in the documented shapes ([H, A], [B, H, A], sample [n, H, A]), a saved and loaded copy acts exactly like
the original, its state_dict rebuilds it, and it moves between devices. A new registered policy is
checked here without editing this file."""
from __future__ import annotations

import functools
import inspect
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load, save as st_save

import policies
from embodied.errors import UserError
from policies.base import STATE_KEY, Policy

OBS, ACT, B, N = 5, 3, 4, 6
NAMES = policies.names()
# size options that keep planners and large nets seconds-long; a policy gets those its constructor takes
SMALL = {"latent_dim": 32, "enc_dim": 32, "mlp_dim": 32, "num_samples": 32, "num_elites": 8, "num_pi_trajs": 4,
         "iterations": 2}
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def small_options(name: str) -> dict:
    accepted = inspect.signature(type(policies.make(name, obs_dim=OBS, act_dim=ACT)).__init__).parameters
    return {k: v for k, v in SMALL.items() if k in accepted}


def build(name: str, seed: int = 0, fit: bool = True) -> Policy:
    """A registered policy with its constructor defaults but `SMALL`; `fit` gives normalisable policies
    non-default statistics, so the tests below also see whether those buffers are saved."""
    torch.manual_seed(seed)
    policy = policies.make(name, obs_dim=OBS, act_dim=ACT, **small_options(name))
    if fit and hasattr(policy, "fit_normalization"):
        rng = np.random.default_rng(seed)
        policy.fit_normalization(rng.normal(2.0, 3.0, (64, OBS)).astype(np.float32),
                                 rng.uniform(-0.5, 0.8, (64, ACT)).astype(np.float32))
    return policy


def observations(n: int = B, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(100 + seed).normal(size=(n, OBS)).astype(np.float32)


def reset(policy: Policy) -> None:
    """Policies with an observation history forget it (a new episode)."""
    getattr(policy, "reset", lambda: None)()


def stochastic(policy: Policy, obs: np.ndarray, seed: int) -> np.ndarray:
    torch.manual_seed(seed)
    return policy.act(obs, deterministic=False)


def test_the_registry_lists_the_builtin_policies_and_names_them():
    assert {"gaussian", "diffusion", "flow"} <= set(NAMES)
    for name in NAMES:
        assert policies.make(name, obs_dim=OBS, act_dim=ACT).name == name


@pytest.mark.parametrize("name", NAMES)
def test_act_and_sample_shapes(name):
    policy = build(name, fit=False)  # unfitted: actions in the env's [-1, 1]
    obs = observations()
    single = policy.act(obs[0])
    assert single.dtype == np.float32 and single.ndim == 2 and single.shape[1] == ACT
    horizon = single.shape[0]
    assert horizon >= 1
    reset(policy)
    assert policy.act({STATE_KEY: obs[0]}).shape == (horizon, ACT)       # the observation dict works too
    batch = policy.act(obs)
    assert batch.dtype == np.float32 and batch.shape == (B, horizon, ACT)
    assert policy.act(obs, deterministic=False).shape == (B, horizon, ACT)
    samples = policy.sample(obs[0], N)
    assert samples.dtype == np.float32 and samples.shape == (N, horizon, ACT)
    for actions in (single, batch, samples):
        assert np.isfinite(actions).all() and np.abs(actions).max() <= 1.0 + 1e-6
    assert not np.allclose(samples, samples[:1])                           # n samples, not n copies of one
    np.testing.assert_array_equal(policy.act(obs), batch)                  # deterministic: a function of obs


@pytest.mark.parametrize("name", NAMES)
def test_a_noise_stream_gives_fresh_repeatable_draws_to_the_policies_that_draw_noise(name):
    """`act(obs, generator=g)`: what evaluation and the policy server call. Policies that sample even when
    acting deterministically (diffusion, flow, MPPI) draw fresh noise from g at every call, the same
    sequence for the same seed; the Gaussian's mean and the VLA's L1 (parallel) head need none."""
    policy = build(name, fit=False)
    obs = observations()

    def two_calls(seed):
        stream = torch.Generator().manual_seed(seed)
        reset(policy)
        first = policy.act(obs, generator=stream)
        reset(policy)
        return first, policy.act(obs, generator=stream)

    first, second = two_calls(3)
    assert first.shape == (B, first.shape[1], ACT)
    np.testing.assert_array_equal(np.stack(two_calls(3)), np.stack([first, second]))
    if name == "gaussian" or getattr(policy, "head", "flow") != "flow":
        np.testing.assert_array_equal(first, second)
    else:
        assert not np.allclose(first, second)


@pytest.mark.parametrize("name", NAMES)
def test_a_state_of_the_wrong_width_is_refused_not_read_as_a_batch(name):
    """A [2 * obs_dim] vector used to be reshaped into a batch of two (the gaussian policy acted on it)."""
    policy = build(name, fit=False)
    wrong = np.zeros(2 * OBS, np.float32)
    with pytest.raises(UserError, match=rf"{STATE_KEY} has shape .*{2 * OBS}"):
        policy.act(wrong)
    with pytest.raises(UserError, match=rf"{STATE_KEY} has shape"):
        policy.act(np.zeros((B, OBS + 1), np.float32))


@pytest.mark.parametrize("name", NAMES)
def test_a_saved_and_loaded_copy_acts_exactly_like_the_original(name, tmp_path):
    policy = build(name)
    obs = observations()
    policy.save(tmp_path / "policy")
    assert {p.name for p in (tmp_path / "policy").iterdir()} == {"config.json", "model.safetensors"}
    torch.manual_seed(1234)  # loading must not depend on the global RNG state
    loaded = policies.load(tmp_path / "policy")
    assert type(loaded) is type(policy) and loaded.name == name
    assert json.loads(json.dumps(loaded.config())) == json.loads(json.dumps(policy.config()))
    np.testing.assert_array_equal(loaded.act(obs), policy.act(obs))
    np.testing.assert_array_equal(stochastic(loaded, obs, 7), stochastic(policy, obs, 7))
    torch.manual_seed(8)
    samples = policy.sample(obs[0], N)
    torch.manual_seed(8)
    np.testing.assert_array_equal(loaded.sample(obs[0], N), samples)
    reset(policy), reset(loaded)
    np.testing.assert_array_equal(loaded.act(obs[1]), policy.act(obs[1]))
    # the same check would pass trivially if every instance acted alike: other weights act otherwise
    # (perturbed, not merely re-initialised: TD-MPC2 zero-initialises its reward and Q outputs, so at init
    # every plan scores alike and the planner's choice does not depend on the weights)
    other = build(name, seed=1)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    reset(policy)
    assert not np.array_equal(other.act(obs), policy.act(obs))


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_rebuilds_the_policy(name):
    policy = build(name)
    state = policy.state_dict()
    assert state and all(isinstance(v, torch.Tensor) for v in state.values())
    through_file = st_load(st_save({k: v.contiguous() for k, v in state.items()}))  # what save() writes
    fresh = policies.make(name, **policy.config())
    assert set(fresh.state_dict()) == set(state)        # config() rebuilds the same architecture
    assert any(not torch.equal(fresh.state_dict()[k], v) for k, v in state.items())
    fresh.load_state_dict(through_file, strict=True)
    for key, value in state.items():
        got = fresh.state_dict()[key]
        assert got.dtype == value.dtype and torch.equal(got, value), key
    obs = observations()
    np.testing.assert_array_equal(fresh.act(obs), policy.act(obs))
    np.testing.assert_array_equal(stochastic(fresh, obs, 3), stochastic(policy, obs, 3))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("name", NAMES)
def test_a_policy_moves_to_a_device_and_back(name, device, tmp_path):
    # on CPU repeated runs are bit-identical; GPU kernels may differ in the last bits between launches
    same = np.testing.assert_array_equal if device == "cpu" else (
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6))
    policy = build(name)
    obs = observations()
    on_cpu = policy.act(obs)
    assert policy.to(device) is policy and policy.device.type == device
    assert all(t.device.type == device for t in [*policy.parameters(), *policy.buffers()])
    actions = policy.act(obs)                          # numpy on the host, whatever the device
    assert isinstance(actions, np.ndarray) and actions.shape == on_cpu.shape and np.isfinite(actions).all()
    same(policy.act(obs), actions)
    assert policy.sample(obs[0], N).shape == (N, *on_cpu.shape[1:])
    if device == "cpu":
        np.testing.assert_array_equal(actions, on_cpu)
    policy.save(tmp_path / "policy")                   # saved from the device, loaded anywhere
    np.testing.assert_array_equal(policies.load(tmp_path / "policy", device="cpu").act(obs), on_cpu)
    there = policies.load(tmp_path / "policy", device=device)
    assert there.device.type == device
    same(there.act(obs), actions)
    policy.to("cpu")
    np.testing.assert_array_equal(policy.act(obs), on_cpu)
