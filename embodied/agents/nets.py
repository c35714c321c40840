"""Building blocks shared by the agents: a fused critic ensemble and checkpoint flattening."""
from __future__ import annotations

import ctypes
import math
import os
import sys
from typing import Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from policies.mlp import fused_path_ok, fused_relu_mlp


class EnsembleMLP(nn.Module):
    """N independent MLPs evaluated as one batched matmul per layer (no Python loop over members).

    Weights are [N, in, out]; inputs [B, in] are shared by all members, [N, B, in] are per-member.
    `native_ops = True` runs torch's layer_norm and a one-column bmm for the head instead of the faster
    equivalents below: the reference that tests and `benchmarks/update_speed.py --layernorm-path` compare with.
    """
    native_ops = False

    def __init__(self, num_members: int, in_dim: int, hidden: tuple[int, ...], out_dim: int,
                 layernorm: bool = False, kernel_scale_final: float | None = None):
        super().__init__()
        self.num_members, self.layernorm = num_members, layernorm
        dims = [in_dim, *hidden, out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        self.ln_weights = nn.ParameterList()
        self.ln_biases = nn.ParameterList()
        for i, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
            weight = torch.empty(num_members, fan_in, fan_out)
            bound = 1.0 / math.sqrt(fan_in)  # torch.nn.Linear's default init, per member
            for member in weight:
                nn.init.kaiming_uniform_(member.T, a=math.sqrt(5))
            if kernel_scale_final is not None and i == len(dims) - 3:  # the last hidden layer (WSRL's MLP)
                weight.mul_(kernel_scale_final)
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(torch.empty(num_members, 1, fan_out).uniform_(-bound, bound)))
            if layernorm and i < len(dims) - 2:
                self.ln_weights.append(nn.Parameter(torch.ones(num_members, 1, fan_out)))
                self.ln_biases.append(nn.Parameter(torch.zeros(num_members, 1, fan_out)))

    def forward(self, x: torch.Tensor, x2: torch.Tensor | None = None, members: torch.Tensor | None = None) -> torch.Tensor:
        """x2 (optional) is concatenated to x; the fused path then skips x's input gradient.
        `members` (indices) evaluates only those ensemble members: [len(members), B, out]."""
        weights, biases = list(self.weights), list(self.biases)
        ln_weights, ln_biases = list(self.ln_weights), list(self.ln_biases)
        if members is not None:
            pick = lambda params: [p.index_select(0, members) for p in params]
            weights, biases, ln_weights, ln_biases = pick(weights), pick(biases), pick(ln_weights), pick(ln_biases)
        if not self.layernorm and x.ndim == 2 and fused_path_ok(x):
            return fused_relu_mlp(x, weights, biases, x2)
        if x2 is not None:
            x = torch.cat([x, x2], dim=-1)
        if x.ndim == 2:
            x = x.unsqueeze(0).expand(weights[0].shape[0], -1, -1)
        last = len(weights) - 1
        for i, (weight, bias) in enumerate(zip(weights, biases)):
            if i == last and weight.shape[-1] == 1 and self._fp32_fast(x):
                # one output (a Q or V head): multiply and sum. A one-column bmm and its backward (a rank-1
                # bmm) took 3x as long on CPU at 7,936 rows x 64 (benchmarks/RESULTS.md, "The main job's time")
                return (x * weight.transpose(1, 2)).sum(-1, keepdim=True).add_(bias)
            # bmm then an in-place bias add, not baddbmm: under bf16 autocast baddbmm first materialises
            # the broadcast bias in the output (bf16 CQL / d3rlpy 3.01x -> 3.06x, benchmarks/RESULTS.md)
            x = torch.bmm(x, weight)
            x = x.add_(bias.to(x.dtype))
            if i < last:
                if self.layernorm:  # statistics in fp32 (autocast's rule); affine in the matmul dtype
                    dtype = x.dtype
                    x = layer_norm_last_dim(x) if self._fp32_fast(x) else F.layer_norm(x, x.shape[-1:]).to(dtype)
                    x = torch.addcmul(ln_biases[i].to(dtype), x, ln_weights[i].to(dtype))
                x = torch.relu_(x)  # in place: neither bmm's, add_'s nor addcmul's backward needs its output
        return x

    def _fp32_fast(self, x: torch.Tensor) -> bool:
        """The faster LayerNorm and Q head are for fp32 outside autocast; under bf16 autocast torch's own ops
        were faster (benchmarks/RESULTS.md, "The main job's time")."""
        return x.dtype == torch.float32 and not self.native_ops and not torch.is_autocast_enabled(x.device.type)


