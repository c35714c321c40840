"""Does the critic still tell actions apart? Probe the checkpoints of an offline→online run.

For each checkpoint of RUN_DIR (and, for a run started with `pretrained=`, the pretrained critic at the switch,
also on states of its dataset), on states from the run's online replay:
  beats@sigma   share of perturbed actions a + N(0, sigma^2) (clipped to [-1, 1]) that the actor's objective
                (min or mean over the critics, as the run's agent uses) rates above the actor's own action:
                near 0 for a critic peaked at the policy, near 0.5 for one that ignores the action
  spread        max - min over the ensemble at the actor's action
  |dQ/da|       per-state gradient norm at the actor's action; `coherent` is the norm of its batch mean
  drift         L2 distance of the deterministic action from the pretrained actor's

--climb N (a run started with `pretrained=`): copies of the pretrained actor take N actor-only steps against the
frozen pretrained critic on its dataset's states, at each temperature of --climb-temperatures ("switch" = the
pretrained one), then are probed and evaluated like the run's evals. Was the actor held off the critic's peak by
its entropy term, and is that peak a good policy? (eval: the success rate where the env reports one, else the
normalised score.)

Usage: python benchmarks/critic_probe.py RUN_DIR [--every K] [--states 1024] [--climb N]
The run needs checkpoints inside its online phase (`checkpoint.every=N checkpoint.keep=K`).
"""
from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from embodied.agents.runner import Runner  # noqa: E402
from embodied.checkpoints import find_checkpoints  # noqa: E402
from embodied.config_check import read_saved_run  # noqa: E402
from embodied.errors import UserError  # noqa: E402
from embodied.logging import RunLogger  # noqa: E402
from embodied.run_config import runner_config  # noqa: E402
from embodied.train import load_dataset  # noqa: E402
from sims.source import EnvSource  # noqa: E402
from tqdm import tqdm  # noqa: E402

SIGMAS = (0.05, 0.2, 0.5)


def objective(agent, q: torch.Tensor) -> torch.Tensor:
    return q.min(0).values if getattr(agent.cfg, "actor_q", "mean") == "min" else q.mean(0)


def probe(agent, reference_actor, obs: torch.Tensor, generator: torch.Generator, actor=None) -> dict:
    actor, critic = actor if actor is not None else agent.actor, agent.critic
    with torch.no_grad():
        action = actor.mode(obs)
        q_all = critic(obs, action).float()
        own = objective(agent, q_all)
        beats = {}
        for sigma in SIGMAS:
            wins = [(objective(agent, critic(obs, (action + sigma * torch.randn(action.shape, generator=generator))
                                               .clamp(-1.0, 1.0)).float()) > own).float().mean() for _ in range(8)]
            beats[sigma] = float(torch.stack(wins).mean())
        drift = float((action - reference_actor.mode(obs)).norm(dim=-1).mean())
    probe_action = action.clone().requires_grad_(True)
    critic.requires_grad_(False)
    grad = torch.autograd.grad(objective(agent, critic(obs, probe_action).float()).sum(), probe_action)[0]
    critic.requires_grad_(True)
    return {"beats": beats, "spread": float((q_all.max(0).values - q_all.min(0).values).mean()),
            "grad": float(grad.norm(dim=-1).mean()), "coherent": float(grad.mean(0).norm()),
            "q": float(own.mean()), "drift": drift}


def climb(agent, states: torch.Tensor, steps: int, temperature: float, generator: torch.Generator,
          batch_size: int = 256):
    """A copy of the agent's actor after `steps` Adam steps (the agent's actor lr) on SAC's actor loss at a fixed
    temperature, the critic frozen: where the critic's objective plus that entropy weight takes the policy."""
    actor = copy.deepcopy(agent.actor).float().requires_grad_(True)
    optimizer = torch.optim.Adam(actor.parameters(), lr=agent.cfg.actor_lr)
    agent.critic.requires_grad_(False)
    torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=generator)))  # the actor's sampling noise
    for _ in range(steps):
        obs = states[torch.randint(len(states), (batch_size,), generator=generator)]
        action, log_prob = actor.sample_with_log_prob(obs)
        loss = (temperature * log_prob.float() - objective(agent, agent.critic(obs, action).float())).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    agent.critic.requires_grad_(True)
    return actor.requires_grad_(False)


