"""Simulation speed of the manipulation tasks: our wrapped env against the bare OGBench env it wraps
and against raw `mujoco.mj_step` on the same model, plus rendering and oracle data generation.

Same process, state-only, one thread. The three contenders run interleaved in short rounds (same
random actions, episodes reset at the same 200-step limit); the table gives each one's median over
rounds and the overhead goal uses the median of per-round ratios, because a shared machine is noisy.
Times are CPU time of this process by default (`--clock wall` for wall clock): MuJoCo runs on one
thread, so CPU time is what the env costs, whatever else the machine is doing.

    python benchmarks/sim_speed.py            # ~2-3 minutes
    python benchmarks/sim_speed.py --quick    # seconds: a smoke run of every part

Contenders (cube-single, OGBench's default task 2):
    raw mj_step   mujoco.mj_step(model, data, nstep=25) on our env's compiled model: the physics bound
    ogbench bare  gymnasium.make("cube-single-singletask-v0"): what OGBench users step
    ours          sims.make("cube-single"): dict observations, sub-goal truths, success, reward
Goal: ours costs <= 10% more time per step than the bare OGBench env.
Also: rendered frames/s at 64x64 and 128x128 (our shadow- and reflection-free frames, and OGBench's
default render for reference), and oracle data generation in transitions/s (task and play quality).
Results go to benchmarks/results/sim_speed-<clock>-<time>.json.
"""
from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PHYSICS_STEPS_PER_CONTROL = 25  # OGBench: control 0.05 s / physics 0.002 s
GOAL_OVERHEAD = 0.10


def _clock(kind: str):
    return time.process_time if kind == "cpu" else time.perf_counter


def _stepper(env, actions, get_state):
    """A closure that steps `env` through `actions`, resetting at episode end; returns steps done."""
    cursor = {"i": 0}

    def run(n: int) -> int:
        for _ in range(n):
            a = actions[cursor["i"] % len(actions)]
            cursor["i"] += 1
            out = env.step(a)
            get_state(out[0])
            if out[2] or out[3]:
                env.reset()
        return n

    return run


def bench_steps(rounds: int, steps: int, clock_kind: str) -> dict:
    import gymnasium
    import mujoco
    import ogbench.manipspace  # noqa: F401  (registers OGBench's ids)

    import sims

    clock = _clock(clock_kind)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, size=(4096, 5)).astype(np.float32)
    ours = sims.make("cube-single", seed=0)
    bare = gymnasium.make("cube-single-singletask-v0")
    bare.reset(seed=0)
    model = ours.unwrapped._model
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)

    def raw(n: int) -> int:
        for k in range(n):
            data.ctrl[:] = 0.0
            mujoco.mj_step(model, data, nstep=PHYSICS_STEPS_PER_CONTROL)
        return n

    contenders = {
        "raw_mj_step": raw,
        "ogbench_bare": _stepper(bare, actions, lambda ob: ob),
        "ours": _stepper(ours, actions, lambda ob: ob["observation.state"]),
    }
    for fn in contenders.values():  # warm up caches and lazy allocations
        fn(50)
    per_round = {k: [] for k in contenders}
    order = list(contenders)
    for r in range(rounds):
        for name in order[r % 3:] + order[: r % 3]:  # rotate who goes first
            start = clock()
            contenders[name](steps)
            per_round[name].append(steps / max(clock() - start, 1e-9))
    ratios = [b / o for b, o in zip(per_round["ogbench_bare"], per_round["ours"])]
    bound = [m / b for m, b in zip(per_round["ogbench_bare"], per_round["raw_mj_step"])]
    ours.close()
    bare.close()
    return {
        "steps_per_second": {k: statistics.median(v) for k, v in per_round.items()},
        "per_round": per_round,
        "overhead_vs_bare": statistics.median(ratios) - 1.0,  # time per step: ours / bare - 1
        "bare_fraction_of_physics_bound": statistics.median(bound),
    }


