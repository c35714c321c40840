"""DPPO (Ren et al. 2024): policy-gradient fine-tuning of a diffusion policy through its denoising chain.

The DDPM sampling chain is a sequence of Gaussian steps x_{k-1} ~ N(mu_theta(x_k, k, o), sigma_k^2), so
the chain is itself an MDP and PPO applies to it. What this file implements:

- Fine-tune the last K of N denoising steps (K=10 of N=20): a copy of the denoiser runs those steps
  (`DiffusionPolicy.finetune_last`), the pretrained one the earlier steps, frozen.
- Exploration and likelihoods use sigma_k floored at `min_std` on the fine-tuned steps (the DDPM
  posterior std collapses near x_0, which would make the ratio explode).
- Per-step log-probabilities log N(x_{k-1}; mu, sigma^2) summed over the chunk; one PPO ratio per
  denoising step. The env-step advantage (GAE with a V(s) critic over env decisions, i.e. chunks)
  is discounted by gamma_denoise^(K-1-j) for fine-tuned step j, and the clip ratio grows from
  `clip_ratio_base` at the first fine-tuned step to `clip_ratio` at the last one (exponential schedule).
- Rollouts from `n_envs` vectorised envs (the runner's `EnvSource.make_vec`, in-process or in workers), each
  executing its chunk open-loop (`sims.make(..., execute_horizon=k)`).

`DPPORunner` is the offline->online runner with DPPO as its online phase: BC-diffusion pretraining (or a
checkpoint), then on-policy fine-tuning, evaluated and summarised exactly like the other presets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

from embodied import agents
from embodied.agents.chunking import GenerativeChunkActing
from embodied.agents.base import Agent
from embodied.agents.nets import ValueEnsemble, adam, to_torch
from embodied.agents.runner import Runner, mean_metrics
from embodied.errors import ConfigError
from policies.base import STATE_KEY
from policies.diffusion import DiffusionPolicy
from policies.distributions import gaussian_log_prob


@dataclass
class DPPOConfig:
    denoising_steps: int = 20                 # DDPM steps of the sampling chain
    ft_denoising_steps: int = 10              # fine-tune the last K of them
    min_std: float = 0.1                      # floor on sigma_k of fine-tuned steps (sampling and log-probs)
    gamma_denoise: float = 0.99
    clip_ratio: float = 0.01                  # at the last denoising step
    clip_ratio_base: float = 0.001            # at the first fine-tuned step
    clip_ratio_rate: float = 3.0
    gamma: float = 0.99                       # per env decision (chunk)
    gae_lambda: float = 0.95
    n_envs: int = 8
    rollout_steps: int = 16                   # chunk decisions per env per iteration
    update_epochs: int = 5
    minibatch_size: int = 256
    actor_lr: float = 1e-4
    critic_lr: float = 1e-3
    vf_coef: float = 0.5
    max_grad_norm: float = 1.0
    target_kl: float | None = 1.0             # stop an iteration's epochs early past this approx-KL
    hidden: tuple[int, ...] = (256, 256)      # V(s)
    async_envs: bool = False
    reward_norm: bool = True                  # scale rewards by a running std of discounted returns (as DPPO)
    logprob_reduce: str = "mean"              # PPO ratio from the mean per-element log-prob over the chunk, each
                                              # clamped to [-5, 2] (DPPO); "sum": the exact chunk log-likelihood
    critic_warmup_iters: int = 2              # first iterations fit V(s) only (a fresh critic's advantages are noise)
    # a fresh policy when there is no pretrained one (agents.make("dppo"))
    obs_horizon: int = 1
    pred_horizon: int = 4
    execute_horizon: int = 4
    denoiser: str = "mlp"


def clip_ratios(cfg: DPPOConfig) -> torch.Tensor:
    """[K] clip coefficient per fine-tuned step, base -> final on an exponential schedule."""
    k = cfg.ft_denoising_steps
    if k == 1:
        return torch.tensor([cfg.clip_ratio])
    frac = torch.arange(k, dtype=torch.float64) / (k - 1)
    grow = (torch.exp(cfg.clip_ratio_rate * frac) - 1) / (math.exp(cfg.clip_ratio_rate) - 1)
    return (cfg.clip_ratio_base + (cfg.clip_ratio - cfg.clip_ratio_base) * grow).float()


class DPPO(GenerativeChunkActing, Agent):
    def __init__(self, obs_dim: int, act_dim: int, cfg: DPPOConfig = DPPOConfig(), device: str = "cpu", seed: int = 0,
                 base: DiffusionPolicy | None = None):
        if not 1 <= cfg.ft_denoising_steps <= cfg.denoising_steps:
            raise ConfigError(f"algo ft_denoising_steps={cfg.ft_denoising_steps} must be in [1, denoising_steps="
                              f"{cfg.denoising_steps}]")
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        torch.manual_seed(seed)  # network init
        if base is None:
            base = DiffusionPolicy(obs_dim, act_dim, obs_horizon=cfg.obs_horizon, pred_horizon=cfg.pred_horizon,
                                   execute_horizon=cfg.execute_horizon, denoiser=cfg.denoiser,
                                   num_train_steps=cfg.denoising_steps, sampler="ddpm",
                                   num_inference_steps=cfg.denoising_steps)
        if not isinstance(base, DiffusionPolicy):
            raise ConfigError(f"DPPO fine-tunes a diffusion policy; the pretrained policy is {type(base).__name__} "
                              "(use offline_algo=bc_diffusion)")
        config = {**base.config(), "sampler": "ddpm", "num_inference_steps": cfg.denoising_steps,
                  "finetune_last": cfg.ft_denoising_steps, "use_diffusers_step": False}
        self.actor = DiffusionPolicy(**config).to(self.device)
        state = {k: v for k, v in base.state_dict().items() if not k.startswith("net_ft.")}
        self.actor.load_state_dict(state, strict=False)
        self.actor.net_ft.load_state_dict(self.actor.net.state_dict())
        self.actor.net.requires_grad_(False)
        self.obs_horizon, self.execute_horizon = self.actor.obs_horizon, self.actor.execute_horizon
        self.chunk_horizon = self.actor.pred_horizon
        self.critic = ValueEnsemble(self.actor.cond_dim, cfg.hidden, 1, layernorm=True).to(self.device)
        self.actor_optimizer = adam(self.actor.net_ft.parameters(), cfg.actor_lr)
        self.critic_optimizer = adam(self.critic.parameters(), cfg.critic_lr)
        self.first_ft = cfg.denoising_steps - cfg.ft_denoising_steps
        self.clip = clip_ratios(cfg).to(self.device)
        k = cfg.ft_denoising_steps
        self.denoise_discount = (cfg.gamma_denoise ** torch.arange(k - 1, -1, -1, dtype=torch.float32)).to(self.device)

    # -- the chain --------------------------------------------------------------------------------------
    def value(self, cond: torch.Tensor) -> torch.Tensor:
        return self.critic(cond)[0]

    @torch.no_grad()
    def sample_chain(self, obs_seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the chain with floored noise on fine-tuned steps. Returns the env chunk [B, H, A]
        (rows from the current step on), the fine-tuned latents [B, K+1, Hp, A] and cond [B, C]."""
        actor, cfg = self.actor, self.cfg
        cond = actor.condition(obs_seq)
        x = torch.randn(cond.shape[0], actor.pred_horizon, actor.act_dim, device=cond.device)
        latents = []
        for i in range(cfg.denoising_steps):
            if i == self.first_ft:
                latents.append(x)
            min_std = cfg.min_std if i >= self.first_ft else 0.0
            mean, std = actor.denoise_mean_std(x, i, cond, min_std=min_std)
            x = mean + std * torch.randn_like(mean) if float(std.max()) > 0 else mean
            if i >= self.first_ft:
                latents.append(x)
        chunk = actor.unnormalize_actions(x.clamp(-1.0, 1.0))[:, actor.obs_horizon - 1:]
        return chunk, torch.stack(latents, 1), cond

    def log_probs(self, cond: torch.Tensor, latents: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        """[B, K] log-probability of each fine-tuned transition x_k -> x_{k-1}: summed over the chunk
        ("sum", the exact Gaussian log-likelihood) or DPPO's clamped per-element mean ("mean", which keeps
        the ratio's scale independent of the chunk size, so clip ratios of 0.001-0.01 mean the same for
        any chunk); all K steps in one batched forward pass."""
        actor, cfg = self.actor, self.cfg
        b, k = latents.shape[0], cfg.ft_denoising_steps
        co = actor.coefficients("ddpm", cfg.denoising_steps)
        steps = torch.arange(self.first_ft, cfg.denoising_steps, device=cond.device).repeat(b)  # [B*K]
        x = latents[:, :-1].reshape(b * k, *latents.shape[2:])
        nxt = latents[:, 1:].reshape(b * k, *latents.shape[2:])
        c = cond.repeat_interleave(k, 0)
        eps = actor.net_ft(x, co["t_unit"][steps], c)
        shape = (-1, 1, 1)
        x0 = actor.x0_from_eps(x, eps, co["sqrt_ab"][steps].view(shape), co["sqrt_1mab"][steps].view(shape))
        mean = co["a"][steps].view(shape) * x0 + co["b"][steps].view(shape) * x
        std = co["sigma"][steps].clamp(min=cfg.min_std).view(shape).expand_as(mean)
        elementwise = gaussian_log_prob(nxt, mean, std)
        if reduce == "mean":
            return elementwise.clamp(-5.0, 2.0).mean((-1, -2)).view(b, k)
        return elementwise.sum((-1, -2)).view(b, k)

    # -- PPO ------------------------------------------------------------------------------------------------
    def update(self, rollout: dict, actor: bool = True) -> dict[str, float]:
        """PPO epochs over one rollout: cond [N, C], latents [N, K+1, Hp, A], old_log_probs [N, K],
        advantages [N], returns [N]."""
        cfg = self.cfg
        data = to_torch(rollout, self.device)
        n = data["cond"].shape[0]
        adv = data["advantages"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8) if n > 1 else adv
        history = []
        for _ in range(cfg.update_epochs):
            kl_stop = False
            for idx in torch.randperm(n, device=self.device).split(cfg.minibatch_size):
                new = self.log_probs(data["cond"][idx], data["latents"][idx], cfg.logprob_reduce)
                log_ratio = new - data["old_log_probs"][idx]
                ratio = log_ratio.exp()
                step_adv = adv[idx][:, None] * self.denoise_discount[None]
                pg = torch.max(-step_adv * ratio, -step_adv * torch.clamp(ratio, 1 - self.clip, 1 + self.clip)).mean()
                v = self.value(data["cond"][idx])
                v_loss = F.mse_loss(v, data["returns"][idx])
                self.actor_optimizer.zero_grad(set_to_none=True)
                self.critic_optimizer.zero_grad(set_to_none=True)
                ((pg if actor else 0.0 * pg) + cfg.vf_coef * v_loss).backward()
                torch.nn.utils.clip_grad_norm_(self.actor.net_ft.parameters(), cfg.max_grad_norm)
                if actor:
                    self.actor_optimizer.step()
                self.critic_optimizer.step()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clipfrac = ((ratio - 1).abs() > self.clip).float().mean()
                history.append({"pg_loss": float(pg.detach()), "v_loss": float(v_loss.detach()), "approx_kl": float(approx_kl),
                                "clipfrac": float(clipfrac), "ratio_mean": float(ratio.detach().mean())})
                if actor and cfg.target_kl is not None and approx_kl > cfg.target_kl:
                    kl_stop = True
                    break
            if kl_stop:
                break
        metrics = {k: float(np.mean([h[k] for h in history])) for k in history[0]}
        metrics["epochs_run"] = float(len(history))
        return metrics

    # -- checkpoints (acting comes from GenerativeChunkActing) --------------------------------------------
    def _modules(self) -> dict:
        return {"actor": self.actor, "critic": self.critic}

    def _optimizers(self) -> dict:
        return {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer}


def gae(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray, terminals: np.ndarray, dones: np.ndarray,
        gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns over [T, E] decisions. next_values[t] is V of the state after decision t
    (the final observation when the episode was cut); terminals stop bootstrapping, dones stop the trace."""
    adv = np.zeros_like(rewards)
    last = np.zeros(rewards.shape[1], np.float32)
    for t in range(len(rewards) - 1, -1, -1):
        delta = rewards[t] + gamma * (1.0 - terminals[t]) * next_values[t] - values[t]
        last = delta + gamma * lam * (1.0 - dones[t]) * last
        adv[t] = last
    return adv, adv + values


def _per_env(info: dict, key: str, n: int, default) -> np.ndarray:
    """A step-info value per env under SAME_STEP autoreset (finished envs report it in final_info)."""
    out = np.full(n, default)
    if key in info:
        mask = info.get(f"_{key}", np.ones(n, bool))
        out[mask] = np.asarray(info[key])[mask]
    final = info.get("final_info")
    if final is not None and key in final:
        mask = final.get(f"_{key}", np.zeros(n, bool)) & info.get("_final_info", np.zeros(n, bool))
        out[mask] = np.asarray(final[key])[mask]
    return out


def log_episode_ends(runner: Runner, episode_return: np.ndarray, done: np.ndarray, success: np.ndarray) -> None:
    """Log each finished vector env's return and success, and zero its running return."""
    for i in np.flatnonzero(done):
        runner.episodes_done += 1
        runner.logger.log({"online/episode_return": float(episode_return[i]), "online/success": float(success[i]),
                           "total_step": runner.offline_step + runner.online_step},
                          step=runner.online_step, phase="online", kind="train")
        episode_return[i] = 0.0


class RunningReturnStd:
    """Running std of the discounted return per env: rewards / std keep V targets O(1) whatever the task's
    reward scale (DPPO's running reward scaling)."""

    def __init__(self, n_envs: int, gamma: float):
        self.gamma, self.ret = gamma, np.zeros(n_envs)
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.min_count = 100

    def state_dict(self) -> dict:
        return {"ret": self.ret.tolist(), "count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict) -> None:
        self.ret = np.asarray(state["ret"], np.float64)
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.ret = self.ret * self.gamma + reward
        for x in self.ret:  # Welford
            self.count += 1
            delta = x - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (x - self.mean)
        self.ret[done] = 0.0
        # too few returns for a std (the first ones are near-identical): leave the scale alone until then
        std = np.sqrt(self.m2 / self.count) if self.count >= self.min_count else 1.0
        return (reward / max(std, 1e-2)).astype(np.float32)


@dataclass
class DPPOLoop:
    """Everything DPPO's online phase carries from one rollout to the next, saved with every checkpoint:
    PPO iterations done (the critic warmup counts them), each env's running episode return, the
    return normaliser, and how many checkpoints were written (they fall on rollout boundaries)."""
    n_envs: int
    gamma: float
    iteration: int = 0
    checkpoints_written: int = 0

    def __post_init__(self):
        self.episode_return = np.zeros(self.n_envs)
        self.return_norm = RunningReturnStd(self.n_envs, self.gamma)

    def state_dict(self) -> dict:
        return {"iteration": self.iteration, "checkpoints_written": self.checkpoints_written,
                "episode_return": self.episode_return.tolist(), "return_norm": self.return_norm.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.iteration, self.checkpoints_written = int(state["iteration"]), int(state["checkpoints_written"])
        self.episode_return = np.asarray(state["episode_return"], np.float64)
        self.return_norm.load_state_dict(state["return_norm"])


class DPPORunner(Runner):
    """The offline->online runner with DPPO online (on-policy, vectorised envs, no replay learning).

    With `cfg.world_model` set (algo=diwa) the rollouts run in a model learned from `model_dataset` (or
    the run's dataset) and no real env step is taken online; evaluation stays in the real sim."""

    def __init__(self, *args, model_dataset=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_dataset = model_dataset
        if model_dataset is not None:
            model_dataset.validate(obs_dim=self.spec.obs_dim, act_dim=self.spec.act_dim)

    def _rollout_envs(self, n: int, agent):
        if not self.cfg.world_model:
            return self.envs.make_vec(n, asynchronous=agent.cfg.async_envs, autoreset="same_step",
                                      execute_horizon=agent.execute_horizon)
        from embodied.world_model_env import ImaginationConfig, imagined_vec_env

        data = self.model_dataset if self.model_dataset is not None else self.dataset
        if data is None:
            raise ConfigError("algo.world_model needs offline data to learn the model from; set dataset=...")
        wcfg = ImaginationConfig.from_dict(self.cfg.world_model)
        if wcfg.starts == "policy" and self.dataset is None:
            raise ConfigError("algo.world_model.starts=policy needs the run's dataset; set dataset=...")
        starts = self.dataset if wcfg.starts == "policy" else None
        envs, metrics = imagined_vec_env(wcfg, data, n, agent.execute_horizon, seed=self.cfg.seed,
                                         device=self.cfg.device, log=tqdm.write, starts=starts)
        self.logger.log({**metrics, "total_step": self.offline_step}, step=self.online_step, phase="online",
                        kind="train")
        return envs

    def _finish(self) -> dict:
        summary = super()._finish()
        imagined = bool(self.cfg.world_model)
        summary["online_real_env_steps"] = 0 if imagined else self.online_step
        summary["online_imagined_steps"] = self.online_step if imagined else 0
        return summary

    def _online_agent(self):
        cfg = self.cfg
        dcfg = agents.make_config("dppo", cfg.online_agent)
        base = self.offline_agent.actor if self.offline_agent is not None else None
        agent = DPPO(self.spec.obs_dim, self.spec.act_dim, dcfg, cfg.device, cfg.seed, base=base)
        if base is None:
            self._fit_normalization(agent.actor)
        self.loop = DPPOLoop(dcfg.n_envs, dcfg.gamma)
        return agent

    def loop_state(self) -> dict | None:
        return self.loop.state_dict() if getattr(self, "loop", None) is not None else None

    def load_loop_state(self, state: dict | None) -> None:
        if state is not None:
            self.loop.load_state_dict(state)

    def _run_online(self) -> None:
        cfg, agent = self.cfg, self.agent
        dcfg = agent.cfg
        n, to = dcfg.n_envs, agent.obs_horizon
        envs = self._rollout_envs(n, agent)
        steps_key = "online/imagined_steps" if cfg.world_model else "online/env_steps"
        loop = self.loop
        obs, _ = envs.reset(seed=cfg.seed + 7 + self.online_step)
        states = obs[STATE_KEY]
        history = np.repeat(states[:, None], to, 1)  # [E, To, obs]
        if self.online_step == 0:
            self.evaluate(0, self.offline_step)
        next_eval = (self.online_step // cfg.eval_every_online + 1) * cfg.eval_every_online
        window = []
        bar = tqdm(total=cfg.online_steps, initial=self.online_step, desc="online dppo", disable=not self.progress,
                   dynamic_ncols=True)
        while self.online_step < cfg.online_steps:
            roll = {k: [] for k in ("cond", "latents", "old_log_probs", "values", "next_values", "rewards", "terminals",
                                    "dones")}
            for _ in range(dcfg.rollout_steps):
                seq = torch.as_tensor(history, device=agent.device)
                chunk, latents, cond = agent.sample_chain(seq)
                with torch.no_grad():
                    old = agent.log_probs(cond, latents, dcfg.logprob_reduce)
                    values = agent.value(cond)
                rows = chunk[:, : agent.execute_horizon].cpu().numpy()
                obs, reward, terminated, truncated, info = envs.step(rows)
                executed = _per_env(info, "executed", n, agent.execute_horizon).astype(np.int64)
                success = _per_env(info, "success", n, False).astype(bool)
                reward = self.rewards(reward, steps=executed)
                next_states = obs[STATE_KEY].copy()
                done = np.asarray(terminated) | np.asarray(truncated)
                after = next_states.copy()  # the state after the decision (final obs when the episode ended)
                if "final_obs" in info:
                    for i in np.flatnonzero(info.get("_final_obs", done)):
                        after[i] = info["final_obs"][i][STATE_KEY]
                after_hist = np.concatenate([history[:, 1:], after[:, None]], 1)
                with torch.no_grad():
                    next_values = agent.value(agent.actor.condition(torch.as_tensor(after_hist, device=agent.device)))
                for i in range(n):  # a few states for the switch diagnostics (action distance)
                    self.online_buffer.add(history[i, -1], rows[i, 0], reward[i], after[i], terminated[i], truncated[i])
                for key, value in (("cond", cond), ("latents", latents), ("old_log_probs", old), ("values", values),
                                   ("next_values", next_values)):
                    roll[key].append(value.cpu().numpy())
                roll["rewards"].append(loop.return_norm(reward, done) if dcfg.reward_norm else reward.astype(np.float32))
                roll["terminals"].append(np.asarray(terminated, np.float32))
                roll["dones"].append(done.astype(np.float32))
                self._episode_bookkeeping(reward, executed, done, success)
                history = np.concatenate([history[:, 1:], next_states[:, None]], 1)
                for i in np.flatnonzero(done):
                    history[i] = next_states[i]
                self.online_step += int(executed.sum())
                bar.update(int(executed.sum()))
                if self.online_step >= cfg.online_steps:
                    break
            arrays = {k: np.stack(v) for k, v in roll.items()}  # [T, E, ...]
            adv, ret = gae(arrays["rewards"], arrays["values"], arrays["next_values"], arrays["terminals"],
                           arrays["dones"], dcfg.gamma, dcfg.gae_lambda)
            flat = lambda x: x.reshape(-1, *x.shape[2:])
            window.append(agent.update({"cond": flat(arrays["cond"]), "latents": flat(arrays["latents"]),
                                        "old_log_probs": flat(arrays["old_log_probs"]), "advantages": adv.reshape(-1),
                                        "returns": ret.reshape(-1)}, actor=loop.iteration >= dcfg.critic_warmup_iters))
            loop.iteration += 1
            step = min(self.online_step, cfg.online_steps)
            self.logger.log({**mean_metrics(window), steps_key: self.online_step, "total_step": self.offline_step + step},
                            step=step, phase="online", kind="train")
            window = []
            if step >= next_eval or step >= cfg.online_steps:
                record = self.evaluate(step, self.offline_step + step)
                bar.set_postfix(score=f"{record['eval/score']:.1f}")
                next_eval = (step // cfg.eval_every_online + 1) * cfg.eval_every_online
            self._maybe_checkpoint_crossing(self.offline_step + step)
        envs.close()
        bar.close()

    def _episode_bookkeeping(self, reward: np.ndarray, executed: np.ndarray, done: np.ndarray, success: np.ndarray) -> None:
        self.loop.episode_return += self.rewards.raw(reward, steps=executed)
        log_episode_ends(self, self.loop.episode_return, done, success)

    def learning_start(self) -> int:
        return 0