def climb_temperatures(text: str) -> list[float | None]:
    """--climb-temperatures, parsed: None for 'switch' (the pretrained temperature), else a number >= 0."""
    parsed = []
    for name in text.split(","):
        try:
            value = None if name == "switch" else float(name)
        except ValueError:
            value = -1.0
        if value is not None and value < 0:
            raise SystemExit(f"critic_probe: --climb-temperatures: {name!r} is neither 'switch' nor a number >= 0; "
                             f"pass e.g. switch,0.1,0")
        parsed.append(value)
    return parsed


def climb_rows(runner, agent, data_states: torch.Tensor, probe_states: torch.Tensor, steps: int,
               temperatures: list[float | None], stream) -> list[tuple]:
    """One row per temperature (None: the switch's): the climbed actor's probe on the online states and its
    score on the run's eval episodes."""
    rows = []
    for i, value in enumerate(temperatures):
        temperature = float(agent.alpha()) if value is None else value
        actor = climb(agent, data_states, steps, temperature, stream(-10 - i))
        row = probe(agent, agent.actor, probe_states, stream(-4), actor=actor)
        metrics = runner.run_eval_episodes(lambda states: actor.act(states, deterministic=True)[:, 0, :]).metrics()
        row["eval"] = metrics.get("eval/success", metrics["eval/score"])
        rows.append((f"temperature {temperature:.3g}" + (" (switch)" if value is None else ""), row))
    return rows


def main(argv=None) -> None:
    try:
        probe_run(argv)
    except UserError as err:  # a run dir that is not one, a checkpoint that does not load: one line, no traceback
        raise SystemExit(f"critic_probe: {err}") from None


