"""Q-chunking (Li, Zhou, Levine 2025): reinforcement learning over action chunks.

The critic scores a whole chunk of h actions, Q(s_t, a_{t:t+h}), and is trained with the unbiased
h-step backup

    target = sum_{i<h} gamma^i r_{t+i} + gamma^h Q'(s_{t+h}, a'_{t+h:t+2h})

masked by the replay's `valid` (a chunk that hits an episode end sums the rewards it got and
bootstraps from where it really ended: gamma^{sum valid}, and not at all after a true terminal). The
policy acts with a chunk, executed open-loop, so exploration is temporally coherent and the backup
needs no off-policy correction. Two ways to extract a policy from the BC flow policy (trained on the
same chunks):

- "best_of_n" (QC): sample N = 32 chunks from the flow policy, keep the argmax of Q; also for targets.
- "distill" (QC-FQL): FQL's one-step policy over chunks (behaviour-regularised by distillation).

The learner is FQL's (fql.py) with `horizon` actions per chunk; this file holds Q-chunking's defaults
(the registry builds `FQL` with `QCConfig`).
"""
from __future__ import annotations

from dataclasses import dataclass

from embodied.agents.fql import FQLConfig


@dataclass
class QCConfig(FQLConfig):
    horizon: int = 5
    extraction: str = "best_of_n"
    num_samples: int = 32
