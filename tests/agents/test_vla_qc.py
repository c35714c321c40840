"""algo=vla_qc: a chunk critic over a frozen pretrained VLA, best-of-N over its samples (VLA fine-tuning
route (a)). The backup and the choice against hand-computed values; the errors; a tiny end-to-end run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import policies
from embodied import agents
from embodied.agents.vla_qc import ChunkReplay, demo_chunks
from embodied.config_check import check_config
from embodied.constants import STATE_KEY
from embodied.errors import ConfigError
from embodied.train import run
from tests.agents.test_vla_bc import TINY, compose_train

REPO = Path(__file__).resolve().parents[2]
OBS, ACT, N, H = 4, 2, 3, 2
SMALL_VLA = {"cameras": (), "chunk": H, "text_encoder": "hash", "vla_kwargs": {"dim": 16, "depth": 1, "num_heads": 2}}


def build(**overrides):
    base = agents.make("vla_bc", OBS, ACT, {**SMALL_VLA, "head": "flow"})
    return agents.continue_from("vla_qc", base, {"num_samples": N, "horizon": H, "hidden": (16, 16), **overrides})


def batch_of(agent, b: int = 5, seed: int = 0, terminal: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.uniform(-1, 1, shape).astype(np.float32)
    return {"observations": f(b, OBS), "text": f(b, agent.actor.text_dim), "actions": f(b, H, ACT),
            "rewards": -np.ones((b, H), np.float32), "valid": np.ones((b, H), np.float32),
            "terminals": np.full((b, H), float(terminal), np.float32), "next_observations": f(b, OBS),
            "next_text": f(b, agent.actor.text_dim), "next_candidates": f(b, N, H, ACT)}


def test_the_target_bootstraps_from_the_online_critics_choice_valued_by_the_target_critic():
    agent = build()
    with torch.no_grad():   # make the target critic differ from the online one
        for p in agent.target_critic.parameters():
            p.add_(0.3 * torch.randn_like(p))
    batch = batch_of(agent)
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        online = torch.stack([agent.q(agent.critic, t["next_observations"], t["next_text"], t["next_candidates"][:, j])
                              for j in range(N)], 1)
        pick = t["next_candidates"][torch.arange(5), online.argmax(1)]
        next_q = agent.q(agent.target_critic, t["next_observations"], t["next_text"], pick)
        # gamma = 0.99, h = 2: -1 - 0.99 + 0.99^2 Q'(s', a*)
        expected = -1.0 - 0.99 + 0.99 ** 2 * next_q
        before = [p.clone() for p in agent.critic.parameters()]
    metrics = agent.update(batch)
    assert metrics["target_q_mean"] == pytest.approx(float(expected.mean()), rel=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.critic.parameters()))   # the critic learned


def test_a_terminal_chunk_does_not_bootstrap():
    agent = build()
    metrics = agent.update(batch_of(agent, terminal=True))
    assert metrics["target_q_mean"] == pytest.approx(-1.0 - 0.99, rel=1e-6)


def test_the_agent_acts_with_the_argmax_q_candidate_and_the_vla_stays_frozen():
    agent = build()
    vla_before = {k: v.clone() for k, v in agent.actor.state_dict().items()}
    for seed in range(3):
        agent.update(batch_of(agent, seed=seed))
    assert all(torch.equal(v, agent.actor.state_dict()[k]) for k, v in vla_before.items())
    obs = {STATE_KEY: np.random.default_rng(1).normal(size=(2, OBS)).astype(np.float32), "task": "stack"}
    choice = agent.select(obs, torch.Generator().manual_seed(3))
    assert choice["candidates"].shape == (2, N, H, ACT) and choice["chunk"].shape == (2, H, ACT)
    state = torch.as_tensor(obs[STATE_KEY]).repeat_interleave(N, 0)
    text = torch.as_tensor(choice["text"]).repeat_interleave(N, 0)
    with torch.no_grad():
        q = agent.q(agent.critic, state, text, torch.as_tensor(choice["candidates"]).flatten(0, 1)).view(2, N)
    best = q.argmax(1).numpy()
    np.testing.assert_array_equal(choice["chunk"], choice["candidates"][np.arange(2), best])
    # the same noise stream gives the same candidates and choice
    again = agent.select(obs, torch.Generator().manual_seed(3))
    np.testing.assert_array_equal(again["chunk"], choice["chunk"])


def test_vla_qc_errors_name_the_field_and_the_fix():
    with pytest.raises(ConfigError, match="fine-tunes a pretrained vla_bc"):
        agents.make("vla_qc", OBS, ACT)
    with pytest.raises(ConfigError, match="finetune='adapters': choose one of frozen, head, lora, full"):
        build(finetune="adapters")
    with pytest.raises(ConfigError, match=r"distils whole executed chunks: set algo.online_agent.horizon=2"):
        build(finetune="head", horizon=1)
    parallel = agents.make("vla_bc", OBS, ACT, {**SMALL_VLA, "head": "parallel"})
    with pytest.raises(ConfigError, match="finetune=lora trains the flow head by BC.*head='parallel'"):
        agents.continue_from("vla_qc", parallel, {"num_samples": N, "horizon": H, "finetune": "lora"})
    with pytest.raises(ConfigError, match=r"critic_pretrain_steps must be >= 0 and critic_pretrain_rows >= 1"):
        build(critic_pretrain_rows=0)
    with pytest.raises(ConfigError, match=r"horizon=3 must be in 1..2"):
        build(horizon=3)
    with pytest.raises(ConfigError, match="reward='shaped': choose success or env"):
        build(reward="shaped")
    with pytest.raises(ConfigError, match="does not continue a pretrained agent"):
        agents.continue_from("qc", None)
    agent = build()
    replay = ChunkReplay(4, OBS, agent.actor.text_dim, H, ACT, N)
    row = {k: v[0] for k, v in batch_of(agent).items()}
    with pytest.raises(ValueError, match="ChunkReplay.add takes"):
        replay.add(**{k: v for k, v in row.items() if k != "next_candidates"})
    for _ in range(6):   # a ring: the oldest rows make way
        replay.add(**row)
    assert len(replay) == 4 and replay.sample(3)["next_candidates"].shape == (3, N, H, ACT)


def add_rows(agent, replay, rows: int = 6, seed: int = 0) -> None:
    batch = batch_of(agent, rows, seed)
    for i in range(rows):
        replay.add(**{k: v[i] for k, v in batch.items()}, frames={}, instruction=f"task {i % 2}")


@pytest.mark.parametrize("mode", ["head", "lora", "full"])
def test_each_finetune_mode_trains_what_it_names_by_bc_and_the_pretrained_reference_stays(mode):
    """QC's behaviour-policy update on the VLA: flow BC on VLA input rows (what ChunkReplay keeps with frames)."""
    agent = build(finetune=mode)
    replay = ChunkReplay(8, OBS, agent.actor.text_dim, H, ACT, N, frames={})   # a VLA without cameras: no frames
    add_rows(agent, replay)
    rows = replay.sample_inputs(6)
    assert rows["task"][0].startswith("task") and rows["actions"].shape == (6, H, ACT) and rows["valid"].shape == (6, H)
    before = {k: v.clone() for k, v in agent.actor.state_dict().items()}
    reference = {k: v.clone() for k, v in agent.reference.state_dict().items()}
    assert agent.vla_distance(rows) == 0.0   # nothing learned yet: the same chunks from the same noise
    losses = [agent.bc_update(replay.sample_inputs(6))["bc_loss"] for _ in range(8)]
    assert all(np.isfinite(losses))
    changed = {k for k, v in agent.actor.state_dict().items() if k in before and not torch.equal(v, before[k])}
    head = {k for k in changed if k.split(".")[0] in ("action_in", "action_pos", "time_embed", "action_out")}
    base_backbone = {k for k in changed if k.startswith("backbone.") and "lora_" not in k}
    assert head, "the flow head learns in every mode"
    assert (changed == head) if mode == "head" else True
    assert not base_backbone if mode in ("head", "lora") else base_backbone
    if mode == "lora":
        assert any("lora_B" in k for k in changed)   # the adapters learn
    assert agent.vla_distance(rows) > 0.0
    assert all(torch.equal(v, agent.reference.state_dict()[k]) for k, v in reference.items())


