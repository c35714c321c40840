"""Networks that map a noisy action chunk, a noise level and an observation to a chunk-shaped output
(the noise for diffusion, the velocity for flow matching).

    net(x [B, H, A], t [B] in [0, 1], cond [B, C]) -> [B, H, A]

Three sizes of inductive bias, chosen by name in the policy config:
- "mlp": the chunk flattened; cheap, the right choice for short chunks and state inputs (Q-chunking, FQL).
- "unet": Diffusion Policy's 1D temporal U-Net; residual conv blocks along time with FiLM conditioning,
  so neighbouring actions come out smooth.
- "transformer": a small encoder over one conditioning token plus one token per action.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from embodied.errors import ConfigError


class SinusoidalEmbedding(nn.Module):
    """t in [0, 1] -> [B, dim] sin/cos features (t scaled by 1000 so DDPM's integer steps separate)."""

    def __init__(self, dim: int):
        super().__init__()
        half = dim // 2
        self.register_buffer("freqs", torch.exp(-math.log(10_000.0) * torch.arange(half) / max(half - 1, 1)),
                             persistent=False)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        angles = 1000.0 * t.float()[:, None] * self.freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class MLPDenoiser(nn.Module):
    def __init__(self, horizon: int, act_dim: int, cond_dim: int, hidden: tuple[int, ...] = (512, 512, 512),
                 time_dim: int = 32, layernorm: bool = True):
        super().__init__()
        self.horizon, self.act_dim = horizon, act_dim
        self.time = SinusoidalEmbedding(time_dim)
        layers: list[nn.Module] = []
        width = horizon * act_dim + time_dim + cond_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.LayerNorm(h) if layernorm else nn.Identity(), nn.Mish()]
            width = h
        layers.append(nn.Linear(width, horizon * act_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = torch.cat([x.flatten(1), self.time(t), cond], dim=-1)
        return self.net(h).view(-1, self.horizon, self.act_dim)


class _ConvBlock(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int, groups: int):
        super().__init__(nn.Conv1d(cin, cout, kernel, padding=kernel // 2), nn.GroupNorm(groups, cout), nn.Mish())


class _FiLMResBlock(nn.Module):
    """Two conv blocks; the conditioning vector scales and shifts the first one's output per channel."""

    def __init__(self, cin: int, cout: int, cond_dim: int, kernel: int, groups: int):
        super().__init__()
        self.block1, self.block2 = _ConvBlock(cin, cout, kernel, groups), _ConvBlock(cout, cout, kernel, groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * cout))
        self.skip = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(cond)[..., None].chunk(2, dim=1)
        h = self.block1(x) * (1 + scale) + shift
        return self.block2(h) + self.skip(x)


class UNet1DDenoiser(nn.Module):
    def __init__(self, horizon: int, act_dim: int, cond_dim: int, channels: tuple[int, ...] = (64, 128),
                 time_dim: int = 64, kernel: int = 5, groups: int = 8):
        super().__init__()
        self.horizon, self.act_dim = horizon, act_dim
        self.levels = len(channels) - 1
        multiple = 2 ** self.levels
        self.padded = -(-horizon // multiple) * multiple  # pad time so every downsample halves evenly
        self.time = nn.Sequential(SinusoidalEmbedding(time_dim), nn.Linear(time_dim, 4 * time_dim), nn.Mish(),
                                  nn.Linear(4 * time_dim, time_dim))
        c = time_dim + cond_dim
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        cin = act_dim
        for i, cout in enumerate(channels):
            self.down.append(nn.ModuleList([_FiLMResBlock(cin, cout, c, kernel, groups),
                                            _FiLMResBlock(cout, cout, c, kernel, groups)]))
            self.downsample.append(nn.Conv1d(cout, cout, 3, 2, 1) if i < self.levels else nn.Identity())
            cin = cout
        self.mid = nn.ModuleList([_FiLMResBlock(cin, cin, c, kernel, groups), _FiLMResBlock(cin, cin, c, kernel, groups)])
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for cout, cskip in zip(reversed(channels[:-1]), reversed(channels[1:])):
            self.up.append(nn.ModuleList([_FiLMResBlock(cskip * 2, cout, c, kernel, groups),
                                          _FiLMResBlock(cout, cout, c, kernel, groups)]))
            self.upsample.append(nn.ConvTranspose1d(cout, cout, 4, 2, 1))
        self.final = nn.Sequential(_ConvBlock(channels[0], channels[0], kernel, groups), nn.Conv1d(channels[0], act_dim, 1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = F.pad(x.transpose(1, 2), (0, self.padded - self.horizon))  # [B, A, T]
        c = torch.cat([self.time(t), cond], dim=-1)
        skips = []
        for (b1, b2), down in zip(self.down, self.downsample):
            h = b2(b1(h, c), c)
            skips.append(h)
            h = down(h)
        for block in self.mid:
            h = block(h, c)
        for (b1, b2), up in zip(self.up, self.upsample):  # the shallowest skip goes unused, as in Diffusion Policy
            h = b2(b1(torch.cat([h, skips.pop()], dim=1), c), c)
            h = up(h)
        return self.final(h)[..., : self.horizon].transpose(1, 2)


class TransformerDenoiser(nn.Module):
    def __init__(self, horizon: int, act_dim: int, cond_dim: int, d_model: int = 128, layers: int = 2,
                 heads: int = 4, time_dim: int = 64):
        super().__init__()
        self.horizon, self.act_dim = horizon, act_dim
        self.time = SinusoidalEmbedding(time_dim)
        self.cond_token = nn.Sequential(nn.Linear(time_dim + cond_dim, d_model), nn.Mish(), nn.Linear(d_model, d_model))
        self.action_in = nn.Linear(act_dim, d_model)
        self.position = nn.Parameter(torch.randn(1, horizon + 1, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, act_dim))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        token = self.cond_token(torch.cat([self.time(t), cond], dim=-1))[:, None]
        h = torch.cat([token, self.action_in(x)], dim=1) + self.position
        return self.out(self.encoder(h)[:, 1:])


DENOISERS = {"mlp": MLPDenoiser, "unet": UNet1DDenoiser, "transformer": TransformerDenoiser}


def make_denoiser(name: str, horizon: int, act_dim: int, cond_dim: int, **kwargs) -> nn.Module:
    if name not in DENOISERS:
        raise ConfigError(f"denoiser={name!r} is unknown; valid: {', '.join(sorted(DENOISERS))}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    try:
        return DENOISERS[name](horizon, act_dim, cond_dim, **kwargs)
    except TypeError as err:
        raise ConfigError(f"denoiser_kwargs {sorted(kwargs)} do not fit denoiser={name} ({err})") from None
