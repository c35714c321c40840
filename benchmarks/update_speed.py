"""Gradient updates per second: our SAC / CQL / Cal-QL against Stable-Baselines3 and d3rlpy.

Same process, same thread count, batch 256, 256x256 MLPs, Hopper sizes (obs 11, act 3). The
contenders run interleaved in short rounds (the order rotates each round); the table gives each
one's median over rounds and the goals use the median of per-round ratios, because a shared machine
is noisy. Ours sample each batch from a tensor pool, SB3 samples from its filled replay buffer,
d3rlpy converts a prepared numpy mini-batch every update.

    python benchmarks/update_speed.py                        # ~3-5 minutes, 2 threads, wall clock
    python benchmarks/update_speed.py --threads 1 --clock cpu  # robust to other processes' load
    python benchmarks/update_speed.py --quick    # seconds: a smoke run of every contender

Peers are optional: `pip install stable-baselines3` and `pip install --no-deps d3rlpy==2.8.1`
(+ its small deps: structlog colorama dataclasses-json gym gym-notices scikit-learn); a missing one
is skipped with a message. Results also go to benchmarks/results/update_speed-<threads>-<clock>-<time>.json.

Goals checked: ours fp32 >= 1.5x SB3 SAC, ours bf16 >= 2x SB3 SAC, our CQL bf16 >= 3x d3rlpy CQL, our CQL
fp32 >= 1.5x d3rlpy CQL and >= 0.8 of its matmul ceiling (the CQL update's matmuls timed alone), and
(SAC 10-critic cost / 2-critic cost) / (FLOP-predicted ratio) <= 1.15 (LayerNorm off).
"""
from __future__ import annotations

import os

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning. On a shared 2-core
# machine the default spin-then-sleep made 2-thread updates up to ~70x slower whenever another
# process held a core (threads spin-wait on a sibling that is not scheduled). Applies to every
# contender alike; override with OMP_WAIT_POLICY=ACTIVE.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_info  # noqa: E402

from embodied.agents.cql import CQL, CQLConfig  # noqa: E402
from embodied.agents.sac import SAC, SACConfig  # noqa: E402
from policies.mlp import matmul_wide  # noqa: E402

OBS, ACT, BATCH, HIDDEN, POOL = 11, 3, 256, (256, 256), 100_000


# -- analytic FLOPs (matmuls only: 2 * rows * fan_in * fan_out per layer) --------------------------
def _layers(in_dim: int, out_dim: int) -> list[tuple[int, int]]:
    dims = [in_dim, *HIDDEN, out_dim]
    return list(zip(dims[:-1], dims[1:]))


def _fwd(layers, rows: int) -> float:
    return sum(2.0 * rows * i * o for i, o in layers)


def _bwd(layers, rows: int, input_grad: bool, weight_grad: bool = True) -> float:
    """Backward = weight gradients (one matmul per layer) + activation gradients (one per layer,
    the first layer's only when its input needs a gradient)."""
    flops = _fwd(layers, rows) if weight_grad else 0.0
    return flops + _fwd(layers if input_grad else layers[1:], rows)


def update_flops(num_critics: int, cql_actions: int | None = None, batch: int = BATCH) -> float:
    """FLOPs of one SAC (cql_actions=None) or CQL update as our code runs it."""
    actor, critic = _layers(OBS, 2 * ACT), _layers(OBS + ACT, 1)
    n = num_critics
    if cql_actions is None:
        target = _fwd(actor, batch) + n * _fwd(critic, batch)
        critic_rows = batch
    else:  # one actor pass on [s; s'], target critic at s', critic at (1 + 3n) actions per state
        target = _fwd(actor, 2 * batch) + n * _fwd(critic, batch)
        critic_rows = (1 + 3 * cql_actions) * batch
    critic_step = n * (_fwd(critic, critic_rows) + _bwd(critic, critic_rows, input_grad=False))
    action_grad = 2.0 * batch * ACT * HIDDEN[0]  # dQ/da needs only the action's rows of the first layer
    actor_step = (_fwd(actor, batch) + n * _fwd(critic, batch) + n * (_bwd(critic, batch, False, weight_grad=False)
                                                                       + action_grad)
                  + _bwd(actor, batch, input_grad=False))
    return target + critic_step + actor_step


