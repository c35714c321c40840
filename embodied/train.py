"""The main job: `python -m embodied.train [overrides]` (Hydra).

    python -m embodied.train                                   # default: Cal-QL -> WSRL on PointMaze
    python -m embodied.train env=hopper dataset=medium-replay algo=rlpd seed=1
    python -m embodied.train -m env=hopper,pointmaze-umaze algo=wsrl,naive,scratch seed=0,1,2
    python -m embodied.train resume=true hydra.run.dir=runs/<a killed run>
"""
from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from embodied.errors import ConfigError, UserError, exit_on_user_error

CONF_DIR = Path(__file__).parent / "conf"
GROUPS = ("env", "dataset", "algo", "policy", "logger", "experiment")
DEFAULT_POLICY = "gaussian"  # train.yaml's policy group


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_group_overrides(argv: list[str]) -> None:
    """Catch `algo=typo` before Hydra does, with a one-line error that lists the valid choices."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUPS or value in ("null", ""):
            continue
        valid = group_options(key)
        for choice in value.split(","):
            if choice not in valid:
                raise ConfigError(f"{key}={choice} is not a valid choice; valid {key} options: {', '.join(valid)}")


def load_dataset(cfg: DictConfig):
    from embodied.data import catalog
    from embodied.data.d4rl import load_hdf5
    from embodied.data.minari_io import load_minari

    if cfg.dataset.path:
        return load_hdf5(cfg.dataset.path)
    if cfg.dataset.minari_id:
        return load_minari(cfg.dataset.minari_id)
    return catalog.load_dataset(cfg.env.name, cfg.dataset.quality, cfg.dataset.size, seed=cfg.dataset.seed,
                                progress=cfg.progress)


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


def runner_config(cfg: DictConfig):
    """The RunnerConfig of a composed Hydra config. Switch knobs are the algo preset's keys of the same name."""
    from embodied.agents.runner import RunnerConfig

    algo = cfg.algo
    bf16 = resolve_bf16(cfg.bf16, cfg.device)
    policy = {k: v for k, v in OmegaConf.to_container(cfg.policy, resolve=True).items() if k not in ("name", "kind")}
    if cfg.policy.kind != algo.policy:  # a network group of another kind than the preset's policy
        if cfg.policy.name != DEFAULT_POLICY:
            raise ConfigError(f"policy={cfg.policy.name} is a {cfg.policy.kind} network but algo={algo.name} trains a "
                              f"{algo.policy} policy; use policy={algo.policy} or drop policy=")
        policy = {}  # the default group is the Gaussian agents' network; other kinds bring their own
    run_level = {"gamma": cfg.env.gamma, "bf16": bf16}
    knobs = {f.name for f in dataclasses.fields(RunnerConfig)} - {"env", "offline_agent", "online_agent"}
    switch = {k: v for k, v in OmegaConf.to_container(algo, resolve=True).items() if k in knobs}
    return RunnerConfig(
        env=cfg.env.name, **switch,
        offline_agent=agent_options(algo.offline_algo, "offline_agent", algo.offline_agent, policy, run_level),
        online_agent=agent_options(algo.online_algo, "online_agent", algo.online_agent, policy, run_level),
        offline_steps=cfg.budget.offline_steps if algo.offline_algo else 0, online_steps=cfg.budget.online_steps,
        offline_batch_size=cfg.budget.batch_size, online_batch_size=cfg.budget.batch_size, gamma=cfg.env.gamma,
        reward_scale=cfg.env.reward_scale, reward_bias=cfg.env.reward_bias,
        sparse_failure_reward=cfg.env.sparse_failure_reward, eval_every_offline=cfg.eval.every_offline,
        eval_every_online=cfg.eval.every_online, eval_episodes=cfg.eval.episodes,
        video_episodes=cfg.eval.video_episodes, video_size=cfg.eval.video_size, dip_evals=cfg.eval.dip_evals,
        checkpoint_every=cfg.checkpoint.every, keep_checkpoints=cfg.checkpoint.keep, log_every=cfg.log_every,
        replay_capacity=cfg.replay_capacity, pretrained=cfg.pretrained, seed=cfg.seed, device=cfg.device,
    )


def run(cfg: DictConfig, run_dir: Path) -> dict:
    """Run one experiment into `run_dir`; returns the summary dict (also written to summary.json)."""
    from embodied.agents.runner import Runner
    from embodied.logging import RunLogger
    from embodied.plots import learning_curve

    torch.set_num_threads(cfg.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={cfg.device} but no CUDA device is visible; use device=cpu")
    rcfg = runner_config(cfg)
    rcfg.validate()
    needs_data = bool(cfg.algo.offline_algo) or cfg.algo.offline_ratio > 0
    dataset = load_dataset(cfg) if needs_data else None
    resolved = OmegaConf.to_container(cfg, resolve=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    with RunLogger(run_dir, resolved, wandb_mode=cfg.logger.mode, project=cfg.logger.project,
                   group=cfg.logger.group, name=f"{cfg.env.name}-{cfg.algo.name}-s{cfg.seed}",
                   enabled_wandb=cfg.logger.wandb) as logger:
        runner_cls = Runner
        if rcfg.online_algo == "dppo":  # on-policy fine-tuning with vectorised envs: its own online loop
            from embodied.agents.dppo import DPPORunner as runner_cls
        runner = runner_cls(rcfg, dataset, run_dir, logger, progress=cfg.progress)
        if cfg.resume and not runner.resume_latest():
            print(f"resume=true but {run_dir}/checkpoints has no checkpoint: starting fresh", flush=True)
        summary = runner.run()
        summary.update(algo=cfg.algo.name, preset=cfg.algo.name, run_dir=str(run_dir))
        actor = getattr(runner.agent, "actor", None)
        if actor is not None and hasattr(actor, "save"):  # deployable: `policies.load(<run>/policy)`
            actor.save(run_dir / "policy")
            summary["policy_dir"] = str(run_dir / "policy")
        logger.summary(summary)
    from embodied.logging import read_metrics

    learning_curve(read_metrics(run_dir), run_dir / "learning_curve.png",
                   switch_step=rcfg.offline_steps if rcfg.offline_algo else None,
                   title=f"{cfg.algo.name} on {cfg.env.name} (seed {cfg.seed})")
    print_result(summary)
    return summary


def print_result(summary: dict) -> None:
    fmt = lambda x: "  -  " if x is None else f"{x:7.1f}"
    kind = "normalised score" + (" (approx., v5 physics)" if summary.get("approximate_normalization") else "")
    if summary.get("score_kind") != "d4rl_normalized":
        kind = "return"
    print(f"\n{summary['algo']} on {summary['env']} (seed {summary['seed']}), {kind}, {summary['episodes']} episodes per eval")
    print("| end of offline | end of online | best | post-switch dip | dip from first gradient step |")
    print("|---|---|---|---|---|")
    print(f"| {fmt(summary['offline_score'])} | {fmt(summary['online_score'])} | {fmt(summary['best_score'])} "
          f"| {fmt(summary['dip'])} | {fmt(summary['dip_after_learning_starts'])} |")
    if summary.get("online_success") is not None:
        offline = summary.get("offline_success")
        print(f"success rate: {'-' if offline is None else f'{offline:.2f}'} -> {summary['online_success']:.2f}")
    print(f"run directory: {summary['run_dir']}", flush=True)


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    try:
        run(cfg, Path(HydraConfig.get().runtime.output_dir))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


@exit_on_user_error
def main() -> None:
    check_group_overrides(sys.argv[1:])
    _hydra_main()


if __name__ == "__main__":
    main()
