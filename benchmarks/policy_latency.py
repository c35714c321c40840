"""Per-chunk inference latency at batch 1: diffusion (DDPM-100, DDIM-10, DDIM-5) against flow (10 Euler
steps, the one-step head), same process, same chunk length, same thread count.

    python benchmarks/policy_latency.py                 # ~1 minute, 1 thread
    python benchmarks/policy_latency.py --threads 2 --quick
    python benchmarks/policy_latency.py --compile       # + DDIM-10 with the denoiser under torch.compile

Chunk length 16 (Diffusion Policy: obs horizon 2, prediction horizon 16), obs 28 / act 5 (cube-single
sizes). Each configuration runs interleaved in rounds (order rotates every round) so a shared machine's
load hits every contender alike; the table gives medians over all calls and the goals use medians.
It also times the reference diffusers `.step()` loop for DDIM-10 against the precomputed loop, and a
bare `scheduler.step` call, to show where the Python overhead was. The machine's load average is
recorded, since other processes share the CPU.

Goals: one-step flow >= 20x faster than DDPM-100 (same denoiser family, equal chunk length);
a DDIM-10 chunk of 16 actions under 10 ms.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.diffusion import DiffusionPolicy  # noqa: E402
from policies.flow import FlowPolicy  # noqa: E402

OBS, ACT, TO, H = 28, 5, 2, 16


# name -> (denoiser, kwargs): the default U-Net (64, 128 channels), the CPU-sized one of the bc_diffusion
# preset (32, 64), and the MLP (3 x 512)
DENOISERS = {"unet": ("unet", {}), "unet-small": ("unet", {"channels": (32, 64)}), "mlp": ("mlp", {})}


def contenders(name: str, compiled: bool = False, device: str = "cpu") -> dict:
    torch.manual_seed(0)
    denoiser, kwargs = DENOISERS[name]
    shape = dict(obs_horizon=TO, pred_horizon=H, execute_horizon=8, denoiser=denoiser, denoiser_kwargs=kwargs)
    diffusion = DiffusionPolicy(OBS, ACT, **shape).eval().to(device)
    flow = FlowPolicy(OBS, ACT, **shape).eval().to(device)
    denoiser = name

    def diff(sampler, steps, reference=False):
        def run(obs):
            diffusion.set_sampler(sampler, steps)
            diffusion.use_diffusers_step = reference
            return diffusion.act(obs, deterministic=False)
        return run

    def fl(sampler, steps):
        def run(obs):
            flow.set_sampler(sampler, steps)
            return flow.act(obs, deterministic=False)
        return run

    extra = {}
    if compiled:  # the same weights with the denoiser under torch.compile (inductor), DDIM-10
        torch.manual_seed(0)
        fast = DiffusionPolicy(OBS, ACT, **shape).eval().to(device)
        fast.load_state_dict(diffusion.state_dict())
        fast.net.compile()
        fast.set_sampler("ddim", 10)
        extra[f"{denoiser}/diffusion DDIM-10 (compiled denoiser)"] = lambda obs: fast.act(obs, deterministic=False)
    return extra | {f"{denoiser}/diffusion DDPM-100": diff("ddpm", 100), f"{denoiser}/diffusion DDIM-10": diff("ddim", 10),
            f"{denoiser}/diffusion DDIM-5": diff("ddim", 5), f"{denoiser}/flow Euler-10": fl("euler", 10),
            f"{denoiser}/flow one-step": fl("onestep", 1),
            f"{denoiser}/diffusion DDIM-10 (diffusers .step loop)": diff("ddim", 10, reference=True)}


def time_calls(fn, obs, calls: int) -> list[tuple[float, float]]:
    """(wall ms, this thread's CPU ms) per call. With 1 torch thread all compute runs on this thread,
    so CPU time is what the call costs without the other processes' preemption; wall time includes it."""
    out = []
    for _ in range(calls):
        start, cpu = time.perf_counter(), time.thread_time()
        fn(obs)
        out.append(((time.perf_counter() - start) * 1e3, (time.thread_time() - cpu) * 1e3))
    return out


def bare_step_ms(calls: int = 300) -> float:
    """One diffusers DDIMScheduler.step on a [1, 16, 5] sample: the per-step Python cost it adds."""
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2", clip_sample=True)
    scheduler.set_timesteps(10)
    x, eps, t = torch.randn(1, H, ACT), torch.randn(1, H, ACT), scheduler.timesteps[3]
    for _ in range(20):
        scheduler.step(eps, t, x)
    start = time.perf_counter()
    for _ in range(calls):
        scheduler.step(eps, t, x)
    return (time.perf_counter() - start) * 1e3 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, few calls")
    parser.add_argument("--denoisers", default="unet,unet-small,mlp", help=f"comma list of {', '.join(DENOISERS)}")
    parser.add_argument("--compile", action="store_true", help="also time DDIM-10 with the denoiser under torch.compile")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="goals on thread CPU time (robust to other processes on a shared machine) or wall time")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]; on CUDA the goals use wall time (each call "
                                                        "ends with the actions back on the host)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for the JSON result")
    args = parser.parse_args()
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            parser.error(f"--device={args.device}: torch sees no CUDA device; use --device cpu")
        args.clock = "wall"
    unknown = [d for d in args.denoisers.split(",") if d not in DENOISERS]
    if unknown:
        parser.error(f"--denoisers: unknown {', '.join(unknown)}; valid: {', '.join(DENOISERS)}")
    if args.threads < 1:
        parser.error(f"--threads={args.threads} must be >= 1")
    torch.set_num_threads(args.threads)
    rounds = 1 if args.quick else args.rounds
    obs = np.random.default_rng(0).normal(size=(TO, OBS)).astype(np.float32)[None]  # [1, To, obs]: batch 1
    load_before = os.getloadavg()
    runs = {}
    for denoiser in args.denoisers.split(","):
        runs.update(contenders(denoiser, args.compile, args.device))
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    names = list(runs)
    with torch.inference_mode():
        for name in names:  # warm-up
            time_calls(runs[name], obs, 2)
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                calls = 2 if "DDPM-100" in name else 10
                samples[name] += time_calls(runs[name], obs, 1 if args.quick else calls)
    step_ms = bare_step_ms(30 if args.quick else 300)
    load_after = os.getloadavg()
    wall = {name: statistics.median(w for w, _ in v) for name, v in samples.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in samples.items()}
    med = cpu if args.clock == "cpu" else wall

    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else f"{args.threads} thread(s)"
    print(f"\nper-chunk latency, batch 1, chunk {H} x {ACT} (obs horizon {TO}), {where}, "
          f"load avg {load_before[0]:.2f} -> {load_after[0]:.2f}")
    print("| policy / sampler | median ms (thread CPU) | median ms (wall) | p90 ms (wall) | calls |")
    print("|---|---|---|---|---|")
    for name in names:
        v = sorted(w for w, _ in samples[name])
        print(f"| {name} | {cpu[name]:.2f} | {wall[name]:.2f} | {v[int(0.9 * (len(v) - 1))]:.2f} | {len(v)} |")
    print(f"goals below use the {args.clock} clock")
    print(f"bare diffusers DDIMScheduler.step: {step_ms:.3f} ms per call")
    goals = {}
    for denoiser in args.denoisers.split(","):
        speedup = med[f"{denoiser}/diffusion DDPM-100"] / med[f"{denoiser}/flow one-step"]
        ddim10 = med[f"{denoiser}/diffusion DDIM-10"]
        overhead = med[f"{denoiser}/diffusion DDIM-10 (diffusers .step loop)"] / ddim10
        compiled = med.get(f"{denoiser}/diffusion DDIM-10 (compiled denoiser)")
        if compiled is not None:
            print(f"{denoiser}: DDIM-10 with the denoiser compiled {compiled:.2f} ms ({ddim10 / compiled:.2f}x eager)")
        goals[denoiser] = {"ddim10_compiled_ms": compiled, "onestep_speedup_vs_ddpm100": speedup, "onestep_goal_20x": speedup >= 20,
                           "ddim10_ms": ddim10, "ddim10_goal_under_10ms": ddim10 < 10.0,
                           "diffusers_step_loop_over_precomputed": overhead}
        print(f"{denoiser}: one-step flow is {speedup:.0f}x faster than DDPM-100 (goal >= 20x: "
              f"{'met' if speedup >= 20 else 'MISSED'}); DDIM-10 {ddim10:.2f} ms (goal < 10 ms: "
              f"{'met' if ddim10 < 10 else 'MISSED'}); the diffusers .step loop costs {overhead:.2f}x the precomputed loop")
    result = {"threads": args.threads, "rounds": rounds, "chunk": [H, ACT], "obs_dim": OBS, "obs_horizon": TO,
              "load_avg_before": load_before, "load_avg_after": load_after, "cpu_count": os.cpu_count(),
              "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
              "clock": args.clock, "median_ms": med, "median_wall_ms": wall, "median_cpu_ms": cpu,
              "samples_wall_cpu_ms": samples, "bare_ddim_step_ms": step_ms, "goals": goals,
              "quick": args.quick, "device": where}
    tag = "cuda" if args.device.startswith("cuda") else f"{args.threads}thr"
    out = Path(args.out) / f"policy_latency-{tag}-{args.clock}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    if not args.quick:
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
