"""The one mapping from a composed Hydra train config to the runner's `RunnerConfig`.

Agent options have one source each: the registry's preset values, below the policy group's network options
(when the group is of the preset's kind), below the algo preset's agent dict (where user overrides land),
below the run-level `env.gamma` and `bf16`. Two sources that disagree are an error naming both.
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from embodied.errors import ConfigError

DEFAULT_POLICY = "gaussian"  # train.yaml's policy group


def native_bf16_cpu(cpuinfo: str | None = None) -> bool:
    """Does this CPU multiply bf16 natively (AVX512-BF16 / AMX)?"""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    return "avx512_bf16" in cpuinfo or "amx_bf16" in cpuinfo


def resolve_bf16(setting, device: str, cpuinfo: str | None = None) -> bool:
    """`bf16: auto` turns bf16 autocast on where it pays: a CPU with native bf16 matmuls (AVX512-BF16 /
    AMX; measured 2-3x faster updates here). Not on CUDA: at these network sizes a GPU update is bound
    by kernel launches, and autocast's casts are more launches (SAC on an H200: 155 updates/s in bf16
    against 191 in fp32, benchmarks/RESULTS.md). Not on other CPUs: emulated bf16 is ~15x slower there.
    true/false force it; a forced true on a CPU without native bf16 warns once with that cost."""
    if isinstance(setting, bool):
        if setting and not device.startswith("cuda") and not native_bf16_cpu(cpuinfo):
            warnings.warn("bf16=true on a CPU without AVX512-BF16/AMX: autocast is emulated there, measured ~15x "
                          "slower than fp32 (SAC 4.1 vs 60.5 updates/s, CQL 0.4 vs 7.3 on an AVX2 EPYC); use bf16=auto",
                          stacklevel=2)
        return setting
    if str(setting).lower() != "auto":
        raise ConfigError(f"bf16={setting} is not one of true, false, auto")
    if device.startswith("cuda"):
        return False
    return native_bf16_cpu(cpuinfo)


def agent_options(name: str | None, section: str, options: DictConfig, policy: dict, run_level: dict) -> dict:
    """One agent's options: the policy group's network options (when it is of the preset's kind), then the
    algo preset (`algo.<section>`, where user overrides land too), then run-level values (env.gamma, bf16).
    A preset option that contradicts the policy group or a run-level value is an error naming both."""
    from embodied import agents

    own = OmegaConf.to_container(options, resolve=True)
    if name in (None, "same"):
        if own:
            raise ConfigError(f"algo.{section} sets {', '.join(sorted(own))} but algo.online_algo=same keeps the "
                              f"offline agent; set them under algo.offline_agent")
        return {}
    fields = {f.name for f in dataclasses.fields(agents.config_class(name))}
    merged = {k: v for k, v in policy.items() if k in fields}
    for key, value in own.items():
        if key in merged and merged[key] != value:
            raise ConfigError(f"algo.{section}.{key}={value} (the preset's) conflicts with policy.{key}={merged[key]}; "
                              f"set algo.{section}.{key}={merged[key]} to use it, or drop the policy override")
    merged.update(own)
    for key, value in run_level.items():
        if key in fields:
            if key in own and own[key] != value:
                raise ConfigError(f"algo.{section}.{key}={own[key]} conflicts with the run's {key}={value}; "
                                  f"set {'env.gamma' if key == 'gamma' else key} instead")
            merged[key] = value
    return merged


VLA_PRESET_HEADS = {"vla_bc": "parallel", "vla_qc": "flow", "vla_ppo": "flow", "vla_ppo_manip": "flow"}  # conf/algo/<name>.yaml (tested)


def vla_offline_options(cfg: DictConfig) -> DictConfig:
    """The VLA presets' offline options with `policy.head` applied, so that `algo=vla_bc policy.head=flow` and
    `algo.offline_agent.head=flow` are one setting. Both set and different is an error, and so is a non-flow
    head for vla_ppo (PPO fine-tunes the flow head's chain)."""
    algo = cfg.algo
    options = OmegaConf.to_container(algo.offline_agent, resolve=True)
    head = cfg.policy.head
    if head is None or head == options.get("head"):
        return OmegaConf.create(options)
    if algo.online_algo == "vla_ppo" and head != "flow":
        raise ConfigError(f"policy.head={head}: algo={algo.name} fine-tunes the flow head; drop policy.head, or "
                          f"pretrain another head with algo=vla_bc")
    if options.get("head") != VLA_PRESET_HEADS.get(algo.name, options.get("head")):  # algo.offline_agent.head set too
        raise ConfigError(f"policy.head={head} conflicts with algo.offline_agent.head={options.get('head')}; "
                          f"set one of them")
    options["head"] = head
    return OmegaConf.create(options)


def runner_config(cfg: DictConfig):
    """The RunnerConfig of a composed Hydra config. Switch knobs are the algo preset's keys of the same name."""
    from embodied.agents.runner import SWITCH_KNOBS, RunnerConfig

    algo = cfg.algo
    bf16 = resolve_bf16(cfg.bf16, cfg.device)
    policy = {k: v for k, v in OmegaConf.to_container(cfg.policy, resolve=True).items() if k not in ("name", "kind")}
    if cfg.policy.kind != algo.policy:  # a network group of another kind than the preset's policy
        if cfg.policy.name != DEFAULT_POLICY or algo.policy == "vla":  # the VLA presets select their own group
            raise ConfigError(f"policy={cfg.policy.name} is a {cfg.policy.kind} network but algo={algo.name} trains a "
                              f"{algo.policy} policy; use policy={algo.policy} or drop policy=")
        policy = {}  # the default group is the Gaussian agents' network; other kinds bring their own
    offline_options = algo.offline_agent
    if algo.policy == "vla":
        offline_options, policy = vla_offline_options(cfg), {}
    run_level = {"gamma": cfg.env.gamma, "bf16": bf16}
    switch = {k: v for k, v in OmegaConf.to_container(algo, resolve=True).items() if k in SWITCH_KNOBS}
    return RunnerConfig(
        env=cfg.env.name, env_options=env_options(cfg), **switch,
        offline_agent=agent_options(algo.offline_algo, "offline_agent", offline_options, policy, run_level),
        online_agent=agent_options(algo.online_algo, "online_agent", algo.online_agent, policy, run_level),
        offline_steps=cfg.budget.offline_steps if algo.offline_algo else 0, online_steps=cfg.budget.online_steps,
        offline_batch_size=cfg.budget.batch_size, online_batch_size=cfg.budget.batch_size, gamma=cfg.env.gamma,
        reward_scale=cfg.env.reward_scale, reward_bias=cfg.env.reward_bias,
        sparse_failure_reward=cfg.env.sparse_failure_reward, eval_at_start=cfg.eval.at_start,
        eval_every_offline=cfg.eval.every_offline,
        eval_every_online=cfg.eval.every_online, eval_episodes=cfg.eval.episodes,
        eval_first_episode=cfg.eval.first_episode,
        video_episodes=cfg.eval.video_episodes, video_size=cfg.eval.video_size, dip_evals=cfg.eval.dip_evals,
        checkpoint_every=cfg.checkpoint.every, keep_checkpoints=cfg.checkpoint.keep, log_every=cfg.log_every,
        replay_capacity=cfg.replay_capacity, pretrained=cfg.pretrained, seed=cfg.seed, device=cfg.device,
    )


def dataset_env(cfg: DictConfig) -> str:
    """The env a generated dataset is recorded on: `dataset.env`, else the run's own."""
    return cfg.dataset.get("env") or cfg.env.name


def env_options(cfg: DictConfig) -> dict:
    """`env.options`: keyword arguments for the task's builder (`sims.make(name, **options)`), e.g. mt10's
    task_id and reward; the data, the online envs and the evaluation all get them. Null values are left out."""
    options = OmegaConf.to_container(cfg.env.get("options") or {}, resolve=True)
    return {key: value for key, value in options.items() if value is not None}
