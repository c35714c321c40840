"""Named offline datasets (env x quality x size x seed), generated on first use and cached as HDF5.

D4RL's qualities, remade locally with the `sims` expert policies, because gymnasium v5 physics
differ from the v2 envs the original files were recorded in. Manipulation tasks get OGBench-style
oracle data from `embodied.data.ogbench_gen`; files are cached where `embodied.data.cache` says.
"""
from __future__ import annotations

import inspect
import numbers
from dataclasses import asdict, dataclass

import numpy as np

import sims
from embodied.data import mt10_gen, ogbench_gen
from embodied.data.cache import dataset_path
from embodied.data.d4rl import load_hdf5, save_hdf5
from embodied.data.dataset import Dataset, concat
from embodied.data.generate import GENERATOR_VERSION, collect
from embodied.errors import DatasetError
from sims.manip import MANIP_NAMES


@dataclass(frozen=True)
class Part:
    """A share of a dataset: which expert level drives it (None = uniform random) and its noise."""

    level: str | None
    noise_std: float


# Each quality is a list of equal shares, recorded in this order.
RECIPES: dict[str, list[Part]] = {
    "random": [Part(level=None, noise_std=0.0)],
    "medium": [Part("medium", 0.1)],
    "expert": [Part("expert", 0.1)],
    "noisy": [Part("expert", 0.5)],
    # Like the replay buffer of a training run: early policy, then medium, then medium with less noise.
    "medium-replay": [Part("early", 0.3), Part("medium", 0.3), Part("medium", 0.1)],
    "medium-expert": [Part("medium", 0.1), Part("expert", 0.1)],
}
QUALITIES = tuple(RECIPES)


def _is_manip(env: str) -> bool:
    """Manipulation tasks get their data from OGBench's oracles (embodied.data.ogbench_gen)."""
    return env in MANIP_NAMES


def demo_generator(env: str):
    """The module that makes `env`'s scripted demos, or None for the D4RL-style envs here: OGBench's
    oracles (`ogbench_gen`) or Meta-World's scripted policies (`mt10_gen`, task 1 unless a suite asks for
    another). Both give QUALITIES, GenSpec, check_spec, cache_path and load_or_generate."""
    if _is_manip(env):
        return ogbench_gen
    if env == mt10_gen.ENV:
        return mt10_gen
    return None


def check_request(env: str, quality: str, size: int, seed: int = 0) -> None:
    """Reject a bad request before any env is built or file touched."""
    generator = demo_generator(env)
    if generator is not None:
        generator.check_spec(generator.GenSpec(env, quality, size, seed))
        return
    if quality not in RECIPES:
        raise DatasetError(f"unknown dataset quality '{quality}': choose one of {', '.join(QUALITIES)}")
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise DatasetError(f"dataset size={size!r} must be a positive integer number of transitions")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise DatasetError(f"dataset seed={seed!r} must be a non-negative integer")
    if env not in sims.names():
        raise DatasetError(f"unknown env '{env}' for a dataset: choose one of {', '.join(sims.names())}")


def load_dataset(env: str, quality: str, size: int, seed: int = 0, *, options: dict | None = None, cache_dir=None,
                 progress: bool = True) -> Dataset:
    """The cached dataset, or a freshly generated and cached one. A cache file written by an older
    generator version is regenerated rather than silently reused. `options` are the run's env options
    (`env.options`): `task_id` picks the task a scripted-demo env records, mt10's `reward` relabels it."""
    check_request(env, quality, size, seed)
    options = dict(options or {})
    generator = demo_generator(env)
    if generator is not None:
        task = {"task_id": options["task_id"]} if options.get("task_id") is not None else {}
        ds = generator.load_or_generate(generator.GenSpec(env, quality, int(size), int(seed), **task),
                                        cache_dir=cache_dir, progress=progress)
        return mt10_gen.success_rewards(ds) if options.get("reward") == "success" and generator is mt10_gen else ds
    if options.get("task_id") is not None:
        raise DatasetError(f"env option task_id for env={env!r}: only the scripted-demo envs (OGBench "
                           "manipulation, mt10) have tasks to pick; drop env.options.task_id")
    spec = sims.spec(env)
    path = dataset_path(env, quality, int(size), int(seed), cache_dir)
    if path.is_file():
        ds = load_hdf5(path, cached=True)
        if ds.metadata.get("generator_version") == GENERATOR_VERSION:
            ds.validate(spec.obs_dim, spec.act_dim, env=env)
            return ds
    ds = generate(env, quality, int(size), int(seed), progress=progress)
    ds.validate(spec.obs_dim, spec.act_dim, env=env)
    save_hdf5(ds, path)
    return ds


def generate(env: str, quality: str, size: int, seed: int = 0, *, progress: bool = True) -> Dataset:
    """Record the recipe's shares back to back, each with its own env and seed stream."""
    recipe = RECIPES[quality]
    shares = [size // len(recipe) + (i < size % len(recipe)) for i in range(len(recipe))]
    parts, episodes, successes = [], 0, None
    for index, (part, steps) in enumerate(zip(recipe, shares)):
        if steps == 0:
            continue
        part_seed = int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
        sim = sims.make(env, seed=part_seed)
        try:
            policy = _expert(sims, env, part.level, part_seed) if part.level is not None else None
            ds = collect(sim, policy, steps, noise_std=part.noise_std, seed=part_seed, progress=progress,
                         desc=f"{env} {quality} [{part.level or 'random'}]")
        finally:
            sim.close()
        parts.append(ds)
        episodes += ds.metadata["episodes"]
        if "success_episodes" in ds.metadata:
            successes = (successes or 0) + ds.metadata["success_episodes"]
    metadata = {
        "env": env,
        "quality": quality,
        "size": size,
        "seed": seed,
        "recipe": [asdict(p) for p in recipe],
        "policy": ", ".join(f"{p.level or 'uniform-random'} (noise {p.noise_std})" for p in recipe),
        "episodes": episodes,
        "generator_version": GENERATOR_VERSION,
    }
    if successes is not None:
        metadata["success_episodes"] = successes
    return concat(parts, metadata=metadata)


def _expert(sims, env: str, level: str, seed: int):
    """sims.expert(env, level), seeded when it takes a seed (stochastic experts such as the maze
    controller's detours), so each share and each dataset seed gets its own behaviour."""
    if "seed" in inspect.signature(sims.expert).parameters:
        return sims.expert(env, level, seed=seed)
    return sims.expert(env, level)
