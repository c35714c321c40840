"""Multi-task behaviour cloning of the VLA-style policy (`policies/vla.py`) on a suite's image demos.

    python -m embodied.train algo=vla_bc env=cube-single-suite policy.head=parallel|flow|ar

One model learns every task of the suite from camera frames, the state and the instruction. The loss
is the head's: L1 on the normalised chunk (OpenVLA-OFT's parallel decoding), flow-matching velocity MSE
(pi0's action expert), or cross-entropy over 256 action bins (OpenVLA). Batches are the current frame,
state and instruction with the next `chunk` actions (`embodied.data.suite`); the chunk is executed
open-loop. Evaluation loops over the suite's tasks, each with its own rendered envs and instructions,
and reports success per task.

Optimiser, as in OpenVLA-OFT's vla-scripts/finetune.py: AdamW at lr 5e-4 with torch's default weight
decay (0.01; OFT passes only the lr) and no gradient clipping (`grad_clip` is a knob; 0 = off). OFT
decays the lr x0.1 at step 100k, past any budget here, so no schedule. OFT fine-tunes a pretrained 7B
model with LoRA; here the whole small network trains from scratch (no vision weights ship), so the
backbone sizes are CPU-sized counts, not OFT's.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

import policies
from embodied.agents.base import Agent
from embodied.agents.runner import CHUNK_EVAL_ENVS, Runner, eval_seed
from embodied.constants import STATE_KEY, TASK_SEED_STRIDE
from embodied.errors import ConfigError
from embodied.evaluation import dict_step_policy, evaluate, record_video
from sims.manip_variations import check_variation


@dataclass
class VLABCConfig:
    head: str = "parallel"                     # parallel (OFT) | flow (pi0-style) | ar (OpenVLA-style bins)
    chunk: int = 8                             # OpenVLA-OFT's LIBERO chunk
    cameras: tuple = ("front",)
    image_size: int = 64
    vla_kwargs: dict = field(default_factory=dict)   # policies.vla.VLAPolicy sizes (dim, depth, channels, ...)
    text_encoder: str = "minilm"               # minilm (frozen all-MiniLM-L6-v2) | hash (tests: no model load)
    lr: float = 5e-4                           # OpenVLA-OFT
    weight_decay: float = 0.01                 # torch AdamW's default, which OFT inherits
    grad_clip: float = 0.0                     # OFT clips nothing; > 0 clips the global grad norm
    distill_weight: float = 1.0                # flow head with onestep_head: train the one-step head alongside


class VLAActing:
    """Acting with the agent's VLA (`self.actor`) as it is: what vla_bc evaluates and vla_ppo deploys."""

    @torch.no_grad()
    def act_chunk(self, obs, deterministic: bool = False, generator: torch.Generator | None = None) -> np.ndarray:
        """[B, chunk, A] for a batched observation dict, or for state histories [B, To, obs]."""
        if not isinstance(obs, dict):
            obs = {STATE_KEY: np.asarray(obs, np.float32)[:, -1]}
        return self.actor.act(obs, deterministic=deterministic, generator=generator)

    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        return self.actor.act(obs, deterministic)[..., 0, :]


class VLABC(VLAActing, Agent):
    def __init__(self, obs_dim: int, act_dim: int, cfg: VLABCConfig = VLABCConfig(), device: str = "cpu",
                 seed: int = 0):
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        if cfg.text_encoder not in ("minilm", "hash"):
            raise ConfigError(f"algo text_encoder={cfg.text_encoder!r}: choose minilm or hash")
        torch.manual_seed(seed)  # network init
        text = None
        if cfg.text_encoder == "hash":
            from policies.vla import hash_text_encoder

            text = hash_text_encoder(int(dict(cfg.vla_kwargs).get("text_dim", 384)))
        self.actor = policies.make("vla", obs_dim=obs_dim, act_dim=act_dim, cameras=list(cfg.cameras),
                                   image_size=cfg.image_size, chunk=cfg.chunk, head=cfg.head,
                                   text_encoder=text, **dict(cfg.vla_kwargs)).to(self.device)
        self.optimizer = torch.optim.AdamW(self.actor.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.chunk_horizon, self.obs_horizon, self.execute_horizon = cfg.chunk, 1, cfg.chunk

    def fit_normalization(self, observations: np.ndarray, actions: np.ndarray) -> None:
        self.actor.fit_normalization(observations, actions)

    @staticmethod
    def _obs(batch: dict) -> dict:
        """A suite batch already holds the policy's keys; a replay chunk batch holds `observations`."""
        if STATE_KEY in batch:
            return batch
        return {STATE_KEY: batch["observations"]}

    def update(self, batch) -> dict[str, float]:
        self.actor.train()
        obs = self._obs(batch)
        actions = torch.as_tensor(np.asarray(batch["actions"], np.float32), device=self.device)
        loss = self.actor.loss(obs, actions, batch.get("valid"))
        metrics = {"bc_loss": loss.detach()}
        if self.actor.head == "flow" and self.actor.onestep_head and self.cfg.distill_weight > 0:
            distill = self.actor.distill_loss(obs)
            loss = loss + self.cfg.distill_weight * distill
            metrics["distill_loss"] = distill.detach()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")   # 0: measure the norm, no clip
        metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.actor.parameters(), clip)
        self.optimizer.step()
        self.actor.eval()
        return {k: float(v) for k, v in metrics.items()}

    def _modules(self) -> dict:
        return {"actor": self.actor}

    def _optimizers(self) -> dict:
        return {"optimizer": self.optimizer}


