"""TD-MPC2's world model and its MPPI planner, as a deployable policy (`policies.load` rebuilds it).

The model is decoder-free: an encoder maps the observation to a latent z made of groups of
`simnorm_dim` numbers that each sum to one (SimNorm), and everything else works on z:

    z' = d(z, a)                  latent dynamics (SimNorm output)
    r  = R(z, a)                  reward, as logits over `num_bins` bins in symlog space
    Q_i(z, a), i < num_q          Q ensemble, the same discrete regression (dropout on the first layer)
    a ~ pi(z)                     policy prior: tanh-squashed Gaussian
    p_end(z')                     termination probability (only with `episodic`)

Every network is Linear -> LayerNorm -> Mish stacks (TD-MPC2's recipe). Scalars are read from logits
as symexp(sum_k softmax(logits)_k * bin_k); targets are written as the two bins around symlog(x).

`act` plans with MPPI over `plan_horizon` latent steps: `num_pi_trajs` rollouts of the policy prior
plus Gaussian samples around a mean, scored by
    G = sum_t gamma^t r_t + gamma^H Q(z_H, pi(z_H))      (mean of two random Q heads)
and refitted `iterations` times to the softmax(temperature * G)-weighted top `num_elites`. The mean
starts from the previous call's plan shifted one step (the warm start), so a rollout's steps chain.
The training losses are in `embodied/agents/tdmpc2.py`; this module only holds what acting needs.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from embodied.constants import IMAGES_PREFIX
from embodied.errors import ConfigError
from policies.base import Policy, state_of
from policies.registry import register

PLAN_ROWS = 1 << 16  # latent rollouts per batched MPPI pass: bounds memory when many states plan at once


# -- discrete regression in symlog space -------------------------------------------------------------

def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.expm1(x.abs())


def two_hot(x: torch.Tensor, num_bins: int, vmin: float, vmax: float) -> torch.Tensor:
    """[...] scalars -> [..., num_bins] targets: symlog(x), clipped to [vmin, vmax], split linearly
    between its two neighbouring bins (weights sum to one, and decode back to x inside the range)."""
    width = (vmax - vmin) / (num_bins - 1)
    pos = (symlog(x).clamp(vmin, vmax) - vmin) / width
    low = pos.floor().clamp(0, num_bins - 2)
    upper = (pos - low).unsqueeze(-1)
    out = torch.zeros(*x.shape, num_bins, device=x.device, dtype=x.dtype)
    index = low.long().unsqueeze(-1)
    out.scatter_(-1, index, 1.0 - upper)
    return out.scatter_(-1, index + 1, upper)


def two_hot_inv(logits: torch.Tensor, vmin: float, vmax: float) -> torch.Tensor:
    """[..., num_bins] logits -> [...] scalars: the expected bin under softmax, mapped back by symexp."""
    bins = torch.linspace(vmin, vmax, logits.shape[-1], device=logits.device, dtype=logits.dtype)
    return symexp(F.softmax(logits, dim=-1) @ bins)


def soft_ce(logits: torch.Tensor, target: torch.Tensor, vmin: float, vmax: float) -> torch.Tensor:
    """Cross-entropy of [..., bins] logits against the two-hot encoding of [...] scalar targets."""
    return -(two_hot(target, logits.shape[-1], vmin, vmax) * F.log_softmax(logits, dim=-1)).sum(-1)


# -- layers --------------------------------------------------------------------------------------------

class SimNorm(nn.Module):
    """Softmax over consecutive groups of `dim` features: the latent lives on a product of simplices,
    which bounds it and keeps long latent rollouts from drifting in scale."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return F.softmax(x.reshape(*shape[:-1], -1, self.dim), dim=-1).reshape(shape)