def sb3_sac_flops(batch: int = BATCH) -> float:
    """FLOPs of one Stable-Baselines3 SAC update: ours plus the critic weight gradients that its
    actor loss computes (SB3 does not freeze the critics there; they are zeroed before the next
    critic step) and the observation's rows of dQ/d[s, a]. Their ratio bounds how much faster ours
    can be while both are matmul-bound."""
    critic = _layers(OBS + ACT, 1)
    return update_flops(2, batch=batch) + 2 * _fwd(critic, batch) + 2 * 2.0 * batch * OBS * HIDDEN[0]


# -- contenders: each is a function that runs k updates -------------------------------------------
def matmul_floor(num_critics: int = 2, device: str = "cpu", cql_actions: int | None = None):
    """The matmuls of one of our SAC (or, with `cql_actions`, CQL) updates and nothing else: the shapes
    `update_flops` counts, in the orientation our fused MLP (`policies/mlp.py`) runs them, on preallocated
    tensors. Its rate is the ceiling for any implementation doing our arithmetic with these kernels on this
    core: ceiling / peer says how fast ours could be with zero non-matmul overhead."""
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device)
    ops = []

    def layer_ops(layers, rows, members, forward=False, weight_grad=False, input_grad=False, action_grad=False):
        for index, (fan_in, fan_out) in enumerate(layers):
            lead = (members,) if members else ()
            # critic ensembles hold [N, in, out]; the actor's nn.Linear weights are [out, in], used transposed
            w = rand(*lead, fan_in, fan_out) if members else rand(fan_out, fan_in).t()
            x, dy = rand(*lead, rows, fan_in), rand(*lead, rows, fan_out)
            if forward:
                ops.append(lambda x=x, w=w: matmul_wide(x, w))
            if weight_grad:
                ops.append(lambda x=x, dy=dy: matmul_wide(x.transpose(-1, -2), dy))
            if input_grad and index > 0:
                ops.append(lambda dy=dy, w=w: matmul_wide(dy, w.transpose(-1, -2)))
            if action_grad and index == 0:  # dQ/da: only the action's rows of the first layer
                ops.append(lambda dy=dy, w=w[..., OBS:, :]: matmul_wide(dy, w.transpose(-1, -2)))

    actor, critic, n = _layers(OBS, 2 * ACT), _layers(OBS + ACT, 1), num_critics
    critic_rows = BATCH if cql_actions is None else (1 + 3 * cql_actions) * BATCH
    layer_ops(actor, BATCH if cql_actions is None else 2 * BATCH, 0, forward=True)  # target: pi(s') (CQL: [s; s'])
    layer_ops(critic, BATCH, n, forward=True)                                      # target critics
    layer_ops(critic, critic_rows, n, forward=True, weight_grad=True, input_grad=True)  # critic step
    layer_ops(actor, BATCH, 0, forward=True)                                       # actor step: pi(s)
    layer_ops(critic, BATCH, n, forward=True)                                      # Q(s, pi(s))
    layer_ops(critic, BATCH, n, input_grad=True, action_grad=True)                 # dQ/da (critics frozen)
    layer_ops(actor, BATCH, 0, weight_grad=True, input_grad=True)                  # actor gradients

    def run(k: int) -> None:
        for _ in range(k):
            for op in ops:
                op()
    return run


def _pool(seed: int = 0, device: str = "cpu", obs_dim: int = OBS, act_dim: int = ACT) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pool = dict(observations=torch.randn(POOL, obs_dim, generator=g),
                actions=torch.rand(POOL, act_dim, generator=g) * 2 - 1,
                rewards=torch.randn(POOL, generator=g), next_observations=torch.randn(POOL, obs_dim, generator=g),
                terminals=(torch.rand(POOL, generator=g) < 0.01).float(), mc_returns=torch.randn(POOL, generator=g) * 10)
    return {key: value.to(device) for key, value in pool.items()}