def evaluate_tasks(env: str, tasks: list[int], chunk_fn, agent_cfg, episodes: int, task_seed, variation: str = "none",
                   prefix: str = "eval", execute_horizon: int | None = None, episode_success: dict | None = None,
                   **evaluate_kwargs) -> dict:
    """Success and return per task of a suite under one variation, and their means: `chunk_fn(seed)` is the
    policy over batched observation dicts (fresh noise per chunk), `task_seed(task)` the first start seed,
    `execute_horizon` the actions run open-loop per chunk (None: the VLA's chunk).
    Keys: `<prefix>/task<k>/success`, `<prefix>/task<k>/return`, `<prefix>/success`, `<prefix>/return`.
    A dict passed as `episode_success` receives each task's 0/1 per episode, in start-state order (what a
    paired, per-slice comparison needs)."""
    metrics, successes, returns = {}, [], []
    for task in tasks:
        seed = task_seed(task)   # the same start states at every eval, and in every variation
        result = evaluate(env, None, episodes, seed=seed, env_kwargs=suite_env_kwargs(agent_cfg, task, variation),
                          chunk_policy=chunk_fn(seed), obs_horizon=1, execute_horizon=execute_horizon or agent_cfg.chunk,
                          max_envs=CHUNK_EVAL_ENVS, full_obs=True, **evaluate_kwargs)
        task_metrics = result.metrics()
        if episode_success is not None and result.successes is not None:
            episode_success[task] = np.asarray(result.successes, int).tolist()
        metrics[f"{prefix}/task{task}/success"] = task_metrics.get("eval/success", 0.0)
        metrics[f"{prefix}/task{task}/return"] = task_metrics["eval/return"]
        successes.append(metrics[f"{prefix}/task{task}/success"])
        returns.append(task_metrics["eval/return"])
    metrics.update({f"{prefix}/success": float(np.mean(successes)), f"{prefix}/return": float(np.mean(returns))})
    return metrics


def suite_env_kwargs(agent_cfg, task: int, variation: str = "none") -> dict:
    """What a suite task's eval env needs for a VLA (a VLABCConfig or the VLA policy itself: both carry
    `cameras` and `image_size`): its cameras at the model's size, and the instruction."""
    return dict(task_id=task, images=tuple(agent_cfg.cameras), image_size=agent_cfg.image_size, language=True,
                variation=variation)


def suite_tasks(env_tasks) -> list[int]:
    tasks = [int(t) for t in (env_tasks or [])]
    if not tasks:
        raise ConfigError("algo=vla_bc trains on a suite: pick env=<name>-suite (env.tasks lists its task ids)")
    return tasks


class VLARunner(Runner):
    """The runner's offline loop, checkpoints and summary, with the suite's image demos as the offline
    source and an evaluator that loops over the suite's tasks (rendered frames and instructions)."""

    def __init__(self, cfg, dataset, run_dir, logger, *, tasks, variations=("none",), progress: bool = True,
                 envs=None):
        self.tasks = suite_tasks(tasks)
        self.variations = [check_variation(v) for v in variations]  # the final eval's sets
        self.videos_per_task = cfg.video_episodes  # recorded per task in _finish, from the policy's own inputs
        cfg = dataclasses.replace(cfg, video_episodes=0)
        super().__init__(cfg, dataset, run_dir, logger, progress=progress, envs=envs)

    def _offline_buffer(self):
        self.dataset.seed(self.cfg.seed + 2)
        return self.dataset

    def _env_kwargs(self, task: int, variation: str = "none") -> dict:
        return suite_env_kwargs(self.offline_agent.cfg, task, variation)

    def _task_seed(self, task: int) -> int:
        return self._eval_seed() + TASK_SEED_STRIDE * task

    def _task_policy(self, seed: int):
        """A per-step policy over observation dicts (one env): chunks executed open-loop, fresh noise."""
        return dict_step_policy(self._chunk_fn(seed), self.agent.execute_horizon)

    def _evaluate_tasks(self, variation: str, prefix: str) -> dict:
        cfg = self.cfg
        return evaluate_tasks(cfg.env, self.tasks, self._chunk_fn, self.offline_agent.cfg, cfg.eval_episodes,
                              self._task_seed, variation, prefix, execute_horizon=self.agent.execute_horizon,
                              gamma=cfg.gamma, reward_transform=self.rewards)

    def evaluate(self, step: int, total_step: int) -> dict:
        metrics = self._evaluate_tasks("none", "eval")
        metrics.update({"eval/score": metrics["eval/return"], "eval/episodes": float(self.cfg.eval_episodes)})
        return self._record_eval(step, total_step, metrics)

    def _finish(self) -> dict:
        summary = super()._finish()
        last = self.eval_history[-1]
        summary["tasks"] = self.tasks
        summary["task_success"] = {t: last[f"eval/task{t}/success"] for t in self.tasks}
        summary["variation_success"] = {"none": summary["task_success"]}
        for variation in self.variations:
            if variation == "none":
                continue
            metrics = self._evaluate_tasks(variation, f"final/{variation}")   # same start seeds as set (i)
            last_step = last["step"]
            self.logger.log({**metrics, "total_step": last["total_step"]}, step=last_step, phase=last["phase"],
                            kind="eval")
            summary["variation_success"][variation] = {t: metrics[f"final/{variation}/task{t}/success"]
                                                       for t in self.tasks}
        if self.videos_per_task > 0:
            summary["videos"] = {}
            for task in self.tasks:
                seed = self._task_seed(task)   # the eval's first start state
                path = record_video(self.cfg.env, self._task_policy(seed), self.run_dir / "videos" / f"task{task}.mp4",
                                    episodes=1, seed=seed, size=self.cfg.video_size, env_kwargs=self._env_kwargs(task),
                                    full_obs=True)
                summary["videos"][task] = str(path) if path else None
        return summary