def mish(x: torch.Tensor) -> torch.Tensor:
    """x tanh(softplus(x)). On large tensors that need no gradient (planning) it is computed in place as
    x n / (n + 2), n = e^x (e^x + 2): the same values, 2-3x faster than aten's mish on CPU (on small ones
    the extra op calls cost more than they save)."""
    if x.requires_grad or x.numel() < 16384:
        return F.mish(x)
    e = x.clamp(max=20.0).exp_()
    n = e.mul_(e + 2.0)
    return n.div_(n + 2.0).mul_(x)


class Mish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mish(x)


class NormedLinear(nn.Sequential):
    """Linear -> (dropout) -> LayerNorm -> activation (Mish unless told otherwise)."""

    def __init__(self, in_dim: int, out_dim: int, act: nn.Module | None = None, dropout: float = 0.0):
        layers = [nn.Linear(in_dim, out_dim)]
        if dropout:
            layers.append(nn.Dropout(dropout))
        super().__init__(*layers, nn.LayerNorm(out_dim), act if act is not None else Mish())


def mlp(in_dim: int, hidden: list[int], out_dim: int, out_act: nn.Module | None = None) -> nn.Sequential:
    """Normed hidden layers; the output layer is plain Linear, or normed with `out_act` (SimNorm)."""
    dims = [in_dim, *hidden]
    layers = [NormedLinear(a, b) for a, b in zip(dims[:-1], dims[1:])]
    layers.append(NormedLinear(dims[-1], out_dim, out_act) if out_act is not None else nn.Linear(dims[-1], out_dim))
    return nn.Sequential(*layers)


def trunc_normal_init(module: nn.Module) -> None:
    """TD-MPC2's init: weights ~ N(0, 0.02^2) (trunc_normal_'s default cut at +-2 is 100 std away), zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        nn.init.zeros_(module.bias)


class QEnsemble(nn.Module):
    """`num_q` Q networks (Linear-LN-Mish x2, Linear) as one batched matmul per layer: [M, in] -> [N, M, out].

    Dropout acts on the first layer's output in training mode; `members` evaluates only those heads."""

    def __init__(self, num_q: int, in_dim: int, hidden: int, out_dim: int, dropout: float):
        super().__init__()
        self.dropout = dropout
        dims = [in_dim, hidden, hidden, out_dim]
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(num_q, a, b)) for a, b in zip(dims[:-1], dims[1:]))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(num_q, 1, b)) for b in dims[1:])
        self.ln_weights = nn.ParameterList(nn.Parameter(torch.ones(num_q, 1, hidden)) for _ in range(2))
        self.ln_biases = nn.ParameterList(nn.Parameter(torch.zeros(num_q, 1, hidden)) for _ in range(2))
        for weight in self.weights[:-1]:
            nn.init.trunc_normal_(weight, std=0.02)
        nn.init.zeros_(self.weights[-1])  # zero output layer: every head starts at Q = 0

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        pick = (lambda p: p) if members is None else (lambda p: p.index_select(0, members))
        h = x.unsqueeze(0)
        for i in range(3):
            h = torch.matmul(h, pick(self.weights[i])) + pick(self.biases[i])
            if i < 2:
                if i == 0 and self.dropout and self.training:
                    h = F.dropout(h, self.dropout, training=True)
                h = F.layer_norm(h, h.shape[-1:]) * pick(self.ln_weights[i]) + pick(self.ln_biases[i])
                h = mish(h)
        return h


class ShiftAug(nn.Module):
    """Random shifts of up to `pad` pixels (replicate padding, then a crop), in training mode only."""

    def __init__(self, pad: int = 3):
        super().__init__()
        self.pad = pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        n, _, h, w = x.shape
        padded = F.pad(x, (self.pad,) * 4, mode="replicate")
        shift = torch.randint(0, 2 * self.pad + 1, (n, 2), device=x.device)
        rows = (shift[:, :1] + torch.arange(h, device=x.device))[:, None, :, None]   # [n, 1, h, 1]
        cols = (shift[:, 1:] + torch.arange(w, device=x.device))[:, None, None, :]   # [n, 1, 1, w]
        batch = torch.arange(n, device=x.device)[:, None, None, None]
        channel = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        return padded[batch, channel, rows, cols]


