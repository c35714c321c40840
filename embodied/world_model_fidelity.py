"""How far a learned world model is from MuJoCo (issue 17, item 4): small diagnostics on real rollouts.

    segs = real_segments("hopper", expert, num_segments=64, horizon=20, seed=123, noise_std=0.1)
    open_loop_error(model, segs)            # state error vs horizon (ensemble mean, open loop)
    reward_accuracy(model, segs)            # one-step reward MAE / correlation
    classifier_accuracy(clf, segs.states[:, 1:], segs.success)   # sparse tasks
    penalty_rank_correlation(model, segs, penalty="max_std")     # does u(s, a) rank the true error?

`model` is anything with `predict(obs [B, D], act [B, A]) -> (means [K, B, D], stds [K, B, D] | None,
rewards [K, B] | None)`, as `embodied.world_model_env.StateEnsembleModel`: the diagnostics only call
`predict`, so hand-made models (an oracle, a "nothing changes" baseline) go through the same code.
Everything runs on CPU under `torch.no_grad()`; arrays come back as numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from embodied.data.generate import state_of
from embodied.errors import ConfigError
from embodied.stats import bootstrap_means
from embodied.world_model_env import uncertainty


# -- real rollouts ------------------------------------------------------------------------------------

@dataclass
class Segments:
    """N real windows of H consecutive steps, each wholly inside one episode.

    states[:, 0] is the start state and states[:, t + 1] the state after actions[:, t]; rewards and
    success are per step (success[:, t] is info["success"] after step t, None when the task has no
    success flag). An episode may end (terminate or time out) only on a window's last step.
    """

    states: np.ndarray  # [N, H + 1, D] float32
    actions: np.ndarray  # [N, H, A] float32
    rewards: np.ndarray  # [N, H] float32
    success: np.ndarray | None  # [N, H] bool
    episode: np.ndarray  # [N] int: which real episode each window came from
    start_step: np.ndarray  # [N] int: the window's first step in its episode
    info: dict = field(default_factory=dict)

    @property
    def num_segments(self) -> int:
        return int(self.actions.shape[0])

    @property
    def horizon(self) -> int:
        return int(self.actions.shape[1])

    def transitions(self):
        """Every real (s, a, r, s') of every window, flattened: the one-step diagnostics use these."""
        D, A = self.states.shape[-1], self.actions.shape[-1]
        return (self.states[:, :-1].reshape(-1, D), self.actions.reshape(-1, A), self.rewards.reshape(-1),
                self.states[:, 1:].reshape(-1, D))


def real_segments(env_name: str, policy, num_segments: int, horizon: int, seed: int, *,
                  noise_std: float = 0.0, max_episodes: int = 1000) -> Segments:
    """Roll `policy` (state -> action; None: uniform random) in the real `sims` env and cut each episode
    into back-to-back windows of `horizon` steps, so that the model is judged on the states the policy
    really visits. Windows that an episode end would cut are *skipped* (no mask): a model rollout past
    a real termination has nothing to be compared with. Gaussian `noise_std` is added to the policy's
    action and clipped to [-1, 1] (as `embodied.data.generate.collect` does), which spreads the windows
    beyond the policy's own path. The windows of an episode are aligned so that the last one ends on the
    episode's last step (its first `len % horizon` steps are dropped instead): the steps into a success
    or a fall, which the model and a success classifier most need to get right, are always covered.
    Deterministic given `seed`.
    """
    import sims

    if num_segments < 1 or horizon < 1:
        raise ConfigError(f"num_segments={num_segments}, horizon={horizon}: each must be >= 1")
    env = sims.make(env_name, seed=seed)
    rng = np.random.default_rng(seed)
    low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
    act_dim = int(np.prod(env.action_space.shape))
    reset_policy = getattr(policy, "reset", None)
    out = {k: [] for k in ("states", "actions", "rewards", "success", "episode", "start_step")}
    has_success, episodes, steps = False, 0, 0
    try:
        while len(out["states"]) < num_segments:
            if episodes >= max_episodes:
                raise ConfigError(f"{env_name}: {episodes} episodes gave only {len(out['states'])} windows of "
                                  f"{horizon} steps; lower horizon or num_segments")
            if callable(reset_policy):
                reset_policy()
            obs, _ = env.reset(seed=seed if episodes == 0 else None)
            states, actions, rewards, success = [state_of(obs)], [], [], []
            done = False
            while not done:
                if policy is None:
                    a = rng.uniform(low, high).astype(np.float32)
                else:
                    a = np.asarray(policy(states[-1]), np.float32).reshape(-1)[:act_dim]
                    if noise_std > 0:
                        a = a + rng.normal(0.0, noise_std, act_dim).astype(np.float32)
                    a = np.clip(a, low, high)
                obs, r, terminated, truncated, info = env.step(a)
                has_success |= "success" in info
                states.append(state_of(obs)); actions.append(a); rewards.append(float(r))
                success.append(bool(info.get("success", False)))
                done = bool(terminated or truncated)
            steps += len(actions)
            offset = len(actions) % horizon  # the last window ends on the episode's last step
            for start in range(offset, len(actions) - horizon + 1, horizon):
                if len(out["states"]) == num_segments:
                    break
                out["states"].append(np.stack(states[start:start + horizon + 1]))
                out["actions"].append(np.stack(actions[start:start + horizon]))
                out["rewards"].append(np.asarray(rewards[start:start + horizon], np.float32))
                out["success"].append(np.asarray(success[start:start + horizon], bool))
                out["episode"].append(episodes); out["start_step"].append(start)
            episodes += 1
    finally:
        env.close()
    return Segments(states=np.stack(out["states"]).astype(np.float32), actions=np.stack(out["actions"]),
                    rewards=np.stack(out["rewards"]), success=np.stack(out["success"]) if has_success else None,
                    episode=np.asarray(out["episode"]), start_step=np.asarray(out["start_step"]),
                    info={"env": env_name, "seed": int(seed), "noise_std": float(noise_std),
                          "episodes": episodes, "env_steps": steps})


# -- statistics ---------------------------------------------------------------------------------------

def rank(x) -> np.ndarray:
    """Ranks 0..n-1 with ties given their average rank (what Spearman's rho needs; scipy's rankdata
    minus 1), in numpy so that scipy is not a dependency."""
    x = np.asarray(x, np.float64).reshape(-1)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def pearson(x, y) -> float:
    """Pearson correlation; nan when either side is constant (a correlation is then undefined)."""
    x, y = np.asarray(x, np.float64).reshape(-1), np.asarray(y, np.float64).reshape(-1)
    if len(x) != len(y):
        raise ConfigError(f"pearson: {len(x)} vs {len(y)} values")
    x, y = x - x.mean(), y - y.mean()
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denom) if denom > 0 else float("nan")


