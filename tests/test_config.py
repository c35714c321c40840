"""One source of truth for agent knobs: a user override takes effect or is an error that names the conflict."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from embodied import agents
from embodied.errors import ConfigError
from embodied.run_config import resolve_bf16, runner_config
from embodied.train import CONF_DIR


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def built(overrides: list[str], phase: str = "offline"):
    rcfg = runner_config(compose_train(overrides))
    rcfg.validate()
    name = rcfg.offline_algo if phase == "offline" else rcfg.online_algo
    return agents.make_config(name, rcfg.offline_agent if phase == "offline" else rcfg.online_agent)


@pytest.mark.parametrize("online", ["cql", "calql", "iql", "fql"])
def test_an_online_algo_the_switch_cannot_continue_is_rejected_before_training(online):
    """Before: any online_algo other than `same` silently became SAC (online_algo=cql dropped the penalty)."""
    with pytest.raises(ConfigError, match=f"online_algo={online}"):
        runner_config(compose_train(["algo=wsrl", f"algo.online_algo={online}"])).validate()


def test_registry_presets_do_not_win_over_user_overrides():
    """Before: `algo=fql algo.horizon=5` trained h=1 and `algo=qc` ignored extraction=distill."""
    assert built(["algo=fql", "algo.horizon=5"]).horizon == 5
    assert built(["algo=fql"]).horizon == 1
    assert built(["algo=qc", "algo.offline_agent.extraction=distill"]).extraction == "distill"
    assert built(["algo=qc"]).extraction == "best_of_n"


def test_the_default_policy_group_does_not_override_a_presets_network():
    """Before: `algo=qc` without `policy=flow` trained [256, 256] instead of the preset's 3 layers."""
    assert built(["algo=qc"]).hidden == (256, 256, 256)
    assert built(["algo=qc", "policy=flow"]).hidden == (256, 256, 256)
    assert built(["algo=wsrl", "policy.hidden=[64,64]"]).hidden == (64, 64)


def test_conflicting_network_options_are_errors_that_name_both():
    with pytest.raises(ConfigError, match="obs_horizon=1.*policy.obs_horizon=2"):
        runner_config(compose_train(["algo=dppo", "policy=diffusion"]))
    with pytest.raises(ConfigError, match="policy=flow is a flow network but algo=wsrl"):
        runner_config(compose_train(["algo=wsrl", "policy=flow"]))
    with pytest.raises(ConfigError, match="env.gamma"):
        runner_config(compose_train(["algo=wsrl", "+algo.online_agent.gamma=0.9"]))
    with pytest.raises(ConfigError, match="algo.online_agent sets"):
        runner_config(compose_train(["algo=calql", "+algo.online_agent.cql_alpha=1.0"]))


def test_the_vla_presets_take_their_head_from_policy_head_or_from_the_preset():
    """The VLA issue spells the head `algo=vla_bc env=<suite> policy.head=flow`; before, that was Hydra's
    "Key 'head' is not in struct" (only algo.offline_agent.head existed)."""
    from embodied.run_config import VLA_PRESET_HEADS
    from embodied.train import group_options

    suite = "env=cube-single-suite"
    # a preset missing from the table would skip the head-conflict check below
    assert set(VLA_PRESET_HEADS) == {p for p in group_options("algo") if p.startswith("vla_")}
    for preset, head in VLA_PRESET_HEADS.items():
        assert compose_train([f"algo={preset}", suite]).algo.offline_agent.head == head   # the yaml's, or inherited
        assert built([f"algo={preset}", suite]).head == head
    for head in ("parallel", "flow", "ar"):
        assert built(["algo=vla_bc", suite, f"policy.head={head}"]).head == head
        assert built(["algo=vla_bc", suite, f"algo.offline_agent.head={head}"]).head == head
    assert compose_train(["algo=vla_ppo", suite]).policy.name == "vla"   # the presets select the group
    assert built(["algo=vla_qc", suite, "policy.head=parallel"]).head == "parallel"   # frozen best-of-N takes any head
    with pytest.raises(ConfigError, match="policy.head=ar conflicts with algo.offline_agent.head=flow"):
        runner_config(compose_train(["algo=vla_bc", suite, "policy.head=ar", "algo.offline_agent.head=flow"]))
    with pytest.raises(ConfigError, match="policy.head=parallel: algo=vla_ppo fine-tunes the flow head"):
        runner_config(compose_train(["algo=vla_ppo", suite, "policy.head=parallel"]))
    with pytest.raises(ConfigError, match="policy=gaussian is a gaussian network but algo=vla_bc trains a vla policy"):
        runner_config(compose_train(["algo=vla_bc", suite, "policy=gaussian"]))
    assert compose_train(["algo=wsrl"]).policy.name == "gaussian"   # the others keep the default group


