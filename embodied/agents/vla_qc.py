"""Online RL fine-tuning of a pretrained VLA, off-policy and in chunks: Q-chunking's best-of-N over the
VLA's own samples (route (a) of the VLA fine-tuning issue).

    python -m embodied.train algo=vla_qc env=cube-single-suite dataset=task algo.online_agent.task=2

The pretrained VLA (`policies/vla.py`, trained by `vla_bc.py`) stays frozen by default. A critic over chunks,
Q(s, instruction, a_{t:t+h}), learns online with Q-chunking's unbiased h-step backup

    target = sum_{i<h} gamma^i r_{t+i} + gamma^{sum valid} (1 - terminal) Q'(s_{t+h}, l, a*),
    a* = argmax_j Q(s_{t+h}, l, a^j)

where a^1..a^N are N = 32 chunks the VLA samples at s_{t+h} (flow noise, or the parallel head's
Laplace samples); as in QC's code the online critic picks a* and the target critic values it. A chunk
that meets an episode end sums the rewards it got (`valid`) and does not bootstrap past a true terminal,
as the repo's other chunk critics do (`chunking.chunk_td_target`; QC instead drops such chunks from the
loss, which here would drop every success: the suite's episodes end on success). The agent acts with
the argmax-Q candidate (QC's best-of-N extraction) and executes it open-loop. The critic reads the state and the instruction's frozen text embedding, not the frames
(an asymmetric critic: the simulator's state is at hand during fine-tuning; the policy still acts from
the camera), so fine-tuning costs no image encoder passes beyond the VLA's sampling.

The VLA itself learns with `finetune=head|lora|full` (what of it trains: `vla_bc.prepare_finetune`, as
route (b)): QC's behaviour-policy update, flow-matching BC on batches drawn uniformly over the union of
the pretraining demos (every task) and the online chunks it executed, one BC step per `bc_every` env steps.
The chunks best-of-N picked are what it distils, so the VLA's own samples move towards them. Online rows then
keep their frame and instruction for it. `finetune/vla_distance` logs the fine-tuned VLA's chunk against the
pretrained one's from the same noise on online states.

What departs from QC (named, listed in benchmarks/RESULTS.md):
- `finetune=frozen` (the default, for CPU budgets): the VLA does not learn (QC keeps training its flow policy
  with BC); only the critic does. The policy can only move within the VLA's own samples, which bounds
  forgetting. With the other modes, `bc_every` (QC: 1) and `bc_batch_size` (QC: the critic's batch) are counts.
- Transitions are stored at chunk boundaries only: the N candidates drawn there to act are the next
  state's target candidates, so targets need no image replay and no extra VLA call (QC samples chunk
  starts at every step and draws fresh target samples; when the VLA learns, the stored candidates are the
  VLA's samples as it was when they were drawn). Updates per env step are the runner's `utd`.
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

import sims
from embodied import agents
from embodied.agents.base import Agent
from embodied.agents.chunking import chunk_td_target
from embodied.agents.nets import CriticEnsemble, adam, soft_update, to_torch
from embodied.agents.runner import mean_metrics
from embodied.agents.vla_bc import VLAFinetuneRunner, check_online_reward, merge_adapters, prepare_finetune
from embodied.checkpoints import Checkpoint, fallback, first_line
from embodied.constants import STATE_KEY, TASK_KEY, image_key
from embodied.data.suite import chunk_steps
from embodied.data.replay import decode_rng, encode_rng
from embodied.errors import CheckpointError, ConfigError
from embodied.evaluation import stack_observations

FINETUNE_MODES = ("frozen", "head", "lora", "full")


@dataclass
class VLAQCConfig:
    task: int = 1                              # the suite task fine-tuned online; evaluation covers all of them
    horizon: int = 8                           # critic and execution chunk, <= the VLA's (8: all of it)
    num_samples: int = 32                      # QC's best-of-N (acting and targets)
    hidden: tuple[int, ...] = (512, 512, 512, 512)  # QC's value network
    num_critics: int = 2                       # QC
    q_agg: str = "mean"                        # QC; "min" is a knob
    critic_layernorm: bool = True              # QC
    text_features: int = 64                    # the instruction embedding's projection before the critic MLP
    lr: float = 3e-4                           # QC
    gamma: float = 0.99
    tau: float = 0.005                         # QC
    finetune: str = "frozen"                   # what of the VLA learns: frozen = nothing (the critic only), or
                                               # head | lora | full by BC on demos + online chunks (QC's actor)
    lora_rank: int = 8                         # finetune=lora: peft's default r
    lora_alpha: int = 8                        # peft's default
    bc_every: int = 1                          # env steps per VLA BC step (QC: an actor step per critic step)
    bc_batch_size: int = 0                     # 0: the critic's batch (QC: one batch for both)
    critic_pretrain_steps: int = 0             # QC trains its critic offline first; here, at the switch, on the
                                               # suite's demos (`demo_chunks`), this many updates (0: off)
    critic_pretrain_rows: int = 2048           # demo chunk starts for it; the VLA draws their targets' candidates once
    reward: str = "success"                    # what the critic values: "success" (1.0 at the step that succeeds,
                                               # as route (b)) or "env" (the env's reward through the run's transform)


class CandidateCritic(nn.Module):
    """Q ensemble over (normalised state, projected instruction embedding, normalised chunk): [N, B]."""

    def __init__(self, obs_dim: int, text_dim: int, chunk_dim: int, cfg: VLAQCConfig):
        super().__init__()
        self.text_proj = nn.Linear(text_dim, cfg.text_features)
        self.q = CriticEnsemble(obs_dim + cfg.text_features, chunk_dim, cfg.hidden, cfg.num_critics,
                                cfg.critic_layernorm)

    def forward(self, state: torch.Tensor, text: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        return self.q(torch.cat([state, self.text_proj(text)], -1), chunk.flatten(1))


class VLAQC(Agent):
    stochastic_extraction = True   # best-of-N draws VLA samples whatever the head

    def __init__(self, obs_dim: int, act_dim: int, cfg: VLAQCConfig = VLAQCConfig(), device: str = "cpu",
                 seed: int = 0, vla=None):
        if vla is None:
            raise ConfigError("algo=vla_qc fine-tunes a pretrained VLA: it continues offline_algo=vla_bc "
                              "(set algo=vla_qc, or pretrained=<a vla_bc run>)")
        if cfg.finetune not in FINETUNE_MODES:
            raise ConfigError(f"algo.online_agent.finetune={cfg.finetune!r}: choose one of {', '.join(FINETUNE_MODES)}")
        self.learns = cfg.finetune != "frozen"
        if self.learns and (getattr(vla, "head", None) != "flow" or vla.flow_sampler != "euler"):
            raise ConfigError(f"algo.online_agent.finetune={cfg.finetune} trains the flow head by BC, and this VLA acts "
                              f"with head={getattr(vla, 'head', None)!r}: pretrain with policy.head=flow "
                              "(Euler sampler), or keep finetune=frozen")
        if self.learns and (cfg.horizon != vla.chunk or cfg.bc_every < 1 or cfg.bc_batch_size < 0):
            raise ConfigError(f"algo.online_agent.finetune={cfg.finetune} distils whole executed chunks: set "
                              f"algo.online_agent.horizon={vla.chunk} (the VLA's chunk; got {cfg.horizon}), "
                              f"bc_every >= 1 and bc_batch_size >= 0")
        check_online_reward(cfg.reward)
        horizon = cfg.horizon
        if not 1 <= horizon <= vla.chunk:
            raise ConfigError(f"algo.online_agent.horizon={cfg.horizon} must be in 1..{vla.chunk} (the VLA's chunk "
                              f"algo.offline_agent.chunk={vla.chunk}); set algo.online_agent.horizon={vla.chunk}")
        if cfg.num_samples < 1 or cfg.q_agg not in ("mean", "min"):
            raise ConfigError("algo.online_agent.num_samples must be >= 1 and q_agg one of mean, min")
        if cfg.critic_pretrain_steps < 0 or cfg.critic_pretrain_rows < 1:
            raise ConfigError("algo.online_agent.critic_pretrain_steps must be >= 0 and critic_pretrain_rows >= 1 "
                              f"(got {cfg.critic_pretrain_steps} and {cfg.critic_pretrain_rows})")
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        torch.manual_seed(seed)  # critic init
        self.reference = copy.deepcopy(vla).requires_grad_(False).eval() if self.learns else None
        trainable = prepare_finetune(vla, cfg.finetune, cfg.lora_rank, cfg.lora_alpha)   # frozen: none
        self.actor = vla.eval()   # what deploys
        self.actor_optimizer = adam(trainable, cfg.lr) if trainable else None   # QC: one lr for actor and critic
        self.horizon = horizon
        self.chunk_horizon = self.execute_horizon = horizon
        self.obs_horizon = 1
        self.critic = CandidateCritic(obs_dim, vla.text_dim, horizon * act_dim, cfg).to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic_optimizer = adam(self.critic.parameters(), cfg.lr)

    @classmethod
    def from_agent(cls, vla_agent, cfg: VLAQCConfig, seed: int = 0) -> "VLAQC":
        return cls(vla_agent.obs_dim, vla_agent.act_dim, cfg, str(vla_agent.device), seed, vla=vla_agent.actor)

    # -- the VLA's candidates and their values ---------------------------------------------------------
    @torch.no_grad()
    def candidates(self, obs: dict, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """N sampled chunks [B, N, h, A] (raw actions) for a batched observation dict, and the rows'
        instruction embeddings [B, text_dim]. The frames and instruction are encoded once per row."""
        vla, n = self.actor, self.cfg.num_samples
        state, images, tasks, _ = vla._inputs(obs)
        prefix = vla.prefix(state, images, tasks).repeat_interleave(n, 0)
        chunks = vla.unnormalize_actions(vla.generate(prefix, deterministic=False, generator=generator))
        return chunks[:, : self.horizon].reshape(state.shape[0], n, self.horizon, self.act_dim), vla.embed_text(tasks)

    def values(self, critic: nn.Module, state: torch.Tensor, text: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        """Per-critic Q [N, B] of raw states [B, obs], embeddings [B, text_dim] and raw chunks [B, h, A],
        normalised with the VLA's statistics."""
        vla = self.actor
        return critic((state - vla.obs_mean) / vla.obs_std, text, vla.normalize_actions(chunk))

    def q(self, critic: nn.Module, state: torch.Tensor, text: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        """Aggregated Q [B] (`q_agg` over the critics)."""
        values = self.values(critic, state, text, chunk)
        return values.mean(0) if self.cfg.q_agg == "mean" else values.min(0).values

    def best(self, critic: nn.Module, state: torch.Tensor, text: torch.Tensor,
             candidates: torch.Tensor) -> torch.Tensor:
        """The argmax-Q chunk [B, h, A] among candidates [B, N, h, A] under `critic`."""
        b, n = candidates.shape[:2]
        scores = self.q(critic, state.repeat_interleave(n, 0), text.repeat_interleave(n, 0),
                        candidates.flatten(0, 1)).view(b, n)
        return candidates[torch.arange(b, device=candidates.device), scores.argmax(1)]

    @torch.no_grad()
    def select(self, obs: dict, generator: torch.Generator | None = None) -> dict[str, np.ndarray]:
        """Act at a chunk boundary: the candidates, the chosen chunk and the instruction embedding."""
        candidates, text = self.candidates(obs, generator)
        state = torch.as_tensor(np.asarray(obs[STATE_KEY], np.float32), device=self.device).reshape(
            candidates.shape[0], -1)
        chunk = self.best(self.critic, state, text, candidates)
        return {"candidates": candidates.cpu().numpy(), "chunk": chunk.cpu().numpy(), "text": text.cpu().numpy()}

    @torch.no_grad()
    def act_chunk(self, obs, deterministic: bool = False, generator: torch.Generator | None = None) -> np.ndarray:
        """[B, h, A]: best-of-N over VLA samples (QC acts and evaluates this way), for a batched observation
        dict or state histories [B, To, obs] (a state-only VLA). Deterministic without a `generator`: fixed
        noise, so the choice is a function of the observation."""
        if not isinstance(obs, dict):
            obs = {STATE_KEY: np.asarray(obs, np.float32)[:, -1]}
        if generator is None and deterministic:
            generator = torch.Generator(device=self.device).manual_seed(0)
        return self.select(obs, generator)["chunk"]

    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        state = obs[STATE_KEY] if isinstance(obs, dict) else obs
        single = np.ndim(state) == 1
        if not isinstance(obs, dict):
            obs = {STATE_KEY: np.asarray(obs, np.float32).reshape(-1, self.obs_dim)}
        chunk = self.act_chunk(obs, deterministic)[:, 0]
        return chunk[0] if single else chunk

    # -- update ----------------------------------------------------------------------------------------
    def update(self, batch) -> dict[str, float]:
        """One critic step on a ChunkReplay batch (observations, text, actions [B, h, A], rewards, valid,
        terminals [B, h], next_observations, next_text, next_candidates [B, N, h, A])."""
        batch = to_torch(batch, self.device)
        with torch.no_grad():  # QC: the online critic picks the next chunk, the target critic values it
            next_obs, next_text = batch["next_observations"], batch["next_text"]
            next_chunk = self.best(self.critic, next_obs, next_text, batch["next_candidates"])
            next_q = self.q(self.target_critic, next_obs, next_text, next_chunk)
            target = chunk_td_target(batch["rewards"], batch["valid"], batch["terminals"], next_q, self.cfg.gamma)
        q = self.values(self.critic, batch["observations"], batch["text"], batch["actions"])
        loss = ((q - target) ** 2).mean()   # QC: the mean over critics and batch
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_optimizer.step()
        soft_update(self.target_critic, self.critic, self.cfg.tau)
        return {"critic_loss": float(loss.detach()), "q_mean": float(q.detach().mean()),
                "target_q_mean": float(target.mean())}

    def bc_update(self, batch: dict) -> dict[str, float]:
        """One flow-matching BC step of the VLA (QC's behaviour-policy update) on the policy's inputs (state,
        frames, instruction) with raw action chunks [B, chunk, A] and `valid` [B, chunk]."""
        self.actor.train()   # the pretraining's image augmentation
        loss = self.actor.loss(batch, batch["actions"], batch["valid"])
        self.actor_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.actor_optimizer.step()
        self.actor.eval()
        return {"bc_loss": float(loss.detach())}

    @torch.no_grad()
    def vla_distance(self, obs: dict) -> float:
        """Mean per-step distance (raw action units) between the fine-tuned and the pretrained VLA's chunks
        from the same noise, on a batch of observation rows: how far the VLA itself has moved."""
        vla, ref = self.actor, self.reference
        state, images, tasks, _ = vla._inputs(obs)
        z = torch.randn((state.shape[0], vla.chunk, vla.act_dim), generator=torch.Generator().manual_seed(0))
        z = z.to(self.device)
        now = vla.unnormalize_actions(vla.euler(vla.prefix(state, images, tasks), z))
        before = ref.unnormalize_actions(ref.euler(ref.prefix(state, images, tasks), z))
        return float((now - before).norm(dim=-1).mean())

    def _modules(self) -> dict:
        # the VLA is saved frozen too: a resumed run rebuilds this agent from an untrained pretraining agent
        modules = {"critic": self.critic, "target_critic": self.target_critic, "actor": self.actor}
        return {**modules, "reference": self.reference} if self.learns else modules

    def _optimizers(self) -> dict:
        optimizers = {"critic_optimizer": self.critic_optimizer}
        return {**optimizers, "actor_optimizer": self.actor_optimizer} if self.learns else optimizers


class ChunkReplay:
    """Chunk-boundary transitions for `VLAQC.update`: everything the h-step backup reads. With `frames`
    ({image key: frame shape}, {} for a VLA without cameras) each row also keeps its chunk start's frames and
    instruction, so that `sample_inputs` can give the VLA's BC rows (finetune != frozen); with None (the
    default) no frames are stored."""

    KEYS = ("observations", "text", "actions", "rewards", "valid", "terminals", "next_observations", "next_text",
            "next_candidates")

    def __init__(self, capacity: int, obs_dim: int, text_dim: int, horizon: int, act_dim: int, num_samples: int,
                 seed: int = 0, frames: dict[str, tuple] | None = None):
        shapes = {"observations": (obs_dim,), "text": (text_dim,), "actions": (horizon, act_dim),
                  "rewards": (horizon,), "valid": (horizon,), "terminals": (horizon,),
                  "next_observations": (obs_dim,), "next_text": (text_dim,),
                  "next_candidates": (num_samples, horizon, act_dim)}
        self.data = {k: np.zeros((capacity, *shape), np.float32) for k, shape in shapes.items()}
        self.frames = None if frames is None else {k: np.zeros((capacity, *shape), np.uint8)
                                                   for k, shape in frames.items()}
        self.instructions = np.full(capacity, "", object)
        self.capacity, self.size, self.cursor = capacity, 0, 0
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, frames: dict | None = None, instruction: str | None = None, **row) -> None:
        if set(row) != set(self.KEYS):
            raise ValueError(f"ChunkReplay.add takes {', '.join(self.KEYS)}; got {', '.join(sorted(row))}")
        if self.frames is not None and (set(frames or {}) != set(self.frames) or instruction is None):
            raise ValueError(f"this ChunkReplay keeps frames: add needs frames={{{', '.join(self.frames)}}} and the "
                             f"instruction; got frames {sorted(frames or {})}")
        for key, value in row.items():
            self.data[key][self.cursor] = value
        for key, value in (frames or {}).items() if self.frames is not None else ():
            self.frames[key][self.cursor] = value
        self.instructions[self.cursor] = instruction or ""
        self.cursor = (self.cursor + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        index = self.rng.integers(0, self.size, batch_size)
        return {k: v[index] for k, v in self.data.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """The written rows as plain arrays (a checkpoint reads them back with allow_pickle=False): the
        instructions as fixed-width text, and the sampling stream's state."""
        n = self.size
        state = {f"data/{k}": v[:n].copy() for k, v in self.data.items()}
        state.update({f"frames/{k}": v[:n].copy() for k, v in (self.frames or {}).items()})
        state["instructions"] = self.instructions[:n].astype(str)
        state["counts"] = np.asarray([self.capacity, self.size, self.cursor], np.int64)
        state["rng_state"] = encode_rng(self.rng)
        return state

    def load_state_dict(self, state: dict) -> None:
        capacity, size, cursor = (int(x) for x in state["counts"])
        frames = sorted(k.split("/", 1)[1] for k in state if k.startswith("frames/"))
        if capacity != self.capacity or frames != sorted(self.frames or {}):
            raise ValueError(f"the saved replay has capacity {capacity} and frames {frames}, this run's "
                             f"{self.capacity} and {sorted(self.frames or {})}")
        for key, value in self.data.items():
            value[:size] = state[f"data/{key}"]   # a shape that differs raises ValueError
        for key, value in (self.frames or {}).items():
            value[:size] = state[f"frames/{key}"]
        self.instructions[:size] = state["instructions"]
        self.size, self.cursor, self.rng = size, cursor, decode_rng(state["rng_state"])

    def sample_inputs(self, batch_size: int) -> dict:
        """BC rows in the VLA's input keys (as `SuiteDemos.sample_chunks`): state, frames, instruction, the
        executed chunk and its `valid` mask."""
        if self.frames is None:
            raise ValueError("this ChunkReplay keeps no frames: build it with frames= to sample VLA inputs")
        index = self.rng.integers(0, self.size, batch_size)
        return {STATE_KEY: self.data["observations"][index], TASK_KEY: list(self.instructions[index]),
                **{k: v[index] for k, v in self.frames.items()}, "actions": self.data["actions"][index],
                "valid": self.data["valid"][index]}


def demo_chunks(demos, horizon: int, step_rewards: np.ndarray, rows: int, rng: np.random.Generator) -> dict:
    """Chunk transitions of the suite's demos for the critic's offline pretraining, laid out as the online
    rows: for a chunk start, its episode's next `horizon` actions, their rewards, `valid` and `terminals`
    (1 from the succeeding step on), and `next_index`, the demo step the backup bootstraps from (-1 past a
    success: no bootstrap). A chunk that reaches an episode's time limit is left out: the demos keep no
    state after it. `rows` starts are drawn without replacement from the rest."""
    n = len(demos.actions)
    start = np.arange(n)
    last = demos.last
    inside = start + horizon - 1 < last                  # the next chunk starts inside the episode
    success = demos.terminals[last].astype(bool)         # the episode ends in success at its last step
    eligible = np.flatnonzero(inside | success)
    chosen = np.sort(rng.choice(eligible, min(rows, len(eligible)), replace=False))
    index, valid = chunk_steps(chosen, last, horizon)
    ends = ~inside[chosen]
    terminals = (ends[:, None] & (index == last[chosen][:, None])).astype(np.float32)   # the success step on
    return {"start": chosen, "actions": demos.actions[index], "valid": valid.astype(np.float32),
            "rewards": (step_rewards[index] * valid).astype(np.float32), "terminals": terminals,
            "next_index": np.where(ends, -1, chosen + horizon)}


@dataclass
class QCLoop:
    """What vla_qc's online loop carries from one chunk to the next beyond the runner's counters, saved with
    every online checkpoint. A resume starts a fresh episode, so the open episode is not in it."""
    checkpoints_written: int = 0
    critic_updates_owed: int = 0
    bc_steps_owed: int = 0     # env steps towards the next BC step of the VLA (finetune != frozen)
    next_eval: int = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for field in fields(self):
            setattr(self, field.name, int(state[field.name]))


class VLAQCRunner(VLAFinetuneRunner):
    """VLARunner with the online phase of `online_algo=vla_qc`: one env of the fine-tuned task (frames and
    the instruction), a chunk per boundary, chunk transitions into a ChunkReplay, `utd` critic updates per
    env step. The switch knobs are the runner's: `warmup_steps` act with the VLA's own sample (no
    selection, no updates), `random_steps` with uniform chunks; evaluation covers every task of the suite,
    so the other tasks' success before and after is the forgetting measurement. Online checkpoints hold
    the chunk replay (with its frames when the VLA learns) and the loop's `QCLoop`."""

    chunk_replay: ChunkReplay | None = None   # the online phase's; built at its start or by a resume

    def _online_agent(self):
        self.loop = QCLoop()
        return agents.continue_from("vla_qc", self.offline_agent, self.cfg.online_agent, seed=self.cfg.seed)

    def _new_replay(self, frames: dict | None) -> ChunkReplay:
        cfg, agent = self.cfg, self.agent
        return ChunkReplay(max(1, min(cfg.replay_capacity, cfg.online_steps)), agent.obs_dim, agent.actor.text_dim,
                           agent.horizon, agent.act_dim, agent.cfg.num_samples, seed=cfg.seed + 1, frames=frames)

    def _replay_state(self) -> dict[str, np.ndarray]:
        return self.chunk_replay.state_dict() if self.chunk_replay is not None else super()._replay_state()

    def _load_replay(self, ckpt: Checkpoint) -> None:
        if self.phase != "online":
            return super()._load_replay(ckpt)
        saved, keys = ckpt.replay, [image_key(camera) for camera in self.agent.actor.cameras]
        try:   # the frames' shapes are the saved ones: load_state_dict checks the rest
            replay = self._new_replay({k: saved[f"frames/{k}"].shape[1:] for k in keys} if self.agent.learns else None)
            replay.load_state_dict(saved)
        except (KeyError, ValueError, TypeError) as err:
            raise CheckpointError(f"checkpoint {ckpt.path / 'replay_online.npz'} does not hold this run's chunk "
                                  f"replay ({type(err).__name__}: {first_line(err)}); {fallback(ckpt.path)}") from None
        self.chunk_replay = replay

    def loop_state(self) -> dict | None:
        return self.loop.state_dict() if getattr(self, "loop", None) is not None else None

    def load_loop_state(self, state: dict | None) -> None:
        if state is not None:
            self.loop.load_state_dict(state)

    def _chunk_source(self, choice: dict) -> np.ndarray:
        """The executed chunk at this boundary: per `action_source`, the VLA's own first sample (warmup),
        uniform noise (random steps) or the argmax-Q candidate."""
        source = self.action_source(self.online_step)
        if source == "pretrained":
            return choice["candidates"][0, 0]
        if source == "random":
            return self.rng.uniform(-1.0, 1.0, choice["chunk"].shape[1:]).astype(np.float32)
        return choice["chunk"][0]

    def _bc_batch(self, replay: ChunkReplay, batch_size: int) -> dict:
        """QC's behaviour-policy batch: uniform over the union of the pretraining demos (every task of the suite)
        and the online steps, so the online share is online steps / (online steps + demo steps)."""
        share = self.online_step / (self.online_step + len(self.dataset))
        n_online = min(int(self.rng.binomial(batch_size, share)), batch_size) if len(replay) else 0
        parts = [replay.sample_inputs(n_online)] if n_online else []
        if n_online < batch_size:
            parts.append(self.dataset.sample_chunks(batch_size - n_online, self.agent.actor.chunk))
        return {k: [x for part in parts for x in part[k]] if k == TASK_KEY else np.concatenate([part[k] for part in parts])
                for k in parts[0]}

    def _pretrain_critic(self) -> None:
        """QC's offline critic training, at the switch: `critic_pretrain_steps` updates of the same backup on
        `demo_chunks` of every task's demos, with the reward the online phase uses (success: the demos'
        succeeding steps), their targets' candidates drawn once by the VLA at the next chunk's state."""
        cfg, agent, qcfg = self.cfg, self.agent, self.agent.cfg
        demos, vla = self.dataset, self.agent.actor
        if demos is None or getattr(demos, "terminals", None) is None:
            raise ConfigError("algo.online_agent.critic_pretrain_steps > 0 trains the critic on the suite's demos: "
                              "run with dataset=task (not pretrained= alone)")
        started = time.time()
        step_rewards = (demos.terminals.astype(np.float32) if qcfg.reward == "success"
                        else np.asarray(self.rewards(demos.rewards), np.float32))
        rows = demo_chunks(demos, agent.horizon, step_rewards, qcfg.critic_pretrain_rows,
                           np.random.default_rng(cfg.seed + 3))
        count, n = len(rows["start"]), qcfg.num_samples
        replay = ChunkReplay(count, agent.obs_dim, vla.text_dim, agent.horizon, agent.act_dim, n, seed=cfg.seed + 5)
        generator = torch.Generator(device=agent.device).manual_seed(cfg.seed + 13)
        for block in tqdm(np.array_split(np.arange(count), max(1, count // 64)), desc="critic pretraining: candidates",
                          disable=not self.progress, dynamic_ncols=True):
            start, after = rows["start"][block], rows["next_index"][block]
            text = vla.embed_text([demos.instructions[i] for i in start]).cpu().numpy()
            candidates = np.zeros((len(block), n, agent.horizon, agent.act_dim), np.float32)
            live = after >= 0
            if live.any():
                at = after[live]
                obs = {STATE_KEY: demos.states[at], TASK_KEY: [demos.instructions[i] for i in at],
                       **{image_key(c): demos.images[c][at] for c in vla.cameras}}
                candidates[live] = agent.candidates(obs, generator)[0].cpu().numpy()
            for k, row in enumerate(block):
                replay.add(observations=demos.states[start[k]], text=text[k], actions=rows["actions"][row],
                           rewards=rows["rewards"][row], valid=rows["valid"][row], terminals=rows["terminals"][row],
                           next_observations=demos.states[max(after[k], 0)], next_text=text[k],
                           next_candidates=candidates[k])
        window = [agent.update(replay.sample(cfg.online_batch_size))
                  for _ in tqdm(range(qcfg.critic_pretrain_steps), desc="critic pretraining", disable=not self.progress,
                                dynamic_ncols=True)]
        metrics = {f"critic_pretrain/{k.split('/', 1)[1]}": v for k, v in mean_metrics(window[-100:]).items()}
        self.logger.log({**metrics, "critic_pretrain/rows": float(count),
                         "critic_pretrain/successes": float(rows["terminals"][:, -1].sum()),
                         "critic_pretrain/seconds": time.time() - started, "total_step": self.offline_step},
                        step=0, phase="online", kind="train")

    def _run_online(self) -> None:
        cfg, agent = self.cfg, self.agent
        h, n, learns = agent.horizon, agent.cfg.num_samples, agent.learns
        loop, resumed = self.loop, self.online_step > 0
        if not resumed:
            loop.next_eval = cfg.eval_every_online
            loop.checkpoints_written = self.offline_step // cfg.checkpoint_every if cfg.checkpoint_every > 0 else 0
        if agent.cfg.critic_pretrain_steps > 0 and cfg.online_steps > 0 and not resumed:
            self._pretrain_critic()
        if learns and self.dataset is None:
            raise ConfigError(f"algo.online_agent.finetune={agent.cfg.finetune} trains the VLA on the pretraining demos "
                              "too: run with the suite's dataset (dataset=task), not pretrained= alone")
        env = sims.make(cfg.env, **self._env_kwargs(self.finetune_task))
        obs, _ = env.reset(seed=cfg.seed + 7 + self.online_step)   # a resume starts a fresh episode
        frame_keys = [image_key(camera) for camera in agent.actor.cameras] if learns else []
        if self.chunk_replay is None:
            self.chunk_replay = self._new_replay({k: obs[k].shape for k in frame_keys} if learns else None)
        replay = self.chunk_replay
        generator = torch.Generator(device=agent.device).manual_seed(cfg.seed + 11 + self.online_step)
        bc_batch, bc_window = agent.cfg.bc_batch_size or cfg.online_batch_size, []
        episode_step, limit = 0, getattr(env.spec, "max_episode_steps", None) or float("inf")
        # no eval at online step 0: with an untrained critic best-of-N picks a uniformly random sample, the
        # VLA's own distribution, which the end-of-pretraining eval already measured on the same start states
        bar = tqdm(total=cfg.online_steps, initial=self.online_step, desc=f"online vla_qc task {self.finetune_task}",
                   disable=not self.progress, dynamic_ncols=True)
        pending, episode_return = None, 0.0
        window, acting = [], []   # critic-update metrics; acting diagnostics per chunk
        while self.online_step < cfg.online_steps:
            choice = agent.select(stack_observations([obs]), generator)
            if pending is not None:  # the last chunk's transition bootstraps from this state's candidates
                replay.add(**pending, next_candidates=choice["candidates"][0])
                pending = None
            self._maybe_checkpoint_crossing(self.offline_step + self.online_step)   # every chunk so far is in replay
            chunk, text, state = self._chunk_source(choice), choice["text"][0], obs[STATE_KEY].copy()
            inputs = {"frames": {k: obs[k].copy() for k in frame_keys}, "instruction": obs[TASK_KEY]} if learns else {}
            spread = np.linalg.norm(choice["candidates"][0] - choice["candidates"][0].mean(0), axis=-1).mean()
            drift = np.linalg.norm(chunk - choice["candidates"][0].mean(0), axis=-1).mean()
            rewards, valid, terminals = np.zeros(h, np.float32), np.zeros(h, np.float32), np.zeros(h, np.float32)
            terminated = truncated = False
            for i in range(h):
                if i < h - 1 and episode_step + 1 < limit:
                    sims.skip_next_frames(env)   # mid-chunk frames are never read: rendering is most of a step
                obs, reward, terminated, truncated, info = env.step(chunk[i])
                episode_step += 1
                episode_return += float(reward)
                rewards[i] = float(info["success"]) if agent.cfg.reward == "success" else float(self.rewards(reward))
                valid[i], terminals[i:] = 1.0, float(terminated)
                self.online_step += 1
                bar.update(1)
                if self.online_step > self.learning_start():
                    loop.critic_updates_owed += cfg.utd
                    loop.bc_steps_owed += int(learns)
                if terminated or truncated or self.online_step >= cfg.online_steps:
                    break
            row = dict(observations=state, text=text, actions=chunk, rewards=rewards, valid=valid, terminals=terminals,
                       next_observations=obs[STATE_KEY], next_text=text, **inputs)
            if terminated:  # no bootstrap past a true terminal: the candidates are never read
                replay.add(**row, next_candidates=np.zeros((n, h, agent.act_dim), np.float32))
            elif truncated:  # a time limit: bootstrap from the final state's own candidates
                replay.add(**row, next_candidates=agent.candidates(stack_observations([obs]), generator)[0][0].cpu().numpy())
            else:
                pending = row
            acting.append((drift, spread))
            if terminated or truncated:
                self.episodes_done += 1
                self.logger.log({"online/episode_return": episode_return, "online/success": float(info.get("success", 0)),
                                 "total_step": self.offline_step + self.online_step},
                                step=self.online_step, phase="online", kind="train")
                obs, _ = env.reset(seed=cfg.seed + 7 + self.online_step)
                episode_return, episode_step = 0.0, 0
            if loop.critic_updates_owed and len(replay):
                window += [agent.update(replay.sample(cfg.online_batch_size)) for _ in range(loop.critic_updates_owed)]
                loop.critic_updates_owed = 0
            if loop.bc_steps_owed >= agent.cfg.bc_every and len(replay):
                steps, loop.bc_steps_owed = divmod(loop.bc_steps_owed, agent.cfg.bc_every)
                bc_window += [agent.bc_update(self._bc_batch(replay, bc_batch)) for _ in range(steps)]
            if self.online_step // cfg.log_every > (self.online_step - h) // cfg.log_every and acting:
                # action distance: the executed chunk from the mean of the VLA's samples at that state (the
                # pretrained policy's mean action), against the samples' own spread around it
                drift_mean, spread_mean = np.mean(acting, 0)
                learned = {}
                if learns and len(replay):   # how far the VLA itself moved, on online states
                    learned = {**(mean_metrics(bc_window) if bc_window else {}),
                               "finetune/vla_distance": agent.vla_distance(replay.sample_inputs(min(len(replay), 32)))}
                self.logger.log({**(mean_metrics(window) if window else {}), **learned,
                                 "finetune/action_distance": drift_mean, "finetune/candidate_spread": spread_mean,
                                 "total_step": self.offline_step + self.online_step},
                                step=self.online_step, phase="online", kind="train")
                window, acting, bc_window = [], [], []
            if self.online_step >= loop.next_eval or self.online_step >= cfg.online_steps:
                record = self.evaluate(self.online_step, self.offline_step + self.online_step)
                bar.set_postfix(success=f"{record['eval/success']:.2f}")
                loop.next_eval += cfg.eval_every_online
        bar.close()
        env.close()
        if agent.cfg.finetune == "lora":
            merge_adapters(agent.actor)   # <run>/policy saves as a plain VLA
        if cfg.online_steps == 0:   # a pretraining-only run: its summary reads one online-phase eval
            self.evaluate(0, self.offline_step)