def spearman(x, y) -> float:
    """Spearman's rho: the Pearson correlation of the ranks, so only the ordering counts (a penalty
    need only be monotone in the error, not proportional to it)."""
    return pearson(rank(x), rank(y))


def _interval(values: np.ndarray, seed: int = 0, resamples: int = 1000) -> dict[str, np.ndarray]:
    """Per column of values [N, T]: mean, a bootstrap 95% interval of that mean over the N rows, and the
    2.5/97.5 percentiles of the rows themselves (the spread of single segments)."""
    values = np.asarray(values, np.float64)
    means = bootstrap_means(values, resamples, seed)  # [resamples, T]
    return {"mean": values.mean(0), "ci95_low": np.percentile(means, 2.5, axis=0),
            "ci95_high": np.percentile(means, 97.5, axis=0),
            "p2_5": np.percentile(values, 2.5, axis=0), "p97_5": np.percentile(values, 97.5, axis=0)}


# -- diagnostics ------------------------------------------------------------------------------------

def _predict(model, s: np.ndarray | torch.Tensor, a: np.ndarray | torch.Tensor):
    with torch.no_grad():
        return model.predict(torch.as_tensor(s, dtype=torch.float32), torch.as_tensor(a, dtype=torch.float32))


def _state_std(model, state_std, dim: int) -> np.ndarray:
    """The dataset's per-dimension state std: given, or the input normaliser a fitted
    StateEnsembleModel keeps (its first `dim` entries are the observations' std)."""
    if state_std is None:
        in_std = getattr(model, "in_std", None)
        if in_std is None:
            raise ConfigError("open_loop_error needs state_std (the dataset's per-dimension std) for a model "
                              "without an `in_std` normaliser")
        state_std = in_std[:dim]
    std = np.asarray(torch.as_tensor(state_std).detach().cpu(), np.float64).reshape(-1)
    if std.shape != (dim,):
        raise ConfigError(f"state_std has shape {std.shape}, the states have dim {dim}")
    return np.maximum(std, 1e-6)


