"""Chunk executors: turn action chunks `[H, A]` into one action per control step.

Shared by the online training loop (`sims.wrappers.ChunkedActionWrapper`) and the robot deploy loop.
A chunk is computed from the observation taken at control step `obs_step`; the action for control
step `step` is row `step - obs_step` of it. So inference delay is counted in actions consumed: a
chunk that arrives while the robot is at step `obs_step + d` starts at row `d`, and a chunk whose
rows are all in the past is dropped (`push` returns False).

    ex = executors.make("open_loop", execute_horizon=8)
    for step in count():
        if ex.wants_chunk(step):            # call once per control step; True counts as a request
            ex.push(policy.act(obs), step)  # or later, from an async inference thread
        action = ex.next_action(step)       # None: nothing to execute (hold position)

Three strategies (DESIGN.md §4, real-robot conventions):
- `OpenLoopExecutor(k)`: run the first k actions of each chunk, then switch to the next chunk
  (Diffusion Policy's execution horizon, Q-chunking's open-loop chunk). A late chunk keeps serving
  its remaining rows until a newer one arrives.
- `TemporalEnsembleExecutor(weight)`: ACT's temporal ensembling; a new chunk every step, and the
  action for step t averages every chunk that covers t with weights exp(-weight * i), i = 0 the
  oldest chunk.
- `BlendingExecutor(blend_steps)`: when a new chunk arrives, cross-fade linearly from the old
  chunk's actions into the new chunk's over `blend_steps` steps (no jump at the chunk boundary).
"""
from __future__ import annotations

from collections import deque
from typing import Protocol, runtime_checkable

import numpy as np

from embodied.errors import ConfigError, UserError


@runtime_checkable
class ChunkExecutor(Protocol):
    def reset(self) -> None: ...

    def push(self, chunk: np.ndarray, obs_step: int) -> bool: ...

    def next_action(self, step: int) -> np.ndarray | None: ...

    def wants_chunk(self, step: int) -> bool: ...

    @property
    def last_delay_steps(self) -> int: ...


def _as_chunk(chunk) -> np.ndarray:
    chunk = np.asarray(chunk, dtype=np.float32)
    if chunk.ndim == 1:  # a single-step policy's action: a chunk of one
        chunk = chunk[None]
    if chunk.ndim != 2 or chunk.shape[0] < 1:
        raise UserError(f"chunk has shape {chunk.shape}; pass an [H, A] array (H >= 1 actions)")
    return chunk


class _Base:
    """Bookkeeping every executor shares: request cadence, stale-chunk dropping, delay measurement."""

    def __init__(self, request_every: int):
        if int(request_every) < 1:
            raise ConfigError(f"request interval {request_every} must be >= 1 control step")
        self.request_every = int(request_every)
        self.reset()

    def reset(self) -> None:
        self._chunks: deque[tuple[int, np.ndarray]] = deque()  # (obs_step, chunk), oldest first
        self._next_request = 0          # first step at which wants_chunk says yes
        self._served_until = -1         # the last step an action was returned for
        self._newest_used = True        # has the newest chunk produced an action yet
        self._last_delay = 0
        self.dropped = 0                # chunks rejected as too late or out of order

    @property
    def last_delay_steps(self) -> int:
        return self._last_delay

    def will_want_chunk(self, step: int) -> bool:
        """What `wants_chunk(step)` would answer, without counting it as a request."""
        return step >= self._next_request

    def wants_chunk(self, step: int) -> bool:
        if step >= self._next_request:
            self._next_request = step + self.request_every
            return True
        return False

    def push(self, chunk, obs_step: int) -> bool:
        chunk, obs_step = _as_chunk(chunk), int(obs_step)
        newest = self._chunks[-1][0] if self._chunks else None
        too_late = obs_step + len(chunk) - 1 <= self._served_until
        if too_late or (newest is not None and obs_step < newest):
            self.dropped += 1
            return False
        if newest == obs_step:  # a recomputed chunk for the same observation replaces the old one
            self._chunks.pop()
        self._chunks.append((obs_step, chunk))
        self._newest_used = False
        self._next_request = max(self._next_request, obs_step + self.request_every)
        self._trim()
        return True

    def _trim(self) -> None:
        """Forget chunks that cannot contribute to any future step."""
        ...

    def _covering(self, step: int) -> list[tuple[int, np.ndarray]]:
        return [(s, c) for s, c in self._chunks if s <= step < s + len(c)]

    def _note_use(self, step: int) -> None:
        self._served_until = max(self._served_until, step)
        if not self._newest_used and self._chunks and self._chunks[-1][0] <= step:
            self._last_delay = step - self._chunks[-1][0]
            self._newest_used = True


