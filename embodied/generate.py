"""Generate an oracle dataset for a manipulation task (Hydra): OGBench's recipe, our HDF5 writer.

    python -m embodied.generate env=cube-single quality=play               # OGBench size: 1,001,000 steps
    python -m embodied.generate env=scene quality=task size=20000 seed=1
    python -m embodied.generate env=cube-double quality=noisy size=2002 images=[front] out=/tmp/cd.hdf5

The request is checked (env, quality, size, seed, cameras) before any env is built; the file is the
catalog's cache entry unless `out=` is given, so `python -m embodied.train env=... dataset=play`
reuses it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from embodied.errors import ConfigError, UserError, exit_on_user_error

KEYS = ("quality", "size", "seed", "task_id", "noise", "noise_smoothing", "min_norm", "p_random_action",
        "episode_steps", "images", "image_size")


def spec_from_config(cfg: DictConfig):
    from embodied.data.ogbench_gen import GenSpec, check_spec

    values = OmegaConf.to_container(cfg, resolve=True)
    env = values.pop("env")["name"]
    unknown = sorted(set(values) - set(KEYS) - {"out", "force", "progress"})
    if unknown:
        raise ConfigError(f"unknown generate option(s) {unknown}: valid ones are {', '.join(KEYS + ('out', 'force', 'progress'))}")
    kwargs = {"env": env, **{k: values[k] for k in KEYS}}
    kwargs["images"] = tuple(kwargs["images"] or ())
    return check_spec(GenSpec(**kwargs))


def run(cfg: DictConfig) -> Path:
    from embodied.data import ogbench_gen
    from embodied.data.d4rl import save_hdf5

    spec = spec_from_config(cfg)  # every check happens before any work
    path = Path(cfg.out) if cfg.out else ogbench_gen.cache_path(spec)
    if path.is_file() and not cfg.force:
        print(f"exists: {path} (force=true regenerates it)")
        return path
    print(f"generating {spec.env} {spec.quality}: {spec.size} transitions, seed {spec.seed}, task {spec.task_id}, "
          f"noise {spec.noise}, p_random_action {spec.p_random_action}, episode_steps {spec.episode_steps}"
          + (f", images {list(spec.images)} at {spec.image_size}px" if spec.images else ""), flush=True)
    ds, extras = ogbench_gen.generate(spec, progress=cfg.progress)
    save_hdf5(ds, path, extras=extras)
    meta = ds.metadata
    print(f"wrote {path}: {len(ds)} transitions, {meta['episodes']} episodes, success {meta['success_episodes']}/"
          f"{meta['episodes']}, {meta['transitions_per_second']:.0f} transitions/s")
    return path


@hydra.main(config_path="conf", config_name="generate", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def check_env_override(argv: list[str]) -> None:
    """`env=typo` fails here with the list of valid envs, before Hydra prints its own error."""
    envs = {p.stem for p in (Path(__file__).parent / "conf" / "env").glob("*.yaml")}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if key == "env" and sep and value not in envs:
            from embodied.data.ogbench_gen import check_spec, GenSpec

            check_spec(GenSpec(value, "play"))  # raises, naming the manipulation envs
            raise ConfigError(f"env={value} has no config in embodied/conf/env")


@exit_on_user_error
def main() -> None:
    check_env_override(sys.argv[1:])
    _hydra_main()


if __name__ == "__main__":
    main()