class _LayerNormLastDim(torch.autograd.Function):
    """LayerNorm over the last dim, without affine parameters, for CPU tensors.

    torch's CPU layer_norm kernel took 2.3x as long as these five elementwise ops at width 64 (7,936 rows x 2
    members; benchmarks/RESULTS.md, "The main job's time"). The backward is torch's own kernel."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        centered = x - mean
        rstd = centered.square().mean(-1, keepdim=True).add_(eps).rsqrt_()
        ctx.save_for_backward(x, mean, rstd)
        return centered.mul_(rstd)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, mean, rstd = ctx.saved_tensors
        grad_x, _, _ = torch.ops.aten.native_layer_norm_backward(
            grad.contiguous(), x, x.shape[-1:], mean, rstd, None, None, [True, False, False])
        return grad_x, None


def layer_norm_last_dim(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """F.layer_norm(x, x.shape[-1:]) with no affine; on CPU the faster equivalent above."""
    if x.device.type == "cpu":
        return _LayerNormLastDim.apply(x, eps)
    return F.layer_norm(x, x.shape[-1:], eps=eps)


class CriticEnsemble(nn.Module):
    """Q(s, a) for N critics at once: returns [N, B]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...], num_critics: int,
                 layernorm: bool = False, kernel_scale_final: float | None = None):
        super().__init__()
        self.num_critics = num_critics
        self.net = EnsembleMLP(num_critics, obs_dim + act_dim, hidden, 1, layernorm, kernel_scale_final)

    def forward(self, obs: torch.Tensor, action: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(obs, action, members).squeeze(-1)


class ValueEnsemble(nn.Module):
    """V(s) for N members: returns [N, B] (IQL uses N=1)."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...], num_members: int = 1, layernorm: bool = False):
        super().__init__()
        self.net = EnsembleMLP(num_members, obs_dim, hidden, 1, layernorm)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)


_ALLOCATOR_TUNED = False


def tune_allocator() -> bool:
    """Keep freed CPU tensor memory inside the process instead of handing it back to the OS.

    glibc serves allocations above 128 KiB with fresh mmap pages and trims freed heap memory, so
    every large activation of every update page-faults again: ~10k faults per CQL update, which
    made it 1.6x slower on the 2-core dev machine. This raises the mmap threshold to glibc's maximum
    (32 MiB) and the trim threshold to 1 GiB: memory stays at its peak, which training wants anyway.
    Process-wide, idempotent, a no-op off glibc; set EMBODIED_NO_MALLOPT=1 to skip it.
    """
    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED or not sys.platform.startswith("linux") or os.environ.get("EMBODIED_NO_MALLOPT"):
        return _ALLOCATOR_TUNED
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    _ALLOCATOR_TUNED = bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))
    return _ALLOCATOR_TUNED


@torch.no_grad()
def mean_q(critic: nn.Module, obs, action, device) -> np.ndarray:
    """Ensemble-mean Q of numpy (state, action) rows: the runner's calibration diagnostic."""
    obs = torch.as_tensor(np.asarray(obs, np.float32), device=device)
    action = torch.as_tensor(np.asarray(action, np.float32), device=device)
    return critic(obs, action).float().mean(0).cpu().numpy()


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def adam(params, lr: float) -> torch.optim.Adam:
    """Adam with the fused kernel where this torch supports it (CPU and CUDA in torch >= 2.4)."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


@torch.no_grad()
def orthogonal_init_(module: nn.Module, gain: float = math.sqrt(2.0), last_hidden_gain: float | None = None) -> None:
    """WSRL's (jaxrl_m's) default init: every kernel orthogonal with `gain`, every bias 0; an ensemble's last hidden
    layer with `last_hidden_gain` instead when given (its `kernel_scale_final`). Works on nn.Linear stacks
    and on EnsembleMLP ([N, in, out] per member); LayerNorm parameters keep their 1 / 0."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.orthogonal_(sub.weight, gain)
            if sub.bias is not None:
                sub.bias.zero_()
        elif isinstance(sub, EnsembleMLP):
            last_hidden = len(sub.weights) - 2
            for i, (weight, bias) in enumerate(zip(sub.weights, sub.biases)):
                layer_gain = last_hidden_gain if (i == last_hidden and last_hidden_gain is not None) else gain
                for member in weight:
                    nn.init.orthogonal_(member, layer_gain)
                bias.zero_()


def multiplier(param: torch.Tensor, kind: str) -> torch.Tensor:
    """A positive multiplier (temperature, Lagrange weight) from its raw parameter: exp(p) or softplus(p)."""
    return param.exp() if kind == "exp" else F.softplus(param)


def multiplier_inverse(value: float, kind: str) -> float:
    """The raw parameter that gives `value` (> 0)."""
    return math.log(value) if kind == "exp" else math.log(math.expm1(value))


@torch.no_grad()
def adam_zero_grad_step(*optimizers: torch.optim.Optimizer) -> None:
    """One optimizer step with a zero gradient: Adam still moves each parameter by its decayed momentum."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = torch.zeros_like(param)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def split_batch(batch: Mapping[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    """`parts` equal slices along the batch axis (UTD minibatches); the batch must divide evenly."""
    size = len(next(iter(batch.values())))
    if parts < 1 or size % parts:
        raise ValueError(f"a batch of {size} rows does not split into {parts} equal minibatches")
    if parts == 1:
        return [dict(batch)]
    step = size // parts
    return [{k: v[i * step:(i + 1) * step] for k, v in batch.items()} for i in range(parts)]


def to_torch(batch: Mapping[str, np.ndarray | torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in batch.items():
        tensor = torch.as_tensor(value, device=device)
        out[key] = tensor.float() if tensor.dtype in (torch.float64, torch.bool, torch.uint8) else tensor
    return out
