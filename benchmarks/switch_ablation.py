"""Which online knob stops the post-switch collapse on PointMaze? One Cal-QL pretraining (the
o2o_pointmaze budget: 4,000 bf16 steps on medium-replay data), then WSRL's online phase (1,000 warmup
steps, SAC at UTD 1) from that same pretrained agent with several SAC variants.

    python benchmarks/switch_ablation.py        # about 10 minutes on 2 idle cores

Prints the online eval curve (step, success %) of each variant.
"""
from __future__ import annotations

import copy
import time

import torch

from embodied.agents.runner import Runner, RunnerConfig
from embodied.data import catalog

VARIANTS = {
    "default": {},
    "no_entropy_backup": {"backup_entropy": False},      # as in CQL/Cal-QL pretraining
    "actor_lr_1e-4": {"actor_lr": 1e-4},                 # the pretraining actor learning rate
    "both": {"backup_entropy": False, "actor_lr": 1e-4},
}


class NoLogger:
    def log(self, *args, **kwargs) -> None:
        pass


def main() -> None:
    torch.set_num_threads(1)
    dataset = catalog.load_dataset("pointmaze-umaze", "medium-replay", 50_000, progress=False)
    critic = dict(num_critics=2, critic_layernorm=True, bf16=True)
    base = dict(env="pointmaze-umaze", offline_algo="calql", online_algo="sac", offline_steps=4000,
                online_steps=3000, warmup_steps=1000, eval_episodes=10, eval_every_offline=4000,
                eval_every_online=500, video_episodes=0, dip_evals=1, reward_bias=-1.0, sparse_failure_reward=0.0,
                offline_agent=critic, online_agent=critic)
    pretraining = Runner(RunnerConfig(**base), dataset, "/tmp/switch_ablation", NoLogger(), progress=False)
    started = time.time()
    pretraining._run_offline()
    end_of_offline = pretraining.eval_history[-1]
    print(f"pretrained Cal-QL: success {end_of_offline['eval/score']:.0f}% ({time.time() - started:.0f} s)", flush=True)
    for name, extra in VARIANTS.items():
        cfg = RunnerConfig(**{**base, "online_agent": {**critic, **extra}})
        runner = Runner(cfg, dataset, f"/tmp/switch_ablation/{name}", NoLogger(), progress=False)
        runner.offline_agent = runner.agent = copy.deepcopy(pretraining.offline_agent)
        runner.offline_step, runner.eval_history = cfg.offline_steps, [dict(end_of_offline)]
        runner._switch()
        runner._run_online()
        curve = [(r["step"], round(r["eval/score"])) for r in runner.eval_history if r["phase"] == "online"]
        print(f"{name}: {curve}", flush=True)


if __name__ == "__main__":
    main()
