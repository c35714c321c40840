"""Learn the planner's skills from its oracles: goal-conditioned flow BC, one checkpoint per suite.

    python -m planners.train_skills --envs cube-single,cube-double,scene --out runs/skills
    python benchmarks/planner_eval.py --planners rule --skills learned --skills-dir runs/skills

Data: from each suite's OGBench evaluation start states (a random task id per episode, seeds from
`data_seed` on, far from the seeds the planner suite evaluates on), a random sequence of sub-goals
whose preconditions hold (pick, place_on / place_in / place_at, open, close, press) is run by the
scripted oracles of `planners.sim`. Every step of a sub-goal the oracle finished is kept, as
(observation, goal vector) -> action; failed sub-goals are dropped (filtered BC). The demos are saved
in D4RL's HDF5 layout (`demos.hdf5`, one episode per sub-goal).

Policy: the toolkit's flow-matching chunk policy (`policies/flow.py`, MLP velocity network, Euler
sampler) trained by `embodied.agents.bc_generative.GenerativeBC`, on the observation without
OGBench's goal half, concatenated with `planners.learned_skill.goal_vector`. The checkpoint is a plain
`policies` directory plus `skills.json` (skill names, observation slice, data and training figures).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embodied.constants import STATE_KEY
from embodied.errors import UserError, exit_on_user_error

SUITES = ("cube-single", "cube-double", "scene")


@dataclass
class SkillTrainConfig:
    envs: tuple[str, ...] = SUITES
    episodes: int = 500             # start states per suite; each runs up to `subgoals_per_episode`
    subgoals_per_episode: int = 6
    action_noise: float = 0.0       # DART-style when > 0: the arm runs oracle + N(0, sigma), the demo keeps the oracle's action (0.2 did worse)
    joint_velocities: bool = False  # the arm's joint velocities in the policy input: they echo the last action,
                                    # and with them the cloned slides copied their own turning (see policy_columns)
    data_seed: int = 100_000        # the planner suite resets with seeds 0..~1100
    steps: int = 30_000             # gradient steps per suite
    batch_size: int = 256
    pred_horizon: int = 4           # chunk of 4 actions, 2 executed before re-planning the chunk
    execute_horizon: int = 2
    hidden: tuple[int, ...] = (512, 512, 512)  # the toolkit's MLP denoiser default
    lr: float = 1e-4                # GenerativeBCConfig's default (Diffusion Policy's)
    seed: int = 0
    threads: int = 2


# -------------------------------------------------------------------------------------------- data
def collect(env_name: str, episodes: int, subgoals_per_episode: int, seed: int, action_noise: float = 0.0,
            log=print):
    """Oracle demos for one suite: (list of Episode, per-skill [finished, attempted], obs_dim).

    With `action_noise` the executed action is perturbed and the recorded label is the oracle's own
    action from the perturbed state, so the demos show how to recover from the small errors a cloned
    policy makes. Tried against the learned slides spinning the wrist above the handle: at 0.2 they still
    did, and pick got worse (benchmarks/RESULTS.md), so the default is off.
    """
    import sims
    from embodied.data.dataset import Episode
    from planners import symbolic as sym
    from planners.grounding import candidates
    from planners.learned_skill import goal_vector
    from planners.sim import oracle_skills, world_from_env

    env = sims.make(f"{env_name}-goal", max_episode_steps=10**6)
    obs_dim = env.get_wrapper_attr("suite").obs_dim
    rng = np.random.default_rng(seed)
    demos, counts = [], {}
    try:
        for ep in range(episodes):
            obs, info = env.reset(seed=seed + ep, options={"task_id": int(rng.integers(1, 6))})
            library = oracle_skills(env)
            names = library.names()
            for k in range(subgoals_per_episode):
                world = world_from_env(env)
                state = sym.atoms(world)
                options = [c for c in candidates(world, library, state)
                           if library.get(c.skill).check(state, c.args) is None]  # preconditions hold
                if not options:
                    break
                # skills weighted by 1 / (1 + demos so far), so the rare ones (place_in needs an open
                # drawer and a held cube) are taken whenever they come up
                skills = sorted({c.skill for c in options})
                weights = np.array([1.0 / (1 + counts.get(s, [0, 0])[0]) for s in skills])
                skill = skills[rng.choice(len(skills), p=weights / weights.sum())]
                bindings = [c for c in options if c.skill == skill]
                subgoal = bindings[rng.integers(len(bindings))]
                goal = goal_vector(subgoal, names)
                spec = library.get(skill)
                policy = spec.policy(env, subgoal, seed=seed + 1000 * ep + k)
                policy.reset(obs, info)
                states, actions = [np.asarray(obs[STATE_KEY][:obs_dim], np.float32)], []
                for _ in range(spec.max_steps):
                    action = policy.act(obs, info)
                    executed = np.clip(action + action_noise * rng.standard_normal(action.shape), -1.0, 1.0)
                    obs, _, _, _, info = env.step(executed.astype(np.float32))
                    states.append(np.asarray(obs[STATE_KEY][:obs_dim], np.float32))
                    actions.append(action)
                    if policy.done:
                        break
                finished = bool(policy.done) and spec.succeeded(world_from_env(env), subgoal)
                tally = counts.setdefault(skill, [0, 0])
                tally[0] += finished
                tally[1] += 1
                if not finished:
                    break  # the world may be in a state no plan expects: start a fresh episode
                inputs = np.concatenate([np.stack(states), np.repeat(goal[None], len(states), 0)], 1)
                demos.append(Episode(inputs, np.stack(actions), np.zeros(len(actions), np.float32), truncated=True))
            if (ep + 1) % 25 == 0 or ep + 1 == episodes:
                log(f"[{env_name}] {ep + 1}/{episodes} start states, {len(demos)} sub-goal demos, "
                    f"{sum(len(d) for d in demos)} steps; oracle finished/attempted {counts}")
    finally:
        env.close()
    return demos, counts, obs_dim


# ------------------------------------------------------------------------------------------- train
ARM_JOINT_VEL = slice(6, 12)  # OGBench manipspace observations: joint_pos[0:6], joint_vel[6:12], effector, ...


def policy_columns(obs_dim: int, goal_dim: int, joint_velocities: bool) -> list[int]:
    """Columns of `concat(observation, goal vector)` the skill policy reads.

    Without the arm's joint velocities by default: they are a copy of the previous action, and a policy
    cloned with them learns to keep doing what it did (the copycat problem of causal confusion in
    imitation, de Haan et al. 2019). Ours turned the wrist in one direction until the joint limit on
    every open and close: 0/36 slides at stop 24.
    """
    drop = set(range(obs_dim)[ARM_JOINT_VEL]) if not joint_velocities else set()
    return [i for i in range(obs_dim + goal_dim) if i not in drop]


def select_columns(dataset, columns: list[int]):
    return dataclasses.replace(dataset, observations=dataset.observations[:, columns],
                               next_observations=dataset.next_observations[:, columns])


def train(dataset, cfg: SkillTrainConfig, log=print):
    """GenerativeBC(flow) on the demo chunks; returns the agent and its last metrics."""
    from embodied.agents.bc_generative import GenerativeBC, GenerativeBCConfig
    from embodied.data.replay import ReplayBuffer

    replay = ReplayBuffer(dataset.obs_dim, dataset.act_dim, len(dataset), seed=cfg.seed)
    replay.add_dataset(dataset)
    bc_cfg = GenerativeBCConfig(policy="flow", obs_horizon=1, pred_horizon=cfg.pred_horizon,
                                execute_horizon=cfg.execute_horizon, denoiser="mlp",
                                denoiser_kwargs={"hidden": tuple(cfg.hidden)}, lr=cfg.lr,
                                policy_kwargs={"onestep_head": False}, distill_weight=0.0)  # Euler sampling only
    agent = GenerativeBC(dataset.obs_dim, dataset.act_dim, bc_cfg, seed=cfg.seed)
    agent.fit_normalization(dataset.observations, dataset.actions)
    metrics, t0 = {}, time.perf_counter()
    for step in range(1, cfg.steps + 1):
        metrics = agent.update(replay.sample_chunks(cfg.batch_size, cfg.pred_horizon))
        if step % max(1, cfg.steps // 10) == 0 or step == cfg.steps:
            log(f"  step {step}/{cfg.steps}: bc_loss {metrics['bc_loss']:.4f} "
                f"({step / (time.perf_counter() - t0):.0f} steps/s)")
    return agent, metrics


def check_config(cfg: SkillTrainConfig) -> None:
    """Every value that would otherwise fail only after minutes of collecting demos."""
    for env_name in cfg.envs:
        if env_name not in SUITES:
            raise UserError(f"--envs: unknown suite {env_name!r}; choose from {', '.join(SUITES)}")
    if cfg.action_noise < 0:
        raise UserError(f"--action-noise={cfg.action_noise} must be >= 0")
    for name in ("episodes", "subgoals_per_episode", "steps", "batch_size", "pred_horizon", "execute_horizon"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}={getattr(cfg, name)} must be >= 1")
    if cfg.execute_horizon > cfg.pred_horizon:
        raise UserError(f"--execute-horizon={cfg.execute_horizon} must be <= --pred-horizon={cfg.pred_horizon}")


def reuse_demos(demos_dir: Path, env_name: str):
    """(dataset, demo count, oracle tallies, obs_dim) from an earlier run's `<demos_dir>/<suite>`."""
    from embodied.data.d4rl import load_hdf5

    source = demos_dir / env_name
    if not (source / "demos.hdf5").is_file() or not (source / "skills.json").is_file():
        raise UserError(f"--demos {demos_dir}: no {env_name}/demos.hdf5 and skills.json there; give the --out "
                        f"of an earlier `python -m planners.train_skills` run")
    meta = json.loads((source / "skills.json").read_text())
    dataset = load_hdf5(source / "demos.hdf5")
    return dataset, meta["subgoal_demos"], meta["oracle_finished_attempted"], int(meta["obs_dim"])