def conv_encoder(image_shape: tuple[int, int, int], channels: int, simnorm_dim: int) -> nn.Sequential:
    """TD-MPC2's pixel encoder for 64x64 frames: shift augmentation, 4 ReLU convolutions, SimNorm."""
    return nn.Sequential(
        ShiftAug(), nn.Conv2d(image_shape[0], channels, 7, stride=2), nn.ReLU(),
        nn.Conv2d(channels, channels, 5, stride=2), nn.ReLU(), nn.Conv2d(channels, channels, 3, stride=2), nn.ReLU(),
        nn.Conv2d(channels, channels, 3, stride=1), nn.Flatten(), SimNorm(simnorm_dim))


def conv_out_dim(image_shape: tuple[int, int, int], channels: int) -> int:
    size = image_shape[1]
    for kernel, stride in ((7, 2), (5, 2), (3, 2), (3, 1)):
        size = (size - kernel) // stride + 1
    return channels * size * size


def check_settings(s: dict, obs_dim: int | None = None) -> None:
    """One-line ConfigErrors for settings the model or the planner cannot use."""
    if s["obs_type"] not in ("state", "rgb"):
        raise ConfigError(f"obs_type={s['obs_type']!r} must be 'state' or 'rgb'")
    if s["latent_dim"] % s["simnorm_dim"]:
        raise ConfigError(f"latent_dim={s['latent_dim']} must be a multiple of simnorm_dim={s['simnorm_dim']}")
    if s["obs_type"] == "rgb":
        shape = tuple(int(v) for v in s["image_shape"])
        if len(shape) != 3:
            raise ConfigError(f"image_shape={list(shape)} must be [channels, height, width]")
        if obs_dim is not None and obs_dim != int(np.prod(shape)):
            raise ConfigError(f"obs_type=rgb needs obs_dim = C*H*W = {int(np.prod(shape))} (flattened frames), "
                              f"got {obs_dim}")
        out = conv_out_dim(shape, s["num_channels"])
        if out != s["latent_dim"]:
            raise ConfigError(f"obs_type=rgb: the conv encoder gives {out} features for {list(shape)}; "
                              f"set latent_dim={out}")
    if s["num_bins"] < 2 or not s["vmin"] < s["vmax"]:
        raise ConfigError(f"num_bins={s['num_bins']}, vmin={s['vmin']}, vmax={s['vmax']}: need >= 2 bins and "
                          "vmin < vmax")
    if s["num_q"] < 2:
        raise ConfigError(f"num_q={s['num_q']} must be >= 2 (targets use two random Q heads)")
    if not 0 < s["min_std"] <= s["max_std"]:
        raise ConfigError(f"min_std={s['min_std']}, max_std={s['max_std']}: need 0 < min_std <= max_std")
    for name in ("plan_horizon", "iterations", "num_samples", "num_elites"):
        if s.get(name, 1) < 1:
            raise ConfigError(f"{name}={s[name]} must be >= 1")
    if s["num_pi_trajs"] < 0 or s["temperature"] <= 0:
        raise ConfigError(f"num_pi_trajs={s['num_pi_trajs']} must be >= 0 and temperature={s['temperature']} > 0")


# -- the policy: world model + MPPI --------------------------------------------------------------------