def test_demo_chunks_lay_out_the_demos_as_online_rows_and_skip_time_limits():
    """Two episodes: steps 0-4 end in success at 4, steps 5-9 at a time limit. Horizon 3."""
    terminals = np.zeros(10, bool)
    terminals[4] = True
    demos = SimpleNamespace(actions=np.arange(10, dtype=np.float32)[:, None].repeat(2, 1), terminals=terminals,
                            last=np.array([4] * 5 + [9] * 5))
    rows = demo_chunks(demos, 3, terminals.astype(np.float32), 100, np.random.default_rng(0))
    # a chunk that reaches the time limit (starts 7, 8, 9) has no state to bootstrap from: left out
    np.testing.assert_array_equal(rows["start"], [0, 1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(rows["next_index"], [3, 4, -1, -1, -1, 8, 9])
    np.testing.assert_array_equal(rows["valid"][3], [1, 1, 0])          # start 3: steps 3, 4, then the episode ended
    np.testing.assert_array_equal(rows["terminals"][3], [0, 1, 1])      # from the succeeding step on, as online
    np.testing.assert_array_equal(rows["rewards"][3], [0, 1, 0])
    np.testing.assert_array_equal(rows["rewards"][2], [0, 0, 1])
    np.testing.assert_array_equal(rows["terminals"][0], [0, 0, 0])
    np.testing.assert_array_equal(rows["actions"][3, :, 0], [3, 4, 4])  # padded with the last real action
    assert len(demo_chunks(demos, 3, terminals.astype(np.float32), 4, np.random.default_rng(0))["start"]) == 4


def test_a_replay_that_keeps_frames_refuses_rows_without_them():
    agent = build()
    frameless = ChunkReplay(4, OBS, agent.actor.text_dim, H, ACT, N)
    row = {k: v[0] for k, v in batch_of(agent).items()}
    frameless.add(**row)
    with pytest.raises(ValueError, match="keeps no frames: build it with frames="):
        frameless.sample_inputs(1)
    keeping = ChunkReplay(4, OBS, agent.actor.text_dim, H, ACT, N, frames={"observation.images.front": (8, 8, 3)})
    with pytest.raises(ValueError, match=r"add needs frames=\{observation.images.front\} and the instruction"):
        keeping.add(**row)
    keeping.add(**row, frames={"observation.images.front": np.full((8, 8, 3), 7, np.uint8)}, instruction="stack")
    rows = keeping.sample_inputs(2)
    assert rows["observation.images.front"].dtype == np.uint8 and int(rows["observation.images.front"].max()) == 7
    assert rows["task"] == ["stack", "stack"]


VLA_QC_TINY = ["algo=vla_qc", "env=cube-single-suite", "env.tasks=[1,2]", "dataset=task", "dataset.size=300",
               "budget.offline_steps=6", "budget.online_steps=40", "budget.batch_size=8", "eval.episodes=1",
               "eval.every_offline=6", "eval.every_online=40", "logger=jsonl", "progress=false", "threads=1",
               "checkpoint.every=0", "eval.video_episodes=0", "log_every=16", "algo.online_agent.task=2",
               "algo.online_agent.num_samples=4", "algo.online_agent.hidden=[32,32]", *TINY]


def test_vla_qc_config_errors_before_any_work():
    check_config(compose_train(VLA_QC_TINY))
    with pytest.raises(ConfigError, match="algo.online_agent.task=7 is not in env.tasks"):
        check_config(compose_train([*VLA_QC_TINY, "algo.online_agent.task=7"]))
    check_config(compose_train([*VLA_QC_TINY, "checkpoint.every=10"]))   # online checkpoints are written
    with pytest.raises(ConfigError, match="env.options=.* with the suite env=cube-single: .*drop env.options"):
        check_config(compose_train([*VLA_QC_TINY, "env.options.task_id=2"]))


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["frozen", "lora"])
def test_vla_qc_resumes_from_an_online_checkpoint_with_its_chunk_replay(tmp_path, monkeypatch, finetune):
    """An online checkpoint holds the chunk replay (with the frames the VLA's BC reads when it learns), the
    loop's owed updates and next eval, and the VLA itself; a run resumed from it finishes the budget on the
    pretrained VLA's weights, not an untrained one's."""
    import shutil

    from embodied.checkpoints import find_checkpoints

    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    overrides = [*VLA_QC_TINY, "checkpoint.every=16", "checkpoint.keep=5", f"algo.online_agent.finetune={finetune}",
                 *(["algo.online_agent.bc_every=4"] if finetune == "lora" else [])]
    full = run(compose_train(overrides), tmp_path / "run")
    online = [p for p in find_checkpoints(tmp_path / "run")
              if json.loads((p / "state.json").read_text())["phase"] == "online"]
    # 6 offline steps, 8-step chunks: the totals 22 and 38 cross 16 and 32 at the chunk starts 16 and 32
    assert [json.loads((p / "state.json").read_text())["online_step"] for p in online] == [16, 32]
    loop = json.loads((online[0] / "state.json").read_text())["loop"]
    assert loop["checkpoints_written"] == 1 and loop["next_eval"] == 40
    with np.load(online[0] / "replay_online.npz", allow_pickle=False) as replay:
        assert replay["counts"].tolist()[1] == 2 and replay["instructions"].shape == (2,)   # chunks 0-8, 8-16
        frames = [k for k in replay.files if k.startswith("frames/")]
        assert (len(frames) == 1 and replay[frames[0]].shape[0] == 2) if finetune == "lora" else not frames

    shutil.copytree(tmp_path / "run", tmp_path / "resumed")   # as if killed after the first online checkpoint
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / online[1].name)
    resumed = run(compose_train([*overrides, "resume=true"]), tmp_path / "resumed")
    assert resumed["online_steps"] == 40 and resumed["finetune"]["success_before"] == full["finetune"]["success_before"]
    lines = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line["phase"] == "online" and line["kind"] == "eval"] == [40]
    assert [line["step"] for line in lines if "train/critic_loss" in line] == [16, 32]
    if finetune == "frozen":   # the resumed run acted with the pretrained VLA, restored from the checkpoint
        before, after = policies.load(tmp_path / "run" / "policy"), policies.load(tmp_path / "resumed" / "policy")
        assert all(torch.equal(v, after.state_dict()[k]) for k, v in before.state_dict().items())
    else:
        assert any("train/bc_loss" in line for line in lines if line["step"] > 16)


