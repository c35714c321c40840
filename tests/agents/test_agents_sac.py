"""SAC and its building blocks: fused ensemble, subset min, TD target, loss swap, checkpoints."""
import math

import pytest
import torch
from safetensors.torch import load as st_load, save as st_save
from torch import nn

from embodied.agents.bc import BC, BCConfig
from embodied.agents.cql import CQL, CQLConfig
from embodied.agents.iql import IQL, IQLConfig
from embodied.agents.nets import CriticEnsemble, EnsembleMLP, layer_norm_last_dim
from embodied.agents.sac import SAC, SACConfig


def _batch(obs_dim=3, act_dim=2, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(observations=torch.randn(size, obs_dim, generator=g),
                actions=torch.rand(size, act_dim, generator=g) * 2 - 1,
                rewards=torch.randn(size, generator=g), next_observations=torch.randn(size, obs_dim, generator=g),
                terminals=(torch.rand(size, generator=g) < 0.3).float(), mc_returns=torch.randn(size, generator=g))


@pytest.mark.parametrize("layernorm", [False, True])
@pytest.mark.parametrize("out_dim", [2, 1])  # 1: a Q head, computed as multiply-and-sum instead of a matmul
def test_ensemble_equals_loop_of_separate_mlps(layernorm, out_dim):
    torch.manual_seed(0)
    members, dims = 3, (5, 7, 6, out_dim)
    ens = EnsembleMLP(members, dims[0], dims[1:-1], dims[-1], layernorm)
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for p in [*ens.ln_weights, *ens.ln_biases]:
            p.add_(torch.randn_like(p) * 0.3)
    mlps = []
    for m in range(members):
        layers = []
        for i, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
            linear = nn.Linear(fan_in, fan_out)
            with torch.no_grad():
                linear.weight.copy_(ens.weights[i][m].T)
                linear.bias.copy_(ens.biases[i][m, 0])
            layers.append(linear)
            if i < len(dims) - 2:
                if layernorm:
                    norm = nn.LayerNorm(fan_out)
                    with torch.no_grad():
                        norm.weight.copy_(ens.ln_weights[i][m, 0])
                        norm.bias.copy_(ens.ln_biases[i][m, 0])
                    layers.append(norm)
                layers.append(nn.ReLU())
        mlps.append(nn.Sequential(*layers))

    shared = torch.randn(4, dims[0])
    per_member = torch.randn(members, 4, dims[0])
    expected_shared = torch.stack([mlp(shared) for mlp in mlps])
    torch.testing.assert_close(ens(shared), expected_shared, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ens(per_member), torch.stack([mlp(x) for mlp, x in zip(mlps, per_member)]),
                               rtol=1e-5, atol=1e-5)
    # gradients too: each member's weights get exactly its own MLP's gradient, and the input its sum
    shared.requires_grad_(True)
    ens(shared).square().sum().backward()
    ens_input_grad, shared.grad = shared.grad, None
    torch.stack([mlp(shared) for mlp in mlps]).square().sum().backward()
    torch.testing.assert_close(ens_input_grad, shared.grad, rtol=1e-4, atol=1e-5)
    for m, mlp in enumerate(mlps):
        linears = [layer for layer in mlp if isinstance(layer, nn.Linear)]
        norms = [layer for layer in mlp if isinstance(layer, nn.LayerNorm)]
        for weight, bias, linear in zip(ens.weights, ens.biases, linears):
            torch.testing.assert_close(weight.grad[m], linear.weight.grad.T, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(bias.grad[m, 0], linear.bias.grad, rtol=1e-4, atol=1e-5)
        for weight, bias, norm in zip(ens.ln_weights, ens.ln_biases, norms):
            torch.testing.assert_close(weight.grad[m, 0], norm.weight.grad, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(bias.grad[m, 0], norm.bias.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device,autocast", [("cpu", False), ("cpu", True), ("cuda", False)])
def test_layernorm_critic_matches_torch_native_ops(device, autocast, monkeypatch):
    """The CPU LayerNorm and the multiply-and-sum Q head give torch's layer_norm + bmm values and gradients."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (benchmarks/gpu_check.sh)")
    torch.manual_seed(0)
    critic = CriticEnsemble(4, 1, (64, 64), num_critics=2, layernorm=True, kernel_scale_final=0.01).to(device)
    with torch.no_grad():
        for p in [*critic.net.ln_weights, *critic.net.ln_biases]:
            p.add_(torch.randn_like(p) * 0.3)
    obs = (torch.randn(310, 4) * 3 + 1).to(device)
    act = (torch.rand(310, 1) * 2 - 1).to(device).requires_grad_(True)

    def values_and_grads():
        critic.zero_grad(set_to_none=True)
        act.grad = None
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            q = critic(obs, act)
        q.float().square().sum().backward()
        return q, [act.grad, *(p.grad for p in critic.parameters())]

    q, grads = values_and_grads()
    monkeypatch.setattr(EnsembleMLP, "native_ops", True)
    q_native, grads_native = values_and_grads()
    assert q.dtype == q_native.dtype == (torch.bfloat16 if autocast else torch.float32)
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(q, q_native, **tol)
    for got, want in zip(grads, grads_native):
        torch.testing.assert_close(got, want, **tol)


def test_cpu_layer_norm_matches_torch_layer_norm():
    x = (torch.randn(2, 33, 64, dtype=torch.float64) * 5 + 3).requires_grad_(True)
    grad_out = torch.randn_like(x)
    torch.testing.assert_close(layer_norm_last_dim(x), nn.functional.layer_norm(x, (64,)))
    (got,) = torch.autograd.grad(layer_norm_last_dim(x), x, grad_out)
    (want,) = torch.autograd.grad(nn.functional.layer_norm(x, (64,)), x, grad_out)
    torch.testing.assert_close(got, want)


def test_min_over_random_subset_of_size_k():
    agent = SAC(3, 2, SACConfig(hidden=(8,), num_critics=5, num_min=2), seed=0)
    q = torch.arange(5.0)[:, None].expand(5, 3)  # member i predicts i everywhere
    draws = torch.stack([agent.critic_subset_min(q) for _ in range(4000)])
    assert (draws == draws[:, :1]).all()  # one subset per call, shared by the whole batch
    freq = torch.bincount(draws[:, 0].long(), minlength=5).float() / len(draws)
    # min of 2 distinct members out of 5: P(min = i) = (4 - i) / 10
    torch.testing.assert_close(freq, torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0]), atol=0.03, rtol=0)
    full = SAC(3, 2, SACConfig(hidden=(8,), num_critics=2, num_min=2))
    assert torch.equal(full.critic_subset_min(torch.tensor([[1.0, 5.0], [2.0, 3.0]])), torch.tensor([1.0, 3.0]))


def test_td_target_bootstraps_on_timeouts_not_terminals():
    agent = SAC(3, 2, SACConfig(hidden=(8,), backup_entropy=False))
    with torch.no_grad():  # Q'(s, a) = 2 everywhere
        agent.target_critic.net.weights[-1].zero_()
        agent.target_critic.net.biases[-1].fill_(2.0)
    batch = dict(_batch(size=3), rewards=torch.tensor([1.0, 1.0, 1.0]), terminals=torch.tensor([0.0, 1.0, 0.0]),
                 timeouts=torch.tensor([0.0, 0.0, 1.0]))
    torch.testing.assert_close(agent.td_target(batch), torch.tensor([1 + 0.99 * 2, 1.0, 1 + 0.99 * 2]))

    entropic = SAC(3, 2, SACConfig(hidden=(8,), backup_entropy=True, init_temperature=0.5))
    entropic.target_critic.load_state_dict(agent.target_critic.state_dict())
    entropic.actor.sample_with_log_prob = lambda obs: (torch.zeros(len(obs), 2), torch.full((len(obs),), -1.0))
    torch.testing.assert_close(entropic.td_target(batch), torch.tensor([1 + 0.99 * 2.5, 1.0, 1 + 0.99 * 2.5]))


def _step_state(optimizer):
    return {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}


def test_from_agent_keeps_or_reinitialises_critic_and_optimizers():
    torch.manual_seed(0)
    cql = CQL(3, 2, CQLConfig(hidden=(8,), cql_n_actions=2))
    for _ in range(3):
        cql.update(_batch())
    online = SACConfig(hidden=(8,), actor_lr=1e-3, critic_lr=2e-3)

    kept = SAC.from_agent(cql, online)
    assert kept.actor is cql.actor and kept.critic is cql.critic and kept.target_critic is cql.target_critic
    assert kept.alpha_param is cql.alpha_param
    assert kept.critic_optimizer is cql.critic_optimizer and kept.actor_optimizer is cql.actor_optimizer
    assert _step_state(kept.critic_optimizer)["step"].item() == 3  # Adam moments carried over
    assert kept.actor_optimizer.param_groups[0]["lr"] == 1e-3 and kept.critic_optimizer.param_groups[0]["lr"] == 2e-3

    critic_before = {k: v.clone() for k, v in cql.critic.state_dict().items()}
    fresh = SAC.from_agent(cql, online, reinit_critic=True, reset_optimizers=True)
    assert fresh.actor is cql.actor and fresh.critic is not cql.critic
    assert any(not torch.equal(v, fresh.critic.state_dict()[k]) for k, v in critic_before.items())
    for k, v in fresh.critic.state_dict().items():
        assert torch.equal(v, fresh.target_critic.state_dict()[k])
    for opt in (fresh.actor_optimizer, fresh.critic_optimizer, fresh.alpha_optimizer):
        assert opt.state_dict()["state"] == {}
    assert fresh.actor_optimizer is not cql.actor_optimizer
    assert all(torch.equal(v, cql.critic.state_dict()[k]) for k, v in critic_before.items())  # source untouched

    reset_only = SAC.from_agent(cql, online, reset_optimizers=True)
    assert reset_only.critic is cql.critic and reset_only.critic_optimizer.state_dict()["state"] == {}
    metrics = reset_only.update(_batch())
    assert all(math.isfinite(v) for v in metrics.values())


def test_from_bc_and_iql_agents():
    bc = BC(3, 2, BCConfig(hidden=(8,)))
    bc.update(_batch())
    sac = SAC.from_agent(bc, SACConfig(hidden=(8,)), reinit_critic=True)
    assert sac.actor is bc.actor and sac.actor_optimizer is bc.actor_optimizer
    assert sac.alpha_param.requires_grad and sac.critic.num_critics == 2
    sac.update(_batch())
    iql = IQL(3, 2, IQLConfig(hidden=(8,)))
    iql.update(_batch())
    sac = SAC.from_agent(iql, SACConfig(hidden=(8,)))
    assert sac.critic is iql.critic and sac.actor is iql.actor
    sac.update(_batch())


@pytest.mark.parametrize("make", [
    lambda: SAC(3, 2, SACConfig(hidden=(8,), num_critics=4, num_min=4, critic_layernorm=True)),
    lambda: CQL(3, 2, CQLConfig(hidden=(8,), cql_n_actions=2, lagrange=True, calql=True)),
    lambda: IQL(3, 2, IQLConfig(hidden=(8,))),
    lambda: BC(3, 2, BCConfig(hidden=(8,))),
], ids=["sac", "calql-lagrange", "iql", "bc"])
def test_state_dict_round_trip_through_safetensors(make):
    torch.manual_seed(0)
    agent = make()
    for seed in range(3):
        agent.update(_batch(seed=seed))
    state = st_load(st_save(agent.state_dict()))
    torch.manual_seed(1)
    restored = make()
    restored.load_state_dict(state)
    for key, value in agent.state_dict().items():
        assert torch.equal(value, restored.state_dict()[key]), key
    # the restored agent continues exactly like the original (same weights, moments, step counts)
    torch.manual_seed(7)
    a = agent.update(_batch(seed=9))
    torch.manual_seed(7)
    b = restored.update(_batch(seed=9))
    assert a == b
    for key, value in agent.state_dict().items():
        assert torch.equal(value, restored.state_dict()[key]), key


@pytest.mark.parametrize("bf16", [False, True])
def test_sac_update_runs_and_moves_weights(bf16):
    torch.manual_seed(0)
    agent = SAC(3, 2, SACConfig(hidden=(16,), num_critics=4, num_min=2, critic_layernorm=True, bf16=bf16))
    before = [p.clone() for p in agent.critic.parameters()]
    metrics = agent.update(_batch())
    assert all(math.isfinite(v) for v in metrics.values())
    assert all(not torch.equal(a, b) for a, b in zip(before, agent.critic.parameters()))


def test_orthogonal_init_matches_wsrl_kernels_and_zero_biases():
    """WSRL's networks start orthogonal (gain sqrt 2), biases 0, the critic's last hidden layer at gain 1e-2."""
    torch.manual_seed(0)
    cfg = SACConfig(hidden=(32, 32), num_critics=3, critic_layernorm=True, critic_kernel_scale_final=0.01,
                    actor_layernorm=True, init="orthogonal")
    agent = SAC(3, 2, cfg)
    gains = [math.sqrt(2.0), 0.01, math.sqrt(2.0)]
    for weight, bias, gain in zip(agent.critic.net.weights, agent.critic.net.biases, gains):
        for member in weight:  # [in, out]: orthonormal along the shorter side, scaled by the gain
            gram = member @ member.T if member.shape[0] <= member.shape[1] else member.T @ member
            torch.testing.assert_close(gram, gain ** 2 * torch.eye(len(gram)), atol=1e-5, rtol=1e-4)
        assert bias.abs().max() == 0
    linears = [m for m in agent.actor.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 3
    for linear in linears:
        w = linear.weight
        gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        torch.testing.assert_close(gram, 2.0 * torch.eye(len(gram)), atol=1e-5, rtol=1e-4)
        assert linear.bias.abs().max() == 0
    default = SAC(3, 2, SACConfig(hidden=(32, 32)))
    assert default.critic.net.biases[0].abs().max() > 0  # PyTorch's default init keeps nonzero biases


def test_zero_grad_adam_steps_move_the_frozen_networks_by_momentum_only_in_split_updates():
    """WSRL's critic-only minibatches also step the actor's Adam with a zero gradient (jaxrl_m's
    networks_to_update); a joint update (UTD 1) is one step of each optimizer either way."""
    batch = _batch(size=32)

    def run(flag: bool, utd: int, actor: bool):
        torch.manual_seed(0)
        agent = SAC(3, 2, SACConfig(hidden=(16, 16), zero_grad_adam_steps=flag), seed=0)
        agent.update(batch)  # builds Adam momentum in every network
        before = [p.detach().clone() for p in agent.actor.parameters()]
        agent.update(batch, utd=utd, actor=actor)
        moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(agent.actor.parameters(), before))
        return moved, [p.detach().clone() for p in agent.actor.parameters()], agent

    assert run(False, 2, actor=False)[0] == 0  # critic only: the actor stays put
    assert run(True, 2, actor=False)[0] > 0    # ... unless its momentum is stepped
    _, joint_off, agent_off = run(False, 1, actor=True)
    _, joint_on, agent_on = run(True, 1, actor=True)
    for a, b in zip(joint_off, joint_on):       # UTD 1: identical updates with or without the flag
        torch.testing.assert_close(a, b)
    _, split_off, _ = run(False, 4, actor=True)
    _, split_on, agent_split = run(True, 4, actor=True)
    assert any(not torch.equal(a, b) for a, b in zip(split_off, split_on))
    steps = lambda agent, name: int(next(iter(getattr(agent, name).state.values()))["step"])
    assert steps(agent_split, "actor_optimizer") == 1 + 5  # 4 momentum steps + 1 real one in the split update
    assert steps(agent_split, "critic_optimizer") == 1 + 5  # 4 real + 1 momentum
    assert steps(agent_on, "actor_optimizer") == steps(agent_off, "actor_optimizer") == 2


@pytest.mark.parametrize("entropy_obs", ["observations", "next_observations"])
def test_temperature_entropy_is_taken_where_configured(entropy_obs):
    """WSRL's temperature loss uses actions sampled at s': only then does next_observations move the temperature."""
    def alpha_param_after(next_scale: float) -> float:
        torch.manual_seed(0)
        agent = SAC(3, 2, SACConfig(hidden=(16, 16), temperature_entropy_obs=entropy_obs), seed=0)
        batch = _batch(size=64)
        batch["next_observations"] = batch["next_observations"] * next_scale
        # plain SGD: the step is the gradient itself (Adam's first step is +-lr whatever the entropy)
        agent.alpha_optimizer = torch.optim.SGD([agent.alpha_param], lr=1.0)
        agent.update_actor_and_alpha(batch)
        return float(agent.alpha_param.detach())

    assert alpha_param_after(1.0) == alpha_param_after(1.0)
    differs = alpha_param_after(1.0) != alpha_param_after(50.0)
    assert differs == (entropy_obs == "next_observations")


def test_bad_init_or_entropy_obs_is_a_one_line_config_error():
    from embodied.errors import ConfigError
    with pytest.raises(ConfigError, match="init='xavier'"):
        SACConfig(init="xavier")
    with pytest.raises(ConfigError, match="temperature_entropy_obs='s2'"):
        SACConfig(temperature_entropy_obs="s2")


def test_checkpoint_scalars_load_by_name_and_a_missing_one_is_an_error():
    """Checkpoints from before `multiplier_param` named the exp temperature `log_alpha`: they still load; a
    checkpoint without the temperature (or a softplus agent fed an exp-era one) is refused, not silently reset."""
    from embodied.errors import CheckpointError
    agent = SAC(3, 2, SACConfig(hidden=(8,), init_temperature=0.3))
    old = {("log_alpha" if k == "alpha_param" else k): v for k, v in agent.state_dict().items()}
    fresh = SAC(3, 2, SACConfig(hidden=(8,)))
    fresh.load_state_dict(old)
    assert float(fresh.alpha()) == pytest.approx(0.3)
    softplus = SAC(3, 2, SACConfig(hidden=(8,), multiplier_param="softplus"))
    with pytest.raises(CheckpointError, match="no 'alpha_param'"):
        softplus.load_state_dict(old)