def probe_run(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--every", type=int, default=1, help="probe every k-th online checkpoint")
    parser.add_argument("--states", type=int, default=1024, help="online states per probe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--climb", type=int, default=0, metavar="N",
                        help="actor-only steps against the frozen pretrained critic (needs a run with pretrained=)")
    parser.add_argument("--climb-temperatures", default="switch,0.1,0",
                        help="comma-separated temperatures for --climb; 'switch' is the pretrained one")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if not (args.run_dir / ".hydra" / "config.yaml").is_file():
        raise SystemExit(f"critic_probe: {args.run_dir} has no .hydra/config.yaml: pass the directory of a run "
                         f"written by embodied.train")
    cfg = read_saved_run(args.run_dir)[0]   # the config the run was started with, not today's presets
    rcfg = runner_config(cfg)
    temperatures = climb_temperatures(args.climb_temperatures)
    if args.climb and not cfg.get("pretrained"):
        raise SystemExit(f"critic_probe: --climb needs a run started with pretrained=<run>; {args.run_dir} was not")
    checkpoints = find_checkpoints(args.run_dir)
    if not checkpoints:
        raise SystemExit(f"{args.run_dir}/checkpoints has no step_* checkpoint: rerun with checkpoint.every=N "
                         f"checkpoint.keep=K")
    dataset = load_dataset(cfg)
    scratch = Path(tempfile.mkdtemp(prefix="critic_probe-"))
    logger = RunLogger(scratch, {}, wandb_mode="disabled", enabled_wandb=False)
    runner = Runner(rcfg, dataset, scratch, logger, progress=False, envs=EnvSource(rcfg.env, rcfg.env_options))
    # one stream per row, seeded by what the row is: a row's figures do not depend on which other rows ran
    stream = lambda key: torch.Generator().manual_seed(args.seed * 1_000_003 + 3 + key)  # keys -3..-1: switch rows

    def states(generator: torch.Generator) -> torch.Tensor | None:
        """States of the loaded checkpoint's online replay; None while it is empty (Cal-QL adds whole episodes)."""
        replay = getattr(runner.online_buffer, "online", runner.online_buffer)
        if replay.size == 0:
            return None
        pick = torch.randperm(replay.size, generator=generator)[: args.states]
        return torch.as_tensor(replay.observations[: replay.size], dtype=torch.float32)[pick]

    switch_agent = None
    if cfg.get("pretrained"):  # the critic as the switch hands it over, on the first probed checkpoint's states
        switch = Runner(rcfg, dataset, scratch / "switch", logger, progress=False,
                        envs=EnvSource(rcfg.env, rcfg.env_options))
        switch.load_pretrained(cfg.pretrained)
        switch_agent = switch.offline_agent if getattr(switch.offline_agent, "critic", None) is not None else None
    if args.climb and (switch_agent is None or dataset is None):
        raise SystemExit(f"critic_probe: --climb needs a run started with pretrained=<run> from an offline dataset, "
                         f"with a pretrained critic; {args.run_dir} has none")
    rows, climbed = [], []
    for path in tqdm(checkpoints[:: args.every], desc="checkpoints", dynamic_ncols=True):
        runner.load_checkpoint(path)
        obs = states(stream(runner.online_step)) if runner.phase == "online" else None
        if obs is None:
            continue
        if switch_agent is not None and not rows:  # on the same states as the first checkpoint's row
            rows.append(("switch (pretrained critic)", runner.online_step,
                         probe(switch_agent, switch_agent.actor, obs, stream(-1))))
            if dataset is not None:  # and on the states it was trained on, for contrast
                pick = torch.randperm(len(dataset.observations), generator=stream(-2))[: args.states]
                data_states = torch.as_tensor(np.asarray(dataset.observations)[pick.numpy()], dtype=torch.float32)
                rows.append(("switch, dataset states", None,
                             probe(switch_agent, switch_agent.actor, data_states, stream(-3))))
                if args.climb:
                    climbed = climb_rows(switch, switch_agent, data_states, obs, args.climb, temperatures, stream)
        reference = runner.pretrained_actor if runner.pretrained_actor is not None else runner.agent.actor
        rows.append((path.name, runner.online_step, probe(runner.agent, reference, obs, stream(runner.online_step))))
    if not rows:
        raise SystemExit(f"no checkpoint of {args.run_dir} is in the online phase with a non-empty replay")
    print(f"critic probe of {args.run_dir} ({len(rows)} rows; states from the online replay)")
    print("| checkpoint | online step | " + " | ".join(f"beats@{s}" for s in SIGMAS)
          + " | spread | dQ/da | coherent | Q | drift |")
    print("|---" * (len(SIGMAS) + 7) + "|")
    for name, step, r in rows:
        print(f"| {name} | {'-' if step is None else step} | " + " | ".join(f"{r['beats'][s]:.2f}" for s in SIGMAS)
              + f" | {r['spread']:.3f} | {r['grad']:.4f} | {r['coherent']:.4f} | {r['q']:.2f} | {r['drift']:.3f} |")
    if climbed:
        print(f"\nthe pretrained actor after {args.climb} actor-only steps against the frozen pretrained critic "
              f"(dataset states; probed on the switch row's online states; eval: {switch.cfg.eval_episodes} episodes)")
        print("| climbed at | " + " | ".join(f"beats@{s}" for s in SIGMAS) + " | dQ/da | coherent | Q | drift | eval |")
        print("|---" * (len(SIGMAS) + 6) + "|")
        for name, r in climbed:
            print(f"| {name} | " + " | ".join(f"{r['beats'][s]:.2f}" for s in SIGMAS)
                  + f" | {r['grad']:.4f} | {r['coherent']:.4f} | {r['q']:.2f} | {r['drift']:.3f} | {r['eval']:.2f} |")
    logger.close()


if __name__ == "__main__":
    main()