@pytest.mark.slow
def test_vla_qc_fine_tunes_one_task_and_evaluates_every_task(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    summary = run(compose_train(VLA_QC_TINY), tmp_path / "run")
    finetune = summary["finetune"]
    assert finetune["task"] == 2 and set(finetune["other_tasks_after"]) == {1}
    assert 0.0 <= finetune["success_before"] <= 1.0 and 0.0 <= finetune["success_after"] <= 1.0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    online = [line for line in lines if line["phase"] == "online"]
    train = [line for line in online if line["kind"] == "train" and "train/critic_loss" in line]
    assert [line["step"] for line in train] == [16, 32]   # 8-step chunks, a record every 16 env steps
    assert all(np.isfinite(line["train/critic_loss"]) and line["finetune/action_distance"] >= 0 for line in train)
    evals = [line for line in online if line["kind"] == "eval"]
    assert [e["step"] for e in evals] == [40]   # "before" is the end-of-pretraining eval
    assert {"eval/task1/success", "eval/task2/success"} <= set(evals[-1])
    assert (tmp_path / "run" / "checkpoints" / "pretrained" / "state.json").is_file()   # fine-tune again: pretrained=
    # benchmarks/vla_finetune.py: fine-tunes from that pretraining (no offline phase) and tables the result
    out = tmp_path / "finetune.json"
    overrides = [o for o in VLA_QC_TINY if o.split("=")[0] not in ("algo", "env", "dataset", "dataset.size",
                                                                    "budget.online_steps", "eval.every_online",
                                                                    "algo.online_agent.task", "checkpoint.every",
                                                                    "eval.video_episodes", "logger", "progress",
                                                                    "threads")]
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "vla_finetune.py"), "--pretrained", str(tmp_path / "run"),
                    "--tasks", "1", "--seeds", "1", "--online-steps", "16", "--dataset-size", "300",
                    "--out", str(tmp_path / "sweep"), "--json", str(out), "--", *overrides],
                   check=True, cwd=REPO, timeout=900)
    result = json.loads(out.read_text())
    assert [(j["task"], j["seed"]) for j in result["jobs"]] == [(1, 0)]
    table = result["tables"]["1"]
    assert table["seeds"] == 1 and 0.0 <= table["after"]["success"] <= 1.0 and len(table["after"]["ci95"]) == 2
    assert table["episodes_before"] == 1   # the pretraining's own eval.episodes, read from its metrics
    again = subprocess.run([sys.executable, str(REPO / "benchmarks" / "vla_finetune.py"), "--pretrained",
                            str(tmp_path / "run"), "--tasks", "1", "--seed-list", "0", "--online-steps", "16",
                            "--dataset-size", "300", "--out", str(tmp_path / "sweep"), "--json", str(tmp_path / "again.json"),
                            "--", *overrides], check=True, cwd=REPO, timeout=120, capture_output=True, text=True)
    assert "reused" in again.stdout   # the finished job of the same command is not rerun
    assert json.loads((tmp_path / "again.json").read_text())["jobs"] == result["jobs"]
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "vla_finetune.py"), "--recompute", str(out)],
                   check=True, cwd=REPO, timeout=120)
    assert json.loads(out.read_text())["tables"] == result["tables"]   # rebuilt from the jobs alone
    # --slices --before: seed k evaluates its own start states (eval.first_episode = k E), and "before" is a
    # benchmarks/vla_eval_sets.py eval of the same policy on all of them, not the run's own first E
    script = lambda *extra, **kw: subprocess.run([sys.executable, str(REPO / "benchmarks" / "vla_finetune.py"), *extra],
                                                 cwd=REPO, timeout=600, capture_output=True, text=True, **kw)
    before = tmp_path / "before.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "vla_eval_sets.py"), "--policy",
                    str(tmp_path / "run" / "policy"), "--env", "cube-single", "--tasks", "1", "2", "--episodes", "2",
                    "--sets", "none", "--out", str(before)], check=True, cwd=REPO, timeout=600)
    unsliced = script("--recompute", str(out), "--before", str(before))
    assert unsliced.returncode != 0 and "--before and --slices go together" in unsliced.stderr
    sliced_out = tmp_path / "sliced.json"
    sliced = script("--pretrained", str(tmp_path / "run"), "--tasks", "1", "--seeds", "2", "--online-steps", "16",
                    "--dataset-size", "300", "--out", str(tmp_path / "sliced"), "--json", str(sliced_out), "--slices",
                    "--before", str(before), "--", *overrides)
    assert sliced.returncode == 0, sliced.stderr[-2000:]
    assert "eval.first_episode=1" in sliced.stdout and "eval.first_episode=0" in sliced.stdout   # E = 1 per seed
    rebuilt = json.loads(sliced_out.read_text())
    evaluated = json.loads(before.read_text())["sets"]["none"]["task_success"]
    assert rebuilt["slices"] and rebuilt["tables"]["1"]["episodes_before"] == 2
    assert rebuilt["tables"]["1"]["before"]["per_seed"] == [evaluated["1"]]
    assert rebuilt["tables"]["1"]["other_tasks_before"]["per_seed"] == [evaluated["2"]]
    # the before eval keeps each start state's outcome, so each seed's gain is paired with its own slice
    outcomes = json.loads(before.read_text())["sets"]["none"]["episode_success"]
    assert len(outcomes["1"]) == 2 and set(outcomes["1"]) <= {0, 1} and sum(outcomes["1"]) / 2 == evaluated["1"]
    level = rebuilt["tables"]["1"]["seed_level"]
    assert level["pairing"] == "slice" and level["task_before_per_seed"] == [float(v) for v in outcomes["1"]]
    assert result["tables"]["1"]["seed_level"]["pairing"] == "same states"   # every seed on the run's own states
    too_few = script("--pretrained", str(tmp_path / "run"), "--tasks", "1", "--seed-list", "0", "--online-steps", "16",
                     "--dataset-size", "300", "--out", str(tmp_path / "sliced"), "--json", str(tmp_path / "few.json"),
                     "--slices", "--before", str(before), "--", *overrides)   # seed 0 reused; 1 state, not 2
    assert too_few.returncode != 0 and "must cover exactly seeds 0..n-1 x 1 states; it has 2" in too_few.stderr
    # a "before" measured with another sampler than the route acts with is refused (vla_qc: the policy's own 10)
    other_sampler = tmp_path / "before_k2.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "vla_eval_sets.py"), "--policy",
                    str(tmp_path / "run" / "policy"), "--env", "cube-single", "--tasks", "1", "2", "--episodes", "2",
                    "--sets", "none", "--flow-steps", "2", "--out", str(other_sampler)], check=True, cwd=REPO, timeout=600)
    assert json.loads(other_sampler.read_text())["flow_steps"] == 2
    refused = script("--recompute", str(sliced_out), "--before", str(other_sampler))
    assert refused.returncode != 0 and "evaluated at 2 flow steps, and vla_qc acts at 10" in refused.stderr
    wrong = script("--pretrained", str(tmp_path / "other"), "--slices", "--before", str(before), "--tasks", "1")
    assert wrong.returncode != 0 and "not " + str(tmp_path / "other" / "policy") in wrong.stderr
    lines = (tmp_path / "sweep" / "task1_s0" / "metrics.jsonl").read_text().splitlines()
    assert not any(json.loads(line)["phase"] == "offline" and json.loads(line)["kind"] == "train" for line in lines)
    # a pretraining-only run (budget.online_steps=0, the README's first command) ends with one eval
    # (before the fix its summary found no online-phase eval and raised)
    zero = run(compose_train([*VLA_QC_TINY, "budget.online_steps=0", f"pretrained={tmp_path / 'run'}"]),
               tmp_path / "zero")
    assert zero["online_steps"] == 0 and set(zero["task_success"]) == {1, 2}


