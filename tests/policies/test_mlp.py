"""The fused ReLU MLP computes what the plain autograd path computes: values and every gradient."""
import pytest
import torch
from torch import nn

from embodied.agents.nets import CriticEnsemble, EnsembleMLP
from policies.mlp import MLP, matmul_wide, mlp


@pytest.mark.parametrize("a_shape,b_shape", [((5, 7), (7, 1)), ((5, 1), (1, 9)), ((3, 5, 7), (3, 7, 2)),
                                             ((3, 64, 16), (3, 16, 64)), ((2, 4, 1), (2, 1, 6)), ((9, 4), (4, 3))])
def test_matmul_wide_is_a_matmul_in_any_orientation(a_shape, b_shape):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(a_shape, generator=g), torch.randn(b_shape, generator=g)
    torch.testing.assert_close(matmul_wide(a, b), a @ b)
    # transposed views as operands (how the backward pass calls it)
    torch.testing.assert_close(matmul_wide(b.transpose(-1, -2), a.transpose(-1, -2)), (a @ b).transpose(-1, -2))


def test_only_thin_results_come_back_transposed():
    """A tall [rows, 256] result (CQL's 31 actions per state) must come back contiguous: as a transposed
    view it made the ReLU backward that reads it next ~10x slower. Thin ones keep the fast orientation."""
    tall = matmul_wide(torch.randn(2, 2000, 64), torch.randn(2, 64, 256))
    assert tall.is_contiguous()
    assert matmul_wide(torch.randn(2000, 64), torch.randn(64, 256)).is_contiguous()
    thin = matmul_wide(torch.randn(2, 2000, 64), torch.randn(2, 64, 11))   # an input gradient: turned
    assert not thin.is_contiguous() and thin.transpose(-1, -2).is_contiguous()


def _values_and_grads(module, inputs, forward):
    for p in module.parameters():
        p.grad = None
    for x in inputs:
        x.grad = None
    out = forward()
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()  # a non-uniform upstream grad
    return out.detach(), [None if p.grad is None else p.grad.clone() for p in module.parameters()], \
        [None if x.grad is None else x.grad.clone() for x in inputs]


@pytest.mark.parametrize("hidden,out_dim", [((32, 32), 6), ((16,), 1), ((8, 8, 8), 3)])
def test_fused_mlp_matches_sequential(hidden, out_dim):
    torch.manual_seed(0)
    net = mlp(11, hidden, out_dim)
    assert isinstance(net, MLP) and list(net.state_dict()) == list(nn.Sequential(*net).state_dict())
    x = torch.randn(64, 11, requires_grad=True)
    fused = _values_and_grads(net, [x], lambda: net(x))
    plain = _values_and_grads(net, [x], lambda: nn.Sequential.forward(net, x))
    assert type(net(x).grad_fn).__name__ == "_FusedReluMLPBackward"
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(fused[1] + fused[2], plain[1] + plain[2]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for p in net.parameters():  # gradients land in the parameters' own layout (no extra copy in Adam)
        assert p.grad.is_contiguous()


@pytest.mark.parametrize("obs_grad,act_grad,frozen", [(False, True, True), (False, False, False), (True, True, False),
                                                      (True, False, True)])
def test_fused_critic_ensemble_matches_plain_path(obs_grad, act_grad, frozen):
    torch.manual_seed(0)
    critic = CriticEnsemble(11, 3, (32, 32), num_critics=4)
    critic.requires_grad_(not frozen)
    obs = torch.randn(40, 11, requires_grad=obs_grad)
    act = torch.randn(40, 3, requires_grad=act_grad)

    def plain():  # EnsembleMLP's generic path: per-member batched matmuls under plain autograd
        x = torch.cat([obs, act], -1).unsqueeze(0).expand(4, -1, -1)
        for i, (w, b) in enumerate(zip(critic.net.weights, critic.net.biases)):
            x = torch.bmm(x, w) + b
            x = x.relu() if i < len(critic.net.weights) - 1 else x
        return x.squeeze(-1)

    fused = _values_and_grads(critic, [obs, act], lambda: critic(obs, act))
    expected = _values_and_grads(critic, [obs, act], plain)
    torch.testing.assert_close(fused[0], expected[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(fused[1] + fused[2], expected[1] + expected[2]):
        if want is None:
            assert got is None  # nobody asked: nothing computed (frozen critics, the data's observations)
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_fused_path_steps_aside_for_autocast_layernorm_and_per_member_inputs():
    torch.manual_seed(0)
    ens = EnsembleMLP(2, 5, (8,), 1)
    x = torch.randn(4, 5, requires_grad=True)
    assert type(ens(x).grad_fn).__name__ == "_FusedReluMLPBackward"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ens(x).dtype == torch.bfloat16  # autocast's casts keep working on the plain path
    assert "Fused" not in type(EnsembleMLP(2, 5, (8,), 1, layernorm=True)(x).grad_fn).__name__
    assert "Fused" not in type(ens(torch.randn(2, 4, 5, requires_grad=True)).grad_fn).__name__
    assert "Fused" not in type(mlp(5, (8,), 2, layernorm=True)(x).grad_fn).__name__
    assert "Fused" not in type(MLP(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))(x).grad_fn).__name__


def test_fused_mlp_second_call_and_double_use_of_one_output():
    """An output used twice gets the summed gradient; a retained graph can be backpropagated twice."""
    torch.manual_seed(0)
    net = mlp(3, (8,), 2)
    x = torch.randn(5, 3, requires_grad=True)
    y = net(x)
    (y.sum() + y.square().sum()).backward(retain_graph=True)
    first = x.grad.clone()
    x.grad = None
    (y.sum() + y.square().sum()).backward()
    torch.testing.assert_close(x.grad, first)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_check.sh)")
def test_fused_critic_on_cuda_matches_cpu():
    torch.manual_seed(0)
    critic = CriticEnsemble(11, 3, (64, 64), num_critics=2)
    obs, act = torch.randn(32, 11), torch.randn(32, 3)
    results = {}
    for device in ("cpu", "cuda"):
        critic.to(device)
        a = act.detach().to(device).requires_grad_(True)
        for p in critic.parameters():
            p.grad = None
        q = critic(obs.to(device), a)
        assert type(q.grad_fn.next_functions[0][0]).__name__ == "_FusedReluMLPBackward"
        q.square().sum().backward()
        results[device] = [t.detach().cpu() for t in (q, a.grad, *[p.grad for p in critic.parameters()])]
    for got, want in zip(results["cuda"], results["cpu"]):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
