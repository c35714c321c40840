"""Imagined rollouts in a learned model, behind the gymnasium 1.x vector API (issue 17, item 2).

    model = StateEnsembleModel(ds.obs_dim, ds.act_dim); model.fit(ds)
    env = WorldModelEnv(model, ds, num_envs=256, horizon=10, penalty_weight=1.0, seed=0)
    obs, info = env.reset(seed=0)                  # obs["observation.state"]: float32 [256, obs_dim]
    obs, r, term, trunc, info = env.step(actions)  # float32 [256, A] in [-1, 1]

Observation contract. With `StateEnsembleModel` (the default and the recommended model) the model
predicts next *states* directly, s' = s + f_k(s, a) for ensemble member k, so `observation.state` is a
real state-space vector and any state policy can act in the env (MOPO/MOTO-style rollouts). With
`TDMPC2LatentModel` (decoder-free TD-MPC2) the env exposes the model's *latent* as `observation.state`
(float32 [B, latent_dim]): only policies trained on that latent can act in it; nothing decodes it.

Rollouts (one per sub-env): reset samples real states uniformly from `dataset.observations` (and
encodes them, for the latent model); each step feeds (s, a) to every member, takes the next state of
one member drawn at random per rollout (sampled from its Gaussian when the model predicts a std, as
MOPO does), and returns

    reward = r_hat - penalty_weight * u(s, a)
    u      = max_k ||std_k(s, a)||_2           penalty="max_std" (MOPO), needs a probabilistic model
           = ||std over k of mean_k(s, a)||_2   penalty="disagreement" (the spread of the members' means)

A deterministic model (no std) always uses "disagreement". r_hat is the model's reward head (mean over
members), or, with a `SuccessClassifier`, `success_reward` where the classifier says the next state succeeds and `failure_reward` elsewhere; a predicted success
also terminates the rollout (`terminate_on_success`). A rollout is truncated after `horizon` steps.
Autoreset is gymnasium's NEXT_STEP mode, what `sims.vector.make_vec` uses by default: the step after a
rollout ended resets that sub-env (new start state, reward 0, terminated and truncated False) and
ignores its action. `metadata["autoreset_mode"]` says so.

infos: `penalty` and `model_reward` (float32 [B]) and, with a classifier, `success` (bool [B]), each
with gymnasium's `_<key>` mask (False for sub-envs that were resetting).

gymnasium 1.x has no checker for vector envs (`gymnasium.utils.env_checker.check_env` takes a single
env and rejects a VectorEnv), so tests/test_world_model_env.py checks the spaces, shapes, dtypes,
seeding and the autoreset itself.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from torch import nn
from torch.nn import functional as F

from embodied.constants import STATE_KEY
from embodied.errors import ConfigError
from policies.tdmpc2 import two_hot_inv

PENALTIES = ("max_std", "disagreement")


# -- a probabilistic ensemble of state dynamics ------------------------------------------------------

class _EnsembleLinear(nn.Module):
    """K independent Linear layers applied as one batched matmul: [K, B, in] -> [K, B, out]."""

    def __init__(self, members: int, in_dim: int, out_dim: int):
        super().__init__()
        bound = 1.0 / np.sqrt(in_dim)
        self.weight = nn.Parameter(torch.empty(members, in_dim, out_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(members, 1, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class StateEnsembleModel(nn.Module):
    """K MLPs predicting a Gaussian over (s' - s, r) from (s, a), in normalised units (MOPO's model,
    smaller). `predict(s [B, D], a [B, A])` -> (next-state means [K, B, D], stds [K, B, D], rewards [K, B])."""

    def __init__(self, obs_dim: int, act_dim: int, num_members: int = 5, hidden: int = 200, layers: int = 3,
                 probabilistic: bool = True, seed: int = 0):
        super().__init__()
        if num_members < 1 or layers < 1 or hidden < 1:
            raise ConfigError(f"num_members={num_members}, layers={layers}, hidden={hidden}: each must be >= 1")
        self.obs_dim, self.act_dim, self.num_members = int(obs_dim), int(act_dim), int(num_members)
        self.probabilistic = bool(probabilistic)
        out = obs_dim + 1
        dims = [obs_dim + act_dim] + [hidden] * layers
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(seed)
            self.layers = nn.ModuleList(_EnsembleLinear(num_members, i, o) for i, o in zip(dims[:-1], dims[1:]))
            self.head = _EnsembleLinear(num_members, hidden, 2 * out if probabilistic else out)
        self.max_logstd = nn.Parameter(torch.full((1, 1, out), 0.5))
        self.min_logstd = nn.Parameter(torch.full((1, 1, out), -5.0))
        for name, dim in (("in", obs_dim + act_dim), ("out", out)):
            self.register_buffer(f"{name}_mean", torch.zeros(dim))
            self.register_buffer(f"{name}_std", torch.ones(dim))

    def encode(self, states: torch.Tensor) -> torch.Tensor:
        return states  # the model works in state space

    def _raw(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = (torch.cat([obs, act], -1) - self.in_mean) / self.in_std
        x = x.expand(self.num_members, *x.shape) if x.dim() == 2 else x
        for layer in self.layers:
            x = F.silu(layer(x))
        y = self.head(x)
        if not self.probabilistic:
            return y, None
        mean, logstd = y.chunk(2, -1)
        logstd = self.max_logstd - F.softplus(self.max_logstd - logstd)  # soft bounds (PETS/MOPO)
        logstd = self.min_logstd + F.softplus(logstd - self.min_logstd)
        return mean, logstd

    @torch.no_grad()
    def predict(self, obs: torch.Tensor, act: torch.Tensor):
        mean, logstd = self._raw(obs, act)
        mean = mean * self.out_std + self.out_mean
        next_mean = obs + mean[..., :-1]
        std = None if logstd is None else logstd.exp() * self.out_std
        return next_mean, None if std is None else std[..., :-1], mean[..., -1]

    def fit(self, dataset, steps: int = 2000, batch_size: int = 256, lr: float = 1e-3, seed: int = 0,
            device: str = "cpu") -> dict[str, float]:
        """Train every member on its own bootstrap-like shuffle of `dataset` (Gaussian NLL, or MSE when
        not probabilistic). Returns the final training loss."""
        self.to(device)
        obs = torch.as_tensor(dataset.observations, device=device)
        act = torch.as_tensor(dataset.actions, device=device)
        target = torch.cat([torch.as_tensor(dataset.next_observations, device=device) - obs,
                            torch.as_tensor(dataset.rewards, device=device)[:, None]], -1)
        inputs = torch.cat([obs, act], -1)
        self.in_mean.copy_(inputs.mean(0)); self.in_std.copy_(inputs.std(0).clamp_min(1e-6))
        self.out_mean.copy_(target.mean(0)); self.out_std.copy_(target.std(0).clamp_min(1e-6))
        opt = torch.optim.Adam(self.parameters(), lr=lr)
        gen = torch.Generator(device=device).manual_seed(seed)
        n, loss = len(obs), torch.zeros(())
        for _ in range(steps):
            idx = torch.randint(0, n, (self.num_members, batch_size), generator=gen, device=device)
            y = (target[idx] - self.out_mean) / self.out_std
            mean, logstd = self._raw(obs[idx], act[idx])
            if logstd is None:
                loss = (mean - y).square().mean()
            else:
                loss = (((mean - y) * torch.exp(-logstd)).square() * 0.5 + logstd).mean()
                loss = loss + 0.01 * (self.max_logstd.sum() - self.min_logstd.sum())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return {"loss": float(loss.detach())}


class TDMPC2LatentModel(nn.Module):
    """TD-MPC2's decoder-free model as a one-member, deterministic model over its latent:
    `encode(s) = h(s)`, next latent d(z, a), reward from the two-hot reward head. Observations of the
    env are then latents (float32 [B, latent_dim]); the disagreement penalty is zero (one member)."""

    def __init__(self, policy):
        super().__init__()
        self.policy = policy
        self.obs_dim, self.act_dim, self.num_members = policy.latent_dim, policy.act_dim, 1
        self.state_dim = policy.obs_dim  # what encode() takes
        self.probabilistic = False

    @torch.no_grad()
    def encode(self, states: torch.Tensor) -> torch.Tensor:
        return self.policy.encode(states)

    @torch.no_grad()
    def predict(self, z: torch.Tensor, act: torch.Tensor):
        p = self.policy
        return p.next(z, act)[None], None, two_hot_inv(p.reward_logits(z, act), p.vmin, p.vmax)[None]

    @torch.no_grad()
    def end_probability(self, z: torch.Tensor) -> torch.Tensor | None:
        return self.policy.end_probability(z) if self.policy.termination is not None else None


# -- a success classifier for sparse tasks -------------------------------------------------------------

class SuccessClassifier(nn.Module):
    """A small MLP on states: P(success | s). `fit(dataset)` trains it on the next states with labels
    `dataset.terminals` (true task ends) by default, or rewards >= `reward_threshold` when given."""

    def __init__(self, obs_dim: int, hidden: int = 64, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                     nn.Linear(hidden, 1))
        self.register_buffer("mean", torch.zeros(obs_dim))
        self.register_buffer("std", torch.ones(obs_dim))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.net((states - self.mean) / self.std).squeeze(-1)  # logits

    @torch.no_grad()
    def probability(self, states: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self(states))

    def fit(self, dataset, reward_threshold: float | None = None, steps: int = 1000, batch_size: int = 256,
            lr: float = 1e-3, seed: int = 0) -> dict[str, float]:
        states = torch.as_tensor(dataset.next_observations)
        labels = (np.asarray(dataset.terminals, bool) if reward_threshold is None
                  else np.asarray(dataset.rewards) >= reward_threshold)
        y = torch.as_tensor(labels, dtype=torch.float32)
        self.mean.copy_(states.mean(0)); self.std.copy_(states.std(0).clamp_min(1e-6))
        pos = float(y.mean().clamp(1e-3, 1 - 1e-3))
        weight = torch.tensor((1 - pos) / pos)  # balance the rare successes
        opt = torch.optim.Adam(self.parameters(), lr=lr)
        gen = torch.Generator().manual_seed(seed)
        loss = torch.zeros(())
        for _ in range(steps):
            idx = torch.randint(0, len(states), (batch_size,), generator=gen)
            loss = F.binary_cross_entropy_with_logits(self(states[idx]), y[idx], pos_weight=weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = float(((self(states) > 0).float() == y).float().mean())
        return {"loss": float(loss.detach()), "accuracy": acc}


# -- the vector env ---------------------------------------------------------------------------------------

def uncertainty(means: torch.Tensor, stds: torch.Tensor | None, penalty: str = "max_std") -> torch.Tensor:
    """[K, B, D] member means (and stds) -> [B] penalty u(s, a); "max_std" without stds (a deterministic
    model) falls back to "disagreement". The env and the fidelity diagnostics both call this one."""
    if penalty not in PENALTIES:
        raise ConfigError(f"penalty={penalty!r}: choose one of {', '.join(PENALTIES)}")
    if penalty == "max_std" and stds is not None:
        return stds.norm(dim=-1).max(0).values
    if means.shape[0] < 2:
        return torch.zeros(means.shape[1], device=means.device)
    return means.std(0, unbiased=False).norm(dim=-1)


class WorldModelEnv(gymnasium.vector.VectorEnv):
    """`num_envs` imagined rollouts stepped together in `model`, starting from `dataset` states."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, model, dataset, num_envs: int = 256, *, horizon: int = 10, penalty_weight: float = 1.0,
                 penalty: str = "max_std", classifier: SuccessClassifier | None = None,
                 terminate_on_success: bool = True, success_reward: float = 1.0, failure_reward: float = 0.0,
                 success_threshold: float = 0.5, sample_next: bool = True, seed: int | None = None,
                 device: str = "cpu"):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ConfigError(f"num_envs={num_envs!r} must be a positive integer")
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ConfigError(f"horizon={horizon!r} must be a positive integer (imagined steps per rollout)")
        if penalty not in PENALTIES:
            raise ConfigError(f"penalty={penalty!r}: choose one of {', '.join(PENALTIES)}")
        if penalty == "max_std" and not getattr(model, "probabilistic", False) and penalty_weight:
            penalty = "disagreement"  # a deterministic model has no std: fall back to the means' spread
        if penalty_weight < 0:
            raise ConfigError(f"penalty_weight={penalty_weight} must be >= 0")
        state_dim = int(getattr(model, "state_dim", model.obs_dim))
        if dataset.obs_dim != state_dim:
            raise ConfigError(f"dataset obs_dim={dataset.obs_dim} but the model takes states of dim {state_dim}: "
                              "fit the model on this dataset")
        if dataset.act_dim != model.act_dim:
            raise ConfigError(f"dataset act_dim={dataset.act_dim} but the model's act_dim={model.act_dim}: "
                              "fit the model on this dataset")
        self.model = model.to(device).eval()
        self.classifier = None if classifier is None else classifier.to(device).eval()
        self.device = torch.device(device)
        self.starts = torch.as_tensor(np.asarray(dataset.observations, np.float32), device=self.device)
        self.num_envs, self.horizon = num_envs, horizon
        self.penalty_weight, self.penalty = float(penalty_weight), penalty
        self.terminate_on_success, self.success_threshold = bool(terminate_on_success), float(success_threshold)
        self.success_reward, self.failure_reward = float(success_reward), float(failure_reward)
        self.sample_next = bool(sample_next)
        obs_dim = int(model.obs_dim)
        self.single_observation_space = spaces.Dict(
            {STATE_KEY: spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32, seed=seed)})
        self.single_action_space = spaces.Box(-1.0, 1.0, (int(model.act_dim),), np.float32, seed=seed)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        if seed is not None:
            self.action_space.seed(seed)
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(np.random.SeedSequence(seed).generate_state(1)[0].item())
        self._state = torch.zeros(num_envs, obs_dim, device=self.device)
        self._start_index = np.zeros(num_envs, np.int64)
        self._steps = np.zeros(num_envs, np.int64)
        self._needs_reset = np.zeros(num_envs, bool)
        self._seeded = False

    # -- helpers ------------------------------------------------------------------------------------------
    def _restart(self, mask: np.ndarray) -> None:
        """New start states for the sub-envs in `mask`, drawn from the dataset and encoded."""
        rows = np.flatnonzero(mask)
        if not len(rows):
            return
        idx = torch.randint(0, len(self.starts), (len(rows),), generator=self._gen, device=self.device)
        self._start_index[rows] = idx.cpu().numpy()
        with torch.no_grad():
            self._state[torch.as_tensor(rows, device=self.device)] = self.model.encode(self.starts[idx]).float()
        self._steps[rows] = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {STATE_KEY: self._state.cpu().numpy().astype(np.float32, copy=True)}

    def uncertainty(self, means: torch.Tensor, stds: torch.Tensor | None) -> torch.Tensor:
        """[K, B, D] member means (and stds) -> [B] penalty u(s, a) (see the module docstring)."""
        return uncertainty(means, stds, self.penalty)

    def _check_actions(self, actions) -> np.ndarray:
        actions = np.asarray(actions, np.float32).reshape(self.num_envs, -1)
        if actions.shape[1] != self.single_action_space.shape[0]:
            raise ConfigError(f"actions have shape {actions.shape} but the env wants "
                              f"[{self.num_envs}, {self.single_action_space.shape[0]}]")
        return actions

    def advance(self, actions: np.ndarray, live: np.ndarray):
        """One model step for the sub-envs in `live` (the rest stay as they are): per-env rewards,
        terminated, penalty, model reward and success, each [B]. Resets and truncation are the caller's."""
        B = self.num_envs
        rewards = np.zeros(B, np.float32)
        terminated = np.zeros(B, bool)
        penalty = np.zeros(B, np.float32)
        model_reward = np.zeros(B, np.float32)
        success = np.zeros(B, bool)
        if live.any():
            rows = torch.as_tensor(np.flatnonzero(live), device=self.device)
            s = self._state[rows]
            a = torch.as_tensor(np.clip(actions[live], -1.0, 1.0), device=self.device)
            with torch.no_grad():
                means, stds, rews = self.model.predict(s, a)
                K, n = means.shape[0], len(rows)
                pick = torch.randint(0, K, (n,), generator=self._gen, device=self.device)
                arange = torch.arange(n, device=self.device)
                nxt = means[pick, arange]
                if stds is not None and self.sample_next:
                    noise = torch.randn(nxt.shape, generator=self._gen, device=self.device)
                    nxt = nxt + noise * stds[pick, arange]
                u = self.uncertainty(means, stds)
                r = rews.mean(0) if rews is not None else torch.zeros(n, device=self.device)
                done = torch.zeros(n, dtype=torch.bool, device=self.device)
                if self.classifier is not None:
                    succ = self.classifier.probability(nxt) > self.success_threshold
                    r = torch.where(succ, self.success_reward, self.failure_reward)
                    success[live] = succ.cpu().numpy()
                    if self.terminate_on_success:
                        done = succ
                elif hasattr(self.model, "end_probability"):
                    p_end = self.model.end_probability(nxt)
                    if p_end is not None:
                        done = p_end > 0.5
            self._state[rows] = nxt.float()
            model_reward[live] = r.float().cpu().numpy()
            penalty[live] = u.float().cpu().numpy()
            rewards[live] = model_reward[live] - self.penalty_weight * penalty[live]
            terminated[live] = done.cpu().numpy()
            self._steps[live] += 1
        return rewards, terminated, penalty, model_reward, success

    # -- gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._gen.manual_seed(np.random.SeedSequence(seed).generate_state(1)[0].item())
            self.action_space.seed(seed)
            self.observation_space.seed(seed)
        self._needs_reset[:] = False
        self._restart(np.ones(self.num_envs, bool))
        return self._obs(), {"start_index": self._start_index.copy(),
                             "_start_index": np.ones(self.num_envs, bool)}

    def step(self, actions):
        actions = self._check_actions(actions)
        resetting = self._needs_reset.copy()
        live = ~resetting
        rewards, terminated, penalty, model_reward, success = self.advance(actions, live)
        truncated = live & ~terminated & (self._steps >= self.horizon)
        self._restart(resetting)
        self._needs_reset = terminated | truncated
        infos = {"penalty": penalty, "_penalty": live.copy(), "model_reward": model_reward,
                 "_model_reward": live.copy(), "start_index": self._start_index.copy(),
                 "_start_index": resetting.copy()}
        if self.classifier is not None:
            infos["success"], infos["_success"] = success, live.copy()
        return self._obs(), rewards, terminated, truncated, infos