def ours(agent, pool):
    device = next(iter(pool.values())).device

    def run(k: int) -> None:
        for _ in range(k):
            idx = torch.randint(POOL, (BATCH,), device=device)
            agent.update({key: value[idx] for key, value in pool.items()})
    return run


def sb3_sac(device: str = "cpu"):
    import gymnasium as gym
    from stable_baselines3 import SAC as SB3SAC
    from stable_baselines3.common.logger import Logger

    class Dummy(gym.Env):
        observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (ACT,), np.float32)

        def reset(self, seed=None, options=None):
            return np.zeros(OBS, np.float32), {}

        def step(self, action):
            return np.zeros(OBS, np.float32), 0.0, False, False, {}

    model = SB3SAC("MlpPolicy", Dummy(), buffer_size=POOL, batch_size=BATCH, learning_starts=0, device=device, seed=0,
                   policy_kwargs=dict(net_arch=[256, 256]))
    model.set_logger(Logger(folder=None, output_formats=[]))
    rb, rng = model.replay_buffer, np.random.default_rng(0)
    rb.observations[:] = rng.standard_normal(rb.observations.shape, np.float32)
    rb.next_observations[:] = rng.standard_normal(rb.next_observations.shape, np.float32)
    rb.actions[:] = rng.uniform(-1, 1, rb.actions.shape).astype(np.float32)
    rb.rewards[:] = rng.standard_normal(rb.rewards.shape, np.float32)
    rb.full = True
    return lambda k: model.train(gradient_steps=k, batch_size=BATCH)


def d3rlpy_algo(kind: str, device: str = "cpu"):
    import d3rlpy
    from d3rlpy.dataset import TransitionMiniBatch

    encoder = d3rlpy.models.VectorEncoderFactory(hidden_units=list(HIDDEN))
    common = dict(batch_size=BATCH, actor_encoder_factory=encoder, critic_encoder_factory=encoder)
    config = d3rlpy.algos.SACConfig(**common) if kind == "sac" else d3rlpy.algos.CQLConfig(**common)
    algo = config.create(device="cuda:0" if device.startswith("cuda") else "cpu:0")
    algo.create_impl((OBS,), ACT)
    rng = np.random.default_rng(0)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    batch = TransitionMiniBatch(observations=f32(BATCH, OBS), actions=np.tanh(f32(BATCH, ACT)), rewards=f32(BATCH, 1),
                                next_observations=f32(BATCH, OBS), next_actions=np.tanh(f32(BATCH, ACT)),
                                terminals=np.zeros((BATCH, 1), np.float32), intervals=np.ones((BATCH, 1), np.float32),
                                transitions=[])

    def run(k: int) -> None:
        for _ in range(k):
            algo.update(batch)
    return run


