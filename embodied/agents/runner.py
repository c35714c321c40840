"""The offline→online loop: pretrain on a dataset, switch, fine-tune in the environment.

Every preset (wsrl, rlpd, calql, naive, scratch) is this one loop with different switch knobs:

    offline phase   `offline_steps` gradient steps of `offline_algo` on the dataset (skipped when None)
    switch          loss swap to `online_algo` (or keep the offline loss: "same"), optionally a fresh
                    critic and/or fresh optimizer state; the pretrained actor is frozen as a reference
    online phase    `warmup_steps` env steps with the pretrained policy and no gradient steps (WSRL),
                    `random_steps` uniform-random env steps (scratch/RLPD), then `utd` updates per env
                    step on batches mixing offline data at `offline_ratio`

Switch diagnostics (logged for every run): post-switch dip, the critic's Q against the Monte-Carlo
returns of fresh online episodes (calibration gap), and the distance of the fine-tuned actor's actions
from the pretrained actor's on online states.
"""
from __future__ import annotations

import copy
import dataclasses
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import sims
from embodied import agents
from embodied.agents.chunking import is_chunked
from embodied.agents.nets import to_torch
from embodied.agents.sac import SAC
from embodied.checkpoints import (PRETRAINED_DIR, Checkpoint, check_checkpoint_config, dataset_fingerprint, fallback,
                                  find_checkpoints, first_line, pretrained_folder, read_checkpoint, read_pretrained,
                                  write_folder)
from embodied.data.dataset import Dataset
from embodied.data.replay import MixedReplay, ReplayBuffer
from embodied.data.rewards import RewardTransform
from embodied.errors import CheckpointError, ConfigError
from embodied.evaluation import ChunkActor, EvalResult, evaluate, record_video
from sims.source import EnvSource
from embodied.stats import DIP_WINDOW_FRACTION, post_switch_dip
from policies.base import STATE_KEY