class ChunkedWorldModelEnv:
    """A WorldModelEnv behind the contract of `sims.vector.make_vec(..., autoreset="same_step",
    execute_horizon=k)`, so an on-policy chunk learner (DPPO) rolls out in imagination unchanged.

    `step(chunks [B, k, A])` runs the k rows open-loop, each sub-env until its rollout ends, and
    returns the summed reward; a sub-env whose rollout ended restarts in the same step (its final state
    is in `info["final_obs"]`), and `info["executed"]` counts the imagined steps each ran.
    """

    def __init__(self, env: WorldModelEnv, execute_horizon: int):
        if execute_horizon < 1:
            raise ConfigError(f"execute_horizon={execute_horizon} must be >= 1")
        self.env, self.execute_horizon, self.num_envs = env, int(execute_horizon), env.num_envs
        self.single_observation_space = env.single_observation_space

    def reset(self, *, seed: int | None = None, options=None):
        return self.env.reset(seed=seed, options=options)

    def step(self, chunks):
        env, B = self.env, self.num_envs
        chunks = np.asarray(chunks, np.float32).reshape(B, self.execute_horizon, -1)
        total = np.zeros(B, np.float32)
        executed = np.zeros(B, np.int64)
        terminated, truncated, success = np.zeros(B, bool), np.zeros(B, bool), np.zeros(B, bool)
        penalty = np.zeros(B, np.float32)
        active = np.ones(B, bool)
        for j in range(self.execute_horizon):
            r, term, pen, _, succ = env.advance(env._check_actions(chunks[:, j]), active)
            total[active] += r[active]
            penalty[active] += pen[active]
            executed[active] += 1
            success |= succ & active
            terminated |= term & active
            truncated |= active & ~term & (env._steps >= env.horizon)
            active &= ~(terminated | truncated)
            if not active.any():
                break
        done = terminated | truncated
        final_obs = np.empty(B, dtype=object)
        states = env._state.cpu().numpy().astype(np.float32)
        for i in np.flatnonzero(done):
            final_obs[i] = {STATE_KEY: states[i].copy()}
        env._restart(done)
        env._needs_reset[:] = False
        info = {"executed": executed, "_executed": np.ones(B, bool), "success": success, "_success": np.ones(B, bool),
                "penalty": penalty, "_penalty": np.ones(B, bool), "final_obs": final_obs, "_final_obs": done.copy()}
        return env._obs(), total, terminated, truncated, info

    def close(self) -> None:
        self.env.close()