def run(cfg: SkillTrainConfig, out: Path, log=print, demos_dir: Path | None = None) -> dict:
    import torch

    from embodied.data.d4rl import save_hdf5
    from embodied.data.dataset import Dataset
    from embodied.logging import write_json_atomic
    from planners.learned_skill import goal_dim
    from planners.skills import manipulation_skills

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    check_config(cfg)
    skill_names = manipulation_skills().names()
    summary = {}
    for env_name in cfg.envs:
        t0 = time.perf_counter()
        target = out / env_name
        if demos_dir is not None:
            dataset, n_demos, counts, obs_dim = reuse_demos(demos_dir, env_name)
            log(f"[{env_name}] {len(dataset)} demo steps from {demos_dir / env_name}")
        else:
            demos, counts, obs_dim = collect(env_name, cfg.episodes, cfg.subgoals_per_episode, cfg.data_seed,
                                             cfg.action_noise, log)
            if not demos:
                raise UserError(f"[{env_name}] the oracles finished no sub-goal; raise --episodes")
            dataset = Dataset.from_episodes(demos, {"env": f"{env_name}-goal", "source": "planners.train_skills"})
            n_demos = len(demos)
        collect_s = time.perf_counter() - t0
        target.mkdir(parents=True, exist_ok=True)
        if demos_dir is None or demos_dir.resolve() != out.resolve():
            save_hdf5(dataset, target / "demos.hdf5")  # every column, the joint velocities included
        columns = policy_columns(obs_dim, goal_dim(skill_names), cfg.joint_velocities)
        t0 = time.perf_counter()
        agent, metrics = train(select_columns(dataset, columns), cfg, log)
        train_s = time.perf_counter() - t0
        agent.actor.save(target)
        meta = {"env": env_name, "obs_dim": int(obs_dim), "obs_columns": columns, "skill_names": skill_names,
                "transitions": len(dataset), "subgoal_demos": n_demos, "oracle_finished_attempted": counts,
                "collect_s": round(collect_s, 1), "train_s": round(train_s, 1), "final_metrics": metrics,
                "demos_from": str(demos_dir / env_name) if demos_dir is not None else None,
                "config": dataclasses.asdict(cfg)}
        write_json_atomic(target / "skills.json", meta)
        summary[env_name] = {k: meta[k] for k in ("transitions", "subgoal_demos", "collect_s", "train_s")}
        log(f"[{env_name}] saved {target}: {len(dataset)} steps from {n_demos} sub-goals; "
            f"collect {collect_s:.0f} s, train {train_s:.0f} s")
    return summary