@dataclass
class RunnerConfig:
    env: str
    env_options: dict = field(default_factory=dict)     # sims.make keyword arguments (env.options: task_id, ...)
    offline_algo: str | None = "calql"        # None: no pretraining (scratch, rlpd)
    online_algo: str = "sac"                  # "same": keep the offline loss online (Cal-QL fine-tuning)
    offline_agent: dict = field(default_factory=dict)   # config overrides for the offline agent
    online_agent: dict = field(default_factory=dict)    # ... and for the online agent (SAC)
    offline_steps: int = 10_000
    online_steps: int = 10_000                # environment steps, warmup and random steps included
    offline_batch_size: int = 256
    online_batch_size: int = 256
    utd: int = 1                              # critic updates per env step
    critic_only_utd: bool = True              # WSRL/RLPD: utd critic minibatches, then 1 actor step on all of them;
                                              # False: utd full updates (actor and temperature too)
    offline_ratio: float = 0.0                # share of offline data in online batches (WSRL 0, RLPD 0.5)
    warmup_steps: int = 0                     # WSRL: env steps with the pretrained policy, no gradient steps
    random_steps: int = 0                     # uniform-random env steps before learning (scratch, RLPD)
    reinit_critic: bool = False
    reset_optimizers: bool = False
    switch_temperature: str = "keep"          # SAC's temperature at the switch: keep | reset | fast | refit
    switch_temperature_value: float = 0.05    # reset: the new temperature
    switch_temperature_steps: int = 1000      # fast: steps at the raised lr; refit: actor+temperature steps
    switch_temperature_lr_scale: float = 10.0  # fast: temperature lr multiplier for the first steps
    actor_delay_steps: int = 0                # env steps after learning starts with critic updates only (0: WSRL)
    online_cql_alpha: float | None = None     # same, on a CQL-family agent: the penalty weight after the switch
                                              # (the official code's online_cql_alpha); None keeps cql_alpha
    world_model: dict = field(default_factory=dict)  # DPPO only: roll out online in a learned model (DiWA-style),
                                              # embodied.world_model_env.ImaginationConfig; {}: the real env
    pretrained: str | None = None             # start online from this run's saved pretraining (skip offline)
    gamma: float = 0.99
    reward_scale: float = 1.0                 # r' = reward_scale * r + reward_bias (embodied.data.rewards)
    reward_bias: float = 0.0
    sparse_failure_reward: float | None = None  # raw reward of a failed step on sparse tasks (Cal-QL MC returns)
    eval_at_start: bool = True                # the step-0 eval of a run that pretrains (false: skip it)
    eval_every_offline: int = 2_000
    eval_every_online: int = 2_000
    eval_episodes: int = 10
    eval_first_episode: int = 0               # the evals' first start state is this many episodes in (a sweep can
                                              # give each seed its own slice of one larger "before" eval)
    dip_evals: int = 4                        # extra evals inside the dip window(s), so the dip is measured
    video_episodes: int = 1
    video_size: int = 128
    log_every: int = 500
    checkpoint_every: int = 0                 # in total steps (offline grad steps + online env steps); 0: off
    keep_checkpoints: int = 2
    replay_capacity: int = 1_000_000
    seed: int = 0
    device: str = "cpu"

    def validate(self) -> None:
        if not 0.0 <= self.offline_ratio <= 1.0:
            raise ConfigError(f"algo.offline_ratio={self.offline_ratio} must be in [0, 1]")
        agents.check_switch(self.offline_algo, self.online_algo)
        if self.switch_temperature not in SWITCH_TEMPERATURE:
            raise ConfigError(f"algo.switch_temperature={self.switch_temperature!r} must be one of "
                              f"{', '.join(SWITCH_TEMPERATURE)}")
        if self.switch_temperature_value <= 0:
            raise ConfigError(f"algo.switch_temperature_value={self.switch_temperature_value} must be > 0")
        if self.online_cql_alpha is not None:
            self._check_online_cql_alpha()
        if self.pretrained and self.offline_algo is None:
            raise ConfigError(f"pretrained={self.pretrained} but algo has no offline_algo to restore; "
                              "drop pretrained= or pick a preset that pretrains")
        for name in ("offline_steps", "online_steps", "warmup_steps", "random_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0")
        if self.utd < 1 or self.eval_episodes < 1 or self.eval_first_episode < 0:
            raise ConfigError("algo.utd and eval.episodes must be >= 1, eval.first_episode >= 0")
        if self.world_model:
            if self.online_algo != "dppo":
                raise ConfigError(f"algo.world_model is set but online_algo={self.online_algo}: imagined rollouts "
                                  "feed only DPPO (algo=diwa); drop algo.world_model")
            from embodied.world_model_env import ImaginationConfig

            ImaginationConfig.from_dict(self.world_model)

    def _check_online_cql_alpha(self) -> None:
        """The knob needs the kept loss (`same`) of a CQL-family agent whose penalty weight is fixed; the offline
        agent's resolved config (registry preset + overrides) decides, before any work."""
        weight = self.online_cql_alpha
        if self.online_algo != "same" or weight < 0:
            raise ConfigError(f"algo.online_cql_alpha={weight} applies to online_algo=same (kept CQL loss) and must "
                              f"be >= 0; online_algo={self.online_algo}: drop it or use algo=calql")
        offline = agents.make_config(self.offline_algo, self.offline_agent)
        if not hasattr(offline, "cql_alpha"):
            raise ConfigError(f"algo.online_cql_alpha={weight} needs a CQL-family offline agent; "
                              f"{self.offline_algo} has no penalty: drop algo.online_cql_alpha")
        if offline.lagrange:
            raise ConfigError(f"algo.online_cql_alpha={weight} with a Lagrange-tuned penalty (lagrange=true): the "
                              "weight is learned; set algo.offline_agent.lagrange=false or drop algo.online_cql_alpha")

    def reward_transform(self) -> RewardTransform:
        return RewardTransform(self.reward_scale, self.reward_bias, self.sparse_failure_reward)


SWITCH_TEMPERATURE = ("keep", "reset", "fast", "refit")

# The RunnerConfig fields an algo preset sets (conf/algo/*.yaml, as algo.<name>); the others come from the
# budget, eval, env, checkpoint and run-level keys. A knob a preset leaves out keeps the default above.
SWITCH_KNOBS = ("offline_algo", "online_algo", "utd", "critic_only_utd", "offline_ratio", "warmup_steps",
                "random_steps", "reinit_critic", "reset_optimizers", "switch_temperature", "switch_temperature_value",
                "switch_temperature_steps", "switch_temperature_lr_scale", "actor_delay_steps", "online_cql_alpha",
                "world_model")
CHUNK_EVAL_ENVS = 5  # chunk agents run on manipulation tasks, whose envs hold ~100 MB each: evaluate in waves