def test_unknown_or_mistyped_agent_options_name_the_key():
    with pytest.raises(ConfigError, match=r"num_critic \(did you mean num_critics\?\)"):
        agents.make_config("sac", {"num_critic": 3})
    with pytest.raises(ConfigError, match="num_critics='abc' should be a int"):
        agents.make_config("sac", {"num_critics": "abc"})
    with pytest.raises(ConfigError, match="num_min"):
        agents.make_config("sac", {"num_critics": 2, "num_min": 3})


def test_log_every_replay_capacity_and_pretrained_come_from_hydra():
    rcfg = runner_config(compose_train(["log_every=7", "replay_capacity=123", "pretrained=/tmp/x"]))
    assert (rcfg.log_every, rcfg.replay_capacity, rcfg.pretrained) == (7, 123, "/tmp/x")


def test_wsrl_preset_is_the_official_recipe():
    """The preset's values are WSRL's (zhouzypaul/wsrl); CPU-sized experiments change only counts."""
    rcfg = runner_config(compose_train(["algo=wsrl", "env=pointmaze-medium", "~experiment"]))
    online = agents.make_config("sac", rcfg.online_agent)
    offline = agents.make_config(rcfg.offline_algo, rcfg.offline_agent)
    assert (rcfg.utd, rcfg.online_batch_size * rcfg.utd, rcfg.critic_only_utd) == (4, 1024, True)
    assert rcfg.warmup_steps == 5000 and rcfg.offline_ratio == 0.0 and rcfg.switch_temperature == "keep"
    assert (online.num_critics, online.num_min, online.actor_q, online.backup_entropy) == (10, 2, "min", False)
    assert (online.actor_lr, online.critic_lr, online.alpha_lr) == (1e-4, 3e-4, 1e-4)
    assert online.actor_layernorm and online.critic_layernorm and online.critic_hidden == (256,) * 4
    assert not online.state_dependent_std and online.max_target_backup and online.critic_kernel_scale_final == 0.01
    assert offline.calql and offline.lagrange and offline.target_action_gap == 0.8 and offline.max_target_backup
    assert (rcfg.reward_scale, rcfg.reward_bias) == (10.0, -5.0)
    hopper = runner_config(compose_train(["algo=wsrl", "env=hopper", "~experiment"]))
    assert hopper.offline_algo == "cql" and (hopper.reward_scale, hopper.reward_bias) == (1.0, 0.0)
    assert agents.make_config("cql", hopper.offline_agent).critic_hidden == (256, 256)


def test_only_the_main_job_resets_the_temperature_at_the_switch():
    """The main job's one departure that is not a count (RESULTS.md, "The main job"): its WSRL resets the
    temperature; the recipe, the o2o experiments and a user's override keep their own."""
    assert runner_config(compose_train([])).switch_temperature == "reset"
    assert runner_config(compose_train(["algo=naive"])).switch_temperature == "reset"
    for overrides in (["~experiment"], ["experiment=o2o_hopper"], ["experiment=o2o_pointmaze"],
                      ["algo.switch_temperature=keep"], ["env.recipe.switch_temperature=keep"]):
        assert runner_config(compose_train(["algo=wsrl", *overrides])).switch_temperature == "keep", overrides