@dataclass
class ImaginationConfig:
    """`algo.world_model`: roll the online phase out in a model learned once from offline data (DiWA-style)
    instead of the real env. Evaluation stays in the real sim; no real step feeds learning."""
    dataset: str | None = None       # the dataset quality the model learns from (e.g. play); None: the run's dataset
    size: int = 100_000              # ... and its size (a quality name only)
    members: int = 5                 # StateEnsembleModel (MOPO's ensemble, smaller): members, width, depth
    hidden: int = 200
    layers: int = 3
    fit_steps: int = 2000
    classifier_steps: int = 1000     # the success classifier gives the reward and ends a rollout on success
    horizon: int = 10                # imagined steps per rollout before truncation (bootstrapped by V)
    starts: str = "model"            # rollouts start from states of the model's dataset, or of the run's ("policy")
    penalty: str = "max_std"
    penalty_weight: float = 1.0
    success_reward: float | None = None   # None: the dataset's own reward on success steps
    failure_reward: float | None = None   # None: ... and on the other steps

    @classmethod
    def from_dict(cls, values: dict) -> "ImaginationConfig":
        names = {f.name for f in fields(cls)}
        for key in values:
            if key not in names:
                raise ConfigError(f"algo.world_model.{key} is not an option; valid: {', '.join(sorted(names))}")
        cfg = cls(**values)
        for name in ("members", "hidden", "layers", "fit_steps", "classifier_steps", "horizon", "size"):
            if getattr(cfg, name) < 1:
                raise ConfigError(f"algo.world_model.{name}={getattr(cfg, name)} must be >= 1")
        if cfg.penalty not in PENALTIES:
            raise ConfigError(f"algo.world_model.penalty={cfg.penalty!r}: choose one of {', '.join(PENALTIES)}")
        if cfg.starts not in ("model", "policy"):
            raise ConfigError(f"algo.world_model.starts={cfg.starts!r}: choose model (the model's dataset) or "
                              "policy (the run's dataset)")
        if cfg.penalty_weight < 0:
            raise ConfigError(f"algo.world_model.penalty_weight={cfg.penalty_weight} must be >= 0")
        return cfg