class OpenLoopExecutor(_Base):
    """Execute the first `execute_horizon` actions of each chunk open-loop."""

    def __init__(self, execute_horizon: int):
        super().__init__(execute_horizon)
        self.execute_horizon = int(execute_horizon)

    def _trim(self) -> None:
        while len(self._chunks) > 1:
            self._chunks.popleft()  # the newest chunk always wins

    def next_action(self, step: int) -> np.ndarray | None:
        if not self._chunks:
            return None
        obs_step, chunk = self._chunks[-1]
        index = step - obs_step
        if index < 0 or index >= len(chunk):
            return None
        self._note_use(step)
        return chunk[index].copy()


class TemporalEnsembleExecutor(_Base):
    """ACT temporal ensembling: average every chunk covering the step, weight exp(-weight * i), i=0 oldest."""

    def __init__(self, weight: float = 0.01, query_every: int = 1):
        super().__init__(query_every)
        self.weight = float(weight)

    def _trim(self) -> None:
        while self._chunks and self._chunks[0][0] + len(self._chunks[0][1]) - 1 <= self._served_until:
            self._chunks.popleft()

    def next_action(self, step: int) -> np.ndarray | None:
        covering = self._covering(step)
        if not covering:
            return None
        actions = np.stack([c[step - s] for s, c in covering])
        weights = np.exp(-self.weight * np.arange(len(covering)))
        self._note_use(step)
        self._trim()
        return (weights[:, None] * actions).sum(0).astype(np.float32) / weights.sum().astype(np.float32)


class BlendingExecutor(_Base):
    """Cross-fade from the previous chunk into the new one over `blend_steps` steps, then run it open-loop."""

    def __init__(self, blend_steps: int, execute_horizon: int = 8):
        super().__init__(execute_horizon)
        if int(blend_steps) < 0:
            raise ConfigError(f"blend_steps={blend_steps} must be >= 0")
        self.blend_steps, self.execute_horizon = int(blend_steps), int(execute_horizon)

    def reset(self) -> None:
        super().reset()
        self._blend_start: int | None = None  # the step the newest chunk was first used

    def push(self, chunk, obs_step: int) -> bool:
        accepted = super().push(chunk, obs_step)
        if accepted:
            self._blend_start = None
        return accepted

    def _trim(self) -> None:
        while len(self._chunks) > 2:
            self._chunks.popleft()  # the chunk being faded out and the new one

    def next_action(self, step: int) -> np.ndarray | None:
        if not self._chunks:
            return None
        new_step, new = self._chunks[-1]
        new_action = new[step - new_step] if new_step <= step < new_step + len(new) else None
        old_action = None
        if len(self._chunks) == 2:
            old_step, old = self._chunks[0]
            old_action = old[step - old_step] if old_step <= step < old_step + len(old) else None
        if new_action is None:
            action = old_action
        else:
            if self._blend_start is None:
                self._blend_start = step
            done = step - self._blend_start + 1  # 1..blend_steps while fading
            if old_action is None or done > self.blend_steps:
                action = new_action
            else:
                alpha = done / (self.blend_steps + 1)
                action = (1.0 - alpha) * old_action + alpha * new_action
        if action is None:
            return None
        self._note_use(step)
        return np.asarray(action, np.float32).copy()


_EXECUTORS = {"open_loop": OpenLoopExecutor, "temporal_ensemble": TemporalEnsembleExecutor, "blend": BlendingExecutor}


def names() -> list[str]:
    return sorted(_EXECUTORS)


def make(name: str, **kwargs) -> ChunkExecutor:
    if name not in _EXECUTORS:
        raise UserError(f"executor {name!r} is unknown; valid: {', '.join(names())}")
    try:
        return _EXECUTORS[name](**kwargs)
    except TypeError as err:
        raise ConfigError(f"executor {name}: bad options {sorted(kwargs)} ({err})") from None