HEAD_MODULES = ("action_in", "action_pos", "time_embed", "action_out")   # the flow head's own parameters
LORA_TARGETS = ["qkv", "proj", "mlp.0", "mlp.2"]                       # every linear layer of a fusion block


def prepare_finetune(vla, mode: str, lora_rank: int = 8, lora_alpha: int = 8) -> list:
    """What of a flow-head VLA learns online, for both fine-tuning routes; returns the trainable parameters.
    frozen: nothing; head: the action expert's own layers (`HEAD_MODULES`), vision and fusion frozen;
    lora: those plus `peft` LoRA adapters (r, alpha) on every linear layer of the fusion transformer;
    full: everything."""
    vla.requires_grad_(mode == "full")
    if mode in ("head", "lora"):
        for name in HEAD_MODULES:
            getattr(vla, name).requires_grad_(True)
    if mode == "lora":
        import peft

        config = peft.LoraConfig(r=lora_rank, lora_alpha=lora_alpha, target_modules=LORA_TARGETS, lora_dropout=0.0)
        vla.backbone = peft.LoraModel(vla.backbone, config, "default")   # freezes the base weights
    return [p for p in vla.parameters() if p.requires_grad]


def merge_adapters(vla) -> None:
    """Fold LoRA into the fusion transformer's weights: the fine-tuned VLA saves and loads as a plain one."""
    import peft

    if isinstance(vla.backbone, peft.LoraModel):
        vla.backbone = vla.backbone.merge_and_unload()


def check_online_reward(reward: str) -> str:
    """What the fine-tuning routes maximise: "success" (1.0 at the step or decision whose actions reach the
    task's success) or "env" (the env's reward through the run's transform). MT10's shaped reward with
    episodes ending at success pays more for hovering next to the goal than for finishing."""
    if reward not in ("success", "env"):
        raise ConfigError(f"algo.online_agent.reward={reward!r}: choose success or env")
    return reward


class VLAFinetuneRunner(VLARunner):
    """VLARunner for the online fine-tuning routes (`vla_qc`, `vla_ppo`): one task of the suite
    (`algo.online_agent.task`) is fine-tuned, every eval covers all of them, so the other tasks' success
    before and after is the forgetting measurement. Evals use a seed-0 run's start states whatever this
    run's seed: the fine-tunes of every seed are evaluated on the states the (seed-0, default)
    pretraining's end-of-offline eval used, so before and after are paired."""

    def __init__(self, cfg, dataset, run_dir, logger, **kwargs):
        super().__init__(cfg, dataset, run_dir, logger, **kwargs)
        from embodied import agents

        self.finetune_task = agents.make_config(cfg.online_algo, cfg.online_agent).task   # in env.tasks: config_check
        self.before_finetune = None

    def _eval_seed(self) -> int:
        return eval_seed(0) + self.cfg.eval_first_episode

    def _before(self) -> dict:
        """The eval that "before" reads: the end of pretraining."""
        return self.end_of_offline or {}

    def _finish(self) -> dict:
        summary = super()._finish()
        before, after = self._before(), self.eval_history[-1]
        others = [t for t in self.tasks if t != self.finetune_task]
        task_key = lambda t: f"eval/task{t}/success"
        summary["finetune"] = {
            "task": self.finetune_task,
            "success_before": before.get(task_key(self.finetune_task)),
            "success_after": after[task_key(self.finetune_task)],
            "other_tasks_before": {t: before.get(task_key(t)) for t in others},
            "other_tasks_after": {t: after[task_key(t)] for t in others},
        }
        return summary