def build(quick: bool, compile_agent: bool = False, device: str = "cpu") -> tuple[dict, list[str]]:
    pool, contenders, skipped = _pool(device=device), {}, []
    sac = lambda critics, ln, bf16: SAC(OBS, ACT, SACConfig(hidden=HIDDEN, num_critics=critics, num_min=2,
                                                             critic_layernorm=ln, bf16=bf16), device=device, seed=0)
    for bf16, tag in ((False, "fp32"), (True, "bf16")):
        contenders[f"ours SAC 2 critics {tag}"] = ours(sac(2, False, bf16), pool)
        contenders[f"ours SAC 10 critics {tag}"] = ours(sac(10, False, bf16), pool)
        contenders[f"ours SAC 10 critics+LN {tag}"] = ours(sac(10, True, bf16), pool)
        for calql, name in ((False, "CQL"), (True, "Cal-QL")):
            cfg = CQLConfig(hidden=HIDDEN, num_critics=2, calql=calql, bf16=bf16)
            contenders[f"ours {name} {tag}"] = ours(CQL(OBS, ACT, cfg, device=device, seed=0), pool)
    contenders["matmuls only, SAC 2 critics fp32"] = matmul_floor(2, device)
    contenders["matmuls only, CQL 2 critics fp32"] = matmul_floor(2, device, cql_actions=10)
    if compile_agent:  # torch.compile of our two update steps (inductor), as a measured alternative
        agent = sac(2, False, False)
        agent.update_critic = torch.compile(agent.update_critic)
        agent.update_actor_and_alpha = torch.compile(agent.update_actor_and_alpha)
        try:
            ours(agent, pool)(2)  # compiles now, so a failure is reported here and not mid-measurement
            contenders["ours SAC 2 critics fp32 compiled"] = ours(agent, pool)
        except Exception as err:  # noqa: BLE001 - any compiler failure: report it and time the rest
            skipped.append("ours SAC 2 critics fp32 compiled")
            print(f"skipping the compiled contender: torch.compile failed ({type(err).__name__}: "
                  f"{str(err).splitlines()[0][:200]})", file=sys.stderr)
    for name, make, package in (("SB3 SAC", lambda: sb3_sac(device), "stable-baselines3"),
                                ("d3rlpy SAC", lambda: d3rlpy_algo("sac", device), "d3rlpy==2.8.1 (--no-deps)"),
                                ("d3rlpy CQL", lambda: d3rlpy_algo("cql", device), "d3rlpy==2.8.1 (--no-deps)")):
        try:
            contenders[name] = make()
        except ImportError as err:
            skipped.append(name)
            print(f"skipping {name}: {err.name or err} is not installed (pip install {package})", file=sys.stderr)
    return contenders, skipped


def native_ops(run, native: bool):
    """`run` with EnsembleMLP's torch-native LayerNorm and bmm head (True) or its faster equivalents (False)."""
    from embodied.agents.nets import EnsembleMLP

    def timed(k: int) -> None:
        EnsembleMLP.native_ops = native
        try:
            run(k)
        finally:
            EnsembleMLP.native_ops = False
    return timed


def build_layernorm_path(device: str = "cpu") -> dict:
    """CQL with LayerNorm critics, each with EnsembleMLP's CPU LayerNorm and multiply-and-sum Q head against
    torch's layer_norm and a one-column bmm: at Hopper sizes (WSRL's locomotion critic, 2 x 256) and with the
    main job's own agent config (2 x 64, obs 4, act 1, composed from `conf/experiment/default.yaml`)."""
    from embodied import agents
    from embodied.run_config import runner_config
    from embodied.train import compose_train

    rcfg = runner_config(compose_train(["bf16=false"]))
    main_obs, main_act = 4, 1  # InvertedPendulum-v5
    hopper_pool, main_pool = _pool(device=device), _pool(device=device, obs_dim=main_obs, act_dim=main_act)
    hopper = CQLConfig(hidden=HIDDEN, num_critics=2, critic_layernorm=True)
    contenders = {}
    for native, tag in ((False, "ours"), (True, "torch-native")):
        contenders[f"CQL+LN Hopper sizes, {tag}"] = native_ops(ours(CQL(OBS, ACT, hopper, device=device, seed=0),
                                                                    hopper_pool), native)
        main_agent = agents.make(rcfg.offline_algo, main_obs, main_act, rcfg.offline_agent, device, 0)
        contenders[f"main job CQL, {tag}"] = native_ops(ours(main_agent, main_pool), native)
    return contenders


