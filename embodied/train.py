"""The main job: `python -m embodied.train [overrides]` (Hydra).

    python -m embodied.train                                   # default: Cal-QL -> WSRL on PointMaze
    python -m embodied.train env=hopper dataset=medium-replay algo=rlpd seed=1
    python -m embodied.train -m env=hopper,pointmaze-umaze algo=wsrl,naive,scratch seed=0,1,2
    python -m embodied.train resume=true hydra.run.dir=runs/<a killed run>
"""
from __future__ import annotations

import dataclasses
import sys
import time
import traceback
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from embodied.config_check import (check_config, compose_checked, expand_jobs, parse_overrides, read_saved_run,
                                   resume_config, with_agent_options)
from embodied.errors import ConfigError, UserError, exit_on_user_error
from embodied.run_config import dataset_env, env_options, runner_config
from embodied.summary import STATUS_FILE

CONF_DIR = Path(__file__).parent / "conf"
GROUPS = ("env", "dataset", "algo", "policy", "logger", "experiment")


def compose_train(overrides: list[str]) -> DictConfig:
    """The `train` config these overrides compose to, without starting a job: for tools that read a run's
    settings (which offline agent a preset pretrains, how many episodes an eval runs)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


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

    if cfg.dataset.path and Path(cfg.dataset.path).is_dir():  # a LeRobotDataset v3 folder
        from embodied.data.lerobot import load_lerobot_dataset

        return load_lerobot_dataset(cfg.dataset.path)
    if cfg.dataset.path:
        return load_hdf5(cfg.dataset.path)
    if cfg.dataset.minari_id:
        return load_minari(cfg.dataset.minari_id)
    return catalog.load_dataset(dataset_env(cfg), cfg.dataset.quality, cfg.dataset.size, seed=cfg.dataset.seed,
                                options=env_options(cfg), progress=cfg.progress)


def load_suite_demos(cfg: DictConfig, rcfg):
    """algo=vla_bc: `dataset.size` image demos per task of the suite (`env.tasks`), rendered with the
    policy's cameras."""
    from embodied import agents
    from embodied.agents.vla_bc import suite_tasks
    from embodied.data.suite import load_suite

    if cfg.dataset.quality != "task" or cfg.dataset.path or cfg.dataset.minari_id:
        raise ConfigError(f"algo=vla_bc learns from the suite's generated task demos, not dataset.quality="
                          f"{cfg.dataset.quality}{' or a dataset file' if cfg.dataset.path else ''}: pass dataset=task")
    agent_cfg = agents.make_config("vla_bc", rcfg.offline_agent)
    return load_suite(cfg.env.name, suite_tasks(cfg.env.get("tasks")), cfg.dataset.size, cfg.dataset.seed,
                      agent_cfg.cameras, agent_cfg.image_size, progress=cfg.progress)


