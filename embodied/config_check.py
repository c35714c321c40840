"""Checks on the train job's config, run before any work starts (no dataset, env or run-dir writes).

Every value gets its type, range and choices checked, unknown keys get a "did you mean", and Hydra's own
composition errors are turned into the same one-line `ConfigError` naming the key and the fix. The resume
helpers make `resume=true hydra.run.dir=<run>` continue a run with the config it was started with.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from embodied.constants import TASK_SEED_STRIDE
from embodied.errors import ConfigError, UserError

_UNSET = object()
CONF_DIR = Path(__file__).parent / "conf"


# ---- value rules --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """What one config value may be. `kind`: int, float, bool, str, choice, ints (list of ints), device, bf16."""
    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False        # low < value instead of low <= value
    high_open: bool = False
    choices: tuple = ()
    optional: bool = False        # null is allowed
    example: str | None = None    # shown in the fix

    def expectation(self) -> str:
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "bf16":
            text = "true, false or auto"
        elif self.kind == "device":
            text = "cpu, cuda or cuda:<index>"
        elif self.kind == "choice":
            text = "one of " + ", ".join(map(str, self.choices))
        elif self.kind == "str":
            text = "a string"
        else:
            noun = {"int": "an integer", "float": "a number", "ints": "a list of integers"}[self.kind]
            bounds = []
            if self.low is not None:
                bounds.append(f"{'>' if self.low_open else '>='} {_num(self.low)}")
            if self.high is not None:
                bounds.append(f"{'<' if self.high_open else '<='} {_num(self.high)}")
            if self.low is not None and self.high is not None:
                left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
                bounds = [f"in {left}{_num(self.low)}, {_num(self.high)}{right}"]
            text = noun + (" " + " and ".join(bounds) if bounds else "")
            if self.kind == "ints" and bounds:
                text = f"a non-empty list of integers {' and '.join(bounds)}"
        return text + (" or null" if self.optional else "")

    def fix_example(self) -> str:
        if self.example is not None:
            return self.example
        if self.kind in ("bool", "bf16"):
            return "true" if self.kind == "bool" else "auto"
        if self.kind == "device":
            return "cpu"
        if self.kind == "choice":
            return str(self.choices[0])
        if self.kind == "ints":
            return "[256,256]"
        if self.low is not None:
            return _num(self.low + 1 if self.low_open else self.low)
        return "1"

    def ok(self, value) -> bool:
        if value is None:
            return self.optional
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "bf16":
            return isinstance(value, bool) or str(value).lower() == "auto"
        if self.kind == "device":
            return isinstance(value, str) and re.fullmatch(r"cpu|cuda(:\d+)?", value) is not None
        if self.kind == "choice":
            return value in self.choices
        if self.kind == "str":
            return isinstance(value, str)
        if self.kind == "ints":
            return (isinstance(value, (list, tuple)) and len(value) > 0
                    and all(_is_int(v) and self._in_range(v) for v in value))
        if self.kind == "int" and not _is_int(value):
            return False
        if self.kind == "float" and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return False
        return self._in_range(value)

    def _in_range(self, value) -> bool:
        if value != value:  # NaN
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num(value) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _show(value) -> str:
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return str(value)


def Int(low=None, high=None, **kw) -> Rule:
    return Rule("int", low, high, **kw)


def Float(low=None, high=None, **kw) -> Rule:
    return Rule("float", low, high, **kw)


BOOL, STR, OPT_STR = Rule("bool"), Rule("str"), Rule("str", optional=True)

# The run-level values (train.yaml and its groups). Group-specific values (agent options) are below.
RULES: dict[str, Rule] = {
    "seed": Int(0, example="0"),
    "device": Rule("device"),
    "threads": Int(1, example="2"),
    "bf16": Rule("bf16"),
    "resume": BOOL,
    "progress": BOOL,
    "log_every": Int(1, example="500"),
    "replay_capacity": Int(1, example="1000000"),
    "pretrained": OPT_STR,
    "budget.offline_steps": Int(0, example="20000"),
    "budget.online_steps": Int(0, example="20000"),
    "budget.batch_size": Int(1, example="256"),
    "budget.warmup_steps": Int(0, example="5000"),
    "budget.random_steps": Int(0, example="5000"),
    "eval.episodes": Int(1, example="10"),
    "eval.first_episode": Int(0, example="20"),
    "eval.at_start": BOOL,
    "eval.every_offline": Int(1, example="2000"),
    "eval.every_online": Int(1, example="2000"),
    "eval.video_episodes": Int(0, example="2"),
    "eval.video_size": Int(16, example="128"),
    "eval.dip_evals": Int(0, example="4"),
    "checkpoint.every": Int(0, example="10000"),
    "checkpoint.keep": Int(1, example="2"),
    "dataset.quality": STR,
    "dataset.size": Int(1, example="100000"),
    "dataset.seed": Int(0, example="0"),
    "dataset.path": OPT_STR,
    "dataset.minari_id": OPT_STR,
    "dataset.env": OPT_STR,
    "logger.wandb": BOOL,
    "logger.mode": Rule("choice", choices=("offline", "online", "disabled")),
    "logger.project": STR,
    "logger.group": OPT_STR,
    "env.name": STR,
    "env.gamma": Float(0, 1, low_open=True, example="0.99"),
    "env.reward_scale": Float(example="1.0"),
    "env.reward_bias": Float(example="0.0"),
    "env.sparse_failure_reward": Float(optional=True, example="0.0"),
    "env.pretrain_algo": STR,
    "algo.name": STR,
    "algo.policy": STR,
    "algo.offline_algo": OPT_STR,
    "algo.online_algo": STR,
    "algo.offline_ratio": Float(0, 1, example="0.5"),
    "algo.warmup_steps": Int(0, example="5000"),
    "algo.random_steps": Int(0, example="5000"),
    "algo.utd": Int(1, example="1"),
    "algo.critic_only_utd": BOOL,
    "algo.reinit_critic": BOOL,
    "algo.reset_optimizers": BOOL,
    "algo.switch_temperature": Rule("choice", choices=("keep", "reset", "fast", "refit")),
    "algo.switch_temperature_value": Float(0, low_open=True, example="0.05"),
    "algo.switch_temperature_steps": Int(0, example="1000"),
    "algo.switch_temperature_lr_scale": Float(0, low_open=True, example="10"),
    "algo.actor_delay_steps": Int(0, example="0"),
    "algo.online_cql_alpha": Float(0, optional=True, example="1.0"),
    "algo.num_critics": Int(1, example="2"),
    "algo.num_min": Int(1, example="2"),
    "algo.critic_layernorm": BOOL,
    "algo.horizon": Int(1, example="5"),
    "algo.num_samples": Int(1, example="32"),
    "algo.alpha": Float(0, example="100"),
    "policy.hidden": Rule("ints", 1, example="[256,256]"),
    "policy.obs_horizon": Int(1, example="2"),
    "policy.pred_horizon": Int(1, example="16"),
    "policy.execute_horizon": Int(1, example="8"),
}

RULES_TOP = {k for k in RULES if "." not in k}
_POSITIVE = Float(0, low_open=True, example="3e-4")
# Agent options (algo.offline_agent.* / algo.online_agent.*, and the algo.* / policy.* keys they come from).
# Types come from the agent's config dataclass; these add the ranges a type cannot say.
AGENT_RULES: dict[str, Rule] = {
    "num_critics": Int(1, example="2"), "num_min": Int(1, example="2"),
    "hidden": Rule("ints", 1, example="[256,256]"), "critic_hidden": Rule("ints", 1, optional=True, example="[256,256]"),
    "lr": _POSITIVE, "actor_lr": _POSITIVE, "critic_lr": _POSITIVE, "alpha_lr": _POSITIVE, "value_lr": _POSITIVE,
    "cql_alpha_lr": _POSITIVE, "gamma": Float(0, 1, low_open=True, example="0.99"),
    "tau": Float(0, 1, low_open=True, example="0.005"), "init_temperature": Float(0, low_open=True, example="1.0"),
    "max_target_actions": Int(1, example="10"), "cql_n_actions": Int(1, example="10"),
    "cql_alpha": Float(0, example="5.0"), "cql_temperature": Float(0, low_open=True, example="1.0"),
    "lagrange_init": Float(0, low_open=True, example="1.0"), "horizon": Int(1, example="5"),
    "num_samples": Int(1, example="32"), "flow_steps": Int(1, example="10"), "alpha": Float(0, example="100"),
    "expectile": Float(0, 1, low_open=True, high_open=True, example="0.7"), "beta": Float(0, low_open=True, example="3.0"),
    "max_weight": Float(0, low_open=True, example="100"), "obs_horizon": Int(1, example="2"),
    "pred_horizon": Int(1, example="16"), "execute_horizon": Int(1, example="8"),
    "denoising_steps": Int(1, example="20"), "ft_denoising_steps": Int(1, example="10"), "n_envs": Int(1, example="8"),
    "rollout_steps": Int(1, example="16"), "update_epochs": Int(1, example="5"), "minibatch_size": Int(1, example="256"),
    "min_std": Float(0, low_open=True, example="0.1"), "clip_ratio": Float(0, low_open=True, example="0.01"),
    "clip_ratio_base": Float(0, low_open=True, example="0.001"), "gae_lambda": Float(0, 1, example="0.95"),
    "gamma_denoise": Float(0, 1, low_open=True, example="0.99"), "weight_decay": Float(0, example="1e-6"),
    "grad_clip": Float(0, example="10"), "max_grad_norm": Float(0, low_open=True, example="1.0"),
    "critic_warmup_iters": Int(0, example="2"), "vf_coef": Float(0, example="0.5"),
    "target_kl": Float(0, low_open=True, example="1.0"), "distill_weight": Float(0, example="1.0"),
    "critic_kernel_scale_final": Float(0, low_open=True, optional=True, example="0.01"),
}

# Sections whose keys are fixed: a key outside them is a typo (or an option nothing reads).
FIXED_SECTIONS = ("", "budget", "eval", "checkpoint", "dataset", "logger")


def _group_keys(group: str) -> set[str]:
    """Every key any option of a config group defines (conf/<group>/*.yaml), for "did you mean"."""
    keys = set()
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        node = OmegaConf.load(path)
        if not isinstance(node, DictConfig):
            continue
        keys.update(str(k) for k in node.keys() if k != "defaults")
        for entry in node.get("defaults") or []:  # `/recipe: sparse`, `/pretrain@offline_agent: wsrl`
            if isinstance(entry, DictConfig):
                for target in entry.keys():
                    name = str(target).rpartition("@")[2] if "@" in str(target) else str(target).rpartition("/")[2]
                    if name and not name.startswith("override"):
                        keys.add(name)
    return keys


def _flat(node, prefix: str = "") -> dict[str, object]:
    """{dotted key: value} of a plain container, lists kept whole."""
    out = {}
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                out.update(_flat(value, path))
            else:
                out[path] = value
    return out


def suggest(key: str, candidates: Sequence[str]) -> str | None:
    """The closest existing dotted key: a sibling with a similar name first, then any similar full key."""
    parent, _, leaf = key.rpartition(".")
    siblings = [c for c in candidates if c.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(leaf, [c.rpartition(".")[2] for c in siblings], n=1, cutoff=0.6)
    if close:
        return f"{parent}.{close[0]}" if parent else close[0]
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.7)
    return close[0] if close else None


def unknown_key_error(key: str, value, candidates: Sequence[str]) -> ConfigError:
    guess = suggest(key, candidates)
    if guess:
        return ConfigError(f"{key} is not a config key (did you mean {guess}?); fix the name: {guess}={_show(value)}")
    parent = key.rpartition(".")[0]
    valid = sorted({c.rpartition(".")[2] for c in candidates if c.rpartition(".")[0] == parent})
    where = f"valid keys under {parent}: {', '.join(valid)}" if parent and valid else "remove it or fix its spelling"
    return ConfigError(f"{key} is not a config key (nothing reads it); {where}")


def value_error(key: str, value, rule: Rule, why: str | None = None) -> ConfigError:
    example = rule.fix_example()
    if rule.kind == "choice":  # the closest valid choice is the likely fix
        close = difflib.get_close_matches(str(value), [str(c) for c in rule.choices], n=1, cutoff=0.5)
        example = close[0] if close else example
    return ConfigError(f"{key}={_show(value)} {why or 'must be ' + rule.expectation()}; set {key}={example}")


# ---- the whole config -----------------------------------------------------------------------------

def check_config(cfg: DictConfig) -> None:
    """Raise a one-line ConfigError for the first bad value of a composed train config, before any work."""
    import sims
    from embodied import agents

    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    except Exception as err:  # noqa: BLE001 - an interpolation that does not resolve (e.g. ${algo.typo})
        raise ConfigError(f"the config does not resolve ({str(err).splitlines()[0]}); fix the ${{...}} reference "
                          "it names") from None
    resolved.pop("hydra", None)
    flat = _flat(resolved)
    _check_unknown_keys(resolved, flat)
    for key, rule in RULES.items():
        value = flat.get(key, _UNSET)
        if value is not _UNSET and not rule.ok(value):
            raise value_error(key, value, rule)
    if cfg.algo.offline_algo is not None and cfg.algo.offline_algo not in agents.names():
        raise value_error("algo.offline_algo", cfg.algo.offline_algo,
                          Rule("choice", choices=tuple(agents.names()), optional=True))
    if cfg.algo.online_algo not in (*agents.names(), "same"):
        raise value_error("algo.online_algo", cfg.algo.online_algo,
                          Rule("choice", choices=("same", *agents.names())))
    agents.check_switch(cfg.algo.offline_algo, cfg.algo.online_algo)
    _check_choices(cfg, resolved)
    _check_agents(cfg, resolved)
    if cfg.env.name not in sims.names():
        raise value_error("env.name", cfg.env.name, Rule("choice", choices=tuple(sims.names())))
    tasks = cfg.env.get("tasks")
    if tasks is not None and cfg.algo.offline_algo != "vla_bc":
        raise ConfigError(f"env.tasks={list(tasks)} makes a multi-task suite, which only algo=vla_bc trains; "
                          f"pick env={cfg.env.name} (one task) for algo={cfg.algo.name}")
    if tasks is not None and cfg.eval.first_episode + cfg.eval.episodes > TASK_SEED_STRIDE:
        stride = TASK_SEED_STRIDE
        raise ConfigError(f"eval.first_episode={cfg.eval.first_episode} + eval.episodes={cfg.eval.episodes} is over "
                          f"{stride}: a suite's tasks take {stride} start states each (task k's from {stride} k on), "
                          f"so the slice would reach the next task's; keep first_episode + episodes <= {stride}")
    if cfg.algo.offline_algo == "vla_bc":
        n = sims.spec(cfg.env.name).num_tasks or 0
        if not n or not tasks or any(not isinstance(t, int) or not 1 <= t <= n for t in tasks):
            raise ConfigError(f"algo=vla_bc needs a multi-task suite with env.tasks in 1..{n or 5}, got "
                              f"env={cfg.env.name} env.tasks={None if tasks is None else list(tasks)}: "
                              "pick env=cube-single-suite, cube-double-suite, scene-suite or mt10-suite")
    if cfg.algo.online_algo in ("vla_qc", "vla_ppo"):
        online = cfg.algo.online_algo
        task = cfg.algo.online_agent.get("task", agents.config_class(online)().task)
        if task not in list(tasks):
            raise ConfigError(f"algo.online_agent.task={task} is not in env.tasks={list(tasks)}; pick one of the "
                              "suite's tasks to fine-tune")
    variations = cfg.env.get("variations")
    if variations is not None:
        from sims.manip_variations import VARIATIONS

        if cfg.env.name == "mt10":
            from sims.mt10 import VARIATIONS
        if tasks is None:
            raise ConfigError(f"env.variations={list(variations)} are a suite's final eval sets: pick env=<name>-suite")
        bad = [v for v in variations if v not in VARIATIONS]
        if bad or not len(variations):
            raise ConfigError(f"env.variations={list(variations)}: each one of {', '.join(VARIATIONS)} "
                              "(e.g. env.variations=[none,paraphrase,positions,camera,lighting,distractor])")


def _check_unknown_keys(resolved: dict, flat: dict) -> None:
    known = {"": set(RULES_TOP) | {"env", "dataset", "algo", "policy", "logger", "budget", "eval", "checkpoint"}}
    for section in FIXED_SECTIONS[1:]:
        known[section] = {k.split(".", 1)[1] for k in RULES if k.startswith(section + ".")}
    known["env"] = _group_keys("env") | {"options"}
    known["policy"] = _group_keys("policy")
    from embodied.agents.runner import RunnerConfig

    known["algo"] = _group_keys("algo") | {f.name for f in dataclasses.fields(RunnerConfig)}
    candidates = [k for k in flat] + [f"{s}.{k}" if s else k for s, keys in known.items() for k in keys]
    for section, keys in known.items():
        node = resolved if not section else resolved.get(section)
        if not isinstance(node, dict):
            continue
        for key in node:
            if key not in keys:
                full = f"{section}.{key}" if section else str(key)
                raise unknown_key_error(full, node[key], [c for c in candidates if c != full])



def _check_env_options(cfg: DictConfig) -> None:
    """env.options go to the task's builder: build the task once with them, so a bad one fails before any data."""
    from embodied.run_config import env_options
    import sims

    options = env_options(cfg)
    if not options:
        return
    if cfg.env.get("tasks") is not None:
        raise ConfigError(f"env.options={options} with the suite env={cfg.env.name}: its tasks come from env.tasks and "
                          "a fine-tune's algo.online_agent.task; drop env.options")
    if options.get("reward") not in (None, "dense") and (cfg.dataset.path or cfg.dataset.minari_id):
        raise ConfigError(f"env.options.reward={options['reward']} relabels the generated demos, not dataset.path or "
                          "dataset.minari_id files; remove it, or drop the file to train on the generated demos")
    try:
        sims.make(cfg.env.name, **options).close()
    except UserError as err:
        raise ConfigError(f"env.options: {err}; set one of those values, or null for the default") from None
    except TypeError:   # the builder does not take one of them
        raise ConfigError(f"env.options {sorted(options)}: env={cfg.env.name} does not take all of them; remove it "
                          "(OGBench manipulation and mt10 take task_id, mt10 also reward)") from None


def _check_choices(cfg: DictConfig, resolved: dict) -> None:
    """Values whose valid set lives elsewhere: dataset qualities, files that must exist, CUDA."""
    from embodied.data import catalog
    from embodied.run_config import dataset_env

    needs_data = bool(cfg.algo.offline_algo) or cfg.algo.offline_ratio > 0
    _check_dataset_env(cfg)
    if needs_data and not cfg.dataset.path and not cfg.dataset.minari_id:
        data_env = dataset_env(cfg)
        qualities = _qualities(data_env, catalog)
        if cfg.dataset.quality not in qualities:
            raise value_error("dataset.quality", cfg.dataset.quality, Rule("choice", choices=qualities))
        try:
            catalog.check_request(data_env, cfg.dataset.quality, cfg.dataset.size, cfg.dataset.seed)
        except UserError as err:  # DatasetError: already one line naming the value
            raise ConfigError(f"dataset: {err}") from None
    _check_env_options(cfg)
    lerobot = cfg.dataset.path and (Path(cfg.dataset.path) / "meta" / "info.json").is_file()
    if needs_data and cfg.dataset.path and not (Path(cfg.dataset.path).is_file() or lerobot):
        raise ConfigError(f"dataset.path={cfg.dataset.path} does not exist or is neither a file nor a LeRobotDataset "
                          "folder (meta/info.json); point it at a D4RL-layout HDF5 file or a LeRobot v3 folder, or drop "
                          "dataset.path to generate the env's dataset")
    if cfg.pretrained and not Path(cfg.pretrained).exists():
        raise ConfigError(f"pretrained={cfg.pretrained} does not exist; pass a run directory whose offline phase "
                          "finished (or its checkpoints/pretrained)")
    if str(cfg.device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"device={cfg.device} but no CUDA device is visible; use device=cpu")
        index = str(cfg.device).partition(":")[2]
        if index and int(index) >= torch.cuda.device_count():
            raise ConfigError(f"device={cfg.device} but only {torch.cuda.device_count()} CUDA device(s) are "
                              f"visible; use device=cuda:0")


def _check_dataset_env(cfg: DictConfig) -> None:
    """`dataset.env` records the data elsewhere (an any-start maze trained on its fixed-start sibling's data), so
    its observations and actions must be the run env's."""
    import sims
    from embodied.data import catalog

    other = cfg.dataset.get("env")
    if not other or other == cfg.env.name:
        return
    if cfg.dataset.path or cfg.dataset.minari_id:
        raise ConfigError(f"dataset.env={other} names the env to generate data on, but dataset."
                          f"{'path' if cfg.dataset.path else 'minari_id'} loads one; set dataset.env=null to load it")
    if other not in sims.names() or catalog.demo_generator(other) or catalog.demo_generator(cfg.env.name):
        raise ConfigError(f"dataset.env={other}: pick a state-based env of sims.names() other than the scripted-demo "
                          "ones (OGBench manipulation, mt10); set dataset.env=null to record on env.name")
    data, run = sims.spec(other), sims.spec(cfg.env.name)
    if (data.obs_dim, data.act_dim) != (run.obs_dim, run.act_dim):
        raise ConfigError(f"dataset.env={other} has observations/actions of size {data.obs_dim}/{data.act_dim}, "
                          f"env={cfg.env.name} {run.obs_dim}/{run.act_dim}; set dataset.env=null or an env with the "
                          "same spaces")


def _qualities(env: str, catalog) -> tuple:
    generator = catalog.demo_generator(env)
    return tuple((generator or catalog).QUALITIES)


def _check_agents(cfg: DictConfig, resolved: dict) -> None:
    """Agent options: unknown keys, types and ranges, each error naming the key the user sets (algo.num_critics,
    policy.hidden, ...) rather than the internal option it flows into."""
    from embodied import agents
    from embodied.run_config import runner_config

    rcfg = runner_config(cfg)
    rcfg.validate()
    raw = OmegaConf.to_container(cfg, resolve=False)
    for section, name, options in (("offline_agent", rcfg.offline_algo, rcfg.offline_agent),
                                   ("online_agent", rcfg.online_algo, rcfg.online_agent)):
        if name in (None, "same"):
            continue
        cls = agents.config_class(name)
        fields = {f.name for f in dataclasses.fields(cls)}
        own = set(resolved["algo"].get(section) or {})
        for key in sorted(own - fields):
            raise unknown_key_error(f"algo.{section}.{key}", resolved["algo"][section][key],
                                    [f"algo.{section}.{f}" for f in fields])
        defaults = cls()
        for key, value in options.items():
            source = source_key(raw, section, key, resolved)
            rule = AGENT_RULES.get(key) or _type_rule(getattr(defaults, key))
            if rule is not None and not rule.ok(value):
                raise value_error(source, value, rule)
        values = {**{f.name: getattr(defaults, f.name) for f in dataclasses.fields(cls)}, **options}
        if "num_min" in values and "num_critics" in values and values["num_min"] > values["num_critics"]:
            low, high = source_key(raw, section, "num_min", resolved), source_key(raw, section, "num_critics", resolved)
            raise ConfigError(f"{low}={values['num_min']} must be <= {high}={values['num_critics']} (targets take the "
                              f"min over num_min of the critics); set {low}={values['num_critics']}, or raise {high}")
        agents.make_config(name, options)  # the dataclass's own checks (e.g. choices of string options)


def _type_rule(default) -> Rule | None:
    if isinstance(default, bool):
        return BOOL
    if isinstance(default, int):
        return Int()
    if isinstance(default, float):
        return Float()
    if isinstance(default, str):
        return STR
    return None


_INTERPOLATION = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")


def source_key(raw: dict, section: str, key: str, resolved: dict) -> str:
    """The config key a user sets to change agent option `key` of algo.<section>: follows `${a.b}` references
    (algo.online_agent.num_critics -> algo.offline_agent.num_critics -> algo.num_critics)."""
    node = (raw.get("algo") or {}).get(section) or {}
    if key in node:
        path, value = f"algo.{section}.{key}", node[key]
        for _ in range(10):
            match = _INTERPOLATION.fullmatch(value) if isinstance(value, str) else None
            if not match:
                break
            path = match.group(1)
            value = _get(raw, path)
        return path
    if key in (resolved.get("policy") or {}):
        return f"policy.{key}"
    if key == "gamma":
        return "env.gamma"
    return "bf16" if key == "bf16" else f"algo.{section}.{key}"


def _get(tree: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


# ---- command-line overrides (before Hydra runs) ------------------------------------------------------

def parse_overrides(args: Sequence[str]):
    """Hydra's own parser, its errors as one line naming the override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = []
    for arg in args:
        try:
            parsed += parser.parse_overrides([arg])
        except OverrideParseException as err:
            raise ConfigError(f"cannot parse the override {arg!r} ({str(err).splitlines()[0]}); write key=value, "
                              "quote values with spaces or commas, e.g. 'key=\"a,b\"'") from None
    return parsed


def expand_jobs(args: Sequence[str]) -> list[list[str]]:
    """The override list of every job a `-m` sweep launches, in Hydra's order (its basic sweeper's split)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper.split_arguments(parse_overrides(args), None)[0]


def is_group_override(override) -> bool:
    key = override.key_or_group
    return "/" in key or "@" in key or (CONF_DIR / key).is_dir() or key.startswith("hydra")


def compose_checked(compose: Callable[[list[str]], DictConfig], overrides: list[str]) -> DictConfig:
    """Compose a job's config; Hydra's errors (an unknown key, a missing group option) become one line, with
    "did you mean" for a mistyped key."""
    from hydra.errors import HydraException

    try:
        return compose(overrides)
    except HydraException as err:
        raise _composition_error(err, compose, overrides) from None


def _composition_error(err: Exception, compose, overrides: list[str]) -> ConfigError:
    from hydra.errors import MissingConfigException

    if isinstance(err, MissingConfigException):
        return ConfigError(_first(err) + "; pick one of the options the message lists")
    text = str(err)
    ambiguous = re.search(r"Ambiguous value for argument '([^']+)'", text)
    if ambiguous:
        return ConfigError(f"{ambiguous.group(1)} lists several values; add -m to sweep over them, or write "
                           f"{ambiguous.group(1).partition('=')[0]}=[a,b] for one list value")
    match = re.search(r"Could not override '([^']+)'", text)
    if not match:
        return ConfigError(f"{_first(err)}; fix that override")
    key = match.group(1)
    parsed = {o.key_or_group: o for o in parse_overrides(overrides)}
    value = parsed[key].value() if key in parsed else "..."
    groups = [o for o in overrides if is_group_override(parse_overrides([o])[0]) and not o.startswith("hydra")]
    try:
        base = compose(groups)
    except Exception:  # noqa: BLE001 - fall back to Hydra's words
        return ConfigError(f"{key} is not a config key ({_first(err)}); fix the name")
    option = AGENT_OPTION.match(key)
    if option is not None:  # an agent option: the candidates are the agent's config fields
        from embodied import agents

        algo = OmegaConf.select(base, f"algo.{option.group(1)}_algo")
        try:
            fields = sorted(f.name for f in dataclasses.fields(agents.config_class(algo)))
        except Exception:  # noqa: BLE001 - not a registered agent: the generic message below
            fields = []
        if fields:
            guess = suggest(option.group(2), fields)
            fix = f"did you mean {key.rpartition('.')[0]}.{guess}={_show(value)}?" if guess else "fix its name"
            return ConfigError(f"{key} is not an option of the {algo} agent; {fix} (valid: {', '.join(fields)})")
    candidates = list(_flat(OmegaConf.to_container(base, resolve=False)))
    return unknown_key_error(key, value, candidates)


AGENT_OPTION = re.compile(r"^algo\.(offline|online)_agent\.([A-Za-z_]\w*)$")


def with_agent_options(compose, overrides: list[str]) -> list[str]:
    """`algo.offline_agent.expectile=0.9` where the preset does not list `expectile`, or a switch knob it leaves
    at the runner's default (`algo.switch_temperature_value=0.01`): Hydra refuses a key its config lacks, yet
    every field of the agent's config dataclass, and every `runner.SWITCH_KNOBS` entry, is a valid option
    (and checked later). Such overrides get Hydra's `+` (add), so they take effect; others stay as given."""
    from embodied import agents

    from embodied.agents.runner import SWITCH_KNOBS

    keys = [(i, o.partition("=")[0]) for i, o in enumerate(overrides) if not o.startswith(("+", "~"))]
    knobs = [(i, key) for i, key in keys if key.startswith("algo.") and key[len("algo."):] in SWITCH_KNOBS]
    wanted = [(i, m) for i, key in keys if (m := AGENT_OPTION.match(key)) is not None]
    if not wanted and not knobs:
        return overrides
    try:
        base = compose([o for o in overrides if is_group_override(parse_overrides([o])[0])
                        and not o.startswith("hydra")])
    except Exception:  # noqa: BLE001 - the checks that follow report the composition error
        return overrides
    out = list(overrides)
    for i, key in knobs:  # a switch knob the preset leaves at RunnerConfig's default
        if OmegaConf.select(base, key, default="<absent>") == "<absent>":
            out[i] = "+" + overrides[i]
    for i, match in wanted:
        side, name = match.groups()
        agent_options = OmegaConf.select(base, f"algo.{side}_agent")
        if agent_options is None or name in agent_options:
            continue
        try:
            fields = {f.name for f in dataclasses.fields(agents.config_class(OmegaConf.select(base, f"algo.{side}_algo")))}
        except Exception:  # noqa: BLE001 - no such agent: the usual unknown-key error follows
            continue
        if name in fields:
            out[i] = "+" + overrides[i]
    return out


def _first(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


# ---- resume --------------------------------------------------------------------------------------

FREE_ON_RESUME = ("progress", "threads")  # how a job runs, not what it computes: a resume may change them


def read_saved_run(run_dir: Path) -> tuple[DictConfig, list[str]]:
    """The config (.hydra/config.yaml) and overrides a run was started with."""
    config_path, overrides_path = run_dir / ".hydra" / "config.yaml", run_dir / ".hydra" / "overrides.yaml"
    if not run_dir.is_dir():
        raise ConfigError(f"resume=true but hydra.run.dir={run_dir} does not exist; pass the directory of the run "
                          "to continue")
    if not config_path.is_file():
        raise ConfigError(f"resume=true but {run_dir} has no saved config ({config_path}); pass hydra.run.dir=<a run "
                          "directory written by embodied.train>")
    try:
        saved = OmegaConf.load(config_path)
        overrides = OmegaConf.load(overrides_path) if overrides_path.is_file() else ListConfig([])
    except Exception as err:  # noqa: BLE001 - YAML errors of any kind
        raise ConfigError(f"the run's saved config {config_path} is unreadable ({_first(err)}); restore it from "
                          f"{run_dir / 'config.yaml'} or start a new run") from None
    if not isinstance(saved, DictConfig) or not isinstance(overrides, ListConfig):
        raise ConfigError(f"the run's saved config {config_path} is not a config mapping; restore it from "
                          f"{run_dir / 'config.yaml'} or start a new run")
    return saved, [str(o) for o in overrides]


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def resume_config(run_dir: Path, given: Sequence[str], compose: Callable[[list[str]], DictConfig]) -> DictConfig:
    """The config a resumed run continues with: its own saved config. An override given with resume=true must
    leave that config as it is (or change only FREE_ON_RESUME keys); otherwise the error names what it changes."""
    saved, saved_overrides = read_saved_run(run_dir)
    given = [o for o in given if _key(o) != "resume" and not _key(o).startswith("hydra")]
    free = [o for o in given if _key(o) in FREE_ON_RESUME]
    others = [o for o in given if _key(o) not in FREE_ON_RESUME]
    ignore = {"resume", *FREE_ON_RESUME}
    flat = lambda overrides: _flat(OmegaConf.to_container(compose_checked(compose, overrides), resolve=True))
    base = flat(saved_overrides)
    for override in others:  # one at a time, so the error names the override that changes the run
        mine = flat(saved_overrides + [override])
        changed = sorted((k for k in set(base) | set(mine) if k.split(".")[0] not in ignore
                          and base.get(k, _UNSET) != mine.get(k, _UNSET)), key=lambda k: (not k.endswith(".name"), k))
        if changed:
            shown = "; ".join(f"{k}: run {_show(base.get(k))}, given {_show(mine.get(k))}" for k in changed[:2])
            more = f" and {len(changed) - 2} more" if len(changed) > 2 else ""
            raise ConfigError(f"resume=true continues {run_dir} with its saved config, but {override} changes it "
                              f"({shown}{more}); drop {override}, or start a new run to change it")
    composed = compose_checked(compose, saved_overrides + free)
    OmegaConf.set_struct(composed, False)
    final = OmegaConf.merge(composed, saved)  # the run's own values win; keys newer than the run keep defaults
    for key in {_key(o) for o in free}:
        OmegaConf.update(final, key, OmegaConf.select(composed, key), merge=False)
    final.resume = True
    return final
