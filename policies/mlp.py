"""ReLU MLPs whose forward and backward run as one autograd node, with matmuls oriented for CPU BLAS.

Why: at RL sizes (batch 256, 256x256) the hidden-layer matmuls run at the core's peak, but the thin
ones do not. On the AVX-512 dev machine, MKL takes ~90 us for a critic ensemble's 256->1 output layer
written as `bmm(h, w)` and ~10-20 us for the same product oriented as `w^T h^T`; the first layer's
weight gradient `dy^T x` (N = 11) takes 79 us against 23 us for `(x^T dy)^T`. Autograd's matmul
backward picks the orientation from the weight's layout, not from the shape. `fused_relu_mlp` picks
the wide orientation for every product, turns rank-1 products into broadcast multiplies, skips every
gradient nobody asked for (weight gradients of frozen critics, the observation's input gradient),
and saves the per-layer autograd bookkeeping. `benchmarks/update_speed.py` measures what it buys.

Same arithmetic as the plain path (tested to float tolerance, values and gradients); it runs only
where that plain path would be fp32 ReLU layers: no autocast, no LayerNorm.
"""
from __future__ import annotations

import torch
from torch import nn


THIN_MAX_COLS = 32  # results at most this wide (and taller than wide) are computed transposed


def matmul_wide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D or batched 3-D operands, oriented so the result's last dimension is the wide one.

    Only thin results (an output layer, an observation's input gradient) are turned: a [rows, 256] result
    at rows >> 256 (CQL's 31 actions per state) runs as fast either way, and its transposed view made the
    ReLU backward that reads it next ~10x slower (a strided pass against a contiguous mask)."""
    if a.shape[-1] == 1:  # rank-1 (outer) product: a broadcast multiply, no BLAS call
        return a * b
    if b.shape[-1] < a.shape[-2] and b.shape[-1] <= THIN_MAX_COLS:  # thin result: compute its transpose
        return _mm(b.transpose(-1, -2), a.transpose(-1, -2)).transpose(-1, -2)
    return _mm(a, b)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b) if a.ndim == 2 else torch.bmm(a, b)


class _FusedReluMLP(torch.autograd.Function):
    """y = L_k(relu(... relu(L_1([x, x2])))) with L_i(h) = h @ W_i + b_i.

    Weights are [in, out] (an `nn.Linear` weight's transpose, a view) or [N, in, out] for an ensemble
    of N members; biases broadcast against the layer output. A 2-D input to an ensemble is shared by
    all members. `x2` (optional) is concatenated to `x` on the last axis, so a critic's action can ask
    for its gradient without paying for the observation's.
    """

    @staticmethod
    def forward(ctx, x, x2, *params):
        num_layers = len(params) // 2
        weights, biases = params[:num_layers], params[num_layers:]
        inputs = torch.cat([x, x2], dim=-1) if x2 is not None else x
        ensemble = weights[0].ndim == 3
        shared = ensemble and inputs.ndim == 2
        h = inputs.unsqueeze(0).expand(weights[0].shape[0], -1, -1) if shared else inputs
        layer_inputs = []
        for i, (weight, bias) in enumerate(zip(weights, biases)):
            layer_inputs.append(h)
            h = matmul_wide(h, weight).add_(bias)
            if i < num_layers - 1:
                h = h.relu_()  # the saved post-ReLU activation is the next layer's input and this ReLU's mask
        ctx.save_for_backward(*layer_inputs, *params)
        ctx.shared, ctx.split = shared, x.shape[-1]
        return h

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        num_layers = len(saved) // 3
        layer_inputs, weights, biases = saved[:num_layers], saved[num_layers:2 * num_layers], saved[2 * num_layers:]
        needs = ctx.needs_input_grad
        need_x, need_x2 = needs[0], needs[1]
        weight_grads, bias_grads = [None] * num_layers, [None] * num_layers
        grad = grad_out.contiguous()
        grad_x = grad_x2 = None
        for i in reversed(range(num_layers)):
            if i < num_layers - 1:
                grad = torch.ops.aten.threshold_backward(grad, layer_inputs[i + 1], 0.0)
            if needs[2 + i]:
                weight_grads[i] = _like(matmul_wide(layer_inputs[i].transpose(-1, -2), grad), weights[i])
            if needs[2 + num_layers + i]:
                bias_grads[i] = grad.sum(-2).reshape(biases[i].shape)
            if i > 0:
                grad = matmul_wide(grad, weights[i].transpose(-1, -2))
        if need_x or need_x2:  # the first layer's input gradient, only for the parts that need one
            first, split = weights[0], ctx.split
            if need_x:
                grad_x = matmul_wide(grad, first[..., :split, :].transpose(-1, -2))
            if need_x2:
                grad_x2 = matmul_wide(grad, first[..., split:, :].transpose(-1, -2))
            if ctx.shared:
                grad_x = grad_x.sum(0) if grad_x is not None else None
                grad_x2 = grad_x2.sum(0) if grad_x2 is not None else None
        return (grad_x, grad_x2, *weight_grads, *bias_grads)


def _like(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The gradient in the parameter's memory layout, so autograd accumulates it without another copy."""
    if grad.stride() == param.stride():
        return grad
    return torch.empty_strided(param.shape, param.stride(), dtype=grad.dtype, device=grad.device).copy_(grad)


def fused_relu_mlp(x: torch.Tensor, weights, biases, x2: torch.Tensor | None = None) -> torch.Tensor:
    return _FusedReluMLP.apply(x, x2, *weights, *biases)


def fused_path_ok(x: torch.Tensor) -> bool:
    """The fused path computes in the weights' dtype; under autocast the plain path keeps autocast's casts."""
    return not torch.is_autocast_enabled(x.device.type)


class MLP(nn.Sequential):
    """Linear/ReLU stack (LayerNorm optional) with the state-dict keys of the `nn.Sequential` it is.

    Only a strict Linear, ReLU, ..., Linear stack takes the fused path; anything else (LayerNorm, other
    activations) runs as the plain `nn.Sequential` it is.
    """

    def __init__(self, *layers: nn.Module):
        super().__init__(*layers)
        kinds = [nn.Linear if i % 2 == 0 else nn.ReLU for i in range(len(layers))]
        self._linears = [layer for layer in layers if isinstance(layer, nn.Linear)]
        self.fusable = (len(layers) % 2 == 1 and all(type(layer) is kind for layer, kind in zip(layers, kinds))
                        and all(layer.bias is not None for layer in self._linears))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fusable or x.ndim != 2 or not fused_path_ok(x):
            return super().forward(x)
        linears = self._linears
        return fused_relu_mlp(x, [layer.weight.t() for layer in linears], [layer.bias for layer in linears])


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, layernorm: bool = False) -> MLP:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width)]
        if layernorm:
            layers += [nn.LayerNorm(width)]
        layers += [nn.ReLU()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return MLP(*layers)