@register("tdmpc2")
class TDMPC2Policy(Policy):
    """World model and MPPI planner. `act(obs)` -> [1, A] for one observation, [B, 1, A] for a batch.

    `obs_type="rgb"`: observations are frames, flattened CHW ([obs_dim] = C*H*W values in 0..255) or given
    as `observation.images.<camera>` (HWC uint8) in the observation dict."""

    def __init__(self, obs_dim: int, act_dim: int, latent_dim: int = 512, enc_dim: int = 256, num_enc_layers: int = 2,
                 mlp_dim: int = 512, num_q: int = 5, dropout: float = 0.01, simnorm_dim: int = 8, num_bins: int = 101,
                 vmin: float = -10.0, vmax: float = 10.0, log_std_min: float = -10.0, log_std_max: float = 2.0,
                 episodic: bool = False, obs_type: str = "state", image_shape=(3, 64, 64), num_channels: int = 32,
                 mpc: bool = True, plan_horizon: int = 3, iterations: int = 6, num_samples: int = 512,
                 num_elites: int = 64, num_pi_trajs: int = 24, min_std: float = 0.05, max_std: float = 2.0,
                 temperature: float = 0.5, gamma: float = 0.99, plan_seed: int = 0):
        super().__init__()
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.settings = dict(
            latent_dim=int(latent_dim), enc_dim=int(enc_dim), num_enc_layers=int(num_enc_layers), mlp_dim=int(mlp_dim),
            num_q=int(num_q), dropout=float(dropout), simnorm_dim=int(simnorm_dim), num_bins=int(num_bins),
            vmin=float(vmin), vmax=float(vmax), log_std_min=float(log_std_min), log_std_max=float(log_std_max),
            episodic=bool(episodic), obs_type=str(obs_type), image_shape=[int(s) for s in image_shape],
            num_channels=int(num_channels), mpc=bool(mpc), plan_horizon=int(plan_horizon), iterations=int(iterations),
            num_samples=int(num_samples), num_elites=int(num_elites), num_pi_trajs=int(num_pi_trajs),
            min_std=float(min_std), max_std=float(max_std), temperature=float(temperature), gamma=float(gamma),
            plan_seed=int(plan_seed))
        for key, value in self.settings.items():
            setattr(self, key, value)
        check_settings(self.settings, self.obs_dim)
        if self.act_dim >= 20:  # TD-MPC2: two more MPPI iterations for large action spaces
            self.iterations += 2
        L, A, H = self.latent_dim, self.act_dim, self.mlp_dim
        if self.obs_type == "rgb":
            self.encoder = conv_encoder(tuple(self.image_shape), self.num_channels, self.simnorm_dim)
        else:
            hidden = [self.enc_dim] * max(self.num_enc_layers - 1, 1)
            self.encoder = mlp(self.obs_dim, hidden, L, SimNorm(self.simnorm_dim))
        self.dynamics = mlp(L + A, [H, H], L, SimNorm(self.simnorm_dim))
        self.reward = mlp(L + A, [H, H], self.num_bins)
        self.termination = mlp(L, [H, H], 1) if self.episodic else None
        self.pi_net = mlp(L, [H, H], 2 * A)
        self.q = QEnsemble(self.num_q, L + A, H, self.num_bins, self.dropout)
        for module in (self.encoder, self.dynamics, self.reward, self.termination, self.pi_net):
            if module is not None:
                module.apply(trunc_normal_init)
        nn.init.zeros_(self.reward[-1].weight)  # reward predictions start at 0
        self._warm: dict[bool, tuple] = {}   # deterministic? -> (obs, warm start used, plan mean) of the last call

    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, act_dim=self.act_dim, **self.settings)

    # -- the model's pieces ---------------------------------------------------------------------------
    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_type == "rgb":
            frames = obs.reshape(-1, *self.image_shape) / 255.0 - 0.5
            return self.encoder(frames).reshape(*obs.shape[:-1], self.latent_dim)
        return self.encoder(obs)

    def next(self, z: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.dynamics(torch.cat([z, action], -1))

    def reward_logits(self, z: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.reward(torch.cat([z, action], -1))

    def q_logits(self, z: torch.Tensor, action: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """[..., L], [..., A] -> [heads, ..., num_bins]."""
        x = torch.cat([z, action], -1)
        out = self.q(x.reshape(-1, x.shape[-1]), members)
        return out.reshape(out.shape[0], *x.shape[:-1], out.shape[-1])

    def q_value(self, z: torch.Tensor, action: torch.Tensor, reduce: str = "avg", generator=None) -> torch.Tensor:
        """Mean ("avg") or min of two randomly chosen Q heads, as scalars."""
        heads = torch.randperm(self.num_q, generator=generator, device=z.device)[:2]
        q = two_hot_inv(self.q_logits(z, action, heads), self.vmin, self.vmax)
        return q.mean(0) if reduce == "avg" else q.min(0).values

    def pi(self, z: torch.Tensor, generator=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A reparameterised sample, its log-density (tanh Jacobian included) and tanh(mean)."""
        mean, raw = self.pi_net(z).chunk(2, -1)
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (torch.tanh(raw) + 1)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        action = torch.tanh(mean + noise * log_std.exp())
        # TD-MPC2's squash correction, log(1 - tanh^2 + 1e-6): bounded at saturation, unlike the exact Jacobian
        log_det = torch.log(F.relu(1.0 - action.square()) + 1e-6)
        log_prob = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi) - log_det).sum(-1)
        return action, log_prob, torch.tanh(mean)

    def end_probability(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.termination(z)).squeeze(-1)

    # -- planning -------------------------------------------------------------------------------------
    @torch.no_grad()
    def estimate_value(self, z: torch.Tensor, actions: torch.Tensor, generator=None) -> torch.Tensor:
        """Discounted model return of [H, M, A] action sequences from [M, L] latents, plus the
        terminal value; a rollout predicted to end (episodic) collects nothing after it."""
        value, discount = torch.zeros(z.shape[0], device=z.device), 1.0
        alive = torch.ones_like(value)
        for action in actions:
            za = torch.cat([z, action], -1)
            value = value + discount * alive * two_hot_inv(self.reward(za), self.vmin, self.vmax)
            z = self.dynamics(za)
            discount *= self.gamma
            if self.termination is not None:
                alive = alive * (self.end_probability(z) <= 0.5)
        final, _, _ = self.pi(z, generator)
        return value + discount * alive * self.q_value(z, final, "avg", generator)

    @torch.no_grad()
    def plan(self, obs: torch.Tensor, deterministic: bool, warm: torch.Tensor | None = None,
             generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """MPPI from [B, obs] observations: ([B, A] actions, [H, B, A] plan means). `warm` ([H, B, A], the
        previous means) starts the mean shifted one step; deterministic returns the mean's first action,
        otherwise an elite drawn by its weight, plus the final std as exploration noise."""
        H, A, N = self.plan_horizon, self.act_dim, self.num_samples
        P, E = min(self.num_pi_trajs, N - 1), min(self.num_elites, N)
        z = self.encode(obs)
        B, device = z.shape[0], z.device
        pi_actions = torch.empty(H, B * P, A, device=device)
        if P > 0:
            zp = z.repeat_interleave(P, 0)
            for t in range(H):
                pi_actions[t] = self.pi(zp, generator)[0]
                if t < H - 1:
                    zp = self.next(zp, pi_actions[t])
        pi_actions = pi_actions.view(H, B, P, A)
        z = z.repeat_interleave(N, 0)
        mean = torch.zeros(H, B, A, device=device)
        if warm is not None:
            mean[:-1] = warm[1:]
        std = torch.full((H, B, A), self.max_std, device=device)
        for _ in range(self.iterations):
            noise = torch.randn((H, B, N - P, A), generator=generator, device=device)
            sampled = (mean.unsqueeze(2) + std.unsqueeze(2) * noise).clamp(-1, 1)
            actions = torch.cat([pi_actions, sampled], 2)                                  # [H, B, N, A]
            value = self.estimate_value(z, actions.reshape(H, B * N, A), generator).view(B, N).nan_to_num(0.0)
            elite_value, elite = value.topk(E, dim=1)                                      # [B, E]
            elite_actions = actions.gather(2, elite[None, :, :, None].expand(H, B, E, A))  # [H, B, E, A]
            score = torch.softmax(self.temperature * elite_value, dim=1)
            mean = (score[None, :, :, None] * elite_actions).sum(2)
            spread = (score[None, :, :, None] * (elite_actions - mean.unsqueeze(2)).square()).sum(2)
            std = spread.sqrt().clamp(self.min_std, self.max_std)
        if deterministic:
            action = mean[0]
        else:
            pick = torch.multinomial(score, 1, generator=generator)                      # [B, 1]
            action = elite_actions[0].gather(1, pick[:, :, None].expand(B, 1, A))[:, 0]
            action = action + std[0] * torch.randn((B, A), generator=generator, device=device)
        return action.clamp(-1, 1), mean

    def reset(self) -> None:
        """Forget the previous plans (a new episode starts from a zero mean)."""
        self._warm.clear()

    def _warm_start(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor | None:
        """The previous plan of this acting mode, when it belongs to as many states. The same query
        twice in a row reuses the warm start of the first, so it gets the same plan."""
        last = self._warm.get(deterministic)
        if last is None or last[0].shape != obs.shape or last[0].device != obs.device:
            return None
        return last[1] if torch.equal(last[0], obs) else last[2]

    def _obs_tensor(self, obs) -> torch.Tensor:
        if self.obs_type == "rgb" and isinstance(obs, dict) and not any(k.startswith(IMAGES_PREFIX) for k in obs):
            raise ConfigError(f"obs_type=rgb needs an {IMAGES_PREFIX}.<camera> frame in the observation")
        if self.obs_type == "rgb" and isinstance(obs, dict):
            frame = np.asarray(obs[sorted(k for k in obs if k.startswith(IMAGES_PREFIX))[0]], np.float32)
            obs = np.moveaxis(frame, -1, -3).reshape(*frame.shape[:-3], -1)   # HWC -> flat CHW
        return torch.as_tensor(state_of(obs, self.obs_dim if self.obs_type == "state" else None), device=self.device)

    @torch.no_grad()
    def act(self, obs, deterministic: bool = True, generator: torch.Generator | None = None) -> np.ndarray:
        """Plan from the current state(s). deterministic: the plan's mean first action, with fixed planning
        noise (`plan_seed`), so the answer depends on the observation and the warm start only, or with
        fresh noise from `generator` when one is given."""
        state = self._obs_tensor(obs)
        single = state.ndim == 1
        state = state.reshape(-1, self.obs_dim)
        training = self.training
        self.eval()  # no dropout while planning
        if generator is None and deterministic:
            generator = torch.Generator(device=self.device).manual_seed(self.plan_seed)
        if not self.mpc:
            sample, _, mode = self.pi(self.encode(state), generator)
            action = mode if deterministic else sample
        else:
            warm = self._warm_start(state, deterministic)
            rows = max(1, PLAN_ROWS // self.num_samples)
            actions, means = [], []
            for lo in range(0, len(state), rows):
                part = None if warm is None else warm[:, lo:lo + rows]
                a, m = self.plan(state[lo:lo + rows], deterministic, part, generator)
                actions.append(a)
                means.append(m)
            action = torch.cat(actions)
            self._warm[deterministic] = (state.clone(), warm, torch.cat(means, 1))
        self.train(training)
        action = action.float().cpu().numpy()
        return action[:, None, :][0] if single else action[:, None, :]  # [H=1, A] or [B, 1, A]

    @torch.no_grad()
    def sample(self, obs, n: int) -> np.ndarray:
        """n independent stochastic plans from one state (no warm start): [n, 1, A]."""
        state = self._obs_tensor(obs).reshape(1, self.obs_dim).expand(n, -1)
        training = self.training
        self.eval()
        if self.mpc:
            rows = max(1, PLAN_ROWS // self.num_samples)
            action = torch.cat([self.plan(state[lo:lo + rows], False)[0] for lo in range(0, n, rows)])
        else:
            action = self.pi(self.encode(state))[0]
        self.train(training)
        return action.float().cpu().numpy()[:, None, :]