def measure(contenders: dict, rounds: int, seconds: float, warmup: int, clock=time.perf_counter,
            sync=lambda: None) -> dict[str, list[float]]:
    """`sync` waits for queued device work (CUDA) before the clock is read."""
    for run in contenders.values():
        run(warmup)
    sync()
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order each round
            run, done, start = contenders[name], 0, clock()
            while True:
                chunk = 1 if done < 3 else max(1, done // 2)
                run(chunk)
                sync()
                done += chunk
                elapsed = clock() - start
                if elapsed >= seconds and done >= 3:
                    break
            rates[name].append(done / elapsed)
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: one short round, seconds in all")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.5, help="time per contender per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: elapsed time; cpu: this process's CPU time, which a loaded machine does not "
                             "inflate (meaningful with --threads 1)")
    parser.add_argument("--compile", action="store_true", help="also time our fp32 SAC update under torch.compile")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]: every contender runs there (wall clock on CUDA)")
    parser.add_argument("--layernorm-path", action="store_true",
                        help="only time LayerNorm-critic CQL (Hopper sizes and the main job's) with our CPU LayerNorm "
                             "and Q head against torch's layer_norm and bmm head")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error(f"--device={args.device}: torch sees no CUDA device; use --device cpu")
    if cuda:
        args.clock = "wall"
    if args.threads < 1 or args.rounds < 1 or args.seconds <= 0:
        parser.error("--threads and --rounds must be >= 1 and --seconds > 0")
    if args.quick:
        args.rounds, args.seconds = 1, 0.05
    torch.set_num_threads(args.threads)
    if args.layernorm_path:
        return layernorm_path(args)
    contenders, skipped = build(args.quick, args.compile, args.device)
    torch.set_num_threads(args.threads)  # peers' constructors must not change it
    rates, median, where, load_before = measure_all(contenders, args)

    print(f"\nupdates per {args.clock}-clock second, batch {BATCH}, {HIDDEN} MLPs, obs {OBS}, act {ACT}, {where}, "
          f"median of {args.rounds} interleaved rounds, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"load avg {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'contender':32s} {'median':>8s} {'best':>8s} {'worst':>8s}")
    for name, values in rates.items():
        print(f"{name:32s} {median[name]:8.1f} {max(values):8.1f} {min(values):8.1f}")

    predicted = update_flops(10) / update_flops(2)
    goals = []

    def ratio(a: str, b: str) -> float:
        """Median over rounds of the per-round ratio: each round's pair ran minutes apart at most, so
        slow drifts of the machine's load cancel better than in a ratio of medians."""
        return statistics.median(x / y for x, y in zip(rates[a], rates[b]))

    def goal(label, value, target, higher=True):
        ok = value >= target if higher else value <= target
        goals.append(dict(goal=label, value=round(value, 3), target=target, met=bool(ok)))
        print(f"  {label:52s} {value:6.2f}  (goal {'>=' if higher else '<='} {target})  {'MET' if ok else 'NOT MET'}")

    print("\ngoals")
    if "SB3 SAC" in median:
        goal("ours SAC 2 critics fp32 / SB3 SAC", ratio("ours SAC 2 critics fp32", "SB3 SAC"), 1.5)
        goal("ours SAC 2 critics bf16 / SB3 SAC", ratio("ours SAC 2 critics bf16", "SB3 SAC"), 2.0)
        floor = ratio("matmuls only, SAC 2 critics fp32", "SB3 SAC")
        overhead = 1 - ratio("matmuls only, SAC 2 critics fp32", "ours SAC 2 critics fp32") ** -1
        print(f"  (ceiling: our matmuls alone / SB3 SAC = {floor:.2f}x; non-matmul share of our fp32 update "
              f"{overhead:.0%}; 1.5x needs it at or below {1 - 1.5 / floor:.0%})")
    goal("ours CQL fp32 / its matmul ceiling", ratio("ours CQL fp32", "matmuls only, CQL 2 critics fp32"), 0.8)
    if "d3rlpy CQL" in median:
        goal("ours CQL fp32 / d3rlpy CQL", ratio("ours CQL fp32", "d3rlpy CQL"), 1.5)
        goal("ours CQL bf16 / d3rlpy CQL", ratio("ours CQL bf16", "d3rlpy CQL"), 3.0)
        print(f"  (ceiling: CQL matmuls alone / d3rlpy CQL = "
              f"{ratio('matmuls only, CQL 2 critics fp32', 'd3rlpy CQL'):.2f}x)")
    for tag in ("fp32", "bf16"):
        measured = ratio(f"ours SAC 2 critics {tag}", f"ours SAC 10 critics {tag}")
        goal(f"SAC 10/2-critic cost {tag}: {measured:.2f} measured / {predicted:.2f} FLOPs", measured / predicted,
             1.15, higher=False)
    for tag in ("fp32", "bf16"):  # information only: LayerNorm adds elementwise work the FLOP model leaves out
        measured = ratio(f"ours SAC 2 critics {tag}", f"ours SAC 10 critics+LN {tag}")
        print(f"  (RLPD config, 10 critics+LN vs 2 critics {tag}: {measured:.2f} measured / {predicted:.2f} FLOPs "
              f"= {measured / predicted:.2f})")
    print(f"\nFLOPs per update: SAC 2 critics {update_flops(2) / 1e9:.2f} G, 10 critics {update_flops(10) / 1e9:.2f} G, "
          f"CQL 2 critics n=10 {update_flops(2, 10) / 1e9:.2f} G (predicted 10/2 ratio {predicted:.2f}); "
          f"SB3 SAC {sb3_sac_flops() / 1e9:.2f} G, so at equal matmul efficiency ours fp32 / SB3 = "
          f"{sb3_sac_flops() / update_flops(2):.2f}x")

    write_result(args, "update_speed", dict(
        config=dict(batch=BATCH, hidden=HIDDEN, obs_dim=OBS, act_dim=ACT, threads=args.threads, rounds=args.rounds,
                    seconds=args.seconds, clock=args.clock, device=where, omp_wait_policy=os.environ.get("OMP_WAIT_POLICY")), torch=torch.__version__, machine=platform.processor() or platform.machine(), cpu=cpu_info(),
        load_avg=[load_before, os.getloadavg()], rates=rates, median=median, skipped=skipped, goals=goals,
        flops=dict(sac2=update_flops(2), sb3_sac=sb3_sac_flops(), sac10=update_flops(10), cql2=update_flops(2, 10), predicted_ratio=predicted)))


def write_result(args, kind: str, record: dict) -> None:
    """results/<kind>-<threads or cuda>-<clock>-<time>.json; a --quick smoke run writes nothing."""
    if args.quick:
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "cuda" if args.device.startswith("cuda") else f"{args.threads}thr"
    path = out / f"{kind}-{tag}-{args.clock}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}")