@pytest.mark.slow
def test_vla_qc_with_critic_pretraining_and_lora_trains_both_and_saves_a_plain_policy(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    summary = run(compose_train([*VLA_QC_TINY, "algo.online_agent.finetune=lora", "algo.online_agent.bc_every=4",
                                 "algo.online_agent.bc_batch_size=4", "algo.online_agent.critic_pretrain_steps=20",
                                 "algo.online_agent.critic_pretrain_rows=16"]), tmp_path / "run")
    assert 0.0 <= summary["finetune"]["success_after"] <= 1.0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the critic's offline pretraining on the demos ran first, at the switch
    pretrain = [line for line in lines if "critic_pretrain/critic_loss" in line]
    assert len(pretrain) == 1 and pretrain[0]["step"] == 0 and pretrain[0]["critic_pretrain/rows"] == 16
    assert np.isfinite(pretrain[0]["critic_pretrain/critic_loss"])
    train = [line for line in lines if line["phase"] == "online" and line["kind"] == "train" and "train/bc_loss" in line]
    assert [line["step"] for line in train] == [16, 32]   # a BC step per 4 env steps, logged with the critic's
    assert all(np.isfinite(line["train/bc_loss"]) for line in train)
    assert train[-1]["finetune/vla_distance"] > 0.0       # the VLA itself moved from the pretrained one
    saved = policies.load(tmp_path / "run" / "policy")    # adapters merged: a plain VLA
    assert not any("lora" in name for name in saved.state_dict())
    pretrained = load_file(tmp_path / "run" / "checkpoints" / "pretrained" / "model.safetensors")
    weights = saved.state_dict()
    assert not torch.equal(weights["action_out.0.weight"], pretrained["actor.action_out.0.weight"])   # the head
    assert not torch.equal(weights["backbone.blocks.0.qkv.weight"], pretrained["actor.backbone.blocks.0.qkv.weight"])


def test_eval_first_episode_shifts_every_eval_start_state_by_that_many_episodes():
    """`eval.first_episode` (vla_finetune --slices): seed k's evals start k E episodes into the shared states."""
    from embodied.agents.runner import Runner, eval_seed
    from embodied.agents.vla_bc import VLAFinetuneRunner

    runner = SimpleNamespace(cfg=SimpleNamespace(seed=2, eval_first_episode=20))
    assert Runner._eval_seed(runner) == eval_seed(2) + 20
    assert VLAFinetuneRunner._eval_seed(runner) == eval_seed(0) + 20   # fine-tunes share the seed-0 states
    runner._eval_seed = lambda: VLAFinetuneRunner._eval_seed(runner)
    assert VLAFinetuneRunner._task_seed(runner, 8) == eval_seed(0) + 20 + 800   # task 8's slice
    with pytest.raises(ConfigError, match=r"eval.first_episode=90 \+ eval.episodes=20 is over 100"):
        check_config(compose_train([*VLA_QC_TINY, "eval.first_episode=90", "eval.episodes=20"]))
