"""Imagined transitions/s in `embodied.world_model_env.WorldModelEnv` (batch 256) against real
`sims.make(<env>)` steps/s, same process, one thread (issue 17, item 2; goal >= 20x).

    python benchmarks/world_model_throughput.py                 # pointmaze-umaze, a few seconds each side
    python benchmarks/world_model_throughput.py --env cube-single   # the sim DiWA's imagination replaces
    python benchmarks/world_model_throughput.py --real-steps 500 --imagined-steps 20   # smoke run

pointmaze-umaze is the cheapest sim here (a point mass), so its ratio is the hardest to beat; the ratio that
matters for a fine-tune is the one against the sim the model stands in for (`--env`).

Real side: one env, random actions, reset at episode end, `env.step` timed. Times are CPU time of this
process by default (`--clock wall` for wall clock): both sides run on one thread, and the machine may be
shared, so CPU time is what each side costs. The two sides run in alternating rounds (`--rounds`) and the
ratio is the median of the per-round ratios.
Imagined side: a `StateEnsembleModel` at two sizes, 5 members x 3 hidden layers of 200 (MOPO-sized, one
layer fewer) and 5 x 2 x 128, a `SuccessClassifier` on sparse tasks (fitted for 200 steps so its
terminations are plausible; dense tasks use the model's reward and termination heads), the max-std
penalty, horizon 10, start states from the real rollout just recorded; `env.step` on [256, 2] random actions timed, reset steps included (they count as
transitions even though NEXT_STEP resets emit no model step: at horizon 10 that is 1 step in 11, so the
figure is also given without them). The dynamics models are untrained: their speed does not depend on the weights.
Writes benchmarks/results/world_model_throughput-<time>.json with the CPU and the load average.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from machine import cpu_info, uptime  # noqa: E402
from embodied.errors import exit_on_user_error  # noqa: E402


CLOCK = {"cpu": time.process_time, "wall": time.perf_counter}
clock = time.process_time


def bench_real(env_name: str, steps: int, seed: int = 0):
    import sims
    from embodied.constants import STATE_KEY
    from embodied.data.dataset import Dataset

    env = sims.make(env_name, seed=seed)
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1, 1, size=(steps, env.action_space.shape[0])).astype(np.float32)
    obs, _ = env.reset(seed=seed)
    rows = {"observations": [], "actions": [], "rewards": [], "next_observations": [], "terminals": [], "timeouts": []}
    elapsed = 0.0
    for a in actions:
        t0 = clock()
        nxt, r, term, trunc, _ = env.step(a)
        elapsed += clock() - t0
        for key, value in zip(rows, (obs[STATE_KEY], a, r, nxt[STATE_KEY], term, trunc)):
            rows[key].append(value)
        obs = env.reset()[0] if (term or trunc) else nxt
    rows["timeouts"][-1] = True
    ds = Dataset(**{k: np.asarray(v, np.float32 if k not in ("terminals", "timeouts") else bool)
                    for k, v in rows.items()})
    env.close()
    return steps / elapsed, ds


SIZES = {"mopo_5x200x3": (5, 200, 3), "small_5x128x2": (5, 128, 2)}  # members, hidden, hidden layers


def bench_imagined(ds, batch: int, steps: int, size: tuple[int, int, int], classifier, seed: int = 0) -> dict:
    import torch

    from embodied.world_model_env import StateEnsembleModel, WorldModelEnv

    torch.set_num_threads(1)
    members, hidden, layers = size
    model = StateEnsembleModel(ds.obs_dim, ds.act_dim, num_members=members, hidden=hidden, layers=layers, seed=seed)
    env = WorldModelEnv(model, ds, num_envs=batch, horizon=10, penalty_weight=1.0, classifier=classifier, seed=seed)
    env.reset(seed=seed)
    actions = np.random.default_rng(seed).uniform(-1, 1, size=(steps, batch, ds.act_dim)).astype(np.float32)
    for a in actions[: min(3, steps)]:  # warm-up
        env.step(a)
    live = 0
    t0 = clock()
    for a in actions:
        live += int((~env._needs_reset).sum())
        env.step(a)
    elapsed = clock() - t0
    return {"transitions_per_s": batch * steps / elapsed, "model_transitions_per_s": live / elapsed,
            "step_ms": 1e3 * elapsed / steps}


@exit_on_user_error   # a bad --env is one line naming the registered sims
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="pointmaze-umaze", help="any state task of sims (hopper, cube-single, ...)")
    p.add_argument("--real-steps", type=int, default=5000)
    p.add_argument("--imagined-steps", type=int, default=200, help="vector steps of the batch")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clock", choices=sorted(CLOCK), default="cpu")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args(argv)
    global clock
    clock = CLOCK[args.clock]
    import statistics

    import torch

    import sims
    from embodied.world_model_env import SuccessClassifier
    torch.set_num_threads(1)
    sparse = sims.spec(args.env).sparse   # raises with the registered names on a typo
    load_before = uptime()
    reals, rounds = [], {name: [] for name in SIZES}
    classifier = None
    for _ in range(args.rounds):
        real, ds = bench_real(args.env, args.real_steps)
        reals.append(real)
        if sparse and classifier is None:
            classifier = SuccessClassifier(ds.obs_dim)
            classifier.fit(ds, steps=200)  # briefly, so that its terminations are not those of random weights
        for name, size in SIZES.items():
            out = bench_imagined(ds, args.batch, args.imagined_steps, size, classifier)
            out["ratio"] = out["transitions_per_s"] / real
            out["ratio_model_steps_only"] = out["model_transitions_per_s"] / real
            rounds[name].append(out)
    real = statistics.median(reals)
    imagined = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} | {"rounds": rs}
                for name, rs in rounds.items()}
    result = {
        "env": args.env, "success_classifier": sparse,
        "clock": args.clock, "rounds": args.rounds, "real_steps_per_s_rounds": reals,
        "real_steps_per_s": real, "real_steps": args.real_steps,
        "imagined_batch": args.batch, "imagined_vector_steps": args.imagined_steps, "imagined": imagined,
        "goal_ratio": 20.0, "threads": 1, "cpu": cpu_info(), "uptime_before": load_before, "uptime_after": uptime(),
        "python": platform.python_version(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"world_model_throughput-{args.env}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.clock} clock, median of {args.rounds} rounds")
    print(f"real {args.env}: {real:,.0f} steps/s")
    for name, v in imagined.items():
        print(f"imagined {name} (batch {args.batch}): {v['transitions_per_s']:,.0f} transitions/s "
              f"({v['model_transitions_per_s']:,.0f} excluding reset steps), {v['step_ms']:.2f} ms/step; "
              f"ratio (median of rounds) {v['ratio']:.1f}x (model steps only {v['ratio_model_steps_only']:.1f}x), goal >= 20x")
    print(f"cpu: {result['cpu']}  load: {result['uptime_after']}")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
