"""Online RL fine-tuning of a pretrained VLA by policy gradient through its flow head: ReinFlow
(Zhang et al. 2025), route (b) of the VLA fine-tuning issue.

    python -m embodied.train algo=vla_ppo env=cube-single-suite dataset=task algo.online_agent.task=2

The flow head integrates x_{k+1} = x_k + v(x_k, s_k) / K in K Euler steps from x_0 ~ N(0, I). ReinFlow
adds a small learned noise network sigma(s_k, context) and samples each step as a Gaussian,

    x_{k+1} ~ N(clip(x_k + v(x_k, s_k) / K, -1, 1), sigma_k^2),   sigma_k in [min_std, max_std],

so the whole chain is a Markov chain with a tractable likelihood, and PPO applies to it with one ratio per
chunk. The log-likelihood is ReinFlow's normalised one: log N(x_0) plus every transition, divided by
(K + 1) and by the chunk's size, clamped to [logprob_min, logprob_max]; the entropy term is normalised the
same way. The reward is the task's success (1 at the decision whose chunk succeeds, `reward=success`), not
the env's shaped reward: Meta-World's dense reward peaks inside the success region, and with episodes ending
at success a policy that hovers at its edge out-earns one that succeeds (a pilot went 0.3 -> 0.0 success
while its return rose). V(s) reads the state and the instruction's frozen embedding (an asymmetric critic: the sim's
state is at hand while fine-tuning; the policy still acts from the camera). Rollouts come from `n_envs`
envs of the fine-tuned task, each executing its chunk open-loop; GAE over chunk decisions. Evaluation
and deployment use the plain K-step Euler sampler of the fine-tuned VLA (no injected noise), which is
what `policies.load(<run>/policy)` restores.

What learns (`finetune`): "head" the action expert's own layers (action in/out, time embedding, action
positions) with the fusion transformer and vision frozen; "lora" those plus peft LoRA adapters on every
linear layer of the fusion transformer (merged into its weights when fine-tuning ends, so the saved
policy is a plain VLA); "full" the whole network. The noise network always learns.

Forgetting: `bc_coef > 0` adds the pretraining loss (flow matching) on batches of the pretraining demos of
every task of the suite: the retention measure. Every iteration logs the chain KL to the pretrained policy
(the same chain with the pretrained velocity and the same sigma: sum_k |mu_ft - mu_pre|^2 / (2 sigma^2),
an upper bound on the KL between their action distributions) and the action distance between their
deterministic chunks from the same noise.

Defaults are ReinFlow's (cfg/gym/finetune/hopper-v2/ft_ppo_reflow_mlp.yaml, model/flow/ft_ppo/ppoflow.py);
counts (envs, rollout length, minibatch) are CPU-sized and departures are named in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from embodied.agents.base import Agent
from embodied.agents.dppo import DPPOLoop, _per_env, gae, log_episode_ends
from embodied.agents.nets import ValueEnsemble, to_torch
from embodied.agents.runner import mean_metrics
from embodied.agents.vla_bc import (VLAActing, VLAFinetuneRunner, check_online_reward, merge_adapters,
                                     prepare_finetune)
from embodied.constants import STATE_KEY
from embodied.errors import ConfigError
from policies.flow import euler_integrate

FINETUNE_MODES = ("head", "lora", "full")


@dataclass
class VLAPPOConfig:
    task: int = 1                              # the suite task fine-tuned online; evaluation covers all of them
    finetune: str = "head"                     # head | lora | full (what of the VLA learns)
    lora_rank: int = 8                         # peft LoraConfig's default r
    lora_alpha: int = 8                        # peft's default
    denoising_steps: int = 4                   # ReinFlow: K Euler steps, fine-tuned and deployed
    min_std: float = 0.10                      # ReinFlow (hopper): bounds of the learned noise std
    max_std: float = 0.24
    noise_decay: bool = True                   # ReinFlow's learn_decay: max_std cosine-decays after a hold
    noise_hold_ratio: float = 0.35             # ... of the planned iterations
    noise_decay_ratio: float = 0.7             # ... to min_std * 0.3 + max_std * 0.7
    noise_hidden: tuple[int, ...] = (64, 64)   # ReinFlow's noise MLP (Tanh)
    randn_clip: float = 3.0                    # samples stay within 3 std of the mean
    logprob_min: float = -1.0                  # clamp of the normalised log-likelihood
    logprob_max: float = 1.0
    clip_ratio: float = 0.01
    ent_coef: float = 0.03
    vf_coef: float = 0.5
    target_kl: float | None = 1.0              # stop an iteration's minibatches past this approx-KL
    update_epochs: int = 5
    sample_repeats: int = 10                   # ReinFlow's repeat_samples: each decision 10x per epoch
    minibatches: int = 4                       # per epoch: ReinFlow's 40 envs x 500 steps x 10 repeats / batch 50,000,
                                               # kept whatever the rollout's size (20 steps per iteration)
    actor_lr: float = 4.5e-5
    critic_lr: float = 6.5e-4
    critic_weight_decay: float = 1e-5
    max_grad_norm: float | None = None         # ReinFlow's hopper config clips nothing
    gamma: float = 0.99                        # per chunk decision
    gae_lambda: float = 0.95
    reward: str = "success"                    # what PPO maximises: "success" (1 at the decision whose chunk succeeds;
                                               # ReinFlow's manipulation tasks use sparse success rewards) or "env"
                                               # (the env's reward through the run's transform)
    reward_norm: bool = True                   # running std of discounted returns (reward_scale_running)
    critic_hidden: tuple[int, ...] = (256, 256, 256)
    n_envs: int = 4                            # CPU count (ReinFlow: 40)
    rollout_steps: int = 16                    # chunk decisions per env per iteration; CPU count (ReinFlow: 500)
    async_envs: bool = False
    bc_coef: float = 0.0                       # retention: the pretraining loss on the suite's demos (0: off)
    bc_batch_size: int = 32


class NoiseNet(nn.Module):
    """sigma_k [B, chunk * A] in [min_std, max_std] from the step's time embedding and the encoded context
    (both detached), through tanh onto the log-variance range, as ReinFlow's ExploreNoiseNet."""

    def __init__(self, in_dim: int, out_dim: int, hidden: tuple[int, ...], min_std: float, max_std: float):
        super().__init__()
        dims, layers = [in_dim, *hidden], []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.Tanh()]
        self.net = nn.Sequential(*layers, nn.Linear(dims[-1], out_dim))
        self.set_range(min_std, max_std)

    def set_range(self, min_std: float, max_std: float) -> None:
        self.logvar_min, self.logvar_max = 2 * math.log(min_std), 2 * math.log(max_std)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        unit = (torch.tanh(self.net(features)) + 1) / 2
        return torch.exp(0.5 * (self.logvar_min + (self.logvar_max - self.logvar_min) * unit))