class Runner:
    def __init__(self, cfg: RunnerConfig, dataset: Dataset | None, run_dir: str | Path, logger,
                 progress: bool = True, envs: EnvSource | None = None):
        """`envs`: where the online envs come from (the caller's choice; sims' builders for cfg.env if None)."""
        cfg.validate()
        self.cfg, self.dataset, self.logger, self.progress = cfg, dataset, logger, progress
        self.envs = envs if envs is not None else EnvSource(cfg.env, cfg.env_options)
        if self.envs.name != cfg.env:
            raise ConfigError(f"the runner was given envs of {self.envs.name} for env={cfg.env}; pass the same task")
        if dict(self.envs.options) != dict(cfg.env_options):
            raise ConfigError(f"the runner was given envs with options {dict(self.envs.options)} for env.options="
                              f"{dict(cfg.env_options)}; pass the same task and options")
        self.run_dir = Path(run_dir)
        self.spec = sims.spec(cfg.env)
        self.rewards = cfg.reward_transform()  # the one reward transform: data in, online transitions, MC returns
        self.rng = np.random.default_rng(cfg.seed)
        torch.manual_seed(cfg.seed)
        obs_dim, act_dim = self.spec.obs_dim, self.spec.act_dim
        needs_data = cfg.offline_algo is not None or cfg.offline_ratio > 0
        if needs_data and dataset is None:
            raise ConfigError("this preset uses offline data but no dataset was given; set dataset=...")
        if dataset is not None:
            dataset.validate(obs_dim=obs_dim, act_dim=act_dim)
        self.offline_buffer = self._offline_buffer() if needs_data else None
        capacity = max(1, min(cfg.replay_capacity, cfg.online_steps))
        self.online_buffer = ReplayBuffer(obs_dim, act_dim, capacity=capacity, seed=cfg.seed + 1)
        # Cal-QL fine-tuning keeps its loss online, which needs MC returns: online data is added per episode
        self.keep_episode_mc = cfg.online_algo == "same" and cfg.offline_algo == "calql"

        self.offline_agent = None
        if cfg.offline_algo is not None:
            self.offline_agent = agents.make(cfg.offline_algo, obs_dim, act_dim, cfg.offline_agent, cfg.device, cfg.seed)
            self._fit_normalization(self.offline_agent)
        self.agent = self.offline_agent
        self.pretrained_actor = None
        # progress state (checkpointed)
        self.phase = "offline" if cfg.offline_algo is not None and cfg.offline_steps > 0 else "online"
        self.offline_step = 0
        self.online_step = 0
        self.episodes_done = 0
        self.end_of_offline: dict | None = None
        self.switched = False
        self.eval_history: list[dict] = []

    # -- data -----------------------------------------------------------------------------------
    def _offline_buffer(self) -> ReplayBuffer:
        cfg, ds = self.cfg, self.dataset
        rewards = self.rewards(ds.rewards)
        mc = ds.mc_returns(cfg.gamma, rewards=rewards, sparse_failure_reward=self.rewards.failure_reward)
        buffer = ReplayBuffer(self.spec.obs_dim, self.spec.act_dim, capacity=len(ds), seed=cfg.seed + 2)
        buffer.add_dataset(Dataset(ds.observations, ds.actions, rewards, ds.next_observations, ds.terminals,
                                   ds.timeouts, dict(ds.metadata)), mc_returns=mc)
        return buffer

    def _fit_normalization(self, agent) -> None:
        """Generative chunk policies keep dataset normalisation statistics with their weights."""
        if hasattr(agent, "fit_normalization") and self.dataset is not None:
            agent.fit_normalization(self.dataset.observations, self.dataset.actions)

    def _batch(self, source, batch_size: int) -> dict:
        """Agents with a `chunk_horizon` (chunk policies, sequence-trained world models) learn from h-step
        chunks (`valid`-masked), the others from transitions."""
        horizon = getattr(self.agent, "chunk_horizon", None)
        return source.sample(batch_size) if horizon is None else source.sample_chunks(batch_size, horizon)

    def _eval_seed(self) -> int:
        """The first eval start state: the same at every eval, so comparisons across evals are paired."""
        return eval_seed(self.cfg.seed) + self.cfg.eval_first_episode

    def _chunk_fn(self, seed: int):
        """Evaluation's chunk policy: fresh noise for every chunk, as Diffusion Policy, DPPO, FQL and QC
        evaluate, drawn from a stream seeded like the eval's start states so that evals stay paired. (A
        fixed draw per batch row made success depend on the eval's batch width: on one bc_flow checkpoint
        0.08 at 5 envs and 0.52 at 25, against 0.62 at both fresh; benchmarks/eval_noise.py.)"""
        generator = torch.Generator(device=self.agent.device).manual_seed(seed)
        return lambda obs_seq: self.agent.act_chunk(obs_seq, deterministic=True, generator=generator)

    def _horizons(self) -> tuple[int, int]:
        """(observations in, actions executed per call): (1, 1) for step agents."""
        return getattr(self.agent, "obs_horizon", 1), getattr(self.agent, "execute_horizon", 1)

    def _step_policy(self):
        """A per-step policy for one env (videos): chunks executed open-loop, history kept."""
        if not is_chunked(self.agent):
            return self._deterministic
        actor = ChunkActor(self._chunk_fn(self._eval_seed()), *self._horizons())
        return lambda states: actor(states[0])[None]

    def _sampler(self):
        ratio = self.cfg.offline_ratio if self.offline_buffer is not None else 0.0
        return MixedReplay(self.offline_buffer, self.online_buffer, ratio, seed=self.cfg.seed + 3)

    # -- evaluation -------------------------------------------------------------------------------
    def _deterministic(self, states: np.ndarray) -> np.ndarray:
        return self.agent.actor.act(states, deterministic=True)[:, 0, :]

    def _new_episode(self) -> None:
        """Reset the acting policies' per-episode state (TD-MPC2's MPPI warm start, a generative policy's
        observation history), so nothing from one episode, or from an eval, steers the next."""
        for policy in (getattr(self.agent, "actor", None), self.pretrained_actor):
            reset = getattr(policy, "reset", None)
            if callable(reset):
                reset()

    def run_eval_episodes(self, step_policy=None) -> EvalResult:
        """The eval's episodes from its fixed start states, acted by the agent, or by `step_policy`
        ([B, obs] -> [B, A]: a diagnostic's policy, as `benchmarks/critic_probe.py --climb` passes)."""
        cfg, seed = self.cfg, self._eval_seed()
        obs_horizon, execute_horizon = self._horizons()
        chunked = step_policy is None and is_chunked(self.agent)
        step_policy = step_policy or (None if chunked else self._deterministic)
        return evaluate(cfg.env, step_policy, cfg.eval_episodes, seed=seed, gamma=cfg.gamma,
                        reward_transform=self.rewards, chunk_policy=self._chunk_fn(seed) if chunked else None,
                        obs_horizon=obs_horizon, execute_horizon=execute_horizon,
                        max_envs=CHUNK_EVAL_ENVS if chunked else None, env_kwargs=cfg.env_options)

    def evaluate(self, step: int, total_step: int) -> dict:
        self._new_episode()  # eval episodes start fresh; the online episode it interrupts restarts its plan too
        result = self.run_eval_episodes()
        metrics = result.metrics()
        critic = getattr(self.agent, "critic", None)
        if critic is not None and self.phase == "online" and not is_chunked(self.agent):
            q = self.agent.q_values(result.states, result.actions)
            metrics["switch/calibration_gap"] = float(np.mean(q - result.mc_returns))
            metrics["switch/q_mean"] = float(np.mean(q))
            metrics["switch/mc_return_mean"] = float(np.mean(result.mc_returns))
        if self.pretrained_actor is not None and len(self.online_buffer) > 0:
            probe = 256 if is_chunked(self.agent) else 1024  # generative samplers cost tens of network calls
            states = self.online_buffer.sample(min(probe, len(self.online_buffer)),
                                               rng=np.random.default_rng([self.cfg.seed, total_step]))["observations"]
            with torch.no_grad():
                now = self.agent.actor.act(states, deterministic=True)[:, 0, :]
                before = self.pretrained_actor.act(states, deterministic=True)[:, 0, :]
            metrics["switch/action_distance"] = float(np.mean(np.linalg.norm(now - before, axis=-1)))
        self._new_episode()
        return self._record_eval(step, total_step, metrics)

    def _record_eval(self, step: int, total_step: int, metrics: dict) -> dict:
        record = {"step": step, "total_step": total_step, "phase": self.phase, **metrics}
        self.eval_history.append(record)
        self.logger.log({**metrics, "total_step": total_step}, step=step, phase=self.phase, kind="eval")
        return record

    # -- phases ---------------------------------------------------------------------------------
    def run(self) -> dict:
        if self.cfg.pretrained and not self.switched and self.offline_step == 0:
            self.load_pretrained(self.cfg.pretrained)
        if self.phase == "offline":
            self._run_offline()
            self.save_pretrained()
        if not self.switched:
            self._switch()
        # offline only: this run's end-of-offline eval is its final one (not run twice; a run that only loaded
        # a pretraining has none, and gets its one eval at online step 0)
        if self.cfg.online_steps > 0 or not self.eval_history:
            self._run_online()
        return self._finish()

    def _run_offline(self) -> None:
        cfg = self.cfg
        if self.offline_step == 0 and cfg.eval_at_start:
            self.evaluate(0, 0)
        bar = tqdm(total=cfg.offline_steps, initial=self.offline_step, desc=f"offline {cfg.offline_algo}",
                   disable=not self.progress, dynamic_ncols=True)
        window: list[dict] = []
        while self.offline_step < cfg.offline_steps:
            window.append(self.agent.update(self._batch(self.offline_buffer, cfg.offline_batch_size)))
            self.offline_step += 1
            bar.update(1)
            step = self.offline_step
            if step % cfg.log_every == 0:
                self.logger.log({**mean_metrics(window), "total_step": step}, step=step, phase="offline", kind="train")
                window = []
            if step % cfg.eval_every_offline == 0 or step == cfg.offline_steps:
                record = self.evaluate(step, step)
                bar.set_postfix(score=f"{record['eval/score']:.1f}")
            self._maybe_checkpoint(step)
        bar.close()

    def _freeze_pretrained(self) -> None:
        """At the switch: remember the end-of-offline eval and a frozen copy of the pretrained actor
        (it acts during the warmup and is the reference for the action-drift diagnostic)."""
        if self.offline_agent is not None:
            last = [r for r in self.eval_history if r["phase"] == "offline"]
            self.end_of_offline = last[-1] if last else self.evaluate(self.offline_step, self.offline_step)
            self.pretrained_actor = copy.deepcopy(self.offline_agent.actor).requires_grad_(False)

    def _online_agent(self):
        """The agent of the online phase: the offline one (`same`), SAC on its networks, or a fresh one."""
        cfg = self.cfg
        if cfg.online_algo == "same":
            if cfg.online_cql_alpha is not None:  # validate() checked the agent takes it
                agent = self.offline_agent
                agent.cfg = dataclasses.replace(agent.cfg, cql_alpha=float(cfg.online_cql_alpha))
            return self.offline_agent
        if self.offline_agent is not None:  # the loss swap; agents.check_switch allowed this pair
            return SAC.from_agent(self.offline_agent, agents.make_config(cfg.online_algo, cfg.online_agent),
                                  reinit_critic=cfg.reinit_critic, reset_optimizers=cfg.reset_optimizers, seed=cfg.seed)
        agent = agents.make(cfg.online_algo, self.spec.obs_dim, self.spec.act_dim, cfg.online_agent, cfg.device,
                            cfg.seed)
        self._fit_normalization(agent)
        return agent

    def _switch(self) -> None:
        self._freeze_pretrained()
        self.agent = self._online_agent()
        if self.agent is not self.offline_agent and self.offline_agent is not None:
            self._switch_temperature()
        self.phase, self.switched = "online", True
        self.logger.log({"switch/offline_steps": self.offline_step, "total_step": self.offline_step,
                         "switch/end_of_offline_score": (self.end_of_offline or {}).get("eval/score"),
                         "switch/temperature": self._temperature()},
                        step=0, phase="online", kind="switch")

    def _temperature(self) -> float | None:
        alpha = getattr(self.agent, "alpha", None)  # SAC and its kin: the temperature
        return float(alpha().detach()) if callable(alpha) else None

    def _switch_temperature(self) -> None:
        """The pretrained temperature meets a critic that lost its conservative penalty (issue analysis in
        benchmarks/RESULTS.md): keep it (WSRL's code), reset it, or let it move fast at first."""
        cfg, agent = self.cfg, self.agent
        if cfg.switch_temperature == "reset":
            agent.set_alpha(cfg.switch_temperature_value)
            agent.alpha_optimizer.state.clear()
        elif cfg.switch_temperature == "fast":
            self._set_alpha_lr(agent.cfg.alpha_lr * cfg.switch_temperature_lr_scale)

    def _in_fast_temperature_window(self) -> bool:
        cfg = self.cfg
        return cfg.switch_temperature == "fast" and self.online_step < self.learning_start() + cfg.switch_temperature_steps

    def _set_alpha_lr(self, lr: float) -> None:
        for group in self.agent.alpha_optimizer.param_groups:
            group["lr"] = lr

    def _refit_temperature(self, sampler) -> None:
        """`refit`: before the first critic step, actor and temperature steps against the pretrained critic
        on the warmup data, so both settle to the SAC objective before the critic moves."""
        window = [self.agent.update_actor_and_alpha(to_torch(self._batch(sampler, self.cfg.online_batch_size),
                                                             self.agent.device))
                  for _ in range(self.cfg.switch_temperature_steps)]
        self.logger.log({**mean_metrics([{k: float(v) for k, v in m.items()} for m in window]),
                         "total_step": self.offline_step + self.online_step},
                        step=self.online_step, phase="online", kind="refit")

    def _run_online(self) -> None:
        cfg = self.cfg
        env = self.envs.make(seed=cfg.seed + 7 + self.online_step)
        sampler = self._sampler()
        obs, _ = env.reset(seed=cfg.seed + 7 + self.online_step)
        state = obs[STATE_KEY]
        episode: list[tuple] = []
        episode_return, window = 0.0, []
        if self.online_step == 0:
            self.evaluate(0, self.offline_step)
        eval_steps = set(self._dip_eval_steps())
        bar = tqdm(total=cfg.online_steps, initial=self.online_step, desc=f"online {cfg.online_algo}",
                   disable=not self.progress, dynamic_ncols=True)
        owed, owed_start = 0, self.online_step <= self.learning_start()  # gradient steps not yet taken
        actor = ChunkActor(self._online_chunk, *self._horizons())  # one env step (and transition) per action
        while self.online_step < cfg.online_steps:
            step = self.online_step
            action = actor(state)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            next_state = next_obs[STATE_KEY]
            episode_return += float(reward)
            reward = float(self.rewards(reward))
            if self.keep_episode_mc:
                episode.append((state, action, reward, next_state, terminated, truncated))
            else:
                self.online_buffer.add(state, action, reward, next_state, terminated, truncated)
            state = next_state
            if terminated or truncated:
                if episode:
                    self._add_episode(episode)
                    episode = []
                self.episodes_done += 1
                self.logger.log({"online/episode_return": episode_return, "total_step": self.offline_step + step + 1},
                                step=step + 1, phase="online", kind="train")
                episode_return = 0.0
                state = env.reset()[0][STATE_KEY]
                actor.reset()
                self._new_episode()
            self.online_step = step = step + 1
            if step > self.learning_start():
                owed += cfg.utd
                if len(self.online_buffer) > 0:  # Cal-QL adds whole episodes: updates owed meanwhile are deferred
                    if owed_start and cfg.switch_temperature == "refit" and self.agent is not self.offline_agent:
                        self._refit_temperature(sampler)
                    owed_start = False
                    window += self._updates(sampler, owed)
                    owed = 0
                if cfg.switch_temperature == "fast" and step == self.learning_start() + cfg.switch_temperature_steps:
                    self._set_alpha_lr(self.agent.cfg.alpha_lr)
            bar.update(1)
            if step % cfg.log_every == 0 and window:
                self.logger.log({**mean_metrics(window), "total_step": self.offline_step + step}, step=step, phase="online",
                                kind="train")
                window = []
            if step % cfg.eval_every_online == 0 or step == cfg.online_steps or step in eval_steps:
                record = self.evaluate(step, self.offline_step + step)
                bar.set_postfix(score=f"{record['eval/score']:.1f}")
            self._maybe_checkpoint(self.offline_step + step)  # an open Cal-QL episode is not saved: resume restarts it
        bar.close()

    def _updates(self, sampler, count: int) -> list[dict]:
        """`count` critic updates: in minibatch groups of `utd` with one actor step each (critic-only UTD,
        for agents whose update splits a batch), else `count` full updates."""
        cfg = self.cfg
        if cfg.actor_delay_steps and self.online_step <= self.learning_start() + cfg.actor_delay_steps:
            if not getattr(self.agent, "splits_utd", False):
                raise ConfigError(f"algo.actor_delay_steps needs an agent with critic-only updates; "
                                  f"{type(self.agent).__name__} has none: set it to 0")
            return [self.agent.update(self._batch(sampler, cfg.online_batch_size * count), utd=count, actor=False)]
        if cfg.critic_only_utd and getattr(self.agent, "splits_utd", False):
            metrics = []
            for start in range(0, count, cfg.utd):
                parts = min(cfg.utd, count - start)
                metrics.append(self.agent.update(self._batch(sampler, cfg.online_batch_size * parts), utd=parts))
            return metrics
        return [self.agent.update(self._batch(sampler, cfg.online_batch_size)) for _ in range(count)]

    def action_source(self, step: int) -> str:
        """Who acts at online env step `step`, the one schedule of every preset: the frozen pretrained policy
        (WSRL's warmup), then uniform noise (scratch's and RLPD's random steps), then the agent."""
        cfg = self.cfg
        if step < cfg.warmup_steps and self.pretrained_actor is not None:
            return "pretrained"
        if step < cfg.warmup_steps + cfg.random_steps:
            return "random"
        return "agent"

    def _online_chunk(self, obs_seq: np.ndarray) -> np.ndarray:
        """[B, H, A] exploration actions from `action_source`; a step agent's chunk is one action."""
        agent, chunked = self.agent, is_chunked(self.agent)
        source = self.action_source(self.online_step)
        if source == "random":
            shape = (len(obs_seq), self._horizons()[1], self.spec.act_dim)
            return self.rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        if source == "pretrained":
            return self.pretrained_actor.act(obs_seq if chunked else obs_seq[:, -1], deterministic=False)
        if chunked:
            return agent.act_chunk(obs_seq, deterministic=False)
        return np.asarray(agent.act(obs_seq[:, -1], deterministic=False))[:, None]

    def learning_start(self) -> int:
        return min(self.cfg.warmup_steps + self.cfg.random_steps, self.cfg.online_steps)

    def _dip_eval_steps(self) -> list[int]:
        """Evenly spaced evals in the first 10% of online steps, and again once gradient steps begin."""
        cfg, window = self.cfg, DIP_WINDOW_FRACTION * self.cfg.online_steps
        if self.offline_agent is None:
            return []  # nothing pretrained, so no dip to measure
        steps = []
        for start in {0, self.learning_start()}:
            steps += [int(round(start + window * (k + 1) / cfg.dip_evals)) for k in range(cfg.dip_evals)]
        return [s for s in steps if 0 < s <= cfg.online_steps]

    def _add_episode(self, episode: list[tuple]) -> None:
        """Add a finished online episode with its Monte-Carlo returns (Cal-QL fine-tuning needs them)."""
        states, actions, rewards, next_states, terminals, timeouts = (np.asarray(x) for x in zip(*episode))
        ds = Dataset(states.astype(np.float32), actions.astype(np.float32), rewards.astype(np.float32),
                     next_states.astype(np.float32), terminals.astype(bool), timeouts.astype(bool), {})
        mc = ds.mc_returns(self.cfg.gamma, sparse_failure_reward=self.rewards.failure_reward)
        self.online_buffer.add_dataset(ds, mc_returns=mc)

    def _finish(self) -> dict:
        cfg = self.cfg
        online = [r for r in self.eval_history if r["phase"] == "online"]
        final = online[-1] if online else self.eval_history[-1]
        start = (self.end_of_offline or {}).get("eval/score")  # no dip without a pretrained policy
        by_step = {r["step"]: r["eval/score"] for r in online}
        dip = lambda begin: None if start is None else post_switch_dip(by_step, begin, cfg.online_steps, start)
        summary = {
            "env": cfg.env, "offline_algo": cfg.offline_algo, "online_algo": cfg.online_algo, "seed": cfg.seed,
            "offline_steps": self.offline_step, "online_steps": cfg.online_steps, "pretrained": cfg.pretrained,
            "offline_score": (self.end_of_offline or {}).get("eval/score"),
            "online_score": final["eval/score"], "final_score": final["eval/score"],
            "best_score": max(r["eval/score"] for r in online or self.eval_history),
            "dip": dip(0), "dip_after_learning_starts": dip(self.learning_start()),
            "episodes": cfg.eval_episodes, "score_kind": "d4rl_normalized" if self.spec.ref_min_score is not None else "return",
            "approximate_normalization": self.spec.approximate_normalization,
        }
        if self.spec.has_success:
            summary["offline_success"] = (self.end_of_offline or {}).get("eval/success")
            summary["online_success"] = final.get("eval/success")
        for key in ("switch/calibration_gap", "switch/action_distance"):
            values = [r[key] for r in online if key in r]
            if values:
                summary[key.split("/")[1] + "_final"] = values[-1]
        if cfg.video_episodes > 0:
            path = record_video(cfg.env, self._step_policy(), self.run_dir / "videos" / "final.mp4",
                                episodes=cfg.video_episodes, seed=cfg.seed + 123, size=cfg.video_size,
                                env_kwargs=cfg.env_options)
            summary["video"] = str(path) if path else None
        return summary

    # -- checkpoints ----------------------------------------------------------------------------
    def _maybe_checkpoint(self, total_step: int) -> bool:
        if self.cfg.checkpoint_every <= 0 or total_step % self.cfg.checkpoint_every != 0:
            return False
        self.save_checkpoint(total_step)
        return True

    def _maybe_checkpoint_crossing(self, total_step: int) -> None:
        """On-policy loops step by whole rollouts, so a checkpoint falls where the total crosses a multiple of
        `checkpoint_every`; `self.loop.checkpoints_written` (saved with the loop state) counts them."""
        every = self.cfg.checkpoint_every
        if every > 0 and total_step // every > self.loop.checkpoints_written:
            self.loop.checkpoints_written = total_step // every
            self.save_checkpoint(total_step)

    def save_checkpoint(self, total_step: int) -> Path:
        root = self.run_dir / "checkpoints"
        # after the switch the online agent owns the pretrained networks: they are saved once, under it
        tensors = {f"agent.{k}": v for k, v in self.agent.state_dict().items()}
        if self.pretrained_actor is not None:
            tensors.update({f"pretrained_actor.{k}": v.contiguous() for k, v in self.pretrained_actor.state_dict().items()})
        tensors["torch_rng"] = torch.get_rng_state()
        state = dict(phase=self.phase, offline_step=self.offline_step, online_step=self.online_step,
                     episodes_done=self.episodes_done, end_of_offline=self.end_of_offline,
                     eval_history=self.eval_history, rng=self.rng.bit_generator.state, total_step=total_step,
                     config=asdict(self.cfg), loop=self.loop_state(), saved_at=time.time())
        final = write_folder(root / f"step_{total_step:09d}", tensors, state, replay_online=self._replay_state())
        for old in sorted(p for p in root.iterdir() if p.name.startswith("step_"))[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load_checkpoint(self, path: Path | Checkpoint) -> None:
        """Restore a checkpoint folder (or one `read_checkpoint` already validated) into this runner: the
        online agent's structure is rebuilt and its state loaded; nothing of the switch runs again."""
        ckpt = path if isinstance(path, Checkpoint) else read_checkpoint(path)
        check_checkpoint_config(ckpt, asdict(self.cfg))
        state, tensors = ckpt.state, ckpt.tensors
        self.phase, self.offline_step, self.online_step = state["phase"], state["offline_step"], state["online_step"]
        self.episodes_done, self.end_of_offline = state["episodes_done"], state["end_of_offline"]
        self.eval_history, self.rng.bit_generator.state = state["eval_history"], state["rng"]
        if self.phase == "online":
            if self.offline_agent is not None:
                self.pretrained_actor = copy.deepcopy(self.offline_agent.actor).requires_grad_(False)
            self.agent, self.switched = self._online_agent(), True
        split = lambda prefix: {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        try:
            self.agent.load_state_dict(split("agent."))
            if self.pretrained_actor is not None and split("pretrained_actor."):
                self.pretrained_actor.load_state_dict(split("pretrained_actor."))
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(f"checkpoint {ckpt.path / 'model.safetensors'} does not fit this run's networks "
                                  f"({first_line(err)}); resume with the config the run was started with") from None
        if self.phase == "online" and self.cfg.switch_temperature == "fast":  # optimizer lrs are not saved
            scale = self.cfg.switch_temperature_lr_scale if self._in_fast_temperature_window() else 1.0
            self._set_alpha_lr(self.agent.cfg.alpha_lr * scale)
        self._load_replay(ckpt)
        if self.phase == "online":
            self.load_loop_state(state.get("loop"))
        torch.set_rng_state(tensors["torch_rng"])

    def _replay_state(self) -> dict[str, np.ndarray]:
        """What a checkpoint's replay_online.npz holds: plain arrays (read back with allow_pickle=False)."""
        return self.online_buffer.state_dict()

    def _load_replay(self, ckpt: Checkpoint) -> None:
        try:
            self.online_buffer.load_state_dict(ckpt.replay)
        except (KeyError, ValueError, TypeError) as err:
            raise CheckpointError(f"checkpoint {ckpt.path / 'replay_online.npz'} does not hold a replay buffer "
                                  f"({type(err).__name__}: {first_line(err)}); {fallback(ckpt.path)}") from None
        self.online_buffer.cut_open_episode()  # the env restarts a fresh episode after a resume

    def loop_state(self) -> dict | None:
        """State an online loop carries between env steps beyond the runner's own (none for the replay loop)."""
        return None

    def load_loop_state(self, state: dict | None) -> None:
        pass

    # -- pretrain once, fine-tune many (checkpoints/pretrained/) ------------------------------------------
    def save_pretrained(self) -> Path:
        """checkpoints/pretrained/: the offline agent at the switch, with the config that made it."""
        state = dict(config=asdict(self.cfg), offline_step=self.offline_step,
                     dataset_size=None if self.dataset is None else len(self.dataset),
                     dataset_fingerprint=dataset_fingerprint(self.dataset),
                     eval_history=[r for r in self.eval_history if r["phase"] == "offline"], saved_at=time.time())
        return write_folder(self.run_dir / "checkpoints" / PRETRAINED_DIR, self.offline_agent.state_dict(), state)

    def load_pretrained(self, path: str | Path) -> None:
        """Skip the offline phase: restore a saved pretraining whose config matches this run's."""
        folder = pretrained_folder(path)
        state, tensors = read_pretrained(path, asdict(self.cfg), self.dataset)
        try:
            self.offline_agent.load_state_dict(tensors)
        except (RuntimeError, KeyError) as err:
            raise CheckpointError(f"pretrained={folder} does not fit this agent ({first_line(err)})") from None
        self.offline_step = state["offline_step"]
        self.eval_history = list(state["eval_history"])
        for record in self.eval_history:  # the new run's metrics and curve show the pretraining it starts from
            metrics = {k: v for k, v in record.items() if k not in ("step", "phase")}
            self.logger.log(metrics, step=record["step"], phase="offline", kind="eval")
        self.phase = "online"
        print(f"pretrained: {folder} (offline step {self.offline_step}, "
              f"score {self.eval_history[-1]['eval/score']:.1f})" if self.eval_history else f"pretrained: {folder}",
              flush=True)

    def resume_latest(self, checkpoint: Checkpoint | None = None) -> bool:
        """Continue from `checkpoint` (already read) or the newest one in the run dir; False when none exists."""
        if checkpoint is None:
            found = find_checkpoints(self.run_dir)
            if not found:
                return False
            checkpoint = read_checkpoint(found[-1])
        self.load_checkpoint(checkpoint)
        total = self.offline_step + self.online_step
        self.logger.truncate_after(total)
        print(f"resumed from {checkpoint.path} (phase {self.phase}, offline step {self.offline_step}, "
              f"online step {self.online_step})", flush=True)
        return True


def eval_seed(seed: int) -> int:
    """A run's first eval start seed, from its seed (later episodes and tasks count up from it)."""
    return seed * 1000 + 10_000


def mean_metrics(window: list[dict]) -> dict:
    """A window of per-update metric dicts -> one record of their means, keys prefixed train/."""
    keys = window[0].keys() if window else []
    return {f"train/{k}": float(np.mean([m[k] for m in window])) for k in keys}
