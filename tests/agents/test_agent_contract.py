"""The agent contract, for every name in `embodied.agents.names()` (docs/ARCHITECTURE.md,
`embodied/agents`): actions in the documented shapes (chunked agents also `act_chunk`), a state_dict that
goes through safetensors and rebuilds an agent that acts and keeps training exactly like the original
(networks and optimizer moments), and a state that moves between devices. Networks are shrunk through
whichever of the `SMALL` options an agent's config has; a new registered agent is checked here too."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load, save as st_save

from embodied import agents
from embodied.data.replay import ReplayBuffer
from policies.base import STATE_KEY

OBS, ACT, B = 5, 3, 4
NAMES = agents.names()
SMALL = {"hidden": (32, 32), "cql_n_actions": 2, "num_samples": 4, "flow_steps": 3, "update_epochs": 1,
         "minibatch_size": 16, "critic_hidden": (32, 32), "sample_repeats": 1, "denoiser": "mlp",
         "denoiser_kwargs": {"hidden": (32, 32)},
         # vla_bc: state-only (the replay batches here carry no frames), a tiny backbone, no model to load
         "cameras": (), "vla_kwargs": {"dim": 32, "depth": 1, "channels": (8, 16)}, "text_encoder": "hash"}
# what a continuation needs of the agent it continues (vla_ppo fine-tunes the flow head's chain)
BASES = {"vla_ppo": {"head": "flow"}}
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))


def build(name: str, device: str = "cpu", init_seed: int = 0, base_overrides: dict | None = None):
    """The registry's agent (preset values included) with small networks; `init_seed` seeds the weights. An
    agent that continues a pretrained one (agents.CONTINUATIONS) is built on a small agent of that kind."""
    fields = {f.name for f in dataclasses.fields(agents.config_class(name))}
    small = {k: v for k, v in {**SMALL, **(base_overrides or {})}.items() if k in fields}
    if name in agents.CONTINUATIONS:
        base = build(agents.CONTINUATIONS[name], device=device, base_overrides=BASES.get(name))
        torch.manual_seed(init_seed)
        return agents.continue_from(name, base, small, seed=0)
    torch.manual_seed(init_seed)
    return agents.make(name, OBS, ACT, small, device=device, seed=0)


@pytest.fixture(scope="module")
def buffer() -> ReplayBuffer:
    """Ten 20-step episodes of random transitions (half end in a terminal, half time out), with Monte-Carlo
    returns for Cal-QL."""
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(OBS, ACT, capacity=400, seed=0)
    for episode in range(10):
        obs = rng.normal(size=OBS).astype(np.float32)
        for t in range(20):
            nxt = rng.normal(size=OBS).astype(np.float32)
            end = t == 19
            buf.add(obs, rng.uniform(-1, 1, ACT).astype(np.float32), float(rng.normal()), nxt,
                    terminal=end and episode % 2 == 0, timeout=end and episode % 2 == 1,
                    mc_return=float(rng.normal()))
            obs = nxt
    return buf


def training_batch(agent, buf: ReplayBuffer, n: int = 32, seed: int = 0) -> dict:
    """What the runner feeds `agent.update`: a chunk batch for chunked agents, a transition batch for the
    others; DPPO learns from its own denoising chains (on-policy), so it gets a rollout of those."""
    if hasattr(agent, "sample_chain"):
        g = torch.Generator().manual_seed(seed)
        obs = torch.as_tensor(buf.sample(n)["observations"], device=agent.device)
        _, latents, cond = agent.sample_chain(obs)
        with torch.no_grad():
            old = agent.log_probs(cond, latents, agent.cfg.logprob_reduce)
        return {"cond": cond, "latents": latents, "old_log_probs": old,
                "advantages": torch.randn(n, generator=g).to(agent.device),
                "returns": torch.randn(n, generator=g).to(agent.device)}
    if hasattr(agent, "explore"):   # vla_ppo: its own noisy chains over rollout rows (on-policy)
        g = torch.Generator().manual_seed(seed)
        rows = agent.inputs({STATE_KEY: buf.sample(n)["observations"], "task": "push the block"})
        out = agent.explore(rows)
        return {"rows": rows, "chain": out["chain"], "log_prob": out["log_prob"],
                "advantages": torch.randn(n, generator=g), "returns": torch.randn(n, generator=g)}
    if hasattr(agent, "candidates"):   # vla_qc: chunk-boundary rows with the next state's VLA samples
        chunks = buf.sample_chunks(n, agent.chunk_horizon)
        g = torch.Generator().manual_seed(seed)
        text = torch.randn(n, agent.actor.text_dim, generator=g).numpy()
        candidates = torch.rand(n, agent.cfg.num_samples, agent.horizon, ACT, generator=g).numpy() * 2 - 1
        return {"observations": chunks["observations"], "text": text, "actions": chunks["actions"],
                "rewards": chunks["rewards"], "valid": chunks["valid"], "terminals": chunks["terminals"],
                "next_observations": chunks["next_observations"][:, -1], "next_text": text,
                "next_candidates": candidates}
    if hasattr(agent, "act_chunk"):
        return buf.sample_chunks(n, agent.chunk_horizon)
    return buf.sample(n)


def update(agent, batch: dict, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    metrics = agent.update(batch)
    assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics
    return metrics


def observations(n: int = B) -> np.ndarray:
    return np.random.default_rng(7).normal(size=(n, OBS)).astype(np.float32)


def module_tensors(agent) -> list[torch.Tensor]:
    return [t for module in agent._modules().values() for t in [*module.parameters(), *module.buffers()]]


def assert_same_state(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def test_the_registry_lists_every_algorithm():
    assert {"sac", "cql", "calql", "iql", "bc", "bc_diffusion", "bc_flow", "fql", "qc", "qc_fql", "dppo"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_act_shapes(name):
    agent = build(name)
    obs = observations()
    single = agent.act(obs[0], deterministic=True)
    assert single.dtype == np.float32 and single.shape == (ACT,)
    assert agent.act({STATE_KEY: obs[0]}, deterministic=True).shape == (ACT,)
    batch = agent.act(obs, deterministic=True)
    assert batch.dtype == np.float32 and batch.shape == (B, ACT)
    sampled = agent.act(obs, deterministic=False)
    assert sampled.shape == (B, ACT)
    for actions in (single, batch, sampled):
        assert np.isfinite(actions).all() and np.abs(actions).max() <= 1.0 + 1e-6
    np.testing.assert_array_equal(agent.act(obs, deterministic=True), batch)   # a function of the observation
    if hasattr(agent, "act_chunk"):   # the chunked-agent contract (embodied/agents/chunking.py)
        horizons = agent.chunk_horizon, agent.obs_horizon, agent.execute_horizon
        assert all(isinstance(h, int) and h >= 1 for h in horizons), horizons
        rows = agent.chunk_horizon - agent.obs_horizon + 1            # the chunk from the current step on
        assert agent.execute_horizon <= rows
        history = np.repeat(obs[:, None], agent.obs_horizon, axis=1)  # [B, To, obs]
        for deterministic in (True, False):
            chunk = agent.act_chunk(history, deterministic=deterministic)
            assert chunk.dtype == np.float32 and chunk.shape == (B, rows, ACT)
            assert np.isfinite(chunk).all() and np.abs(chunk).max() <= 1.0 + 1e-6
        # evaluation's mode: noise from a given stream, fresh at every call and repeatable per seed. A
        # fixed draw per batch row (the old evaluation) made success depend on the eval's batch width.
        stream = torch.Generator().manual_seed(7)
        first, second = (agent.act_chunk(history, deterministic=True, generator=stream) for _ in range(2))
        # the VLA's L1 and AR heads decode no noise, unless the agent draws samples to choose among (best-of-N)
        draws_noise = getattr(agent.actor, "head", "flow") == "flow" or getattr(agent, "stochastic_extraction", False)
        assert not np.allclose(first, second) if draws_noise else np.array_equal(first, second)
        np.testing.assert_array_equal(agent.act_chunk(history, deterministic=True,
                                                      generator=torch.Generator().manual_seed(7)), first)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_acts_and_trains_like_the_original(name, buffer):
    agent = build(name)
    untrained_keys = set(agent.state_dict())
    update(agent, training_batch(agent, buffer), seed=10)
    state = agent.state_dict()
    assert len(state) > len(untrained_keys)          # optimizer moments are part of it once they exist
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in state.values())
    state = st_load(st_save(state))                  # through safetensors, as checkpoints are written

    restored = build(name, init_seed=1)              # other initial weights, empty optimizers
    before = restored.state_dict()
    assert any(not torch.equal(v, state[k]) for k, v in before.items())
    restored.load_state_dict(state)
    assert_same_state(restored.state_dict(), agent.state_dict())

    obs = observations()
    np.testing.assert_array_equal(restored.act(obs, deterministic=True), agent.act(obs, deterministic=True))
    torch.manual_seed(5)
    sampled = agent.act(obs, deterministic=False)
    torch.manual_seed(5)
    np.testing.assert_array_equal(restored.act(obs, deterministic=False), sampled)

    batch = training_batch(agent, buffer, seed=1)    # one more step on both: the same metrics and weights
    assert update(restored, batch, seed=11) == update(agent, batch, seed=11)
    assert_same_state(restored.state_dict(), agent.state_dict())


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("name", NAMES)
def test_a_trained_state_moves_to_an_agent_on_a_device(name, device, buffer):
    source = build(name)
    update(source, training_batch(source, buffer), seed=10)
    target = build(name, device=device, init_seed=1)
    assert target.device == torch.device(device)
    assert all(t.device.type == device for t in module_tensors(target))
    target.load_state_dict(source.state_dict())
    assert all(t.device.type == device for t in module_tensors(target))
    assert_same_state(target.state_dict(), source.state_dict())   # a state_dict is always CPU tensors
    obs = observations()
    actions = target.act(obs, deterministic=True)
    assert isinstance(actions, np.ndarray) and actions.shape == (B, ACT) and np.isfinite(actions).all()
    if device == "cpu":
        np.testing.assert_array_equal(actions, source.act(obs, deterministic=True))
    update(target, training_batch(target, buffer, seed=1), seed=11)   # moments were moved too: it keeps learning
    assert all(t.device.type == device for t in module_tensors(target))