@exit_on_user_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = SkillTrainConfig()
    ap.add_argument("--envs", default=",".join(defaults.envs))
    ap.add_argument("--out", default="runs/skills")
    for field in ("episodes", "subgoals_per_episode", "data_seed", "steps", "batch_size", "pred_horizon",
                  "execute_horizon", "seed", "threads"):
        ap.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field))
    ap.add_argument("--hidden", default=",".join(map(str, defaults.hidden)))
    ap.add_argument("--lr", type=float, default=defaults.lr)
    ap.add_argument("--action-noise", type=float, default=defaults.action_noise)
    ap.add_argument("--joint-velocities", action=argparse.BooleanOptionalAction, default=defaults.joint_velocities,
                    help="give the skill policy the arm's joint velocities (off: they echo the last action)")
    ap.add_argument("--demos", default=None, help="train on an earlier run's demos (its --out) instead of collecting")
    args = ap.parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k not in ("out", "demos")}
    values["envs"] = tuple(e.strip() for e in args.envs.split(",") if e.strip())
    try:
        values["hidden"] = tuple(int(h) for h in args.hidden.split(","))
    except ValueError:
        raise UserError(f"--hidden={args.hidden!r}: give layer widths as integers, e.g. 512,512,512") from None
    cfg = SkillTrainConfig(**values)
    check_config(cfg)
    out = Path(args.out)
    print(json.dumps(run(cfg, out, demos_dir=Path(args.demos) if args.demos else None), indent=2))


if __name__ == "__main__":
    main()