def imagined_vec_env(cfg: ImaginationConfig, dataset, num_envs: int, execute_horizon: int, seed: int = 0,
                     device: str = "cpu", log=print, starts=None) -> tuple[ChunkedWorldModelEnv, dict]:
    """Fit the model and success classifier on `dataset`; the chunked imagined vector env and fit metrics.
    Rollouts start from `starts` (a Dataset of the same env) when given, else from `dataset`."""
    terminal = np.asarray(dataset.terminals, bool)
    if not terminal.any():
        raise ConfigError("algo.world_model: the dataset has no terminal (success) step for the success classifier; "
                          "use a dataset with successes (e.g. dataset=play on a manipulation task)")
    rewards = np.asarray(dataset.rewards, np.float32)
    success_reward = cfg.success_reward if cfg.success_reward is not None else float(rewards[terminal].mean())
    failure_reward = cfg.failure_reward if cfg.failure_reward is not None else (
        float(rewards[~terminal].mean()) if (~terminal).any() else 0.0)
    torch.manual_seed(seed)
    model = StateEnsembleModel(dataset.obs_dim, dataset.act_dim, num_members=cfg.members, hidden=cfg.hidden,
                               layers=cfg.layers, seed=seed)
    fit = model.fit(dataset, steps=cfg.fit_steps, seed=seed, device=device)
    classifier = SuccessClassifier(dataset.obs_dim, seed=seed)
    clf = classifier.fit(dataset, steps=cfg.classifier_steps, seed=seed)
    metrics = {"world_model/fit_loss": fit["loss"], "world_model/classifier_accuracy": clf["accuracy"],
               "world_model/success_reward": success_reward, "world_model/failure_reward": failure_reward,
               "world_model/transitions": float(len(dataset))}
    log(f"world model: {cfg.members} x {cfg.layers} x {cfg.hidden} fitted on {len(dataset)} transitions "
        f"({cfg.fit_steps} steps, loss {fit['loss']:.3f}); success classifier accuracy {clf['accuracy']:.3f}")
    env = WorldModelEnv(model, starts if starts is not None else dataset, num_envs, horizon=cfg.horizon,
                        penalty=cfg.penalty,
                        penalty_weight=cfg.penalty_weight, classifier=classifier, success_reward=success_reward,
                        failure_reward=failure_reward, seed=seed, device=device)
    return ChunkedWorldModelEnv(env, execute_horizon), metrics