def bench_render(frames: int, clock_kind: str) -> dict:
    import mujoco

    import sims

    clock = _clock(clock_kind)  # llvmpipe (software GL) renders on this process's threads: CPU time counts it
    out = {}
    for size in (64, 128):
        env = sims.make("cube-single", seed=0, images=("front",), image_size=size)
        env.reset(seed=0)
        renderer = env.get_wrapper_attr("_renderer")
        data = env.unwrapped._data
        for _ in range(10):
            renderer.update_scene(data, camera="front")
            renderer.render()
        start = clock()
        for _ in range(frames):
            renderer.update_scene(data, camera="front")
            renderer.render()
        render_fps = frames / (clock() - start)
        actions = np.random.default_rng(0).uniform(-1, 1, (frames, 5)).astype(np.float32)
        start = clock()
        for a in actions:
            if any(env.step(a)[2:4]):
                env.reset()
        step_fps = frames / (clock() - start)
        env.close()
        # OGBench's own render path at the same size, shadows and reflections as shipped
        ref = sims.make("cube-single", seed=0)
        model = ref.unwrapped._model
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, size)
        model.vis.global_.offheight = max(model.vis.global_.offheight, size)
        default = mujoco.Renderer(model, height=size, width=size)
        for _ in range(5):
            default.update_scene(ref.unwrapped._data, camera="front")
            default.render()
        n_default = max(frames // 4, 10)
        start = clock()
        for _ in range(n_default):
            default.update_scene(ref.unwrapped._data, camera="front")
            default.render()
        default_fps = n_default / (clock() - start)
        default.close()
        ref.close()
        out[f"{size}x{size}"] = {"render_fps": render_fps, "env_steps_with_image_per_s": step_fps,
                                 "ogbench_default_render_fps": default_fps}
    out["backend"] = os.environ.get("MUJOCO_GL")
    return out


def bench_oracle(size: int) -> dict:
    from embodied.data import ogbench_gen

    out = {}
    for quality in ("task", "play"):
        start = time.perf_counter()
        ds, _ = ogbench_gen.generate(ogbench_gen.GenSpec("cube-single", quality, size=size, seed=0), progress=False)
        seconds = time.perf_counter() - start
        out[quality] = {"transitions": len(ds), "transitions_per_second_wall": len(ds) / seconds,
                        "success_rate": ds.metadata["success_rate"], "episodes": ds.metadata["episodes"]}
    return out


def bench_task_success(episodes: int, suites=("cube-single", "cube-double", "scene", "puzzle-3x3"),
                       task_ids=None) -> dict:
    """Success of the task expert (OGBench's Markov oracles + our sub-goal sequencing, with the
    "task" quality's action noise) on every evaluation task of every suite, as in the task datasets."""
    import sims
    from embodied.data.ogbench_gen import GenSpec, TaskOracle, markov_noise
    from sims.manip import SUITES

    out = {}
    for name in suites:
        suite = SUITES[name]
        spec = GenSpec(name, "task").resolved()
        for task_id in task_ids or range(1, suite.num_tasks + 1):
            env = sims.make(name, task_id=task_id)
            oracle = TaskOracle(env, suite.kind, spec)
            rng = np.random.default_rng(task_id)
            wins, lengths, steps, start = 0, [], 0, time.perf_counter()
            for ep in range(episodes):
                obs, info = env.reset(seed=1000 * task_id + ep)
                oracle.reset()
                xi = rng.uniform(0, spec.noise)
                done, t = False, 0
                while not done:
                    action = np.clip(oracle(obs["observation.state"], info) + markov_noise(rng, xi), -1, 1)
                    obs, _, terminated, truncated, info = env.step(action.astype(np.float32))
                    done, t = terminated or truncated, t + 1
                wins += bool(terminated)
                lengths.append(t)
                steps += t
            env.close()
            out[f"{name}/task{task_id}"] = {"success_rate": wins / episodes, "episodes": episodes,
                                            "mean_length": float(np.mean(lengths)),
                                            "transitions_per_second_wall": steps / (time.perf_counter() - start)}
            print(f"  {name} task {task_id}: {wins}/{episodes} solved, mean length {np.mean(lengths):.0f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1000, help="env steps per contender per round")
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--oracle-size", type=int, default=3000)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--success-episodes", type=int, default=10, help="oracle episodes per evaluation task")
    parser.add_argument("--only", choices=("all", "speed", "success"), default="all")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.frames, args.oracle_size = 2, 60, 10, 100
    import torch

    torch.set_num_threads(1)
    if args.quick:
        args.success_episodes = 1
    success = None
    if args.only in ("all", "success"):
        print("oracle success on every evaluation task:")
        success = (bench_task_success(1, ("cube-single",), task_ids=(2,)) if args.quick else
                   bench_task_success(args.success_episodes))
    if args.only == "success":
        _write(args, {"args": vars(args), "task_success": success}, "oracle_success")
        _print_success(success)
        return
    steps = bench_steps(args.rounds, args.steps, args.clock)
    render = bench_render(args.frames, args.clock)
    oracle = bench_oracle(args.oracle_size)
    sps = steps["steps_per_second"]
    print(f"\ncube-single, state-only, {args.clock} clock, median of {args.rounds} rounds x {args.steps} steps")
    print("| contender | env steps/s | vs bare OGBench |")
    print("|---|---|---|")
    for name in ("raw_mj_step", "ogbench_bare", "ours"):
        print(f"| {name} | {sps[name]:,.0f} | {sps[name] / sps['ogbench_bare']:.2f}x |")
    ok = steps["overhead_vs_bare"] <= GOAL_OVERHEAD
    print(f"our overhead over the bare env: {100 * steps['overhead_vs_bare']:+.1f}% per step "
          f"(goal <= {100 * GOAL_OVERHEAD:.0f}%): {'met' if ok else 'NOT met'}; the bare env runs at "
          f"{100 * steps['bare_fraction_of_physics_bound']:.0f}% of the raw mj_step bound")
    print("\n| frames | our render fps | env steps/s with image obs | OGBench default render fps |")
    print("|---|---|---|---|")
    for size in ("64x64", "128x128"):
        r = render[size]
        print(f"| {size} | {r['render_fps']:,.0f} | {r['env_steps_with_image_per_s']:,.0f} | "
              f"{r['ogbench_default_render_fps']:,.0f} |")
    print("\n| oracle data | transitions/s (wall) | episodes | success |")
    print("|---|---|---|---|")
    for quality, r in oracle.items():
        print(f"| {quality} | {r['transitions_per_second_wall']:,.0f} | {r['episodes']} | {r['success_rate']:.2f} |")
    if success:
        _print_success(success)
    result = {"args": vars(args), "steps": steps, "render": render, "oracle": oracle, "task_success": success,
              "goal_overhead": GOAL_OVERHEAD, "goal_met": ok}
    _write(args, result, "sim_speed")


def _print_success(success: dict) -> None:
    print("\n| task | oracle success | episodes | mean length |")
    print("|---|---|---|---|")
    for key, r in success.items():
        print(f"| {key} | {r['success_rate']:.2f} | {r['episodes']} | {r['mean_length']:.0f} |")


def _write(args, result: dict, stem: str) -> None:
    if args.quick:  # a smoke run never writes results
        return
    result.update(python=platform.python_version(), machine=platform.machine(), cpu_count=os.cpu_count(),
                  load_avg=os.getloadavg(), time=time.strftime("%Y%m%d-%H%M%S"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}-{args.clock}-{'quick-' if args.quick else ''}{result['time']}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