def run(cfg: DictConfig, run_dir: Path, on_start=None) -> dict:
    """Run one experiment into `run_dir`; returns the summary dict (also written to summary.json).

    Every config value, and with resume=true every file of the checkpoint to continue from, is checked before
    any work starts or anything in `run_dir` is written; `on_start()` is called once those checks passed."""
    from embodied.agents.runner import Runner
    from sims.source import EnvSource
    from embodied.checkpoints import check_checkpoint_config, find_checkpoints, read_checkpoint
    from embodied.logging import RunLogger
    from embodied.plots import learning_curve

    check_config(cfg)
    rcfg = runner_config(cfg)
    rcfg.validate()
    checkpoint = None
    if cfg.resume and find_checkpoints(run_dir):
        checkpoint = read_checkpoint(find_checkpoints(run_dir)[-1])
        check_checkpoint_config(checkpoint, dataclasses.asdict(rcfg))
    if on_start is not None:
        on_start()
    torch.set_num_threads(cfg.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.resume and checkpoint is None and (run_dir / "metrics.jsonl").exists():
        # killed before its first checkpoint: it starts over, and the earlier attempt's lines are kept aside
        attempt = 1 + len(list(run_dir.glob("metrics.before-restart-*.jsonl")))
        (run_dir / "metrics.jsonl").rename(run_dir / f"metrics.before-restart-{attempt}.jsonl")
    needs_data = bool(cfg.algo.offline_algo) or cfg.algo.offline_ratio > 0
    vla = rcfg.offline_algo == "vla_bc"
    dataset = load_suite_demos(cfg, rcfg) if vla else load_dataset(cfg) if needs_data else None
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if not (cfg.resume and (run_dir / "config.yaml").exists()):  # a resumed run keeps the copy it started with
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    with RunLogger(run_dir, resolved, wandb_mode=cfg.logger.mode, project=cfg.logger.project,
                   group=cfg.logger.group, name=f"{cfg.env.name}-{cfg.algo.name}-s{cfg.seed}",
                   enabled_wandb=cfg.logger.wandb) as logger:
        runner_cls, extra = Runner, {}
        if rcfg.online_algo == "dppo":  # on-policy fine-tuning with vectorised envs: its own online loop
            from embodied.agents.dppo import DPPORunner as runner_cls
        if vla:  # a suite's image demos and a per-task evaluator
            from embodied.agents.vla_bc import VLARunner as runner_cls
            if rcfg.online_algo == "vla_qc":  # online: a chunk critic and best-of-N over the VLA's samples
                from embodied.agents.vla_qc import VLAQCRunner as runner_cls
            if rcfg.online_algo == "vla_ppo":  # online: PPO through the flow head's noisy chain (ReinFlow)
                from embodied.agents.vla_ppo import VLAPPORunner as runner_cls

            extra["tasks"] = list(cfg.env.tasks)
            extra["variations"] = list(cfg.env.get("variations") or ["none"])
        if rcfg.world_model.get("dataset"):  # DiWA: the world model learns from its own dataset (e.g. play)
            from embodied.data import catalog

            extra["model_dataset"] = catalog.load_dataset(dataset_env(cfg), rcfg.world_model["dataset"],
                                                          rcfg.world_model.get("size", 100_000),
                                                          seed=cfg.dataset.seed, options=env_options(cfg),
                                                          progress=cfg.progress)
        envs = EnvSource(rcfg.env, rcfg.env_options)
        runner = runner_cls(rcfg, dataset, run_dir, logger, progress=cfg.progress, envs=envs, **extra)
        if checkpoint is not None:
            runner.resume_latest(checkpoint)
        elif cfg.resume:
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
    if summary.get("task_success"):
        print("success per task: " + ", ".join(f"task {t}: {s:.2f}" for t, s in summary["task_success"].items()))
    if summary.get("online_success") is not None:
        offline = summary.get("offline_success")
        print(f"success rate: {'-' if offline is None else f'{offline:.2f}'} -> {summary['online_success']:.2f}")
    print(f"run directory: {summary['run_dir']}", flush=True)


class JobStatus:
    """<run_dir>/status.json: running, done or failed with its one-line error (a crash's traceback goes to
    error.txt), so `embodied.summary` and the sweep's exit status can name every job that did not finish."""

    def __init__(self, run_dir: Path, job_num: int | None, overrides: list[str]):
        self.path, self.run_dir = run_dir / STATUS_FILE, run_dir
        self.record = {"job_num": job_num, "overrides": overrides, "started_at": time.time()}

    def write(self, status: str, **fields) -> None:
        from embodied.logging import write_json_atomic

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.record.update(status=status, updated_at=time.time(), **fields)
        write_json_atomic(self.path, self.record)


def _save_job_files(run_dir: Path, cfg: DictConfig, overrides: list[str]) -> None:
    """What Hydra writes to .hydra/ at a job's start; done here for a new job of a resumed sweep, where
    hydra.output_subdir=null keeps Hydra from rewriting the existing jobs' files."""
    hydra_dir = run_dir / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    (hydra_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (hydra_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> dict:
    """One job. In a sweep (-m) a job that fails returns its error instead of exiting, so the other jobs run
    (and Ray sees no crashed worker to retry); main() turns the failures into the sweep's exit status."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    config = HydraConfig.get()
    run_dir = Path(config.runtime.output_dir)
    multirun = config.mode == RunMode.MULTIRUN
    overrides = list(config.overrides.task)
    status = JobStatus(run_dir, config.job.num if multirun else None, overrides)
    resuming, started = cfg.resume is True, False

    def on_start() -> None:
        nonlocal started
        started = True
        status.write("running")

    try:
        if resuming and run_finished(run_dir):
            print(f"resume=true: {run_dir} already finished (status.json: done); nothing to do", flush=True)
            return {"status": "done", "run_dir": str(run_dir)}
        if resuming and (run_dir / ".hydra" / "config.yaml").is_file():
            cfg = resume_config(run_dir, overrides, lambda o: hydra.compose(config_name="train", overrides=o))
        elif resuming and multirun:  # a job of the resumed sweep that never started: it starts now
            _save_job_files(run_dir, cfg, overrides)
        elif resuming:
            read_saved_run(run_dir)  # raises: nothing to resume
        summary = run(cfg, run_dir, on_start=on_start)
        status.write("done", final_score=summary.get("final_score"))
        return {"status": "done", "run_dir": str(run_dir)}
    except UserError as err:
        if started or not resuming:  # a refused resume leaves the run's files as they were
            status.write("failed", error=str(err), kind="user_error")
        print(f"error: {err}", file=sys.stderr, flush=True)
        if multirun:
            return {"status": "failed", "run_dir": str(run_dir), "error": str(err)}
        raise SystemExit(2) from None
    except Exception as err:  # noqa: BLE001 - a bug: recorded with its traceback; fails the job, not the sweep
        line = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        if started or not resuming:
            status.write("failed", error=line, kind="crash")
            (run_dir / "error.txt").write_text(traceback.format_exc())
        if not multirun:
            raise
        traceback.print_exc()
        return {"status": "failed", "run_dir": str(run_dir), "error": line}


def run_finished(run_dir: Path) -> bool:
    """A run that ended normally: its status says done and its summary was written."""
    from embodied.logging import SUMMARY_FILE
    from embodied.summary import run_status

    return run_status(run_dir) == "done" and (run_dir / SUMMARY_FILE).exists()


def _hydra_flags(args: list[str]) -> tuple[list[str], list[str]]:
    flags = [a for a in args if a.startswith("-")]
    return flags, [a for a in args if not a.startswith("-")]


def prepare_cli(args: list[str]) -> list[str]:
    """Check the command line before Hydra starts a job (no run dir exists yet) and return the arguments for
    Hydra: a single run's config is composed and every value checked; a sweep's jobs are composed (a typo in a
    key fails the sweep at once); `resume=true` continues the run with its saved config and keeps Hydra from
    rewriting the run's .hydra/ files."""
    from hydra import compose, initialize_config_dir

    check_group_overrides(args)
    flags, overrides = _hydra_flags(args)
    if any(f not in ("-m", "--multirun") for f in flags):  # --cfg, --help, ...: Hydra's own modes
        return args
    multirun = bool(flags) or any(o.replace(" ", "") == "hydra.mode=MULTIRUN" for o in overrides)
    parsed = parse_overrides(overrides)
    resume = any(o.key_or_group == "resume" and o.value() is True for o in parsed)
    run_dir = next((o.value() for o in parsed if o.key_or_group == "hydra.run.dir"), None)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        compose_fn = lambda o: compose(config_name="train", overrides=o)
        overrides = with_agent_options(compose_fn, overrides)
        if multirun:
            for job in expand_jobs(overrides):
                compose_checked(compose_fn, job)
        elif resume:
            if run_dir is None:
                raise ConfigError("resume=true needs the run to continue: add hydra.run.dir=<its run directory>")
            check_config(resume_config(Path(run_dir), overrides, compose_fn))
            saved = read_saved_run(Path(run_dir))[1]
            given = [o for o in overrides if not o.partition("=")[0].lstrip("+~").startswith("hydra")
                     and o.partition("=")[0] != "resume"]
            hydra_args = [o for o in overrides if o.partition("=")[0].lstrip("+~").startswith("hydra")]
            overrides = [*saved, *given, "resume=true", *hydra_args]
        else:
            check_config(compose_checked(compose_fn, overrides))
    if resume:
        overrides = [o for o in overrides if not o.startswith("hydra.output_subdir=")] + ["hydra.output_subdir=null"]
    return [*flags, *overrides]


def report_sweep(sweep_dir: Path) -> int:
    """Print each job that did not finish with its error line; the exit status: 1 when any did not."""
    from embodied.summary import sweep_jobs, varying_keys

    jobs = sweep_jobs(sweep_dir)
    varying = varying_keys(jobs)
    bad = [job for job in jobs if job.status != "done"]
    print(f"sweep {sweep_dir}: {len(jobs)} jobs, {len(jobs) - len(bad)} done, "
          f"{sum(job.status == 'failed' for job in bad)} failed, "
          f"{sum(job.status != 'failed' for job in bad)} not finished", file=sys.stderr, flush=True)
    for job in bad:
        print(f"  {job.status}: {job.describe(varying)}", file=sys.stderr, flush=True)
    return 1 if bad else 0


@exit_on_user_error
def main() -> None:
    from embodied import summary

    sys.argv = [sys.argv[0], *prepare_cli(sys.argv[1:])]
    summary.LAST_SWEEP_DIR = None
    _hydra_main()
    if summary.LAST_SWEEP_DIR is not None:
        code = report_sweep(summary.LAST_SWEEP_DIR)
        if code:
            raise SystemExit(code)


if __name__ == "__main__":
    main()
