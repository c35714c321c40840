"""How faithful is the learned world model to MuJoCo? (issue 17, item 4; `embodied.world_model_fidelity`)

    python benchmarks/world_model_fidelity.py            # hopper + pointmaze-umaze, ~20k transitions each, minutes
    python benchmarks/world_model_fidelity.py --quick    # seconds: tiny data, a few fit steps (a smoke run)

Per task: a `StateEnsembleModel` (5 members x 3 hidden layers of 200, probabilistic, the WorldModelEnv
default) fitted on `load_dataset(task, "medium-replay", --size, seed=--dataset-seed)`, plus a
`SuccessClassifier` on sparse tasks (pointmaze). Real windows of `--horizon` steps come from the task's
medium expert with Gaussian action noise `--noise-std`, under `--segment-seed` (not the dataset's seeds),
windows cut by an episode end skipped. Diagnostics (see embodied/world_model_fidelity.py):
open-loop state error vs horizon (ensemble mean of means, real actions) next to the "nothing moves"
baseline s_hat_h = s_0; one-step reward MAE / correlation; the classifier's accuracy, precision, recall
and balanced accuracy on real next states; Spearman's rho between the env's penalty u(s, a) (both
"max_std" and "disagreement") and the true one-step error.
One thread (torch and BLAS). Writes benchmarks/results/world_model_fidelity-<time>.json (CPU model,
avx512_bf16 flag, threads, command, arguments, timings) and PNGs under
benchmarks/results/world_model_fidelity/ (a --quick run writes world_model_fidelity-quick-* instead).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from machine import cpu_info, uptime  # noqa: E402


class Persistence:
    """The "nothing moves" baseline: s' = s, one member, no std, no reward. An open-loop error below it
    is the least a useful model must reach."""

    def predict(self, obs, act):
        return obs[None].clone(), None, None


def jsonable(value):
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (np.floating, float)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def run_task(task: str, args) -> tuple[dict, dict]:
    """Fit, roll, diagnose one task. Returns (JSON-ready summary, arrays for the plots)."""

    import sims
    from embodied.data.catalog import load_dataset
    from embodied.world_model_env import StateEnsembleModel, SuccessClassifier
    from embodied.world_model_fidelity import (classifier_accuracy, open_loop_error, penalty_rank_correlation,
                                               real_segments, reward_accuracy)
    from sims.experts import expert

    spec = sims.spec(task)
    t0 = time.perf_counter()
    ds = load_dataset(task, args.quality, args.size, seed=args.dataset_seed, progress=False)
    t_data = time.perf_counter() - t0
    model = StateEnsembleModel(ds.obs_dim, ds.act_dim, num_members=args.members, hidden=args.hidden,
                               layers=args.layers, seed=args.model_seed)
    t0 = time.perf_counter()
    fit = model.fit(ds, steps=args.fit_steps, batch_size=args.batch_size, seed=args.model_seed)
    t_fit = time.perf_counter() - t0
    model.eval()
    classifier, clf_fit, t_clf = None, None, 0.0
    if spec.sparse:
        classifier = SuccessClassifier(ds.obs_dim, seed=args.model_seed)
        t0 = time.perf_counter()
        clf_fit = classifier.fit(ds, steps=args.classifier_steps, seed=args.model_seed)
        t_clf = time.perf_counter() - t0
        classifier.eval()
    t0 = time.perf_counter()
    policy = expert(task, args.expert_level, seed=args.segment_seed)
    segs = real_segments(task, policy, args.segments, args.horizon, args.segment_seed, noise_std=args.noise_std)
    t_segs = time.perf_counter() - t0

    t0 = time.perf_counter()
    ol = open_loop_error(model, segs)
    base = open_loop_error(Persistence(), segs, state_std=model.in_std[:ds.obs_dim])
    rew = reward_accuracy(model, segs)
    pens = {p: penalty_rank_correlation(model, segs, penalty=p) for p in ("max_std", "disagreement")}
    clf = None
    if classifier is not None and segs.success is not None:
        clf = classifier_accuracy(classifier, segs.states[:, 1:], segs.success)
    t_diag = time.perf_counter() - t0

    strip = ("predicted", "real", "uncertainty", "error")
    summary = {
        "task": task, "sparse": bool(spec.sparse),
        "dataset": {"quality": args.quality, "size": len(ds), "seed": args.dataset_seed,
                    "episodes": int(ds.metadata.get("episodes", ds.num_episodes)),
                    "terminals": int(np.asarray(ds.terminals).sum())},
        "model": {"members": args.members, "hidden": args.hidden, "layers": args.layers, "probabilistic": True,
                  "fit_steps": args.fit_steps, "batch_size": args.batch_size, "final_loss": fit["loss"]},
        "classifier": None if clf_fit is None else {"steps": args.classifier_steps, **clf_fit},
        "segments": {**segs.info, "num_segments": segs.num_segments, "horizon": segs.horizon,
                     "expert_level": args.expert_level, "cut_windows": "skipped",
                     "real_successes": None if segs.success is None else int(segs.success.sum())},
        "open_loop": ol, "open_loop_persistence_baseline": base,
        "reward": {k: v for k, v in rew.items() if k not in strip},
        "penalty_rank_correlation": {p: {k: v for k, v in d.items() if k not in strip} for p, d in pens.items()},
        "classifier_accuracy": clf,
        "seconds": {"dataset": t_data, "fit": t_fit, "fit_ms_per_step": 1e3 * t_fit / max(args.fit_steps, 1),
                    "classifier_fit": t_clf, "real_segments": t_segs, "diagnostics": t_diag},
    }
    return summary, {"open_loop": ol, "baseline": base, "reward": rew, "penalty": pens[args.penalty]}


def plot(results: dict, arrays: dict, outdir: Path, penalty: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    tasks = list(results)
    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(outdir / name, dpi=110)
        plt.close(fig)
        written.append(str(outdir / name))

    fig, axes = plt.subplots(2, len(tasks), figsize=(5 * len(tasks), 7), squeeze=False)
    for j, task in enumerate(tasks):
        for i, (key, label) in enumerate((("l2", "L2 state error"), ("normalised", "RMS error / dataset std"))):
            ax = axes[i, j]
            for name, res, color in (("model (ensemble mean)", arrays[task]["open_loop"], "C0"),
                                     ("persistence s_h = s_0", arrays[task]["baseline"], "C7")):
                h, st = res["horizon"], res[key]
                ax.plot(h, st["mean"], color=color, label=name)
                ax.fill_between(h, st["ci95_low"], st["ci95_high"], color=color, alpha=0.35)
                ax.fill_between(h, st["p2_5"], st["p97_5"], color=color, alpha=0.1)
            ax.set_xlabel("open-loop steps"); ax.set_ylabel(label); ax.set_title(task)
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=8, title="band: 95% CI of mean; light: 2.5-97.5%", title_fontsize=7)
    save(fig, "open_loop_error_vs_horizon.png")

    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4.5), squeeze=False)
    for j, task in enumerate(tasks):
        ax, rew = axes[0, j], arrays[task]["reward"]
        ax.scatter(rew["real"], rew["predicted"], s=4, alpha=0.4)
        lo = float(min(rew["real"].min(), rew["predicted"].min())); hi = float(max(rew["real"].max(), rew["predicted"].max()))
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xlabel("real reward"); ax.set_ylabel("predicted reward (one step, member mean)")
        ax.set_title(f"{task}: MAE {rew['mae']:.3g}, r {rew['pearson']:.3f}")
        ax.grid(alpha=0.3)
    save(fig, "reward_predicted_vs_real.png")

    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4.5), squeeze=False)
    for j, task in enumerate(tasks):
        ax, pen = axes[0, j], arrays[task]["penalty"]
        ax.scatter(pen["error"], pen["uncertainty"], s=4, alpha=0.4)
        ax.set_xscale("log"); ax.set_yscale("log")
        ax.set_xlabel("true one-step error ||mean prediction - s'||")
        ax.set_ylabel(f"penalty u(s, a) [{penalty}]")
        ax.set_title(f"{task}: Spearman rho = {pen['spearman']:.3f}")
        ax.grid(alpha=0.3)
    save(fig, "penalty_vs_true_error.png")
    return written


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="hopper,pointmaze-umaze")
    p.add_argument("--quality", default="medium-replay")
    p.add_argument("--size", type=int, default=20000, help="dataset transitions")
    p.add_argument("--dataset-seed", type=int, default=0)
    p.add_argument("--fit-steps", type=int, default=3000)
    p.add_argument("--classifier-steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=256, help="per member")
    p.add_argument("--members", type=int, default=5)
    p.add_argument("--hidden", type=int, default=200)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--model-seed", type=int, default=0)
    p.add_argument("--segments", type=int, default=200, help="real windows per task")
    p.add_argument("--horizon", type=int, default=25, help="steps per window")
    p.add_argument("--segment-seed", type=int, default=12345, help="real rollouts' seed (not the dataset's)")
    p.add_argument("--expert-level", default="medium")
    p.add_argument("--noise-std", type=float, default=0.1)
    p.add_argument("--penalty", choices=("max_std", "disagreement"), default="max_std", help="the one plotted")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="seconds: 3k transitions, 30 fit steps, 8 windows of 5")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.fit_steps, args.classifier_steps = 3000, 30, 30
        args.segments, args.horizon = 8, 5
    import torch
    torch.set_num_threads(args.threads)

    started = time.strftime("%Y%m%d-%H%M%S")
    load_before = uptime()
    results, arrays = {}, {}
    for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        results[task], arrays[task] = run_task(task, args)
        r = results[task]
        ol, base = r["open_loop"], r["open_loop_persistence_baseline"]
        print(f"{task}: fit {r['seconds']['fit']:.1f}s ({r['seconds']['fit_ms_per_step']:.1f} ms/step), "
              f"loss {r['model']['final_loss']:.3f}; {r['segments']['num_segments']} real windows of {args.horizon} "
              f"from {r['segments']['episodes']} episodes")
        for h in sorted({1, min(5, args.horizon), min(10, args.horizon), args.horizon}):
            print(f"  open-loop h={h:>2}: L2 {ol['l2']['mean'][h]:.3f} [{ol['l2']['ci95_low'][h]:.3f}, "
                  f"{ol['l2']['ci95_high'][h]:.3f}], normalised {ol['normalised']['mean'][h]:.3f} "
                  f"(persistence {base['normalised']['mean'][h]:.3f})")
        print(f"  reward: MAE {r['reward']['mae']:.4f}, pearson {r['reward']['pearson']}, "
              f"real mean {r['reward']['real_mean']:.3f} std {r['reward']['real_std']:.3f}")
        for name, d in r["penalty_rank_correlation"].items():
            print(f"  penalty {name}: spearman {d['spearman']:.3f}, pearson {d['pearson']:.3f} (n={d['n']})")
        if r["classifier_accuracy"]:
            c = r["classifier_accuracy"]
            print(f"  classifier: acc {c['accuracy']:.3f}, precision {c['precision']}, recall {c['recall']}, "
                  f"balanced {c['balanced_accuracy']:.3f} ({c['positives']} real successes of {c['n']})")

    tag = "world_model_fidelity-quick" if args.quick else "world_model_fidelity"
    plots = [] if args.no_plots else plot(results, arrays, args.out / tag, args.penalty)
    out = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]) if argv is None
        else " ".join(shlex.quote(a) for a in ["python", "benchmarks/world_model_fidelity.py", *argv]),
        "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "threads": torch.get_num_threads(), "cpu": cpu_info(), "uptime_before": load_before,
        "uptime_after": uptime(), "python": platform.python_version(), "torch": torch.__version__,
        "started": started, "plots": plots, "tasks": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{tag}-{started}.json"
    path.write_text(json.dumps(jsonable(out), indent=2) + "\n")
    print(f"cpu: {out['cpu']}  threads: {out['threads']}  load: {out['uptime_after']}")
    print(f"wrote {path}" + (f" and {len(plots)} plots in {args.out / tag}" if plots else ""))
    return out


if __name__ == "__main__":
    main()