class VLAPPO(VLAActing, Agent):
    """Acts (`act_chunk`, evaluation, deployment) with the fine-tuned VLA's plain K-step Euler sampler, no
    injected noise; explores (`explore`) with the noisy chain."""
    def __init__(self, obs_dim: int, act_dim: int, cfg: VLAPPOConfig = VLAPPOConfig(), device: str = "cpu",
                 seed: int = 0, vla=None):
        if vla is None:
            raise ConfigError("algo=vla_ppo fine-tunes a pretrained VLA: it continues offline_algo=vla_bc "
                              "(set algo=vla_ppo, or pretrained=<a vla_bc run>)")
        if getattr(vla, "head", None) != "flow":
            raise ConfigError(f"algo=vla_ppo needs the flow head (its Euler chain is what PPO fine-tunes); the VLA has "
                              f"head={getattr(vla, 'head', None)!r}: pretrain with policy.head=flow")
        check_online_reward(cfg.reward)
        if cfg.finetune not in FINETUNE_MODES:
            raise ConfigError(f"algo.online_agent.finetune={cfg.finetune!r}: choose one of {', '.join(FINETUNE_MODES)}")
        if cfg.denoising_steps < 1 or not 0 < cfg.min_std <= cfg.max_std:
            raise ConfigError("algo.online_agent.denoising_steps must be >= 1 and 0 < min_std <= max_std")
        if min(cfg.n_envs, cfg.rollout_steps, cfg.update_epochs, cfg.sample_repeats, cfg.minibatches) < 1:
            raise ConfigError("algo.online_agent n_envs, rollout_steps, update_epochs, sample_repeats and "
                              "minibatches must be >= 1")
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        torch.manual_seed(seed)   # noise net and critic init
        vla.flow_steps = cfg.denoising_steps
        self.reference = copy.deepcopy(vla).requires_grad_(False).eval()   # the pretrained policy: KL, distance
        self.actor = vla.eval()
        self.chunk_horizon = self.execute_horizon = vla.chunk
        self.obs_horizon = 1
        trainable = prepare_finetune(self.actor, cfg.finetune, cfg.lora_rank, cfg.lora_alpha)
        d, chunk_size = vla.dim, vla.chunk * act_dim
        self.noise = NoiseNet(2 * d, chunk_size, cfg.noise_hidden, cfg.min_std, cfg.max_std).to(self.device)
        self.critic = ValueEnsemble(obs_dim + vla.text_dim, cfg.critic_hidden, 1).to(self.device)
        trainable = trainable + list(self.noise.parameters())
        self.actor_optimizer = torch.optim.AdamW(trainable, lr=cfg.actor_lr, weight_decay=0.0)
        self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr,
                                                  weight_decay=cfg.critic_weight_decay)

    @classmethod
    def from_agent(cls, vla_agent, cfg: VLAPPOConfig, seed: int = 0) -> "VLAPPO":
        return cls(vla_agent.obs_dim, vla_agent.act_dim, cfg, str(vla_agent.device), seed, vla=vla_agent.actor)

    # -- the noisy chain ------------------------------------------------------------------------------
    def set_progress(self, fraction: float) -> None:
        """learn_decay: the noise's upper bound holds, then cosine-decays, over the planned iterations."""
        cfg = self.cfg
        if not cfg.noise_decay:
            return
        low = cfg.min_std * (1 - cfg.noise_decay_ratio) + cfg.max_std * cfg.noise_decay_ratio
        t = min(max((fraction - cfg.noise_hold_ratio) / (1 - cfg.noise_hold_ratio), 0.0), 1.0)
        self.noise.set_range(cfg.min_std, low + (cfg.max_std - low) * 0.5 * (1 + math.cos(math.pi * t)))

    def condition(self, vla, prefix: torch.Tensor) -> tuple[list, torch.Tensor]:
        """The prefix's key/value cache (what the flow head attends to) and its pooled encoding [B, d]."""
        encoded, cache = vla.backbone(prefix)
        return cache, encoded.mean(1)

    def step_mean_std(self, vla, x: torch.Tensor, k: int, cache: list, context: torch.Tensor,
                      with_std: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Transition k of the chain: mean clip(x + v / K) [B, H, A] and sigma [B, H, A] (the VLA's own grid)."""
        steps = self.cfg.denoising_steps
        s = torch.full((x.shape[0],), k / steps, device=x.device)
        mean = (x + vla.velocity(x, s, cache) / steps).clamp(-1.0, 1.0)
        if not with_std:
            return mean, None
        features = torch.cat([self.actor.time_embed(s).detach(), context.detach()], -1)
        return mean, self.noise(features).view_as(x)

    @torch.no_grad()
    def sample(self, cache: list, context: torch.Tensor) -> tuple[torch.Tensor, list, list]:
        """A noisy chain [B, K+1, H, A] (normalised actions; the last entry is the chunk) with each transition's
        mean and sigma, which its log-prob (`likelihood`) and the KL to the pretrained policy read."""
        actor, cfg = self.actor, self.cfg
        x = torch.randn(context.shape[0], actor.chunk, actor.act_dim, device=context.device)
        chain, means, stds = [x], [], []
        for k in range(cfg.denoising_steps):
            mean, std = self.step_mean_std(actor, x, k, cache, context)
            x = mean + std * torch.randn_like(mean).clamp(-cfg.randn_clip, cfg.randn_clip)
            if k == cfg.denoising_steps - 1:
                x = x.clamp(-1.0, 1.0)
            chain.append(x)
            means.append(mean)
            stds.append(std)
        return torch.stack(chain, 1), means, stds

    def likelihood(self, chain: torch.Tensor, means: list, stds: list) -> tuple[torch.Tensor, torch.Tensor]:
        """ReinFlow's normalised log-likelihood [B] of a chain (clamped) and its normalised entropy [B], from
        the transitions' means and sigmas."""
        cfg, normal = self.cfg, torch.distributions.Normal
        logp = normal(0.0, 1.0).log_prob(chain[:, 0]).flatten(1).sum(1)
        entropy = torch.full_like(logp, 0.5 * math.log(2 * math.pi * math.e) * chain[0, 0].numel())
        for k, (mean, std) in enumerate(zip(means, stds)):
            dist = normal(mean, std)
            logp = logp + dist.log_prob(chain[:, k + 1]).flatten(1).sum(1)
            entropy = entropy + dist.entropy().flatten(1).sum(1)
        scale = (len(means) + 1) * chain[0, 0].numel()
        return (logp / scale).clamp(cfg.logprob_min, cfg.logprob_max), entropy / scale

    def log_prob(self, cache: list, context: torch.Tensor, chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`likelihood` of a stored chain under the current networks (what PPO's ratio reads)."""
        steps = [self.step_mean_std(self.actor, chain[:, k], k, cache, context)
                 for k in range(self.cfg.denoising_steps)]
        return self.likelihood(chain, [m for m, _ in steps], [s for _, s in steps])

    def value(self, state: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return self.critic(torch.cat([(state - self.actor.obs_mean) / self.actor.obs_std, text], -1))[0]

    # -- acting ---------------------------------------------------------------------------------------
    def inputs(self, obs: dict) -> dict:
        """Batched observation dict -> the rows a rollout stores: state, frames, instructions, text embedding."""
        state, images, tasks, _ = self.actor._inputs(obs)
        return {"state": state.to(self.device), "images": images, "tasks": list(tasks),
                "text": self.actor.embed_text(tasks)}

    @torch.no_grad()
    def explore(self, rows: dict) -> dict:
        """One rollout decision for a batch of rows: the raw chunk to execute, the chain, its log-prob, V(s)."""
        prefix = self.actor.prefix(rows["state"], rows["images"], rows["tasks"])
        cache, context = self.condition(self.actor, prefix)
        chain, means, stds = self.sample(cache, context)
        return {"chunk": self.actor.unnormalize_actions(chain[:, -1]), "chain": chain,
                "log_prob": self.likelihood(chain, means, stds)[0],
                "value": self.value(rows["state"], rows["text"])}

    # -- PPO --------------------------------------------------------------------------------------------
    def _conditions(self, rows: dict):
        """A function idx -> (cache, context) over the rollout's rows. What is frozen is encoded once,
        without gradients: everything (head), the prefix tokens (lora: the adapters change the cache)."""
        actor, mode = self.actor, self.cfg.finetune
        if mode == "full":
            return lambda idx: self.condition(actor, actor.prefix(
                rows["state"][idx], {c: v[idx] for c, v in rows["images"].items()}, [rows["tasks"][i] for i in idx]))
        with torch.no_grad():
            prefix = actor.prefix(rows["state"], rows["images"], rows["tasks"])
            if mode == "lora":
                return lambda idx: self.condition(actor, prefix[idx])
            cache, context = self.condition(actor, prefix)
        return lambda idx: ([(k[idx], v[idx]) for k, v in cache], context[idx])

    def update(self, rollout: dict, bc_sampler=None) -> dict[str, float]:
        """PPO epochs over one rollout: rows (state, images, tasks, text), chain [N, K+1, H, A], log_prob,
        advantages, returns [N]. `bc_sampler(n)` draws pretraining batches for the retention term."""
        cfg = self.cfg
        data = to_torch({k: rollout[k] for k in ("chain", "log_prob", "advantages", "returns")}, self.device)
        rows = rollout["rows"]
        n = data["chain"].shape[0]
        conditions = self._conditions(rows)
        history, approx_kl = [], 0.0
        params = [p for group in self.actor_optimizer.param_groups for p in group["params"]]
        for _ in range(cfg.update_epochs):
            order = torch.randperm(n * cfg.sample_repeats) % n
            for idx in order.chunk(cfg.minibatches):
                if cfg.target_kl is not None and approx_kl > cfg.target_kl:
                    break
                idx = idx.to(self.device)
                cache, context = conditions(idx)
                new, entropy = self.log_prob(cache, context, data["chain"][idx])
                log_ratio = new - data["log_prob"][idx]
                ratio = log_ratio.exp()
                adv = data["advantages"][idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8) if len(idx) > 1 else adv   # per minibatch, as ReinFlow
                pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_ratio, 1 + cfg.clip_ratio)).mean()
                values = self.value(rows["state"][idx], rows["text"][idx])
                v_loss = 0.5 * (values - data["returns"][idx]).square().mean()
                loss = pg - cfg.ent_coef * entropy.mean() + cfg.vf_coef * v_loss
                metrics = {}
                if cfg.bc_coef > 0 and bc_sampler is not None:
                    batch = bc_sampler(cfg.bc_batch_size)
                    bc = self.actor.loss(batch, batch["actions"], batch.get("valid"))
                    loss = loss + cfg.bc_coef * bc
                    metrics["bc_loss"] = float(bc.detach())
                self.actor_optimizer.zero_grad(set_to_none=True)
                self.critic_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.max_grad_norm:
                    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                    torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm)
                self.actor_optimizer.step()
                self.critic_optimizer.step()
                with torch.no_grad():
                    approx_kl = float(((ratio - 1) - log_ratio).mean())
                history.append({"pg_loss": float(pg.detach()), "v_loss": float(v_loss.detach()), "approx_kl": approx_kl,
                                "clipfrac": float(((ratio - 1).abs() > cfg.clip_ratio).float().mean()),
                                "ratio_mean": float(ratio.detach().mean()), "entropy": float(entropy.detach().mean()),
                                **metrics})
        out = mean_metrics(history)
        out["train/first_ratio"] = history[0]["ratio_mean"]   # 1 up to float error: stored log-probs recomputed
        out["train/minibatches"] = float(len(history))
        out["train/noise_max_std"] = math.exp(0.5 * self.noise.logvar_max)
        return out

    @torch.no_grad()
    def divergence(self, rows: dict) -> dict[str, float]:
        """Chain KL to the pretrained policy on these rows (the fine-tuned chain's samples, the same sigma), and
        the action distance between the two deterministic chunks from the same noise (raw action units)."""
        actor, ref = self.actor, self.reference
        cache, context = self.condition(actor, actor.prefix(rows["state"], rows["images"], rows["tasks"]))
        ref_cache, _ = self.condition(ref, ref.prefix(rows["state"], rows["images"], rows["tasks"]))
        chain, means, stds = self.sample(cache, context)
        kl = torch.zeros(chain.shape[0], device=chain.device)
        for k, (mean, std) in enumerate(zip(means, stds)):
            ref_mean, _ = self.step_mean_std(ref, chain[:, k], k, ref_cache, context, with_std=False)
            kl += ((mean - ref_mean).square() / (2 * std.square())).flatten(1).sum(1)
        z = torch.randn(chain[:, 0].shape, generator=torch.Generator().manual_seed(0)).to(chain.device)
        steps = self.cfg.denoising_steps   # the VLAs' own sampler (`euler`) on the caches already encoded
        distance = actor.unnormalize_actions(euler_integrate(lambda x, s: actor.velocity(x, s, cache), z, steps)) \
            - ref.unnormalize_actions(euler_integrate(lambda x, s: ref.velocity(x, s, ref_cache), z, steps))
        return {"finetune/chain_kl": float(kl.mean()), "finetune/action_distance": float(distance.norm(dim=-1).mean())}

    def merge_adapters(self) -> None:
        merge_adapters(self.actor)

    def _modules(self) -> dict:
        return {"actor": self.actor, "noise": self.noise, "critic": self.critic, "reference": self.reference}

    def _optimizers(self) -> dict:
        return {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer}


def _stack_rows(rows: list[dict]) -> dict:
    return {"state": torch.cat([r["state"] for r in rows]), "text": torch.cat([r["text"] for r in rows]),
            "images": {c: torch.cat([r["images"][c] for r in rows]) for c in rows[0]["images"]},
            "tasks": [t for r in rows for t in r["tasks"]]}


class VLAPPORunner(VLAFinetuneRunner):
    """VLARunner with the online phase of `online_algo=vla_ppo`: `n_envs` envs of the fine-tuned task
    (frames rendered at chunk ends only, the instruction), one noisy chunk per env per decision, PPO on each
    rollout. The fine-tuned policy (K Euler steps) is evaluated on every task at online step 0, which is the
    "before" of the summary (the pretraining's eval used the VLA's own step count), and every
    `eval.every_online` env steps after."""

    def _online_agent(self):
        from embodied import agents

        agent = agents.continue_from("vla_ppo", self.offline_agent, self.cfg.online_agent, seed=self.cfg.seed)
        self.loop = DPPOLoop(agent.cfg.n_envs, agent.cfg.gamma)   # the same rollout-to-rollout state as DPPO's
        return agent

    def _before(self) -> dict:
        return self.before_finetune or {}

    def loop_state(self) -> dict | None:
        """Saved with every online checkpoint: DPPO's loop state, and the "before" eval a resume cannot redo."""
        if getattr(self, "loop", None) is None:
            return None
        return {**self.loop.state_dict(), "before_finetune": self.before_finetune}

    def load_loop_state(self, state: dict | None) -> None:
        if state is not None:
            self.loop.load_state_dict(state)
            self.before_finetune = state.get("before_finetune")

    def _run_online(self) -> None:
        cfg, agent = self.cfg, self.agent
        pcfg, h = agent.cfg, agent.execute_horizon
        n = pcfg.n_envs
        envs = self.envs.make_vec(n, asynchronous=pcfg.async_envs, autoreset="same_step", seed=cfg.seed + 7,
                                  execute_horizon=h, mid_chunk_frames=False, **self._env_kwargs(self.finetune_task))
        loop = self.loop   # restored by a resume, which then starts fresh episodes from the step it reached
        obs, _ = envs.reset(seed=cfg.seed + 7 + self.online_step)
        if self.online_step == 0:
            self.before_finetune = self.evaluate(0, self.offline_step)
        planned = max(1, math.ceil(cfg.online_steps / (n * pcfg.rollout_steps * h)))
        return_norm, episode_return = loop.return_norm, loop.episode_return
        bc_sampler = self._bc_sampler() if pcfg.bc_coef > 0 else None
        next_eval = (self.online_step // cfg.eval_every_online + 1) * cfg.eval_every_online
        bar = tqdm(total=cfg.online_steps, initial=self.online_step, desc=f"online vla_ppo task {self.finetune_task}",
                   disable=not self.progress, dynamic_ncols=True)
        while self.online_step < cfg.online_steps:
            agent.set_progress(loop.iteration / planned)
            roll = {k: [] for k in ("rows", "chain", "log_prob", "values", "next_values", "rewards", "terminals",
                                    "dones")}
            for _ in range(pcfg.rollout_steps):
                rows = agent.inputs(obs)
                out = agent.explore(rows)
                obs, reward, terminated, truncated, info = envs.step(out["chunk"][:, :h].cpu().numpy())
                executed = _per_env(info, "executed", n, h).astype(np.int64)
                success = _per_env(info, "success", n, False).astype(bool)
                episode_return += np.asarray(reward, np.float64)   # the env's own return, for the logs
                reward = (success.astype(np.float32) if pcfg.reward == "success"
                          else self.rewards(reward, steps=executed))
                done = np.asarray(terminated) | np.asarray(truncated)
                after = np.asarray(obs[STATE_KEY], np.float32).copy()
                if "final_obs" in info:
                    for i in np.flatnonzero(info.get("_final_obs", done)):
                        after[i] = info["final_obs"][i][STATE_KEY]
                with torch.no_grad():
                    next_values = agent.value(torch.as_tensor(after, device=agent.device), rows["text"])
                roll["rows"].append(rows)
                for key, value in (("chain", out["chain"]), ("log_prob", out["log_prob"]), ("values", out["value"]),
                                   ("next_values", next_values)):
                    roll[key].append(value.cpu().numpy())
                roll["rewards"].append(return_norm(reward, done) if pcfg.reward_norm else reward.astype(np.float32))
                roll["terminals"].append(np.asarray(terminated, np.float32))
                roll["dones"].append(done.astype(np.float32))
                log_episode_ends(self, episode_return, done, success)
                self.online_step += int(executed.sum())
                bar.update(int(executed.sum()))
                if self.online_step >= cfg.online_steps:
                    break
            if len(roll["rows"]) == pcfg.rollout_steps:
                arrays = {k: np.stack(v) for k, v in roll.items() if k != "rows"}   # [T, E, ...]
                adv, ret = gae(arrays["rewards"], arrays["values"], arrays["next_values"], arrays["terminals"],
                               arrays["dones"], pcfg.gamma, pcfg.gae_lambda)
                flat = lambda x: x.reshape(-1, *x.shape[2:])   # [T * E, ...], row t * E + e, as _stack_rows
                metrics = agent.update({"rows": _stack_rows(roll["rows"]), "chain": flat(arrays["chain"]),
                                        "log_prob": flat(arrays["log_prob"]), "advantages": adv.reshape(-1),
                                        "returns": ret.reshape(-1)}, bc_sampler)
                metrics.update(agent.divergence(roll["rows"][0]))
                loop.iteration += 1
            else:   # the budget cut this rollout short: 20 gradient steps on a handful of decisions would
                # overfit them (a first version's last update did: clip fraction 0.6), so they go unused
                metrics = {"online/unused_decisions": float(len(roll["rows"]) * n)}
            step = min(self.online_step, cfg.online_steps)
            self.logger.log({**metrics, "online/iteration": loop.iteration, "total_step": self.offline_step + step},
                            step=step, phase="online", kind="train")
            if step >= next_eval or step >= cfg.online_steps:
                record = self.evaluate(step, self.offline_step + step)
                bar.set_postfix(success=f"{record['eval/success']:.2f}")
                next_eval = (step // cfg.eval_every_online + 1) * cfg.eval_every_online
            self._maybe_checkpoint_crossing(self.offline_step + step)
        bar.close()
        envs.close()
        agent.merge_adapters()

    def _bc_sampler(self):
        """Pretraining chunks of every task (the suite's demos) for the retention term."""
        if self.dataset is None:
            raise ConfigError("algo.online_agent.bc_coef > 0 needs the pretraining demos: run with the suite's "
                              "dataset (dataset=task), not pretrained= alone")
        return lambda batch_size: self.dataset.sample_chunks(batch_size, self.agent.actor.chunk)