def open_loop_error(model, segments: Segments, *, member: int | None = None, state_std=None,
                    seed: int = 0) -> dict:
    """Start at each window's real start state and feed the real actions open loop, each predicted state
    back into the model: the error at step h is what h imagined steps cost. The prediction is the mean
    of the members' means (member=None: deterministic, the ensemble's best guess, no sampling noise) or
    one fixed member's mean (member=k). Per horizon step h = 0..H (h = 0 is the real start, error 0):
    `l2` = ||s_hat - s||_2 and `normalised` = RMS over dimensions of (s_hat - s) / std_d, std_d the
    dataset's per-dimension std (1.0 = off by one dataset std in every dimension on average), each as the
    mean over windows, a bootstrap 95% interval of that mean, and the 2.5/97.5 percentiles of windows."""
    states = segments.states.astype(np.float64)
    N, H1, D = states.shape
    std = _state_std(model, state_std, D)
    s = torch.as_tensor(segments.states[:, 0], dtype=torch.float32)
    pred = [s.numpy().astype(np.float64)]
    for t in range(H1 - 1):
        means, _, _ = _predict(model, s, segments.actions[:, t])
        s = means.mean(0) if member is None else means[member]
        pred.append(s.detach().cpu().numpy().astype(np.float64))
    diff = np.stack(pred, 1) - states  # [N, H + 1, D]
    l2 = np.linalg.norm(diff, axis=-1)
    normalised = np.sqrt(((diff / std) ** 2).mean(-1))
    return {"horizon": np.arange(H1), "member": "mean" if member is None else int(member), "num_segments": N,
            "l2": _interval(l2, seed), "normalised": _interval(normalised, seed),
            "finite": bool(np.isfinite(diff).all())}


def reward_accuracy(model, segments: Segments) -> dict:
    """One step from every real (s, a): the model's reward (mean over members) against the real reward,
    so reward errors are measured apart from state drift. MAE, Pearson correlation (nan when the real
    rewards are constant), and the arrays for a scatter plot."""
    s, a, r, _ = segments.transitions()
    _, _, rewards = _predict(model, s, a)
    if rewards is None:
        raise ConfigError("reward_accuracy: this model predicts no reward")
    pred = rewards.mean(0).detach().cpu().numpy().astype(np.float64)
    r = r.astype(np.float64)
    return {"mae": float(np.abs(pred - r).mean()), "pearson": pearson(pred, r), "real_mean": float(r.mean()),
            "real_std": float(r.std()), "n": int(len(r)), "predicted": pred, "real": r}


def classifier_accuracy(classifier, states, success, threshold: float = 0.5) -> dict:
    """A sparse task's success classifier on real states and real success labels: accuracy alone
    says little when successes are rare (always "no" scores ~1), hence precision and recall of the
    success class and balanced accuracy (mean of the two class recalls). Precision/recall are nan
    when nothing is predicted/labelled a success; balanced accuracy is nan unless both classes occur."""
    states = np.asarray(states, np.float32).reshape(-1, np.shape(states)[-1])
    y = np.asarray(success, bool).reshape(-1)
    if len(y) != len(states):
        raise ConfigError(f"classifier_accuracy: {len(states)} states but {len(y)} labels")
    with torch.no_grad():
        p = classifier.probability(torch.as_tensor(states)).detach().cpu().numpy().reshape(-1)
    pred = p > threshold
    tp, fp = int((pred & y).sum()), int((pred & ~y).sum())
    fn, tn = int((~pred & y).sum()), int((~pred & ~y).sum())
    recall = tp / (tp + fn) if tp + fn else float("nan")
    specificity = tn / (tn + fp) if tn + fp else float("nan")
    return {"accuracy": (tp + tn) / len(y), "precision": tp / (tp + fp) if tp + fp else float("nan"),
            "recall": recall, "balanced_accuracy": (recall + specificity) / 2,
            "threshold": float(threshold), "tp": tp, "fp": fp, "fn": fn, "tn": tn, "positives": int(y.sum()),
            "n": int(len(y))}


def penalty_rank_correlation(model, segments: Segments, penalty: str = "max_std") -> dict:
    """Does the env's uncertainty penalty point at the model's real mistakes? For every real (s, a):
    u(s, a) against the true one-step error ||mean_k mean_k(s, a) - s'||_2. The penalty only needs to
    order transitions right to steer a policy away from bad regions, so the headline is Spearman's rho
    (1: the penalty ranks errors perfectly, 0: unrelated); Pearson is given too, with the arrays."""
    s, a, _, s_next = segments.transitions()
    means, stds, _ = _predict(model, s, a)
    u = uncertainty(means, stds, penalty).detach().cpu().numpy().astype(np.float64)
    err = np.linalg.norm(means.mean(0).detach().cpu().numpy().astype(np.float64) - s_next, axis=-1)
    return {"penalty": penalty, "spearman": spearman(u, err), "pearson": pearson(u, err), "n": int(len(err)),
            "uncertainty": u, "error": err, "error_mean": float(err.mean()), "uncertainty_mean": float(u.mean())}