def test_presets_leave_bf16_on_auto_and_a_forced_bf16_warns_on_an_avx2_cpu():
    """Before: the o2o presets forced bf16, which is ~15x slower on a CPU without native bf16."""
    for experiment in ("o2o_hopper", "o2o_pointmaze", "o2o_cube_single", "o2o_cube_double", "default"):
        assert compose_train([f"experiment={experiment}"]).bf16 == "auto"
    avx2 = "flags: fpu avx2 fma"
    assert resolve_bf16("auto", "cpu", cpuinfo=avx2) is False
    assert resolve_bf16("auto", "cpu", cpuinfo="flags: avx512f avx512_bf16") is True
    with pytest.warns(UserWarning, match="15x slower"):
        assert resolve_bf16(True, "cpu", cpuinfo=avx2) is True


@pytest.mark.slow
def test_deterministic_chunk_acting_leaves_the_global_rng_alone():
    """Before: deterministic act_chunk reseeded the global (CPU and CUDA) RNG."""
    agent = agents.make("fql", 4, 2, {"hidden": (16,), "horizon": 3})
    obs = np.zeros((2, 4), np.float32)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    first = agent.act_chunk(obs, deterministic=True)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert np.array_equal(first, agent.act_chunk(obs, deterministic=True))


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["default", "smoke"])
def test_every_preset_builds_its_agents_under_the_shipped_experiments(experiment):
    """Each preset's agent configs build from the composed config (the default experiment once set an option
    that only the Gaussian agents have, which broke `algo=qc`)."""
    from embodied.train import group_options

    presets, built = group_options("algo"), set()
    assert len(presets) >= 10, presets   # an empty or broken glob would check nothing
    for preset in presets:
        for policy in ("", "policy=flow", "policy=diffusion"):
            overrides = [f"algo={preset}", f"experiment={experiment}"] + ([policy] if policy else [])
            cfg = compose_train(overrides)
            if policy and cfg.policy.kind != cfg.algo.policy:
                continue
            try:
                rcfg = runner_config(cfg)
            except ConfigError as err:  # only the documented conflict: DPPO's (and DiWA's) horizons vs policy=diffusion
                assert preset in ("dppo", "diwa") and policy == "policy=diffusion", (overrides, err)
                continue
            rcfg.validate()
            built.add(preset)
            for name, options in ((rcfg.offline_algo, rcfg.offline_agent), (rcfg.online_algo, rcfg.online_agent)):
                if name not in (None, "same"):
                    agents.make_config(name, options)
    assert built == set(presets)   # every preset built with at least its own policy


@pytest.mark.parametrize("maze", ["medium", "large"])
def test_an_anystart_maze_is_its_fixed_start_sibling_but_for_the_name(maze):
    from omegaconf import OmegaConf

    anystart, sibling = (OmegaConf.to_container(compose_train([f"env={name}"]), resolve=True)
                         for name in (f"pointmaze-{maze}-anystart", f"pointmaze-{maze}"))
    assert anystart["env"].pop("name") == f"pointmaze-{maze}-anystart"
    sibling["env"].pop("name")
    assert anystart == sibling


def test_vla_ppo_manip_takes_reinflows_visual_manipulation_values():
    """algo=vla_ppo_manip: ReinFlow's robomimic image config (can, ft_ppo_reflow_mlp_img.yaml) over vla_ppo's
    Hopper values; everything else, the counts included, is vla_ppo's."""
    suite = "env=cube-single-suite"
    manip, hopper = built(["algo=vla_ppo_manip", suite], "online"), built(["algo=vla_ppo", suite], "online")
    assert (manip.min_std, manip.max_std, manip.noise_decay, tuple(manip.noise_hidden)) == (0.08, 0.14, False,
                                                                                            (256, 256, 256))
    assert (manip.actor_lr, manip.update_epochs, manip.target_kl, manip.ent_coef) == (2e-5, 10, 0.01, 0.01)
    assert (hopper.min_std, hopper.max_std, hopper.actor_lr, hopper.target_kl) == (0.10, 0.24, 4.5e-5, 1.0)
    for same in ("denoising_steps", "clip_ratio", "critic_lr", "n_envs", "rollout_steps", "minibatches", "reward"):
        assert getattr(manip, same) == getattr(hopper, same), same
    assert built(["algo=vla_ppo_manip", suite, "algo.online_agent.min_std=0.05"], "online").min_std == 0.05