def measure_all(contenders: dict, args) -> tuple[dict, dict, str, tuple]:
    """`measure` with the command line's rounds, clock and device: (rates, medians, where, load before)."""
    cuda = args.device.startswith("cuda")
    load_before = os.getloadavg()
    rates = measure(contenders, args.rounds, args.seconds, warmup=1 if args.quick else 5,
                    clock=time.perf_counter if args.clock == "wall" else time.process_time,
                    sync=torch.cuda.synchronize if cuda else (lambda: None))
    where = torch.cuda.get_device_name(args.device) if cuda else f"{args.threads} threads"
    return rates, {name: statistics.median(v) for name, v in rates.items()}, where, load_before


def layernorm_path(args) -> None:
    rates, median, where, load_before = measure_all(build_layernorm_path(args.device), args)
    print(f"\nupdates per {args.clock}-clock second, {where}, median of {args.rounds} interleaved rounds, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, load avg {load_before[0]:.2f} -> "
          f"{os.getloadavg()[0]:.2f}")
    for name, values in rates.items():
        print(f"{name:40s} {median[name]:8.1f} {max(values):8.1f} {min(values):8.1f}")
    speedups = {}
    for size in ("CQL+LN Hopper sizes", "main job CQL"):
        ours_rates, native_rates = rates[f"{size}, ours"], rates[f"{size}, torch-native"]
        speedups[size] = statistics.median(a / b for a, b in zip(ours_rates, native_rates))
        print(f"  {size}: ours / torch-native = {speedups[size]:.2f}x (median of per-round ratios)")
    write_result(args, "update_speed-layernorm", dict(
        config=dict(threads=args.threads, rounds=args.rounds, seconds=args.seconds, clock=args.clock,
                    device=where, omp_wait_policy=os.environ.get("OMP_WAIT_POLICY")),
        torch=torch.__version__, cpu=cpu_info(), load_avg=[load_before, os.getloadavg()], rates=rates,
        median=median, speedup=speedups))


if __name__ == "__main__":
    main()
